#!/usr/bin/env bash
# Starts N copies of a program as the ranks of one group, the way torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT = a free loopback port), waits for them, kills stragglers,
# and checks each rank's exit status and output against its expectation. Nothing is left running (trap).
#   run_ranks.sh [-n RANKS] [-t SECONDS] [-e RANK:EXPECT]... -- PROGRAM [ARGS...]
#     -n RANKS         number of ranks (default 2)
#     -t SECONDS       deadline for the ranks expected to end (default 30); then every rank still running is killed
#     -e RANK:EXPECT   what rank RANK must do (default for every rank: ok)
#                        ok           exit 0
#                        fail:REGEX   exit 1 (the program's status for an expected error) with a line of stderr
#                                     matching the extended REGEX
#                        error:REGEX  exit 1 or 2 (the branchgrpo tool's statuses for an error) with such a line
#                        any          anything; it may be killed once the others ended (a rank that hangs)
# Prints each rank's status, time and output; exits 0 when every expectation holds, 1 otherwise.
# Used by tests/distributed/distributed.cmake.
set -u
ranks=2
deadline=30
declare -A expect=()
while (($# > 0)); do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    -t) deadline=$2; shift 2 ;;
    -e) expect[${2%%:*}]=${2#*:}; shift 2 ;;
    --) shift; break ;;
    *) echo "run_ranks.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
(($# > 0)) || { echo "run_ranks.sh: no program given" >&2; exit 2; }

work=$(mktemp -d) || exit 2
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 2' INT TERM

# A free port: bind port 0 and let it go (the ranks take it within milliseconds).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
         2>/dev/null) || port=$((20000 + RANDOM % 40000))

start=$(date +%s.%N)
for ((r = 0; r < ranks; ++r)); do
  RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=$r LOCAL_WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$@" >"$work/out.$r" 2>"$work/err.$r" &
  pids+=($!)
done

# Poll until every rank that must end has ended (bash reaps its children, so kill -0 fails once one exits).
declare -A seconds=()
while :; do
  waiting=0
  now=$(date +%s.%N)
  for ((r = 0; r < ranks; ++r)); do
    if [[ -z ${seconds[$r]:-} ]]; then
      if kill -0 "${pids[$r]}" 2>/dev/null; then
        [[ ${expect[$r]:-ok} == any ]] || waiting=1
      else
        seconds[$r]=$(awk -v a="$start" -v b="$now" 'BEGIN { printf "%.1f", b - a }')
      fi
    fi
  done
  ((waiting == 0)) && break
  if awk -v a="$start" -v b="$now" -v d="$deadline" 'BEGIN { exit !(b - a > d) }'; then
    echo "run_ranks.sh: deadline of $deadline s passed, killing the ranks still running" >&2
    break
  fi
  sleep 0.1
done
ended=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

status=0
for ((r = 0; r < ranks; ++r)); do
  killed=""
  if [[ -z ${seconds[$r]:-} ]]; then
    kill -KILL "${pids[$r]}" 2>/dev/null
    killed=" (killed: still running)"
    seconds[$r]=$ended
  fi
  wait "${pids[$r]}" 2>/dev/null
  code=$?
  want=${expect[$r]:-ok}
  verdict=ok
  case "$want" in
    ok) [[ $code -eq 0 && -z $killed ]] || verdict="FAILED: expected exit 0" ;;
    fail:*)
      if [[ $code -ne 1 || -n $killed ]]; then
        verdict="FAILED: expected exit 1"
      elif ! grep -Eq -- "${want#fail:}" "$work/err.$r"; then
        verdict="FAILED: no stderr line matches '${want#fail:}'"
      fi
      ;;
    error:*)
      if [[ ($code -ne 1 && $code -ne 2) || -n $killed ]]; then
        verdict="FAILED: expected exit 1 or 2"
      elif ! grep -Eq -- "${want#error:}" "$work/err.$r"; then
        verdict="FAILED: no stderr line matches '${want#error:}'"
      fi
      ;;
    any) ;;
    *) verdict="FAILED: unknown expectation '$want'" ;;
  esac
  [[ $verdict == ok ]] || status=1
  echo "rank $r: exit $code after ${seconds[$r]} s$killed, expected $want: $verdict"
  sed -e "s/^/  rank $r stdout: /" "$work/out.$r" | head -n 20
  sed -e "s/^/  rank $r stderr: /" "$work/err.$r" | head -n 20
done
exit $status
