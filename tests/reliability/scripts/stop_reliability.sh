#!/bin/bash
# Stops and exit classes of the long-running commands (tests/reliability/stops.cmake; docs/reliability.md, "Exit
# status" and "Stopping").
#   stop_reliability.sh MODE TOOL MODEL_DIR WORK_DIR SOURCE_DIR
# MODE:
#   eval      SIGTERM 3 s into `train` whose held-out evaluation draws 4 x 4096 samples (about 95 s): exit 143
#             within 10 s, one line naming the evaluation and that no checkpoint was written yet
#   scoring   SIGTERM 8 s in, while a reward server takes 60 s to answer: exit 143 within 10 s, one line naming the request
#   server    a reward server answering HTTP 500 from its second request: exit 1 (a failure during the run), one
#             line naming the url; a server that is not there when the run starts: exit 2 (a refusal)
#   compare   SIGTERM 2 s into `compare` (the toy, 20 seeds x 200 iterations): exit 143 within 10 s, one line
#   pretrain  SIGTERM 2 s into `pretrain` of 100000 steps: exit 143 within 10 s, one line, nothing written
# Each run: the shipped model, a 4-step tree, LoRA rank 2, one prompt per iteration, no grids.
set -u
mode=$1 tool=$2 model=$3 work=$4 source=$5
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() {
  echo "FAIL ($mode): $*" >&2
  exit 1
}

source "$(dirname "${BASH_SOURCE[0]}")/shapes_run_config.sh"
# config NAME [EXTRA TOML] -> $work/NAME.toml: 4 iterations writing to $work/NAME, a checkpoint after each
config() { shapes_run_config "$work/$1.toml" "$model" "$work/$1" 4 1 1e-3 "${2:-}"; }

# stopped_within SECONDS SIGNAL_AT PID: sends SIGTERM to PID after SIGNAL_AT seconds and waits for it; fails unless
# it ends within SECONDS of the signal with exit 143. Sets $elapsed.
stopped_within() {
  # Until the process catches SIGTERM (bit 15 of SigCgt: its handler is installed once the libraries are loaded; a
  # signal before that ends it by the default action, with no line), then SIGNAL_AT seconds more.
  for _ in $(seq 1 600); do
    (($(printf '%d' "0x$(awk '/^SigCgt/ {print $2}' "/proc/$3/status" 2> /dev/null || echo 0)") & 0x4000)) && break
    sleep 0.05
  done
  sleep "$2"
  local start=$SECONDS
  kill -TERM "$3"
  for _ in $(seq 1 $((10 * $1))); do
    kill -0 "$3" 2> /dev/null || break
    sleep 0.1
  done
  if kill -0 "$3" 2> /dev/null; then
    kill -KILL "$3"
    fail "still running $1 s after SIGTERM"
  fi
  wait "$3"
  local status=$?
  elapsed=$((SECONDS - start))
  [ $status = 143 ] || fail "exit $status after SIGTERM: $(cat "$work/err")"
}

# one_line PATTERN: stderr ($work/err) is exactly one line, matching the extended regex PATTERN.
one_line() {
  [ "$(wc -l < "$work/err")" = 1 ] || fail "not one line: $(cat "$work/err")"
  grep -Eq "$1" "$work/err" || fail "$(cat "$work/err")"
}

# server ARGS...: scripts/reward_server.py on a free loopback port; sets $server (pid) and $url.
server() {
  rm -f "$work/port"
  /usr/bin/python3 -B "$source/scripts/reward_server.py" --scorer shapes_alignment --port 0 \
    --port-file "$work/port" "$@" 2> "$work/server.err" &
  server=$!
  for _ in $(seq 1 300); do
    [ -s "$work/port" ] && break
    sleep 0.1
  done
  [ -s "$work/port" ] || fail "the reward server did not start: $(cat "$work/server.err")"
  url="http://127.0.0.1:$(cat "$work/port")"
}

case $mode in
eval)
  python3 "$source/tests/rewards/split_prompt_file.py" "$model/prompts.safetensors" "$work/train.safetensors" 0 8 &&
    python3 "$source/tests/rewards/split_prompt_file.py" "$model/prompts.safetensors" "$work/heldout.safetensors" 8 \
      12 || fail "split"
  config run "[eval]
embeddings = \"$work/heldout.safetensors\"
samples = 4096
steps = 3"
  sed -i "s|^\[data\]|[data]\nembeddings = \"$work/train.safetensors\"|" "$work/run.toml"
  "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err" &
  stopped_within 10 3 $!
  one_line "^train: stopped by SIGTERM during (ODE sampling|decoding|scoring), in the held-out evaluation before \
iteration 0; no checkpoint was written yet$"
  ;;
scoring)
  server --fault slow:60
  config run "[[rewards]]
name = \"remote\"
params = { url = \"$url\", timeout = 120, retries = 0 }"
  "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err" &
  stopped_within 10 8 $!  # 8 s: past loading and the rollout, into the 60 s wait
  kill "$server"
  one_line "^train: stopped by SIGTERM during (a request to $url/score|scoring by the remote reward), in iteration 0 \
\(not kept\); no checkpoint was written yet$"
  ;;
server)
  server --fault http-500@2
  config run "[[rewards]]
name = \"remote\"
params = { url = \"$url\", retries = 0 }"
  timeout 120 "$tool" train --config "$work/run.toml" --quiet > /dev/null 2> "$work/err"
  status=$?
  kill "$server"
  [ $status = 1 ] || fail "exit $status (expected 1: a server failing during the run): $(cat "$work/err")"
  one_line "^branchgrpo: remote reward $url/score: HTTP 500: --fault http-500 on /score request 2 \(after 1 attempt\)$"
  [ -f "$work/run/checkpoints/iter-000001/manifest.txt" ] || fail "the first iteration's checkpoint is missing"
  # Nobody listening when the run starts: the config is refused (exit 2), before any work.
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  config dead "[[rewards]]
name = \"remote\"
params = { url = \"http://127.0.0.1:$port\", retries = 0, connect_timeout = 2 }"
  timeout 120 "$tool" train --config "$work/dead.toml" --quiet > /dev/null 2> "$work/err"
  status=$?
  [ $status = 2 ] || fail "exit $status (expected 2: a refusal before the run): $(cat "$work/err")"
  one_line "^branchgrpo: remote reward http://127.0.0.1:$port/info: .* \(after 1 attempt\)$"
  ;;
compare)
  "$tool" compare --seeds 20 --iters 200 --quiet --out "$work/compare" > /dev/null 2> "$work/err" &
  stopped_within 10 2 $!
  one_line "^branchgrpo: stopped by SIGTERM during (the rollout|ODE sampling)$"
  ;;
pretrain)
  "$tool" pretrain --steps 100000 --batch 4 --quiet --out "$work/pretrain" > /dev/null 2> "$work/err" &
  stopped_within 10 2 $!
  one_line "^branchgrpo: stopped by SIGTERM during pretraining$"
  [ ! -e "$work/pretrain/model.safetensors" ] || fail "a stopped pretrain wrote its model"
  ;;
*)
  fail "unknown mode"
  ;;
esac
echo "$mode: ok${elapsed:+ (stopped ${elapsed} s after SIGTERM)}"
