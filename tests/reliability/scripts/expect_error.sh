#!/bin/sh
# Runs a command that must fail with one line: a non-zero exit status that is not a signal, exactly one line on
# stderr matching an extended regex, and nothing on stdout (unless -o sends stdout elsewhere, e.g. /dev/full).
#   expect_error.sh [-o FILE] [-v KB] [-t SECONDS] [-s STATUS] [-w WARNING] REGEX COMMAND [ARGS...]
#     -o FILE      stdout goes to FILE (not checked)
#     -v KB        run under `ulimit -v KB` (the address-space limit the memory checks must see)
#     -t SECONDS   the command must end within SECONDS (timeout(1); default 25)
#     -s STATUS    the exit status must be exactly STATUS (e.g. 2, the tool's invalid input)
#     -w WARNING   one warning line comes first: stderr is exactly two lines, the first matching the extended regex
#                  WARNING, the second (the error) REGEX
# Used by tests/reliability/cli_outputs.cmake and cli_limits.cmake.
out_file=""
limit=""
seconds=25
expected_status=""
warning=""
while :; do
  case "$1" in
    -o) out_file=$2; shift 2 ;;
    -v) limit=$2; shift 2 ;;
    -t) seconds=$2; shift 2 ;;
    -s) expected_status=$2; shift 2 ;;
    -w) warning=$2; shift 2 ;;
    *) break ;;
  esac
done
regex=$1
shift
command_line="$*"
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
out=${out_file:-$work/stdout}
(
  if [ -n "$limit" ]; then ulimit -v "$limit" || exit 99; fi
  exec timeout "$seconds" "$@"
) >"$out" 2>"$work/stderr"
status=$?
show() {
  echo "command: $command_line" >&2
  echo "exit status: $status" >&2
  [ -z "$out_file" ] && { echo "stdout:" >&2; head -c 2000 "$work/stdout" >&2; }
  echo "stderr:" >&2
  head -c 2000 "$work/stderr" >&2
}
fail() {
  echo "FAILED: $1" >&2
  show
  exit 1
}
[ "$status" -eq 99 ] && fail "cannot set ulimit -v $limit"
[ "$status" -eq 124 ] && fail "did not end within $seconds s"
[ "$status" -eq 0 ] && fail "expected a non-zero exit status"
[ "$status" -ge 128 ] && fail "killed by a signal (exit status $status)"
[ -n "$expected_status" ] && [ "$status" -ne "$expected_status" ] && fail "expected exit status $expected_status"
[ -z "$out_file" ] && [ -s "$work/stdout" ] && fail "expected nothing on stdout"
lines=$(wc -l <"$work/stderr")
if [ -n "$warning" ]; then
  [ "$lines" -eq 2 ] || fail "expected a warning and an error line on stderr, got $lines lines"
  head -n 1 "$work/stderr" | grep -Eq -- "$warning" || fail "the first stderr line does not match: $warning"
  tail -n 1 "$work/stderr" | grep -Eq -- "$regex" || fail "the last stderr line does not match: $regex"
else
  [ "$lines" -eq 1 ] || fail "expected exactly one line on stderr, got $lines"
fi
[ "$(tail -c 1 "$work/stderr" | od -An -c | tr -d ' ')" = '\n' ] || fail "stderr does not end with a newline"
grep -Eq -- "$regex" "$work/stderr" || fail "stderr does not match: $regex"
echo "ok (exit $status): $(cat "$work/stderr")"
exit 0
