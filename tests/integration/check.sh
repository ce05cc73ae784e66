# shellcheck shell=bash
# check.sh - what every shell test here reports and waits with: ok, fail
# and check (counting failures in $failures), check_every, checks_done,
# wait_for and free_port.
# Sourced by services_harness.sh and proc_harness.sh.

failures=0
ok() { echo "ok - $*"; }
fail() {
  echo "FAILED - $*" >&2
  failures=$((failures + 1))
}
check() { # description, condition command...
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
# wait_for SECONDS CMD...: until CMD succeeds (false after SECONDS); to
# re-read a value each time, CMD is e.g. eval '[ "$(q ...)" = 3 ]'
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [[ $SECONDS -le $end ]] || return 1
    sleep 0.1
  done
}
# check_every WHAT NOUN WORDS TEST...: one check that TEST WORD succeeds
# for each of WORDS (split on white space): "WHAT (N NOUN)", followed,
# when it fails, by the words it failed for.
check_every() {
  local what=$1 noun=$2 words=$3 w
  shift 3
  local failed_for=()
  for w in $words; do
    "$@" "$w" || failed_for+=("$w")
  done
  check "$what ($(wc -w <<<"$words") $noun)${failed_for:+; not: ${failed_for[*]}}" test ${#failed_for[@]} -eq 0
}
# checks_done: the test's last words: all passed, or how many checks
# failed (and exit 1).
checks_done() {
  if [[ $failures -ne 0 ]]; then
    echo "$TEST_NAME: $failures check(s) FAILED" >&2
    exit 1
  fi
  echo "$TEST_NAME: all checks passed"
}
# free_port: a loopback port nobody listens on right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
