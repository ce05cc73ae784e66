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

TEST_NAME=test_signals
# shellcheck source=tests/integration/proc_harness.sh
. "$(dirname "$0")/proc_harness.sh"
alive() { kill -0 "$1" 2>/dev/null; }
has() { grep -q -- "$2" "$1" 2>/dev/null; }

tcd_ini "$tmp/tcd.ini"
# the parent's TC_* (with-servers exports TC_PG_URL) must not disturb tcd
env -u TC_NODES "$bin/tcd" -c "$tmp/tcd.ini" 2>>"$tmp/tcd.log" &
tcd=$!
pids+=("$tcd")
check "tcd started and logs to its file" wait_for 20 has "$tmp/tcd.log" '"msg":"'
wait_for 20 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null || true

# --- 1. tcd ---
kill -HUP "$tcd"
check "tcd: SIGHUP is logged" wait_for 5 has "$tmp/tcd.log" 'received SIGHUP: log file reopened'
check "tcd: still running after SIGHUP" alive "$tcd"
mv "$tmp/tcd.log" "$tmp/tcd.log.1"
kill -HUP "$tcd"
check "tcd: after the rename, SIGHUP opened a new log file" wait_for 5 has "$tmp/tcd.log" 'received SIGHUP: log file reopened'
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
wait_for 20 has "$tmp/tcd-pipe.log" '"msg":"' || true
kill -HUP "$tcd"
check "tcd on a pipe: SIGHUP logged, nothing to reopen" wait_for 5 has "$tmp/tcd-pipe.log" 'nothing to reopen; not stopping'
check "tcd on a pipe: still running" alive "$tcd"

# --- 2. stock-service (tcd still running) ---
# (a secret of a cluster in the caller's environment would win over TC_TOKEN)
env -u TC_SECRETS_DIR -u TC_SECRET_FILE STOCK_PG_URL=${STOCK_PG_URL:?} TC_NODES=127.0.0.1:$port TC_TOKEN=$token \
  "$bin/stock-service" --url-file "$tmp/stock.url" 2>>"$tmp/stock.log" &
svc=$!
pids+=("$svc")
check "stock-service serves" wait_for 30 test -s "$tmp/stock.url"
kill -HUP "$svc"
check "stock-service: SIGHUP is logged" wait_for 5 has "$tmp/stock.log" 'received SIGHUP: log file reopened'
mv "$tmp/stock.log" "$tmp/stock.log.1"
kill -HUP "$svc"
check "stock-service: after the rename, a new log file" wait_for 5 has "$tmp/stock.log" 'received SIGHUP: log file reopened'
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

checks_done
