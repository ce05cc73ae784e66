#!/usr/bin/env bash
# test_tickets.sh - more tickets later (issue 24): an organiser adds stock
# to a running sale on a real local cluster with the real services.
#
#   1. a sale of 2 tickets (2 buckets) sold out; three users on the
#      waitlist (1, 2 and 1 tickets); a fourth buyer is refused sold_out;
#   2. refused, nothing changes: no credential (401), a buyer's order
#      token (401), a bad body (400), an unknown ticket type (404); the
#      stock in PostgreSQL and Redis stays 2;
#   3. 4 more tickets (POST /activities/{id}/tickets, key add-1): 200
#      added, PostgreSQL's buckets 3 + 3 (2 each), Redis raised to the
#      same; the three waiting users are served first (waitlist_served 3,
#      orders_placed 3: their orders UNPAID with their freezes in
#      stock_freeze), the waitlist is empty, a new buyer is refused
#      sold_out (the new tickets went to the waitlist); the addition
#      recorded with its operator; each of the three gets a
#      waitlist_ordered notice (the outbox, event-consumers' group notify)
#      and the stock consumer leaves their freezes alone;
#   4. the same call again: done_before, nothing added; the key with
#      another qty: 409 key_reused;
#   5. a waiting user whose limit no longer fits is removed and hears
#      why (waitlist_refused, over_limit); Redis lost the raise (the stock
#      fields set back by hand): the same call again raises it, and a
#      buyer can buy a ticket added without a waitlist;
#   6. an ended sale: 409 sale_ended; stock-service's own /tickets without
#      order-service's signature: 401;
#   7. the invariants (fs_check through flashsale --check-only is not
#      needed here: PostgreSQL's counters against stock_freeze by hand).
#
# Needs TX_BIN_DIR (tcd, order-service, stock-service, txc-compensate) and
# TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_tickets
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"

rcli() { redis-cli -u "$REDIS_URL" "$@"; }

harness_services_up_with_admin_token
ok "cluster and services started ($ORDER_URL, $STOCK_URL)"

A=$(on_sale_activity 'tickets test' 2 1)

# order USER: one ticket; "$code $reason" in $ans, the order id in $oid
order() {
  local r
  r=$(curl -s -o - -w '\n%{http_code}' -XPOST "$ORDER_URL/orders" \
    -d "{\"activity\":$A,\"ticket_type\":1,\"user\":$1,\"qty\":1}")
  ans="$(tail -1 <<<"$r") $(head -1 <<<"$r" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("reason") or "")
except Exception: print("")')"
  oid=$(head -1 <<<"$r" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("order_id") or "")
except Exception: print("")')
  otoken=$(head -1 <<<"$r" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("order_token") or "")
except Exception: print("")')
}
# tickets BODY [CURL ARGS...]: POST /activities/A/tickets; $code, $body
tickets() {
  local b=$1 r
  shift
  r=$(curl -s -o - -w '\n%{http_code}' -XPOST "$ORDER_URL/activities/$A/tickets" "$@" -d "$b")
  code=$(tail -1 <<<"$r")
  body=$(head -n -1 <<<"$r")
}
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print(v if v is not None else "")' "$body" "$1"; }
bearer=(-H "Authorization: Bearer $token")
refused() { # WANT WHAT BODY [curl args...]: adding BODY is refused with status WANT
  local want=$1 what=$2
  shift 2
  tickets "$@"
  check "$what: $want" test "$code" = "$want"
}
pg_stock() { q "$STOCK_PG_URL" "SELECT string_agg(stock::text, ' ' ORDER BY bucket_id) FROM activity_ticket_bucket WHERE activity_id = $A AND ticket_type = 1"; }
redis_stock() { echo "$(rcli HGET "{act_$A}:t1:stock" stock:0) $(rcli HGET "{act_$A}:t1:stock" stock:1)"; }
wl_len() { rcli ZCARD "{act_$A}:t1:wl"; }
join() { # USER QTY: the waitlist's answer status
  curl -s -o /dev/null -w '%{http_code}' -XPOST "$ORDER_URL/activities/$A/waitlist" \
    -d "{\"user\":$1,\"ticket_type\":1,\"qty\":$2}"
}

# --- 1. sold out, three waiting ---
order 1
order 2
order 3
check "two tickets sold, a third buyer refused: $ans" test "$ans" = "409 sold_out"
check "waitlist: 11 wants 1, 12 wants 2, 13 wants 1 (202 each)" \
  test "$(join 11 1) $(join 12 2) $(join 13 1)" = "202 202 202"
check "  3 waiting" test "$(wl_len)" = 3

