#!/usr/bin/env bash
# test_at_writes.sh - the services' AT branches writing plain SQL
# (rm_at_sql, issue 25) on a real local cluster with the real services,
# against the structured calls they replace.
#
# For each of TXC_AT_WRITES=sql and TXC_AT_WRITES=calls, and for each of
# stock-service's AT image mode (STOCK_FREEZE_MODE=at: the bucket row's
# guarded UPDATE under images and its global lock) and the default
# deferred delta mode: a short flash sale with payments and
# cancellations (the invariants hold, every global transaction ended);
# then a purchase Redis lets through and PostgreSQL's stock guard refuses:
# 409, its global transaction rolled back, the order branch's insert
# undone by its digest; no pending undo row left behind.
#
# Needs TX_BIN_DIR (tcd, order-service, stock-service, flashsale) and
# TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_at_writes
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"

harness_cluster_up

# sale WRITES MODE: the services started with them, one sale, stopped.
sale() {
  local out
  out=$(TXC_AT_WRITES=$1 STOCK_FREEZE_MODE=$2 "$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
  eval "$out"
  checked_sale "TXC_AT_WRITES=$1 STOCK_FREEZE_MODE=$2" "$tmp/sale-$1-$2.json" --users 150 --window 1 --tickets 60 \
    --buckets 2 --limit 2 --pay 40 --cancel 10 --again 0 --think-ms 100 --settle 20
  # A purchase PostgreSQL refuses after Redis let it through: the stock
  # branch's guard finds no ticket, the global transaction rolls back and
  # the order branch's insert is undone.
  local act orders code
  act=$(new_activity "seed-$1-$2" 4 1 3)
  q "$STOCK_PG_URL" "UPDATE activity_ticket_bucket SET stock = frozen_count + sold_count WHERE activity_id = $act" >/dev/null
  orders=$(q "$ORDERS_PG_URL" "SELECT count(*) FROM trade_order WHERE activity_id = $act")
  code=$(curl -s -o "$tmp/refused-$1-$2.json" -w '%{http_code}' -XPOST "$ORDER_URL/orders" \
    -d "{\"activity\":$act,\"ticket_type\":1,\"user\":777001,\"qty\":1}")
  check "  $1/$2: PostgreSQL's guard refuses what Redis let through: 409 ($code $(cat "$tmp/refused-$1-$2.json"))" \
    test "$code" = 409
  check "  $1/$2: the order's insert rolled back" \
    test "$(q "$ORDERS_PG_URL" "SELECT count(*) FROM trade_order WHERE activity_id = $act")" = "$orders"
  check "  $1/$2: the freeze's insert rolled back" \
    test "$(q "$STOCK_PG_URL" "SELECT count(*) FROM stock_freeze WHERE activity_id = $act AND user_id = 777001")" = 0
  # committed branches' undo rows go in the background (about a second)
  check "  $1/$2: no undo row left in the orders database" undo_gone "$ORDERS_PG_URL"
  check "  $1/$2: no undo row left in the stock database" undo_gone "$STOCK_PG_URL"
  "$src/examples/services" stop "$ORDER_PID" "$STOCK_PID" ${EVENTS_PID:+"$EVENTS_PID"}
  ORDER_PID=
}

# undo_gone URL: no pending undo row (log_status 0) within 15 s; the
# guard rows (status 1) a rollback leaves for a branch whose prepare
# failed stay until the retention sweep, as designed
undo_gone() {
  local end=$((SECONDS + 15))
  while [[ $SECONDS -le $end ]]; do
    [[ "$(q "$1" "SELECT count(*) FROM undo_log WHERE log_status = 0")" == 0 ]] && return 0
    sleep 0.2
  done
  q "$1" "SELECT string_agg(xid || ' ' || branch_id || ' status ' || log_status || ' ' || log_created || ' ' || left(context, 40), E'\n') FROM undo_log" >&2
  return 1
}

sale sql at
sale sql deferred
sale calls at

check "no sanitizer report" no_sanitizer_report
checks_done
