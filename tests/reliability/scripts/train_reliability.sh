#!/bin/bash
# `branchgrpo train` under damage and interruption (tests/reliability/checkpoints.cmake; docs/reliability.md).
#   train_reliability.sh MODE TOOL MODEL_DIR WORK_DIR
# MODE:
#   checksum   a flipped byte in the newest checkpoint's weights: --resume warns, names the file, falls back to the
#              previous checkpoint, cuts metrics.jsonl / metrics.csv after its iteration (a torn last line too)
#              and finishes; with every checkpoint damaged --resume fails (exit 2) instead of starting afresh
#   config     --resume with a changed optimizer.lr is refused naming it; a changed run.iterations is listed and
#              accepted; every start's config is kept under configs/
#   sigterm    SIGTERM during a 30-iteration run (checkpoint_every = 0): exit 143 and one line naming the checkpoint written at
#              the stop (of the last finished iteration), which verifies; --resume finishes with weights and optimizer state byte-identical to an
#              uninterrupted run's
#   full       metrics.jsonl a symlink to /dev/full: exit non-zero naming it and "No space left on device"
#   files      what the run reads from its directory is bounded and never blocks: a FIFO or a 9 GB sparse file as
#              the newest checkpoint's manifest.txt and a link loop as the newest checkpoint are skipped with a
#              warning (--resume falls back); a FIFO manifest for `sample`, a FIFO or a 1 GB metrics file on
#              resume, a FIFO metrics.jsonl in a fresh run are one line; a file or a dangling link where the
#              checkpoints go fails at the start with exit 2; under `ulimit -f` the write fails naming "File too
#              large" instead of SIGXFSZ (exit 153). Every command under `timeout 60`.
# Each run: the shipped model, a 4-step tree, LoRA rank 2, one prompt per iteration, no grids (about 1 s).
set -u
mode=$1 tool=$2 model=$3 work=$4
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL ($mode): $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/shapes_run_config.sh"

# [every=N] config NAME ITERATIONS [LR [OUT]] -> $work/NAME.toml writing to $work/OUT (default out),
# checkpoint_every = N (default 1)
config() { shapes_run_config "$work/$1.toml" "$model" "$work/${4:-out}" "$2" "${every:-1}" "${3:-1e-3}"; }
lines() { wc -l < "$1" | tr -d ' '; }

case $mode in
checksum)
  config run 3 && config run2 2
  "$tool" train --config "$work/run2.toml" --quiet > /dev/null 2> "$work/err" || fail "first run: $(cat "$work/err")"
  ckpt=$work/out/checkpoints
  printf '{"iteration":2,"rew' >> "$work/out/metrics.jsonl"  # a torn line from a kill
  # Flip one data byte near the end of iteration 2's weights.
  size=$(stat -c %s "$ckpt/iter-000002/weights.safetensors")
  printf '\xff' | dd of="$ckpt/iter-000002/weights.safetensors" bs=1 seek=$((size - 2)) conv=notrunc 2> /dev/null
  "$tool" train --config "$work/run.toml" --resume --quiet > "$work/out.txt" 2> "$work/err" ||
    fail "resume with one damaged checkpoint failed: $(cat "$work/err")"
  grep -q "^warning: skipping checkpoint $ckpt/iter-000002: $ckpt/iter-000002/weights.safetensors: checksum mismatch (xxh64 [0-9a-f]*, manifest says [0-9a-f]*)$" "$work/err" ||
    fail "no warning naming the damaged file: $(cat "$work/err")"
  grep -q "^resuming from $ckpt/iter-000001 (iteration 1)$" "$work/err" || fail "did not fall back: $(cat "$work/err")"
  # Iteration 0's lines kept, 1 and 2 written again: 3 lines, no torn one, one CSV header.
  [ "$(lines "$work/out/metrics.jsonl")" = 3 ] || fail "metrics.jsonl: $(cat "$work/out/metrics.jsonl")"
  [ "$(grep -c '"iteration":1,' "$work/out/metrics.jsonl")" = 1 ] || fail "iteration 1 twice in metrics.jsonl"
  [ "$(lines "$work/out/metrics.csv")" = 4 ] || fail "metrics.csv: $(cat "$work/out/metrics.csv")"
  [ "$(grep -c '^clip_fraction' "$work/out/metrics.csv")" = 1 ] || fail "two CSV headers"
  # Every checkpoint damaged: refused, nothing restarted.
  for dir in "$ckpt"/iter-*; do
    size=$(stat -c %s "$dir/state.safetensors")
    printf '\x01' | dd of="$dir/state.safetensors" bs=1 seek=$((size - 1)) conv=notrunc 2> /dev/null
  done
  "$tool" train --config "$work/run.toml" --resume --quiet > /dev/null 2> "$work/err"
  status=$?
  [ $status = 2 ] || fail "exit $status with every checkpoint damaged: $(cat "$work/err")"
  tail -n 1 "$work/err" | grep -q "^branchgrpo: $ckpt: no valid checkpoint among 3 (newest: $ckpt/iter-000003/state.safetensors: checksum mismatch" ||
    fail "$(cat "$work/err")"
  [ "$(lines "$work/out/metrics.jsonl")" = 3 ] || fail "metrics.jsonl touched by the refused resume"
  ;;
