# shellcheck shell=bash
# services_harness.sh - the frame the shell tests of the demo services
# share (test_demo, test_admin_mode, test_at_writes, test_console,
# test_freeze_modes, test_local_metrics, test_observability, test_openapi,
# test_queued, test_reconcile, test_tickets, test_warmup, test_window): a
# temporary directory, a cleanup at exit that stops the services and the
# cluster and keeps the logs of a failed run, the ok/fail/check helpers, a
# checked sale and an activity of a step's own, and the local cluster
# started with its exports.
#
# Source it after `set -euo pipefail` with TEST_NAME set.  It sets src,
# bin (and exports TX_BIN_DIR), tmp, CLUSTER_DIR and failures.  A test
# that needs more at exit defines harness_cleanup_more() (run first).
# TX_BIN_DIR and TX_SOURCE_DIR come from ctest.

src=${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}
# shellcheck source=tests/integration/check.sh
. "$src/tests/integration/check.sh"
bin=${TX_BIN_DIR:?TX_BIN_DIR not set}
export TX_BIN_DIR=$bin
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$TEST_NAME.XXXXXX")
chmod 711 "$tmp" # root runs PostgreSQL as postgres, which must reach it
export CLUSTER_DIR=$tmp/cluster
cluster_up=0

harness_cleanup() {
  local rc=$?
  set +e
  if declare -F harness_cleanup_more >/dev/null; then harness_cleanup_more; fi
  if [[ -n ${ORDER_PID:-} ]]; then "$src/examples/services" stop "$ORDER_PID" "${STOCK_PID:-}" "${EVENTS_PID:-}"; fi
  [[ $cluster_up -eq 0 ]] || "$src/cluster/local/down" "$CLUSTER_DIR" >/dev/null
  if [[ $rc -ne 0 || $failures -ne 0 ]]; then
    echo "$TEST_NAME: logs kept in $tmp" >&2
    [[ $rc -ne 0 ]] || exit 1
  else
    rm -rf -- "$tmp"
  fi
  exit "$rc"
}
trap harness_cleanup EXIT

q() { # URL SQL: one value
  psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"
}
# no_sanitizer_report: no log of the cluster's (services, nodes) holds a
# sanitizer report.
no_sanitizer_report() { ! grep -l 'Sanitizer\|runtime error:' "$CLUSTER_DIR"/*.log; }
# stop_services [SERVICE...]: stop the services; each SERVICE named
# (order-service, ...) logged that it stopped, and no log holds a
# sanitizer report.
stop_services() {
  "$src/examples/services" stop "$ORDER_PID" "${STOCK_PID:-}" "${EVENTS_PID:-}"
  ORDER_PID=
  local s
  for s in "$@"; do check "$s stopped cleanly" grep -q "\"msg\":\"$s stopped\"" "$CLUSTER_DIR/$s.log"; done
  check "no sanitizer report" no_sanitizer_report
}
# on_sale_activity NAME BUCKETS STOCK: a new activity on sale for an hour
# (at most 2 tickets a user), BUCKETS buckets of STOCK tickets of type 1,
# in PostgreSQL and (txc-compensate --reconcile) in Redis; its id on
# stdout.
on_sale_activity() {
  local a
  a=$(q "$STOCK_PG_URL" "SELECT coalesce(max(activity_id), 0) + 1 FROM activity")
  q "$STOCK_PG_URL" "INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)
      VALUES ($a, '$1', 1, 2, now() - interval '1 second', now() + interval '1 hour');
    INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock)
      SELECT $a, 1, g, $3 FROM generate_series(0, $2 - 1) g" >/dev/null
  "$bin/txc-compensate" --reconcile --activity "$a" >/dev/null 2>&1
  echo "$a"
}
# sale_activity REPORT: the activity of a flashsale --json report.
sale_activity() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["activity"])' "$1"
}
# new_activity NAME TICKETS BUCKETS LIMIT: an activity of a test step's
# own, seeded by flashsale (one user, no sale window); its id on stdout,
# the report in $tmp/NAME.json.
new_activity() {
  "$bin/flashsale" --users 1 --window 0 --tickets "$2" --buckets "$3" --limit "$4" --pay 0 --cancel 0 --again 0 \
    --quiet --json "$tmp/$1.json" >/dev/null
  sale_activity "$tmp/$1.json"
}
# checked_sale LABEL REPORT FLASHSALE-ARGS...: a short sale, checked: flashsale
# exits 0, the invariants hold, tickets were sold and no global
# transaction is left unfinished; the report in REPORT.  "Sold" needs a
# payment: flashsale pays each accepted order with probability --pay, so
# a small sale must ask for enough (10 orders at 20% pay none 1 time in
# 9; at 60%, 1 in 10,000).
checked_sale() {
  local label=$1 report=$2 rc=0
  shift 2
  "$bin/flashsale" "$@" --quiet --json "$report" || rc=$?
  check "$label: flashsale exits 0 (status $rc)" test "$rc" -eq 0
  if python3 - "$report" <<'PY'; then ok "  $label: invariants, sold"; else fail "  $label: sale report"; fi
import json, sys
r = json.load(open(sys.argv[1]))
print("  sold %(sold)d frozen %(frozen)d accepted %(accepted)d rejected %(rejected)s committed %(committed)d "
      "rolled_back %(rolled_back)d unfinished %(unfinished)d" % r)
assert r["invariants_ok"] is True, r["invariants"]
assert r["accepted"] > 0 and r["sold"] > 0
assert r["unfinished"] == 0
PY
}

# harness_cluster_up: cluster/local/up (watched: it goes
# with this shell), retried because up picks free ports by probing and
# another process may take one first; its export lines are evaluated.
harness_cluster_up() {
  local attempt out
  for attempt in 1 2 3; do
    out=$("$src/cluster/local/up" --watch $$) && break
    [[ $attempt -lt 3 ]] || {
      echo "$TEST_NAME: the cluster did not start" >&2
      exit 1
    }
    rm -rf -- "$CLUSTER_DIR"
  done
  cluster_up=1
  eval "$out"
}

# harness_services_up_with_admin_token: the cluster, a fresh admin token
# in $token (in $tmp/admin.token, mode 600, which the exported
# TXC_ADMIN_TOKEN_FILE names) and the services started with it, their
# export lines evaluated.
harness_services_up_with_admin_token() {
  local out
  harness_cluster_up
  token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  (umask 077 && echo "$token" >"$tmp/admin.token")
  export TXC_ADMIN_TOKEN_FILE=$tmp/admin.token
  out=$("$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
  eval "$out"
}
