#!/usr/bin/env bash
# `branchgrpo train` with [eval] on the shipped shapes model (tests/rewards/train_eval.cmake; label rewards):
# the model's 12 prompts split into 8 trained and 4 held out (split_prompt_file.py); 8 iterations, one held-out
# evaluation every 2 (after 0, 2, 4, 6 and 8 iterations), 2 samples per prompt, 3 ODE steps, its own reward.
#   1. a straight run: the evaluation rows in metrics.jsonl and eval.csv, a grid per evaluation, and the last
#      evaluation's samples with scores.jsonl;
#   2. the same run killed (SIGKILL) as soon as its evaluation after 2 iterations is written, then --resume: every
#      evaluation row equal to the straight run's (all but "seconds"), none repeated or skipped, and the final
#      weights byte-identical.
# Usage: train_eval.sh TOOL MODEL_DIR WORK_DIR
set -u
tool=$1 model=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$here/split_prompt_file.py" "$model/prompts.safetensors" "$work/train.safetensors" 0 8 || fail "split"
python3 "$here/split_prompt_file.py" "$model/prompts.safetensors" "$work/heldout.safetensors" 8 12 || fail "split"

config() {  # config NAME OUT
  cat > "$work/$1.toml" <<TOML
[model]
dir = "$model"
[data]
embeddings = "$work/train.safetensors"
prompts_per_iteration = 1
[topology]
split_steps = [0, 2]
branching = [2]
[rollout]
steps = 4
[optimizer]
lr = 1e-3
ema_decay = 0.5
[lora]
rank = 2
alpha = 2.0
[[rewards]]
name = "alignment"
[[rewards]]
name = "jpeg_compressibility"
weight = 0.1
[run]
iterations = 8
checkpoint_every = 1
keep_checkpoints = 2
grid_every = 0
output_dir = "$work/$2"
[eval]
embeddings = "$work/heldout.safetensors"
every = 2
samples = 2
steps = 3
seed = 11
[[eval.rewards]]
name = "alignment"
TOML
}

config straight straight
"$tool" train --config "$work/straight.toml" --quiet > "$work/straight.out" 2> "$work/err" ||
  fail "straight run: $(cat "$work/err")"
grep -q "^eval after 8 iterations: reward [0-9.]* \[[0-9.]*, [0-9.]*\] alignment [0-9.]* (" "$work/straight.out" ||
  fail "no evaluation line: $(cat "$work/straight.out")"
for k in 000000 000002 000004 000006 000008; do
  [ -s "$work/straight/eval/iter-$k.png" ] || fail "eval/iter-$k.png missing"
done
[ "$(ls "$work/straight/eval/final" | grep -c '\.png$')" = 8 ] || fail "eval/final: $(ls "$work/straight/eval/final")"
[ "$(wc -l < "$work/straight/eval.csv")" = 6 ] || fail "eval.csv: $(cat "$work/straight/eval.csv")"
[ "$(wc -l < "$work/straight/metrics.csv")" = 9 ] || fail "metrics.csv: $(wc -l < "$work/straight/metrics.csv") lines"

config killed killed
"$tool" train --config "$work/killed.toml" --quiet > /dev/null 2> "$work/err" &
pid=$!
for _ in $(seq 1 1200); do  # until the evaluation after 2 iterations is written (at most 60 s)
  grep -q '"iteration":2,"kind":"eval"' "$work/killed/metrics.jsonl" 2> /dev/null && break
  sleep 0.05
done
kill -KILL $pid
wait $pid 2> /dev/null
status=$?
[ $status = 137 ] || fail "the run was not killed mid-way (exit $status): $(cat "$work/err")"
"$tool" train --config "$work/killed.toml" --resume --quiet > /dev/null 2> "$work/err" ||
  fail "resume: $(cat "$work/err")"

python3 - "$work/straight" "$work/killed" <<'PY' || fail "the resumed run's evaluations differ"
import json, sys
def evaluations(run):
    rows = [json.loads(line) for line in open(run + "/metrics.jsonl")]
    out = [{k: v for k, v in r.items() if k != "seconds"} for r in rows if r.get("kind") == "eval"]
    return out, [r["iteration"] for r in rows]
(straight, order), (resumed, resumed_order) = evaluations(sys.argv[1]), evaluations(sys.argv[2])
assert [r["iteration"] for r in straight] == [0, 2, 4, 6, 8], [r["iteration"] for r in straight]
assert order == [0, 0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 8], order  # evaluation k before iteration k's row
assert resumed == straight, (resumed, straight)
assert resumed_order == order, resumed_order
for r in straight:
    assert r["prompts"] == 4 and r["samples"] == 2 and r["steps"] == 3 and r["ema"] is True, r
    assert r["reward_low"] <= r["reward_mean"] <= r["reward_high"], r
    assert r["reward/alignment"] == r["reward_mean"] and r["reward/alignment/failed"] == 0, r
scores = [json.loads(line) for line in open(sys.argv[1] + "/eval/final/scores.jsonl")]
assert len(scores) == 8 and scores[0]["prompt"] == "a blue triangle" and scores[0]["file"] == "0000-00.png", scores[0]
# The interval by hand: mean -+ t_{0.975, 7} s / sqrt(8) over the last evaluation's 8 samples (t = 2.364624).
values = [s["reward"] for s in scores]
mean = sum(values) / 8
s = (sum((v - mean) ** 2 for v in values) / 7) ** 0.5
assert abs(mean - straight[-1]["reward_mean"]) < 1e-12
assert abs(mean - 2.364624252 * s / 8 ** 0.5 - straight[-1]["reward_low"]) < 1e-9, straight[-1]
assert abs(mean + 2.364624252 * s / 8 ** 0.5 - straight[-1]["reward_high"]) < 1e-9, straight[-1]
assert open(sys.argv[2] + "/eval/final/scores.jsonl").read() == open(sys.argv[1] + "/eval/final/scores.jsonl").read()
PY
for f in weights.safetensors state.safetensors; do
  cmp -s "$work/straight/checkpoints/iter-000008/$f" "$work/killed/checkpoints/iter-000008/$f" ||
    fail "$f differs from the straight run's"
done
echo "train_eval: ok"
