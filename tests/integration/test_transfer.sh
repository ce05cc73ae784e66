#!/usr/bin/env bash
# test_transfer.sh - the newcomer's program (examples/transfer) as a
# newcomer builds it: against the installed library, not the source tree.
#
#   1. `DESTDIR=... cmake --install BUILD --component rmclient` into a
#      scratch root; a copy of examples/transfer built with its Makefile
#      (pkg-config rmclient: libpq comes along, rpath from libdir), and
#      configured with its CMakeLists.txt (find_package(rmclient)); the
#      binary loads librmclient from the install, not from BUILD.
#   2. A local cluster (cluster/local/up --nodes 1), two databases of the
#      user's own made under TXC_PG_BASE_URL, the RM schema applied with
#      the installed txc-db-migrate (share/txc/sql), the example's tables.
#   3. commit: balance 100.00 -> 89.50, one ledger row, the undo rows go.
#      rollback: both rows as before.  crash: the program exits before the
#      decision; the timeout (5 s) decides the rollback, which finishes
#      only once an RM of both databases runs (transfer serve): the rows
#      come back.  A database without the RM schema: transfer refuses it at
#      rm_resource_add, saying to run txc-db-migrate.
#
# Needs TX_SOURCE_DIR, TX_BIN_DIR (tcd) and TX_BUILD_DIR (the build to
# install), set by ctest; TX_SAN_FLAGS: the sanitizer flags of that build
# (the example is compiled with them, or the ASan library would not load).
set -euo pipefail

src=${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}
build=${TX_BUILD_DIR:?TX_BUILD_DIR not set}
export TX_BIN_DIR=${TX_BIN_DIR:?TX_BIN_DIR not set}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_transfer.XXXXXX")
cluster_up=0 serve_pid=
cleanup() {
  [[ -z $serve_pid ]] || kill "$serve_pid" 2>/dev/null || true
  [[ $cluster_up -eq 0 ]] || "$src/cluster/local/down" "$CLUSTER_DIR" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
passed=0
ok() { passed=$((passed + 1)); echo "ok   - $1"; }
die() { echo "FAIL - $*" >&2; exit 1; }
q() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }
# expect NAME URL SQL WANT [SECONDS]: SQL's value becomes WANT (polled).
expect() {
  local got end=$((SECONDS + ${5:-0}))
  while got=$(q "$2" "$3") && [[ $got != "$4" && $SECONDS -lt $end ]]; do sleep 0.2; done
  [[ $got == "$4" ]] || die "$1: expected '$4', got '$got'"
  ok "$1"
}

# ---- 1. install, build the copy ----
prefix=/opt/txc
DESTDIR=$tmp/root cmake --install "$build" --prefix "$prefix" --component rmclient >/dev/null
inst=$tmp/root$prefix
[[ -x $inst/bin/txc-db-migrate && -f $inst/share/txc/sql/rm/001_undo_log.sql ]] ||
  die "the install lacks txc-db-migrate or the RM schema"
cp -r "$src/examples/transfer" "$tmp/app"
CFLAGS="${TX_SAN_FLAGS:-}" LDFLAGS="${TX_SAN_FLAGS:-}" make -s -C "$tmp/app" PREFIX="$inst" >"$tmp/make.log" 2>&1 ||
  { cat "$tmp/make.log"; die "make of examples/transfer"; }
if grep -q warning "$tmp/make.log"; then cat "$tmp/make.log"; die "examples/transfer builds with warnings"; fi
app=$tmp/app/transfer
lib=$(ldd "$app" | awk '$1 ~ /^librmclient/ { print $3 }')
[[ $lib == "$inst/lib/"* ]] || die "transfer loads librmclient from '$lib', not the install"
ok "built against the DESTDIR install (pkg-config), loads $lib"
if CFLAGS="${TX_SAN_FLAGS:-}" cmake -S "$tmp/app" -B "$tmp/app-cmake" -DCMAKE_PREFIX_PATH="$inst" \
     >"$tmp/cmake.log" 2>&1 && cmake --build "$tmp/app-cmake" >>"$tmp/cmake.log" 2>&1; then
  ok "built with find_package(rmclient)"