config)
  config run 1 && config lr 2 2e-3 && config longer 2
  "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err" || fail "first run: $(cat "$work/err")"
  "$tool" train --config "$work/lr.toml" --resume --quiet > /dev/null 2> "$work/err"
  status=$?
  [ $status = 2 ] || fail "a changed lr: exit $status"
  grep -q "^branchgrpo: .*iter-000001: cannot resume: the config changes optimizer.lr (0.001 -> 0.002), which change the experiment" "$work/err" ||
    fail "$(cat "$work/err")"
  "$tool" train --config "$work/longer.toml" --resume --quiet > /dev/null 2> "$work/err" ||
    fail "a changed iterations: $(cat "$work/err")"
  grep -q "^resume: changed run.iterations (1 -> 2)$" "$work/err" || fail "not listed: $(cat "$work/err")"
  for f in config-000000.toml config-000000.canonical.toml config-000001.toml config-000001.canonical.toml; do
    [ -s "$work/out/configs/$f" ] || fail "configs/$f missing"
  done
  cmp -s "$work/run.toml" "$work/out/configs/config-000000.toml" || fail "configs/config-000000.toml is not run.toml"
  grep -q '^optimizer.lr = 0.001$' "$work/out/configs/config-000001.canonical.toml" || fail "canonical text"
  grep -q '^# input model.dir/model.safetensors = "[0-9]* bytes, xxh64 [0-9a-f]*"$' \
    "$work/out/configs/config-000001.canonical.toml" || fail "no model identity in the canonical text"
  ;;
sigterm)
  every=0 config straight 30 1e-3 straight && every=0 config run 30  # checkpoints at the stop and the end; 30 iterations leave ample time for the signal
  "$tool" train --config "$work/straight.toml" --quiet > /dev/null 2> "$work/err" || fail "straight: $(cat "$work/err")"
  "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err" &
  pid=$!
  for _ in $(seq 1 600); do  # until the first iteration's line is written (at most 60 s)
    [ -s "$work/out/metrics.jsonl" ] && break
    sleep 0.1
  done
  kill -TERM $pid
  wait $pid
  status=$?
  [ $status = 143 ] || fail "exit $status after SIGTERM: $(cat "$work/err")"
  line=$(tail -n 1 "$work/err")
  # After the iteration's update, or during its rollout / scoring (that iteration not kept): either way a checkpoint
  # of the last finished iteration.
  echo "$line" | grep -Eq "^train: stopped by SIGTERM (after [0-9]+ iterations?|during [a-z -]+, in iteration [0-9]+ \(not kept\)); checkpoint $work/out/checkpoints/iter-0000[0-3][0-9] is valid; continue with --resume$" ||
    fail "$line"
  dir=$(echo "$line" | sed 's/.*checkpoint \(.*\) is valid.*/\1/')
  [ -f "$dir/manifest.txt" ] || fail "$dir has no manifest"
  "$tool" train --config "$work/run.toml" --resume --quiet > /dev/null 2> "$work/err" || fail "resume: $(cat "$work/err")"
  for f in weights.safetensors state.safetensors; do
    cmp "$work/straight/checkpoints/iter-000030/$f" "$work/out/checkpoints/iter-000030/$f" ||
      fail "$f differs from the uninterrupted run's"
  done
  [ "$(lines "$work/out/metrics.jsonl")" = 30 ] || fail "metrics.jsonl: $(lines "$work/out/metrics.jsonl") lines"
  ;;
full)
  config run 1
  mkdir -p "$work/out" && ln -s /dev/full "$work/out/metrics.jsonl"
  "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err"
  status=$?
  [ $status != 0 ] || fail "exit 0 with metrics.jsonl on /dev/full"
  [ "$(wc -l < "$work/err")" = 1 ] || fail "not one line: $(cat "$work/err")"
  grep -q "^branchgrpo: $work/out/metrics.jsonl: cannot write: No space left on device$" "$work/err" ||
    fail "$(cat "$work/err")"
  ;;