# --- 2. refused, nothing changes ---
refused 401 "no credential" '{"ticket_type":1,"qty":4,"key":"add-1"}'
refused 401 "a wrong admin token" '{"ticket_type":1,"qty":4,"key":"add-1"}' -H "Authorization: Bearer ${token}x"
tickets '{"ticket_type":1,"qty":0,"key":"add-1"}' "${bearer[@]}"
check "qty 0: 400 ($body)" test "$code" = 400
refused 400 "a bad key" '{"ticket_type":1,"qty":4,"key":"no spaces"}' "${bearer[@]}"
refused 400 "no key" '{"ticket_type":1,"qty":4}' "${bearer[@]}"
refused 400 "not JSON" '{"ticket_type":1,"qty":4,"key":"add-1","extra":' "${bearer[@]}"
tickets '{"ticket_type":9,"qty":4,"key":"add-9"}' "${bearer[@]}"
check "a ticket type without buckets: 404 no_buckets ($body)" test "$code $(field error)" = "404 no_buckets"
check "  nothing changed: stock 1 1 in PostgreSQL and Redis, 3 waiting, no addition" \
  test "$(pg_stock)|$(redis_stock)|$(wl_len)|$(q "$STOCK_PG_URL" "SELECT count(*) FROM stock_addition WHERE activity_id = $A")" = "1 1|1 1|3|0"

# --- 3. four more ---
tickets '{"ticket_type":1,"qty":4,"key":"add-1","operator":"alice"}' "${bearer[@]}"
check "4 more: 200 added ($body)" test "$code $(field result)" = "200 added"
check "  PostgreSQL 3 3, Redis raised to 3 3" test "$(pg_stock)|$(redis_stock)" = "3 3|3 3"
check "  the waitlist served first: 3 served, 3 orders placed" \
  test "$(field waitlist_served) $(field orders_placed) $(field redis)" = "3 3 raised"
check "  the waitlist is empty" test "$(wl_len)" = 0
check "  the waiting users' orders: UNPAID, 4 tickets" \
  test "$(q "$ORDERS_PG_URL" "SELECT count(*) || ' ' || sum(qty) FROM trade_order WHERE activity_id = $A AND user_id IN (11, 12, 13) AND status = 'UNPAID'")" = "3 4"
check "  and their freezes in stock_freeze" \
  test "$(q "$STOCK_PG_URL" "SELECT count(*) FROM stock_freeze WHERE activity_id = $A AND user_id IN (11, 12, 13) AND state = 'FROZEN'")" = 3
order 4
check "  a new buyer finds none: $ans" test "$ans" = "409 sold_out"
check "  the addition recorded with its operator" \
  test "$(q "$STOCK_PG_URL" "SELECT qty || ' ' || added_by FROM stock_addition WHERE activity_id = $A AND add_key = 'add-1'")" = "4 alice"
check "  the log line" grep -q '"msg":"tickets added".*"who":"admin-token"' "$CLUSTER_DIR/order-service.log"

ev() { q "$EVENTS_PG_URL" "$1"; }
notices() { ev "SELECT count(*) FROM member_notice WHERE activity_id = $A AND kind = '$1'"; }
check "  the three hear of it: a waitlist_ordered notice each (event-consumers, group notify)" \
  wait_for 15 eval '[ "$(notices waitlist_ordered)" = 3 ]'
check "  the notice names the order" \
  test "$(ev "SELECT count(*) FROM member_notice WHERE activity_id = $A AND kind = 'waitlist_ordered' AND text LIKE 'Your wait is over: order %'")" = 3
check "  the stock consumer took the three events" \
  wait_for 15 eval '[ "$(q "$STOCK_PG_URL" "SELECT count(*) FROM consumed_event WHERE consumer_group = '"'"'stock'"'"' AND biz_key LIKE '"'"'waitlist.ordered:%'"'"'")" = 3 ]'
check "  the stock consumer left their freezes FROZEN (a waitlist event is not an order's end)" \
  test "$(q "$STOCK_PG_URL" "SELECT count(*) FROM stock_freeze WHERE activity_id = $A AND user_id IN (11, 12, 13) AND state = 'FROZEN'")" = 3

# --- 4. repeats ---
tickets '{"ticket_type":1,"qty":4,"key":"add-1"}' "${bearer[@]}"
check "the same call again: 200 done_before, stock still 3 3" test "$code $(field result) $(pg_stock)" = "200 done_before 3 3"
tickets '{"ticket_type":1,"qty":5,"key":"add-1"}' "${bearer[@]}"
check "the key with another qty: 409 key_reused" test "$code $(field error) $(pg_stock)" = "409 key_reused 3 3"