else
  cat "$tmp/cmake.log"
  die "cmake build of examples/transfer"
fi

# ---- 2. the cluster and the user's databases ----
out=$("$src/cluster/local/up" --nodes 1 --watch $$) || die "cluster/local/up"
eval "$out"
cluster_up=1
[[ -n ${TXC_PG_BASE_URL:-} ]] || die "cluster/local/up exports no TXC_PG_BASE_URL"
for db in bank ledger plain; do q "$TXC_PG_BASE_URL/postgres" "CREATE DATABASE $db" >/dev/null; done
export BANK_PG_URL=$TXC_PG_BASE_URL/bank LEDGER_PG_URL=$TXC_PG_BASE_URL/ledger
"$inst/bin/txc-db-migrate" -q "$BANK_PG_URL" rm
"$inst/bin/txc-db-migrate" -q "$LEDGER_PG_URL" rm
psql -X -q -v ON_ERROR_STOP=1 -d "$BANK_PG_URL" -f "$tmp/app/bank.sql"
psql -X -q -v ON_ERROR_STOP=1 -d "$LEDGER_PG_URL" -f "$tmp/app/ledger.sql"
ok "databases bank and ledger migrated with the installed txc-db-migrate"

balance="SELECT balance FROM account WHERE id = 1"
rows="SELECT count(*) FROM ledger"
undo="SELECT count(*) FROM undo_log"

# ---- 3. commit, rollback, crash ----
"$app" commit >"$tmp/commit.out" || { cat "$tmp/commit.out"; die "transfer commit"; }
grep -q " Committed ok$" "$tmp/commit.out" || die "commit printed: $(cat "$tmp/commit.out")"
expect "commit: debited 10.50" "$BANK_PG_URL" "$balance" "89.50"
expect "commit: one ledger row" "$LEDGER_PG_URL" "$rows" "1"
expect "commit: undo rows deleted" "$BANK_PG_URL" "$undo" "0" 10
expect "commit: undo rows deleted (ledger)" "$LEDGER_PG_URL" "$undo" "0" 10

"$app" rollback >"$tmp/rollback.out" || { cat "$tmp/rollback.out"; die "transfer rollback"; }
grep -q " Rollbacked ok$" "$tmp/rollback.out" || die "rollback printed: $(cat "$tmp/rollback.out")"
expect "rollback: balance restored" "$BANK_PG_URL" "$balance" "89.50"
expect "rollback: ledger row removed" "$LEDGER_PG_URL" "$rows" "1"

rc=0
"$app" crash >"$tmp/crash.out" || rc=$?
[[ $rc -eq 3 ]] || die "transfer crash exited $rc: $(cat "$tmp/crash.out")"
xid=$(awk '{ print $1; exit }' "$tmp/crash.out")
expect "crash: the debit is committed locally" "$BANK_PG_URL" "$balance" "79.00"
# The timeout decides the rollback; no RM runs, so it cannot finish.
expect "crash: timed out, rollback retried without an RM" "$TC_PG_URL" \
  "SELECT status FROM global_table WHERE xid = '$xid'" "7" 30
"$app" serve 60 >"$tmp/serve.out" 2>&1 &
serve_pid=$!
expect "crash: an RM runs, the timeout rollback finishes" "$BANK_PG_URL" "$balance" "89.50" 30
expect "crash: the ledger row is gone" "$LEDGER_PG_URL" "$rows" "1" 10
kill "$serve_pid"
wait "$serve_pid" 2>/dev/null || true
serve_pid=

# ---- a database without the RM schema ----
rc=0
BANK_PG_URL=$TXC_PG_BASE_URL/plain "$app" commit >"$tmp/plain.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] || die "transfer on a database without undo_log exited $rc"
grep -q 'has no undo_log table.*txc-db-migrate' "$tmp/plain.out" ||
  die "no hint to txc-db-migrate: $(cat "$tmp/plain.out")"
ok "a database without undo_log is refused at rm_resource_add, naming txc-db-migrate"
expect "nothing changed" "$BANK_PG_URL" "$balance" "89.50"

echo "$passed passed"
