#!/usr/bin/env bash
# test_queued.sh - the first seed's queued order path (ORDER_MODE=queued,
# issue 24) on a real local cluster with the real services.
#
#   1. an order is answered 202 QUEUED at once (order id, order_token); the
#      consumer creates it within seconds: GET 200 UNPAID, its freeze in
#      stock_freeze, the queue stream empty again;
#   2. with an Idempotency-Key: 202, the same answer replayed, the key on
#      the order in PostgreSQL;
#   3. Redis let through what PostgreSQL has not (PostgreSQL's stock cut
#      under Redis's back, as when Redis lost writes): 202, then the order
#      is not made; the Redis freeze and the user's count are given back,
#      the buyer gets the "rejected" notice with the seed's words;
#   4. an entry left pending by a consumer that died (a ghost reads it and
#      never acknowledges) is claimed after ORDER_QUEUE_RETRY_MS and its
#      order made;
#   5. a malformed entry is deleted, counted, and changes nothing;
#   6. a queued order is paid like any other; the counters agree.
#
# Needs TX_BIN_DIR (tcd, order-service, stock-service, event-consumers,
# txc-compensate) and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_queued
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"

rcli() { redis-cli -u "$REDIS_URL" "$@"; }

harness_cluster_up
out=$(ORDER_MODE=queued "$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
eval "$out"
ok "cluster and services started, order-service in queued mode ($ORDER_URL)"
check "  its ready line says queued" grep -q '"msg":"order-service ready".*"order_mode":"queued"' \
  "$CLUSTER_DIR/order-service.log"

A=$(on_sale_activity 'queued test' 1 10)

# order USER [CURL ARGS]: POST /orders; $code, $body, $oid, $otoken
order() {
  local u=$1 r
  shift
  r=$(curl -s -o - -w '\n%{http_code}' -XPOST "$ORDER_URL/orders" "$@" \
    -d "{\"activity\":$A,\"ticket_type\":1,\"user\":$u,\"qty\":1}")
  code=$(tail -1 <<<"$r")
  body=$(head -n -1 <<<"$r")
  oid=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("order_id") or "")' "$body" 2>/dev/null || true)
  otoken=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("order_token") or "")' "$body" 2>/dev/null || true)
}
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print(v if v is not None else "")' "$body" "$1"; }
order_status() { q "$ORDERS_PG_URL" "SELECT coalesce((SELECT status FROM trade_order WHERE order_id = $1), 'none')"; }
metric() { curl -s "$ORDER_URL/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
stream="{act_$A}:queue"

# --- 1. queued, then made ---
order 1
check "an order: 202 QUEUED at once ($body)" test "$code $(field status)" = "202 QUEUED"
check "  with its order id and order_token" test -n "$oid" -a -n "$otoken"
first=$oid first_token=$otoken
check "  made by the consumer: UNPAID in PostgreSQL" wait_for 10 eval '[ "$(order_status "$first")" = UNPAID ]'
r=$(curl -s -o - -w '\n%{http_code}' "$ORDER_URL/orders/$first" -H "Authorization: Bearer $first_token")
check "  GET with its token: 200 UNPAID" test "$(tail -1 <<<"$r") $(head -1 <<<"$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')" = "200 UNPAID"
check "  its freeze in stock_freeze" \
  test "$(q "$STOCK_PG_URL" "SELECT state FROM stock_freeze WHERE order_id = $first")" = FROZEN
check "  the queue holds nothing any more" wait_for 5 eval '[ "$(rcli XLEN "$stream")" = 0 ]'

# --- 2. an idempotency key ---
order 2 -H "Idempotency-Key: q-key-1"
check "a keyed order: 202" test "$code" = 202
keyed=$oid
order 2 -H "Idempotency-Key: q-key-1"
check "  the same key again: the same order ($oid)" test "$code $oid" = "202 $keyed"
check "  the key on the order in PostgreSQL" \
  wait_for 10 eval '[ "$(q "$ORDERS_PG_URL" "SELECT idem_key FROM trade_order WHERE order_id = $keyed")" = q-key-1 ]'

# --- 3. PostgreSQL refuses what Redis let through ---
q "$STOCK_PG_URL" "UPDATE activity_ticket_bucket SET stock = frozen_count + sold_count WHERE activity_id = $A" >/dev/null
order 3
check "Redis thinks there are tickets: 202 QUEUED" test "$code $(field status)" = "202 QUEUED"
rejected=$oid
check "  the order is not made: PostgreSQL refused (the buyer told: a rejected notice)" \
  wait_for 15 eval '[ "$(q "$EVENTS_PG_URL" "SELECT count(*) FROM member_notice WHERE order_id = $rejected AND kind = '"'"'rejected'"'"'")" = 1 ]'
check "  with the seed's words" \
  test "$(q "$EVENTS_PG_URL" "SELECT text LIKE '%库存异常，抢票未成功，已全额退款%' FROM member_notice WHERE order_id = $rejected")" = t
check "  no order row" test "$(order_status "$rejected")" = none
check "  the Redis freeze given back (record R) and the user's count with it" \
  test "$(rcli HGET "{act_$A}:orders" "$rejected" | cut -c1)/$(rcli HGET "{act_$A}:bought" 3)" = "R/"
q "$STOCK_PG_URL" "UPDATE activity_ticket_bucket SET stock = 10 WHERE activity_id = $A" >/dev/null

# --- 4. a consumer that died with an entry ---
B=$(on_sale_activity 'queued test' 1 5)
ghost_order=$((9000000000000 + $$))
deadline=$(( ($(date +%s) + 3600) * 1000 ))
printf 'MULTI\nXGROUP CREATE {act_%s}:queue order-create 0 MKSTREAM\nXADD {act_%s}:queue * order %s user 4 tt 1 qty 1 bucket 0 deadline %s\nXREADGROUP GROUP order-create ghost COUNT 1 STREAMS {act_%s}:queue >\nEXEC\n' \
  "$B" "$B" "$ghost_order" "$deadline" "$B" | rcli >/dev/null
check "a ghost consumer holds an entry, pending" \
  test "$(rcli XPENDING "{act_$B}:queue" order-create | head -1)" = 1
check "  claimed after the retry time, the order made" \
  wait_for 20 eval '[ "$(order_status "$ghost_order")" = UNPAID ]'
check "  counted as claimed" test "$(metric 'txc_order_queue_entries_total{result="claimed"}')" -ge 1
check "  nothing pending any more" wait_for 5 eval '[ "$(rcli XPENDING "{act_$B}:queue" order-create | head -1)" = 0 ]'

# --- 5. a malformed entry ---
before=$(q "$ORDERS_PG_URL" "SELECT count(*) FROM trade_order")
rcli XADD "$stream" '*' order abc user 5 tt 1 qty 1 bucket 0 deadline 1 >/dev/null
check "a malformed entry is deleted" wait_for 10 eval '[ "$(rcli XLEN "$stream")" = 0 ]'
check "  and counted" test "$(metric 'txc_order_queue_entries_total{result="malformed"}')" = 1
check "  no order made" test "$(q "$ORDERS_PG_URL" "SELECT count(*) FROM trade_order")" = "$before"

# --- 6. pay a queued order ---
r=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$ORDER_URL/orders/$first/pay" -H "Authorization: Bearer $first_token")
check "a queued order paid: 200" test "$r" = 200
check "  its freeze confirmed by the stock consumer" \
  wait_for 10 eval '[ "$(q "$STOCK_PG_URL" "SELECT state FROM stock_freeze WHERE order_id = $first")" = CONFIRMED ]'
check "PostgreSQL: frozen + sold = the live freezes" \
  test "$(q "$STOCK_PG_URL" "SELECT (SELECT sum(frozen_count + sold_count) FROM activity_ticket_bucket WHERE activity_id = $A) = (SELECT sum(qty) FROM stock_freeze WHERE activity_id = $A AND state IN ('FROZEN', 'CONFIRMED'))")" = t
check "Redis: frozen + sold equals PostgreSQL's" \
  test "$(( $(rcli HGET "{act_$A}:t1:stock" frozen:0) + $(rcli HGET "{act_$A}:t1:stock" sold:0) ))" = \
  "$(q "$STOCK_PG_URL" "SELECT frozen_count + sold_count FROM activity_ticket_bucket WHERE activity_id = $A")"

stop_services order-service
checks_done
