# shellcheck shell=bash
# proc_harness.sh - the frame of the shell tests that start tcd or a
# service themselves under scripts/with-servers --pg (test_signals,
# test_systemd, test_http_strangers): a temporary directory, the processes
# listed in 'pids' killed at exit, the logs of a failed run kept, a node's
# configuration, and check.sh's helpers.
#
# Source it after `set -euo pipefail` with TEST_NAME set.  It sets bin
# (TX_BIN_DIR), tmp, pids and failures.

# shellcheck source=tests/integration/check.sh
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
bin=${TX_BIN_DIR:?TX_BIN_DIR not set}
: "${TC_PG_URL:?run me under scripts/with-servers --pg}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$TEST_NAME.XXXXXX")
pids=()

proc_cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [[ $rc -ne 0 || $failures -ne 0 ]]; then echo "$TEST_NAME: logs kept in $tmp" >&2; else rm -rf -- "$tmp"; fi
  exit "$rc"
}
trap proc_cleanup EXIT

# tcd_ini FILE [LINE...]: a node's configuration in FILE (mode 600): node
# 1 on a free loopback port ($port), a fresh token ($token), the store at
# TC_PG_URL; the LINEs after it (more sections).
tcd_ini() {
  local file=$1
  shift
  token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  port=$(free_port)
  printf '%s\n' "[node]" "id = 1" "[server]" "listen = 127.0.0.1:$port" "token = $token" "[store]" \
    "pg_url = $TC_PG_URL" "$@" >"$file"
  chmod 600 "$file"
}
