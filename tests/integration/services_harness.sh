# shellcheck shell=bash
# services_harness.sh - the frame the shell tests of the demo services
# share (test_demo, test_admin_mode, test_reconcile, test_window): a
# temporary directory, a cleanup at exit that stops the services and the
# cluster and keeps the logs of a failed run, the ok/fail/check helpers,
# the local cluster started with its exports, and a small activity on sale
# (harness_seed_activity; test_queued, test_openapi).
#
# Source it after `set -euo pipefail` with TEST_NAME set.  It sets src,
# bin (and exports TX_BIN_DIR), tmp, CLUSTER_DIR and failures.  A test
# that needs more at exit defines harness_cleanup_more() (run first).
# TX_BIN_DIR and TX_SOURCE_DIR come from ctest.

src=${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}
bin=${TX_BIN_DIR:?TX_BIN_DIR not set}
export TX_BIN_DIR=$bin
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$TEST_NAME.XXXXXX")
chmod 711 "$tmp" # root runs PostgreSQL as postgres, which must reach it
export CLUSTER_DIR=$tmp/cluster
failures=0
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
q() { # URL SQL: one value
  psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"
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

# harness_seed_activity ID TICKETS NAME: activity ID on sale from now for an
# hour (2 tickets a user), ticket type 1 in one bucket of TICKETS tickets,
# loaded into Redis (txc-compensate --reconcile).
harness_seed_activity() {
  q "$STOCK_PG_URL" "INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)
      VALUES ($1, '$3', 1, 2, now() - interval '1 second', now() + interval '1 hour');
    INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock) VALUES ($1, 1, 0, $2)" >/dev/null
  "$bin/txc-compensate" --reconcile --activity "$1" >/dev/null 2>&1
}
