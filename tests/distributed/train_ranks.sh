#!/usr/bin/env bash
# `branchgrpo train` on several processes of this host (ctest -L distributed; docs/distributed.md):
#   train_ranks.sh MODE TOOL TEST_PROGRAM MODEL_DIR WORK_DIR [KILL_ON_RENAME_LIBRARY]
# MODE:
#   same        3 iterations of the shipped model on 1 process and on 2 ranks (Gloo, loopback): the final
#               trainable weights agree within 1e-6 (||a - b|| / ||a||; measured 4e-9 at the default lr 1e-5: the
#               ranks' gradient sum rounds differently, and Adam's normalized step turns that into moves of elements
#               whose gradient is at the rounding level: 1.3e-6 at lr 1e-3), iteration 0's rewards are equal to the
#               last bit, later ones within 1e-5, the counts equal.
#               rollout.max_batch = 1, because LibTorch's float32 matrix products round differently for another
#               number of rows, and a rank batches only its own trees (with 64: 1e-6, docs/distributed.md)
#   torchrun    the same 2-rank run launched by torchrun (Debian's python3-torch) instead of by hand: the weights
#               agree with one process's within 1e-6
#   zero1_full, zero2_full, zero2_lora   as `same`, the 2 ranks sharded: [optimizer] sharding = "optimizer"
#               (ZeRO-1) or "gradients" (ZeRO-2), full fine-tuning (LoRA off) or LoRA, against one unsharded process
#   zero2_uneven  as zero2_full with 3 trees on 2 ranks (1 and 2): the rank with fewer accumulate calls pads
#               (ZeRO-2 reduces during every backward pass, a collective)
#   zero_resume a sharded checkpoint written by 2 ZeRO-2 ranks (one shard file per rank, no weights.safetensors) is
#               resumed by one unsharded process, ending where 3 unsharded iterations end; export-lora --merge reads
#               it (the shards assembled: exactly the checkpoint's weights)
#   zero_reshard_1_2, zero_reshard_2_3   a sharded checkpoint of 1 (2) ZeRO-2 ranks resumed by 2 (3) ZeRO-2 ranks,
#               each reading only its new range of the old shards: ends where 3 unsharded iterations end (1e-6)
#   zero_killed 2 ZeRO-2 ranks, checkpoints every 2 of 4 iterations; rank 1 is killed (SIGKILL, kill_on_rename)
#               while writing its shard of checkpoint 4: rank 0 names it, checkpoint 2 stays valid, the staging
#               directory has no manifest; the next start removes it, resumes from 2 and ends bit for bit where an
#               uninterrupted 2-rank run ends (same world size: the same sums in the same order)
#   killed      rank 1 is killed (SIGKILL) in the middle of a long run: rank 0 exits non-zero within its --timeout
#               (5 s) with one line naming rank 1
#   resume      a checkpoint written by 2 ranks is resumed by one process, with a note that the world size changed
#   mismatch    the ranks are given different configs (another lr): both exit with the mismatch line
#   trace       `train --trace DIR` writes one trace file per iteration on one process, and 2 ranks refuse it in
#               one line each (a trace holds one process's rollout)
# Each rank runs the tool with torchrun's variables set by hand (run_ranks.sh); nothing is left running.
set -u
mode=$1 tool=$2 program=$3 model=$4 work=$5 kill_library=${6:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL ($mode): $*" >&2; exit 1; }

# config NAME ITERATIONS [LR] -> $work/NAME.toml, output in $work/NAME
config() {
  cat > "$work/$1.toml" <<TOML
[model]
dir = "$model"
[data]
prompts_per_iteration = 4
[topology]
split_steps = [0, 2]
branching = [2]
[rollout]
steps = 4
max_batch = 1
[optimizer]
lr = ${3:-1e-5}
[lora]
rank = 2
alpha = 2.0
[run]
iterations = $2
checkpoint_every = 0
grid_every = 2
output_dir = "$work/$1"
TOML
}

# compare_runs ONE TWO: 3 iterations each; the final weights within 1e-6 (relative, over all tensors), the metrics'
# counts equal, iteration 0's rewards equal, later ones within 1e-5.
compare_runs() {
  "$program" compare "$work/$1/checkpoints/iter-000003" "$work/$2/checkpoints/iter-000003" 1e-6 ||
    fail "weights differ"
  python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" <<'PY' || fail "metrics differ"
import json, sys
one, two = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
assert len(one) == len(two) == 3, (len(one), len(two))
for a, b in zip(one, two):
    for key in ("iteration", "evaluations", "update_evaluations", "edges", "edges_trained", "trees_dropped"):
        assert a[key] == b[key], (key, a[key], b[key])
    if a["iteration"] == 0:  # the same rollout, bit for bit (the leaf rewards are gathered in the global order)
        for key in ("reward_mean", "reward_std", "reward_min", "reward_max"):
            assert a[key] == b[key], (key, a[key], b[key])
        # A component's mean is each rank's sum all-reduced, then divided: another summation order (a few ulps).
        key = "reward/alignment"
        assert abs(a[key] - b[key]) <= 1e-14 * abs(a[key]), (key, a[key], b[key])
    for key in ("reward_mean", "reward_std", "reward_min", "reward_max", "reward/alignment"):
        assert abs(a[key] - b[key]) <= 1e-5 * max(abs(a[key]), 1e-3), (key, a[key], b[key])
print("metrics: counts equal, iteration 0's rewards equal (components within 1e-14), later ones within 1e-5")
PY
}

# shard MODE NAME [full]: [optimizer] sharding = MODE (buckets of 10,000 floats: they straddle tensors and ranks) in
# NAME.toml; with `full`, full fine-tuning (LoRA off).
shard() {
  [ "$1" = none ] || sed -i "/^\[optimizer\]\$/a sharding = \"$1\"\nbucket_mb = 0.04" "$work/$2.toml"
  [ "${3:-}" = full ] && sed -i "/^\[lora\]\$/a enabled = false" "$work/$2.toml"
  return 0
}

case $mode in
same)
  config one 3 && config two 3
  "$tool" train --config "$work/one.toml" --quiet --json > "$work/one.jsonl" 2> "$work/one.err" || fail "one process: $(cat "$work/one.err")"
  bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/two.toml" --quiet --json --timeout 20 ||
    fail "two ranks"
  compare_runs one two
  ;;