files)
  every=1 config run 2 && every=1 config run3 3
  run() { timeout 60 "$tool" "$@" > /dev/null 2> "$work/err"; }
  run train --config "$work/run.toml" --quiet || fail "first run: $(cat "$work/err")"
  ckpt=$work/out/checkpoints
  cp -a "$work/out" "$work/pristine"
  restore() { rm -rf "$work/out" && cp -a "$work/pristine" "$work/out"; }
  # expect_skip REASON: --resume warns about iter-000002 (REASON, a regex) and resumes from iter-000001.
  expect_skip() {
    run train --config "$work/run.toml" --resume --quiet || fail "resume past a damaged manifest: $(cat "$work/err")"
    grep -q "^warning: skipping checkpoint $ckpt/iter-000002: $ckpt/iter-000002/manifest.txt: $1$" "$work/err" ||
      fail "no warning for $1: $(cat "$work/err")"
    grep -q "^resuming from $ckpt/iter-000001 (iteration 1)$" "$work/err" || fail "no fallback: $(cat "$work/err")"
  }
  restore && rm "$ckpt/iter-000002/manifest.txt" && mkfifo "$ckpt/iter-000002/manifest.txt"
  expect_skip "is a FIFO, not a checkpoint manifest"
  restore && truncate -s 9G "$ckpt/iter-000002/manifest.txt"
  expect_skip "9.66 GB is over the limit of 1.05 MB for a checkpoint manifest"
  restore && ln -s iter-000003 "$ckpt/iter-000003"  # a link to itself, the newest checkpoint
  run train --config "$work/run3.toml" --resume --quiet || fail "resume past a link loop: $(cat "$work/err")"
  grep -q "^warning: skipping checkpoint $ckpt/iter-000003: .*Too many levels of symbolic links" "$work/err" ||
    fail "link loop: $(cat "$work/err")"
  grep -q "^resuming from $ckpt/iter-000002 (iteration 2)$" "$work/err" || fail "no fallback: $(cat "$work/err")"
  # expect_error STATUS REGEX COMMAND...: exit STATUS with one error line, the last on stderr, matching REGEX (a
  # resume's own lines, "resuming from ...", may come before it).
  expect_error() {
    local want=$1 regex=$2
    shift 2
    run "$@"
    local status=$?
    [ $status = "$want" ] || fail "exit $status, not $want: $* : $(cat "$work/err")"
    [ "$(grep -c '^branchgrpo: ' "$work/err")" = 1 ] || fail "not one error line: $(cat "$work/err")"
    tail -n 1 "$work/err" | grep -q "$regex" || fail "$(cat "$work/err")"
  }
  restore && rm "$ckpt/iter-000002/manifest.txt" && mkfifo "$ckpt/iter-000002/manifest.txt"
  expect_error 2 "^branchgrpo: $ckpt/iter-000002/manifest.txt: is a FIFO, not a checkpoint manifest$" \
    sample --config "$work/run.toml" --checkpoint "$ckpt/iter-000002" --out "$work/grid.png"
  restore && rm "$work/out/metrics.jsonl" && mkfifo "$work/out/metrics.jsonl"
  expect_error 2 "^branchgrpo: $work/out/metrics.jsonl: is a FIFO, not a metrics file$" \
    train --config "$work/run3.toml" --resume --quiet
  restore && truncate -s 1G "$work/out/metrics.csv"
  expect_error 2 "^branchgrpo: $work/out/metrics.csv: 1.07 GB is over the limit of 268 MB for a metrics file$" \
    train --config "$work/run3.toml" --resume --quiet
  # A fresh run: a FIFO metrics.jsonl, a file where the checkpoints go, a dangling link as a checkpoint.
  rm -rf "$work/out" && mkdir "$work/out" && mkfifo "$work/out/metrics.jsonl"
  expect_error 2 "^branchgrpo: $work/out/metrics.jsonl: is a FIFO, not a metrics file$" train --config "$work/run.toml" --quiet
  rm -rf "$work/out" && mkdir "$work/out" && touch "$work/out/checkpoints"
  expect_error 2 "^branchgrpo: $work/out/checkpoints: is a file, not a directory$" train --config "$work/run.toml" --quiet
  [ ! -e "$work/out/metrics.jsonl" ] || fail "a run with no place for checkpoints trained"
  rm -rf "$work/out" && mkdir -p "$work/out/checkpoints" && ln -s "$work/nowhere" "$ckpt/iter-000001"
  expect_error 2 "already holds checkpoint iter-000001: pass --resume" train --config "$work/run.toml" --quiet
  # Over the file-size limit: the first write past 16 kB fails with its reason, no SIGXFSZ.
  rm -rf "$work/out"
  (ulimit -f 16 && exec timeout 60 "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err")
  status=$?
  [ $status = 1 ] || fail "exit $status under ulimit -f: $(cat "$work/err")"
  grep -q "^branchgrpo: .*: File too large$" "$work/err" || fail "$(cat "$work/err")"
  ;;
*) fail "unknown mode" ;;
esac
echo "ok ($mode)"
