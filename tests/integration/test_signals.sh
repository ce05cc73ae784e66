#!/usr/bin/env bash
# test_signals.sh - signals and configuration checks of tcd and the
# services (security review, findings 5 and 7; issue 20).
#
# Usage: scripts/with-servers --pg -- tests/integration/test_signals.sh
#
#   1. tcd logging to a file: SIGHUP is logged and does not stop it; after
#      the file is renamed (as logrotate does), SIGHUP makes it write to a
#      new file of the old name; with its log on a pipe, SIGHUP changes
#      nothing and it goes on.
#   2. stock-service the same (the services share svc_wait_signal).
#   3. --check-config says what start-up says: a listen host that is not
#      numeric, the mask --print-config prints in place of a secret, and a
#      misspelt TC_<SECTION>_<KEY> variable are all refused (exit 78) with
#      a message naming them; the clients' TC_* variables of
#      cluster/local/up are not mistaken for settings.
# Needs TX_BIN_DIR (tcd, stock-service) and TC_PG_URL, STOCK_PG_URL.
set -euo pipefail

bin=${TX_BIN_DIR:?TX_BIN_DIR not set}
: "${TC_PG_URL:?run me under scripts/with-servers --pg}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_signals.XXXXXX")
failures=0 pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [[ $rc -ne 0 || $failures -ne 0 ]]; then echo "test_signals: logs kept in $tmp" >&2; else rm -rf -- "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
ok() { echo "ok - $*"; }
fail() { echo "FAILED - $*" >&2; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }
alive() { kill -0 "$1" 2>/dev/null; }
# wait_for TENTHS CMD...
wait_for() { local n=$1 i; shift; for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.1; done; "$@"; }
has() { grep -q -- "$2" "$1" 2>/dev/null; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
port=$(free_port)
cat >"$tmp/tcd.ini" <<INI
[node]
id = 1
[server]
listen = 127.0.0.1:$port
token = $token
[store]
pg_url = $TC_PG_URL
INI
chmod 600 "$tmp/tcd.ini"
# the parent's TC_* (with-servers exports TC_PG_URL) must not disturb tcd
env -u TC_NODES "$bin/tcd" -c "$tmp/tcd.ini" 2>>"$tmp/tcd.log" &
tcd=$!
pids+=("$tcd")
check "tcd started and logs to its file" wait_for 200 has "$tmp/tcd.log" '"msg":"'
wait_for 200 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null || true

# --- 1. tcd ---
kill -HUP "$tcd"
check "tcd: SIGHUP is logged" wait_for 50 has "$tmp/tcd.log" 'received SIGHUP: log file reopened'
check "tcd: still running after SIGHUP" alive "$tcd"
mv "$tmp/tcd.log" "$tmp/tcd.log.1"
kill -HUP "$tcd"
check "tcd: after the rename, SIGHUP opened a new log file" wait_for 50 has "$tmp/tcd.log" 'received SIGHUP: log file reopened'
check "tcd: still running" alive "$tcd"
lines_old=$(wc -l <"$tmp/tcd.log.1")
kill -TERM "$tcd"
wait "$tcd" || true
check "tcd: its last lines went to the new file" has "$tmp/tcd.log" '"msg":"stopped"'
check "tcd: nothing more in the rotated one" test "$(wc -l <"$tmp/tcd.log.1")" = "$lines_old"

# on a pipe: nothing to reopen, goes on
fifo=$tmp/pipe
mkfifo "$fifo"
cat "$fifo" >"$tmp/tcd-pipe.log" &
catpid=$!
"$bin/tcd" -c "$tmp/tcd.ini" 2>"$fifo" &
tcd=$!
pids+=("$tcd")
wait_for 200 has "$tmp/tcd-pipe.log" '"msg":"' || true
kill -HUP "$tcd"
check "tcd on a pipe: SIGHUP logged, nothing to reopen" wait_for 50 has "$tmp/tcd-pipe.log" 'nothing to reopen; not stopping'
check "tcd on a pipe: still running" alive "$tcd"

# --- 2. stock-service (tcd still running) ---
STOCK_PG_URL=${STOCK_PG_URL:?} TC_NODES=127.0.0.1:$port TC_TOKEN=$token \
  "$bin/stock-service" --url-file "$tmp/stock.url" 2>>"$tmp/stock.log" &
svc=$!
pids+=("$svc")
check "stock-service serves" wait_for 300 test -s "$tmp/stock.url"
kill -HUP "$svc"
check "stock-service: SIGHUP is logged" wait_for 50 has "$tmp/stock.log" 'received SIGHUP: log file reopened'
mv "$tmp/stock.log" "$tmp/stock.log.1"
kill -HUP "$svc"
check "stock-service: after the rename, a new log file" wait_for 50 has "$tmp/stock.log" 'received SIGHUP: log file reopened'
check "stock-service: still running" alive "$svc"
kill -TERM "$svc"
wait "$svc" || true
check "stock-service: stopped cleanly, logged in the new file" has "$tmp/stock.log" '"msg":"stock-service stopped"'
kill -TERM "$tcd"
wait "$tcd" || true
wait "$catpid" 2>/dev/null || true

# --- 3. configuration says the truth ---
cfg_rc() { local rc=0; "$@" >"$tmp/cfg.out" 2>&1 || rc=$?; echo "$rc"; }
check "--check-config: a listen host that is not numeric is refused" \
  test "$(cfg_rc "$bin/tcd" -c "$tmp/tcd.ini" --check-config --set server.listen=example.com:1)" = 78
check "  and the message says why" has "$tmp/cfg.out" 'numeric IP'
check "--check-config: the mask of --print-config is not a secret" \
  test "$(cfg_rc "$bin/tcd" -c "$tmp/tcd.ini" --check-config --set 'server.token=********')" = 78
check "  and names server.token" has "$tmp/cfg.out" 'server.token'
"$bin/tcd" -c "$tmp/tcd.ini" --print-config >"$tmp/printed.ini"
check "--print-config masks the token" has "$tmp/printed.ini" 'token = \*\*\*\*\*\*\*\*'
check "--check-config: the printed configuration fed back is refused" \
  test "$(cfg_rc "$bin/tcd" -c "$tmp/printed.ini" --check-config)" = 78
check "--check-config: a misspelt TC_ variable is refused" \
  test "$(cfg_rc env TC_SERVER_TOKN=x "$bin/tcd" -c "$tmp/tcd.ini" --check-config)" = 78
check "  and named" has "$tmp/cfg.out" 'TC_SERVER_TOKN'
check "--check-config: the clients' TC_NODES, TC_TOKEN, TC_ADMIN_SOCKETS are no settings: valid" \
  test "$(cfg_rc env TC_NODES=127.0.0.1:1 TC_TOKEN=x TC_ADMIN_SOCKETS=/tmp/a.sock "$bin/tcd" -c "$tmp/tcd.ini" --check-config)" = 0

echo "test_signals: $failures failure(s)"
[[ $failures -eq 0 ]]