zero2_uneven)
  # 3 trees on 2 ranks (1 and 2): ZeRO-2's per-backward reductions are collectives, so train_iteration pads the rank
  # with fewer accumulate calls (pad_accumulate); the end is where one unsharded process ends.
  config one 3 && config two 3 && shard none one full && shard gradients two full
  sed -i "s/^prompts_per_iteration = 4$/prompts_per_iteration = 3/" "$work/one.toml" "$work/two.toml"
  "$tool" train --config "$work/one.toml" --quiet --json > "$work/one.jsonl" 2> "$work/one.err" || fail "one process: $(cat "$work/one.err")"
  bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/two.toml" --quiet --json --timeout 20 ||
    fail "two ranks"
  compare_runs one two
  ;;
zero1_full | zero2_full | zero2_lora)
  # 2 ranks sharded (ZeRO-1: optimizer, ZeRO-2: gradients) against one unsharded process: the same weights and
  # metrics as `same` checks for plain data parallelism.
  case $mode in zero1*) sharding=optimizer ;; *) sharding=gradients ;; esac
  fine=$([ "${mode#*_}" = full ] && echo full || echo lora)
  config one 3 && config two 3 && shard none one "$fine" && shard "$sharding" two "$fine"
  "$tool" train --config "$work/one.toml" --quiet --json > "$work/one.jsonl" 2> "$work/one.err" || fail "one process: $(cat "$work/one.err")"
  bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/two.toml" --quiet --json --timeout 20 ||
    fail "two ranks"
  compare_runs one two
  ;;