# --- 5. a waiting user over the limit; Redis lost the raise, the repeat mends it ---
check "user 21 waits for 2" test "$(join 21 2)" = 202
rcli HSET "{act_$A}:meta" limit 1 >/dev/null # the limit drops: 2 can never be served now
tickets '{"ticket_type":1,"qty":2,"key":"add-2"}' "${bearer[@]}"
rcli HSET "{act_$A}:meta" limit 2 >/dev/null
check "2 more: 200, PostgreSQL 4 4, nobody served" test "$code $(pg_stock) $(field waitlist_served)" = "200 4 4 0"
check "  user 21 left the waitlist" test "$(wl_len)" = 0
check "  and hears why: a waitlist_refused notice (over_limit)" \
  wait_for 15 eval '[ "$(ev "SELECT count(*) FROM member_notice WHERE activity_id = $A AND user_id = 21 AND kind = '"'"'waitlist_refused'"'"' AND text LIKE '"'"'%over_limit.'"'"'")" = 1 ]'
rcli HSET "{act_$A}:t1:stock" stock:0 3 stock:1 3 >/dev/null
order 5
check "  Redis without them: a buyer refused ($ans)" test "$ans" = "409 sold_out"
tickets '{"ticket_type":1,"qty":2,"key":"add-2"}' "${bearer[@]}"
check "  the same call again: done_before, Redis 4 4 again" test "$code $(field result) $(redis_stock)" = "200 done_before 4 4"
order 5
check "  the buyer gets one now: $ans" test "${ans%% *}" = 201

# --- 6. refusals at the edges ---
B=$((A + 1))
q "$STOCK_PG_URL" "INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)
    VALUES ($B, 'ended', 2, 2, now() - interval '2 hours', now() - interval '1 hour');
  INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock) VALUES ($B, 1, 0, 1)" >/dev/null
r=$(curl -s -o - -w '\n%{http_code}' -XPOST "$ORDER_URL/activities/$B/tickets" "${bearer[@]}" \
  -d '{"ticket_type":1,"qty":1,"key":"late"}')
check "an ended sale: 409 sale_ended" test "$(tail -1 <<<"$r") $(head -1 <<<"$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"])')" = "409 sale_ended"
check "  its stock unchanged" test "$(q "$STOCK_PG_URL" "SELECT stock FROM activity_ticket_bucket WHERE activity_id = $B")" = 1
check "stock-service's /tickets without order-service's signature: 401" \
  test "$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$STOCK_URL/tickets" -d "{\"activity\":$A,\"ticket_type\":1,\"qty\":9,\"key\":\"forged\"}")" = 401
check "  nothing added" test "$(pg_stock)" = "4 4"

# --- 7. the counters agree ---
check "PostgreSQL: frozen + sold = the live freezes, within the stock" \
  test "$(q "$STOCK_PG_URL" "SELECT (SELECT sum(frozen_count + sold_count) FROM activity_ticket_bucket WHERE activity_id = $A) = (SELECT sum(qty) FROM stock_freeze WHERE activity_id = $A AND state IN ('FROZEN', 'CONFIRMED'))")" = t
for u in "$ORDER_URL" "$STOCK_URL" ${EVENTS_URL:+"$EVENTS_URL"}; do
  check "$u/metrics: the process_* families" \
    bash -c "curl -s '$u/metrics' | grep -q '^process_resident_memory_bytes [0-9]' && curl -s '$u/metrics' | grep -q '^process_open_fds [0-9]'"
done
check "metrics: the additions' request durations, by route and status" \
  test "$(curl -s "$ORDER_URL/metrics" | awk '$1 == "txc_http_request_duration_seconds_count{method=\"POST\",route=\"/activities/{id}/tickets\",status=\"200\"}" {print $2}')" -ge 4
gauge() { curl -s "$STOCK_URL/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
g() { gauge "txc_activity_tickets{activity=\"$A\",ticket_type=\"1\",state=\"$1\"}"; }
check "stock-service's per-activity gauges equal PostgreSQL and Redis (stock, frozen, sold, available, waitlist)" \
  test "$(g stock) $(g frozen) $(g sold) $(g available) $(gauge "txc_activity_waitlist{activity=\"$A\",ticket_type=\"1\"}")" = \
  "$(q "$STOCK_PG_URL" "SELECT sum(stock) || ' ' || sum(frozen_count) || ' ' || sum(sold_count) || ' ' || sum(stock - frozen_count - sold_count) FROM activity_ticket_bucket WHERE activity_id = $A AND ticket_type = 1") $(wl_len)"
check "  the stock is the 8 tickets after the additions" test "$(g stock)" = 8
check "stock-service: the prefilter's confirm and release results" \
  bash -c "curl -s '$STOCK_URL/metrics' | grep -q '^txc_client_prefilter_confirm_total{code=\"ok\"}' && curl -s '$STOCK_URL/metrics' | grep -q '^txc_client_prefilter_release_total{code='"
check "metrics: 4 stock additions reached Redis" \
  test "$(curl -s "$ORDER_URL/metrics" | awk '$1 == "txc_client_prefilter_stock_add_total{code=\"ok\"}" {print $2}')" = 4

stop_services
checks_done
