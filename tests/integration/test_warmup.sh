#!/usr/bin/env bash
# test_warmup.sh - the services warm their PostgreSQL connections before
# they serve (svc_pgpool_prewarm with a rehearsal of a request's
# statements, rm_at_open_rehearsal), on a real local cluster with the real
# services.
#
# For the stock-service's two AT modes (deferred, the default, and at,
# whose freeze reads the bucket FOR UPDATE): after the start, each service
# says it warmed its pool's connections, PostgreSQL counted six freezes and
# six orders inserted per connection (SVC_PG_WARM_ROUNDS: past the plan
# cache's five custom plans; the first mode: its counts come up to
# 10 s late), and nothing of it is left: no row of the warm-up's activity
# (-1), order or user, no undo row of the rehearsal's xid, no global
# transaction at the coordinator, no warning in the logs.  Then a small
# sale passes its invariants on the warmed connections.
#
# Needs TX_BIN_DIR and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_warmup
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"

harness_cluster_up

POOL=3
ROUNDS=6 # SVC_PG_WARM_ROUNDS
MAXID=9223372036854775807

# inserted URL TABLE: the rows PostgreSQL counted as inserted into TABLE
# (committed or not)
inserted() { q "$1" "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname = '$2'"; }
# grew_by URL TABLE BEFORE N: TABLE's insert count reached BEFORE + N
# within 15 s (an idle backend reports its counts within 10 s)
grew_by() {
  local end=$((SECONDS + 15))
  until [[ $(inserted "$1" "$2") -ge $(($3 + $4)) ]]; do
    [[ $SECONDS -le $end ]] || { echo "$2: $(inserted "$1" "$2") inserted, wanted $(($3 + $4))" >&2; return 1; }
    sleep 0.3
  done
}

# log_since SVC MARK: what SVC's log got after its first MARK lines (the
# log is appended to across restarts)
log_since() { tail -n "+$(($2 + 1))" "$CLUSTER_DIR/$1.log" 2>/dev/null; }
log_lines() { if [[ -f $CLUSTER_DIR/$1.log ]]; then wc -l <"$CLUSTER_DIR/$1.log"; else echo 0; fi; }
# said SVC MARK TEXT: SVC's log holds TEXT after its first MARK lines
said() { log_since "$1" "$2" | grep -qF -- "$3"; }
not_said() { ! said "$@"; }
WARMED="\"msg\":\"warmed $POOL PostgreSQL connection(s) before serving: a request's statements rehearsed $ROUNDS times on each"

for mode in deferred at; do
  stock_mark=$(log_lines stock-service) order_mark=$(log_lines order-service)
  freezes0=$(inserted "$STOCK_PG_URL" stock_freeze)
  orders0=$(inserted "$ORDERS_PG_URL" trade_order)
  globals0=$(q "$TC_PG_URL" "SELECT (SELECT count(*) FROM global_table) + (SELECT count(*) FROM global_history)")
  out=$(STOCK_FREEZE_MODE=$mode STOCK_THREADS=$POOL ORDER_PG_POOL=$POOL \
    "$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
  eval "$out"
  check "$mode: stock-service warmed its $POOL connections" said stock-service "$stock_mark" "$WARMED"
  check "$mode: order-service warmed its $POOL connections" said order-service "$order_mark" "$WARMED"
  if [[ $mode == deferred ]]; then
    check "$mode: PostgreSQL counted $ROUNDS freezes inserted per stock-service connection" \
      grew_by "$STOCK_PG_URL" stock_freeze "$freezes0" "$((POOL * ROUNDS))"
    check "$mode: PostgreSQL counted $ROUNDS orders inserted per order-service connection" \
      grew_by "$ORDERS_PG_URL" trade_order "$orders0" "$((POOL * ROUNDS))"
  fi
  check "$mode: no row of the warm-up left in the stock database" test "$(q "$STOCK_PG_URL" \
    "SELECT (SELECT count(*) FROM activity WHERE activity_id = -1)
          + (SELECT count(*) FROM activity_ticket_bucket WHERE activity_id = -1)
          + (SELECT count(*) FROM stock_freeze WHERE order_id = $MAXID OR activity_id = -1)
          + (SELECT count(*) FROM stock_log WHERE activity_id = -1)
          + (SELECT count(*) FROM undo_log WHERE xid = 'rm-at-rehearsal')")" = 0
  check "$mode: no row of the warm-up left in the orders database" test "$(q "$ORDERS_PG_URL" \
    "SELECT (SELECT count(*) FROM trade_order WHERE order_id = $MAXID OR user_id = $MAXID)
          + (SELECT count(*) FROM undo_log WHERE xid = 'rm-at-rehearsal')")" = 0
  check "$mode: the coordinator saw no global transaction of the warm-up" test "$(q "$TC_PG_URL" \
    "SELECT (SELECT count(*) FROM global_table) + (SELECT count(*) FROM global_history)")" = "$globals0"
  check "$mode: stock-service did not warn about the warm-up" not_said stock-service "$stock_mark" "could not warm"
  check "$mode: order-service did not warn about the warm-up" not_said order-service "$order_mark" "could not warm"
  checked_sale "STOCK_FREEZE_MODE=$mode" "$tmp/sale-$mode.json" --users 40 --window 0.5 --tickets 20 --buckets 2 \
    --limit 2 --pay 60 --cancel 10 --again 0 --settle 20
  stop_services order-service stock-service
done

checks_done