zero_resume)
  # 2 ranks with ZeRO-2 (full fine-tuning) write the sharded checkpoint of iteration 2; one unsharded process resumes
  # it to 3 and ends where 3 unsharded iterations end.
  config one 3 && config two 2 && config more 3 && sed -i "s|$work/more\"|$work/two\"|" "$work/more.toml"
  shard none one full && shard gradients two full && shard none more full
  "$tool" train --config "$work/one.toml" --quiet > /dev/null 2> "$work/one.err" || fail "one process: $(cat "$work/one.err")"
  bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/two.toml" --quiet --timeout 20 || fail "two ranks"
  sharded=$work/two/checkpoints/iter-000002
  grep -q "^shards 2$" "$sharded/manifest.txt" || fail "the manifest does not say 2 shards"
  [ -f "$sharded/shard-00000-of-00002.safetensors" ] && [ -f "$sharded/shard-00001-of-00002.safetensors" ] &&
    [ ! -e "$sharded/weights.safetensors" ] || fail "not one shard file per rank: $(ls "$sharded")"
  # export-lora reads the sharded checkpoint: the merged transformer is the checkpoint's weights, exactly.
  "$tool" export-lora "$sharded" --merge --output "$work/merged.safetensors" > /dev/null 2> "$work/export.err" ||
    fail "export-lora: $(cat "$work/export.err")"
  "$program" compare "$sharded" "$work/merged.safetensors" 0 || fail "the merged export differs from the shards"
  "$tool" train --config "$work/more.toml" --resume --quiet > /dev/null 2> "$work/resume.err" ||
    fail "resume: $(cat "$work/resume.err")"
  grep -q "^resume: changed .*optimizer.sharding" "$work/resume.err" || fail "no note on the sharding: $(cat "$work/resume.err")"
  "$program" compare "$work/one/checkpoints/iter-000003" "$work/two/checkpoints/iter-000003" 1e-6 || fail "weights differ"
  ;;
zero_reshard_1_2 | zero_reshard_2_3)
  # A sharded checkpoint of FROM ZeRO-2 ranks (iteration 2) resumed by TO ZeRO-2 ranks to 3: each new rank reads its
  # range from the old shards that overlap it; the end is where 3 unsharded iterations end.
  from=${mode:13:1} to=${mode:15:1}
  config one 3 && config part 2 && config more 3 && sed -i "s|$work/more\"|$work/part\"|" "$work/more.toml"
  shard none one full && shard gradients part full && shard gradients more full
  "$tool" train --config "$work/one.toml" --quiet > /dev/null 2> "$work/one.err" || fail "one process: $(cat "$work/one.err")"
  bash "$here/run_ranks.sh" -n "$from" -t 60 -- "$tool" train --config "$work/part.toml" --quiet --timeout 20 ||
    fail "$from ranks"
  grep -q "^shards $from$" "$work/part/checkpoints/iter-000002/manifest.txt" || fail "the manifest does not say $from shards"
  bash "$here/run_ranks.sh" -n "$to" -t 60 -- "$tool" train --config "$work/more.toml" --resume --quiet --timeout 20 ||
    fail "$to ranks resuming"
  grep -q "^shards $to$" "$work/part/checkpoints/iter-000003/manifest.txt" || fail "the manifest does not say $to shards"
  "$program" compare "$work/one/checkpoints/iter-000003" "$work/part/checkpoints/iter-000003" 1e-6 || fail "weights differ"
  ;;
zero_killed)
  # Rank 1 dies (SIGKILL) while writing its shard of checkpoint 4; checkpoint 2 stays valid and the next start
  # continues from it to where an uninterrupted run of the same 2 ranks ends, bit for bit.
  [ -n "$kill_library" ] || fail "no kill_on_rename library given"
  config straight 4 && config cut 4
  shard gradients straight full && shard gradients cut full
  sed -i "s/^checkpoint_every = 0$/checkpoint_every = 2/" "$work/straight.toml" "$work/cut.toml"
  bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/straight.toml" --quiet --timeout 20 ||
    fail "the straight run"
  bash "$here/run_ranks.sh" -n 2 -t 40 -e "0:error:rank 1 (did not reach|stopped inside)" -e 1:any -- \
    bash -c 'if [ "$RANK" = 1 ]; then export LD_PRELOAD="$1" BRANCHGRPO_TEST_KILL_ON_RENAME=iter-000004.tmp/shard-00001; fi
             shift; exec "$@"' rank "$kill_library" "$tool" train --config "$work/cut.toml" --quiet --timeout 5 ||
    fail "rank 0 did not name the killed rank 1"
  checkpoints=$work/cut/checkpoints
  [ -d "$checkpoints/iter-000004.tmp" ] && [ ! -e "$checkpoints/iter-000004.tmp/manifest.txt" ] &&
    [ ! -e "$checkpoints/iter-000004" ] || fail "checkpoint 4 was not cut short: $(ls -R "$checkpoints")"
  "$program" verify "$checkpoints/iter-000002" || fail "checkpoint 2 does not verify"
  resumed=$(bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/cut.toml" --resume --quiet --timeout 20) ||
    fail "the resumed run: $resumed"
  grep -q "rank 0 stderr: resuming from .*iter-000002 (iteration 2)" <<< "$resumed" || fail "did not resume from 2: $resumed"
  [ ! -e "$checkpoints/iter-000004.tmp" ] || fail "the interrupted staging directory is still there"
  "$program" compare "$work/straight/checkpoints/iter-000004" "$checkpoints/iter-000004" 0 || fail "weights differ"
  ;;
torchrun)
  config one 3 && config two 3
  "$tool" train --config "$work/one.toml" --quiet > /dev/null 2> "$work/one.err" || fail "one process: $(cat "$work/one.err")"
  # Debian's torchrun 1.13 under Python 3.11 cannot parse its default --redirects / --tee of 0 (Std.NONE is no
  # longer iterated): give both as 1 (stdout to a log file and to the console).
  timeout 60 torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 --log_dir "$work/logs" --no_python \
    "$tool" train --config "$work/two.toml" --quiet --timeout 20 > "$work/torchrun.out" 2> "$work/torchrun.err" ||
    fail "torchrun: $(tail -n 20 "$work/torchrun.err")"
  "$program" compare "$work/one/checkpoints/iter-000003/weights.safetensors" \
    "$work/two/checkpoints/iter-000003/weights.safetensors" 1e-6 || fail "weights differ"
  ;;
killed)
  config long 100000
  # Rank 1 is killed after 3 s, in the middle of some iteration; rank 0 must name it within its 5 s timeout: it did
  # not reach a collective, or stopped inside one (killed while waiting in it for rank 0), or did not join yet.
  bash "$here/run_ranks.sh" -n 2 -t 40 -e "0:error:rank 1 (did not reach|stopped inside|did not join)" -e 1:any -- \
    bash -c 'if [ "$RANK" = 1 ]; then exec timeout -s KILL 3 "$@"; else exec "$@"; fi' rank \
    "$tool" train --config "$work/long.toml" --quiet --timeout 5 || fail "rank 0 did not name rank 1 in time"
  ;;
resume)
  # 2 ranks write the checkpoint of iteration 2; one process resumes it to 3 and says the world size changed.
  config two 2 && config more 3 && sed -i "s|$work/more\"|$work/two\"|" "$work/more.toml"
  bash "$here/run_ranks.sh" -n 2 -t 60 -- "$tool" train --config "$work/two.toml" --quiet --timeout 20 || fail "two ranks"
  grep -q "^ranks 2$" "$work/two/checkpoints/iter-000002/manifest.txt" || fail "the manifest does not record 2 ranks"
  "$tool" train --config "$work/more.toml" --resume --quiet > /dev/null 2> "$work/resume.err" ||
    fail "resume: $(cat "$work/resume.err")"
  grep -q "^note: the checkpoint was written by 2 processes, this run has 1: the same experiment" "$work/resume.err" ||
    fail "no note on the world size: $(cat "$work/resume.err")"
  ;;
mismatch)
  config rank0 2 1e-5 && config rank1 2 2e-5
  sed -i "s|$work/rank1\"|$work/rank0\"|" "$work/rank1.toml"  # the same output directory, another lr
  line="the ranks run different configs: rank 0 xxh64 [0-9a-f]{16}, rank 1 xxh64 [0-9a-f]{16}$"
  bash "$here/run_ranks.sh" -n 2 -t 40 -e "0:error:^branchgrpo: rank 0: $line" -e "1:error:^branchgrpo: rank 1: $line" -- \
    bash -c 'exec "$1" train --config "$2/rank$RANK.toml" --quiet --timeout 10' rank "$tool" "$work" ||
    fail "the ranks did not both refuse"
  ;;
trace)
  config one 2 && config two 2
  "$tool" train --config "$work/one.toml" --quiet --trace "$work/trace" > /dev/null 2> "$work/one.err" ||
    fail "one process: $(cat "$work/one.err")"
  for i in 000000 000001; do [ -s "$work/trace/trace-$i.safetensors" ] || fail "no trace of iteration $i"; done
  line="--trace $work/trace2: traces the rollout of one process; this run has 2 ranks$"
  bash "$here/run_ranks.sh" -n 2 -t 40 -e "0:error:^branchgrpo: rank 0: $line" -e "1:error:^branchgrpo: rank 1: $line" -- \
    "$tool" train --config "$work/two.toml" --quiet --timeout 10 --trace "$work/trace2" ||
    fail "the ranks did not both refuse --trace"
  ;;
*) fail "unknown mode" ;;
esac
echo "ok ($mode)"
