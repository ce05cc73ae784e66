#!/usr/bin/env bash
# test_reconcile.sh - the daily reconciliation (issue 24) on a real local
# cluster (cluster/local/up) with the real services, after a small real
# flash sale whose payments went through POST /orders/{id}/pay.
#
#   1. the sale; then txc-reconcile: exit 0, 0 differences, every paid
#      order compared with its ledger entry, freeze and points; the run
#      recorded DONE in reconcile_run; the text output; --day of a day
#      without the sale compares nothing.
#   2. each discrepancy injected alone (straight into the databases, as a
#      bug or a lost write would leave it), txc-reconcile run, the
#      discrepancy taken back: exit 1 with exactly that one difference, of
#      the right kind, check and order (or bucket), its reason, expected
#      and actual; the same row in reconcile_difference; the alert line
#      (the services' JSON log format) on stderr; then exit 0 again.  The
#      kinds: paid_without_ledger, ledger_without_order,
#      ledger_order_not_paid, amount_mismatch, paid_not_confirmed,
#      confirmed_not_paid, sold_count_mismatch, paid_without_points,
#      points_not_paid, points_mismatch.  A single discrepancy unreported
#      (or reported as another kind, or with company) fails the test.
#   3. order-service's schedule (ORDER_RECONCILE_INTERVAL_S=2): its
#      /metrics shows the runs and, while a discrepancy lasts, the
#      difference by kind; its log has the alert line; no two runs (the
#      tool's and the schedule's) ever overlapped (the advisory lock).
#   4. exit 2: a database that cannot be reached, bad arguments.
#   5. SIGTERM: the services stop cleanly, no sanitizer report.
#
# Needs TX_BIN_DIR (tcd, order-service, stock-service, event-consumers,
# flashsale, txc-reconcile) and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_reconcile
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"


harness_cluster_up
out=$(ORDER_RECONCILE_INTERVAL_S=2 ORDER_RECONCILE_SETTLE_S=0 ORDER_TICKET_PRICE_CENTS=1250 \
  "$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
eval "$out"
ok "cluster and services started ($ORDER_URL; ${EVENTS_URL:-no event-consumers})"

# --- 1. a small sale, then nothing to report ---
rc=0
"$bin/flashsale" --users 80 --window 1 --tickets 60 --buckets 2 --limit 2 --pay 70 --cancel 10 \
  --again 0 --settle 30 --quiet --json "$tmp/sale.json" >"$tmp/sale.out" || rc=$?
check "flashsale exits 0 (status $rc)" test "$rc" -eq 0
act=$(sale_activity "$tmp/sale.json")
paid=$(q "$ORDERS_PG_URL" "SELECT count(*) FROM trade_order WHERE activity_id = $act AND status = 'PAID'")
check "the sale has paid orders ($paid)" test "$paid" -gt 0
check "every payment wrote its ledger entry with qty x 1250 cents" test "$(q "$ORDERS_PG_URL" \
  "SELECT count(*) FROM trade_order o JOIN payment_ledger l USING (order_id)
    WHERE o.activity_id = $act AND o.status = 'PAID' AND l.amount_cents = o.qty * 1250
      AND o.amount_cents = o.qty * 1250")" = "$paid"

# reconcile [ARGS...]: txc-reconcile --settle 0 --json; rc, $tmp/r.json, $tmp/r.err
reconcile() {
  rc=0
  "$bin/txc-reconcile" --settle 0 --json "$@" >"$tmp/r.json" 2>"$tmp/r.err" || rc=$?
}

reconcile
check "txc-reconcile after the sale: exit 0 (status $rc)" test "$rc" -eq 0
if python3 - "$tmp/r.json" "$paid" <<'EOF'; then ok "0 differences, every paid order compared"; else fail "clean run: $(cat "$tmp/r.json" "$tmp/r.err")"; fi
import json, sys
r = json.load(open(sys.argv[1])); paid = int(sys.argv[2])
print("  counts %s" % r["counts"])
assert r["status"] == "ok" and r["total"] == 0 and r["differences"] == [], r
c = r["counts"]
assert c["paid_orders"] >= paid and c["ledger_entries"] >= paid, c
assert c["confirmed_freezes"] >= paid and c["points_rows"] >= paid and c["buckets"] >= 2, c
assert r["points_compared"] is True
EOF
run_id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$tmp/r.json")
check "run $run_id recorded DONE with 0 differences" test "$(q "$ORDERS_PG_URL" \
  "SELECT state || ' ' || differences || ' ' || started_by FROM reconcile_run WHERE run_id = $run_id")" = "DONE 0 tool"
check "the info line on stderr" grep -q '"level":"info".*"msg":"reconciliation found no differences"' "$tmp/r.err"
rc=0
"$bin/txc-reconcile" --settle 0 >"$tmp/r.txt" 2>/dev/null || rc=$?
check "text output: exit 0, '0 differences'" grep -q '^0 differences$' "$tmp/r.txt"
reconcile --day 2001-01-01
check "--day 2001-01-01: exit 0, nothing compared (status $rc)" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["total"] == 0 and r["counts"]["paid_orders"] == 0 and r["window"]["since"].startswith("2001-01-01T00:00:00")
assert r["window"]["until"].startswith("2001-01-02T00:00:00"), r' "$tmp/r.json"

# --- 2. each discrepancy alone ---
P=$(q "$ORDERS_PG_URL" "SELECT order_id FROM trade_order WHERE activity_id = $act AND status = 'PAID' ORDER BY order_id LIMIT 1")
read -r P_qty P_tt P_bucket < <(q "$ORDERS_PG_URL" "SELECT qty || ' ' || ticket_type || ' ' || bucket_id FROM trade_order WHERE order_id = $P")
U=$(q "$STOCK_PG_URL" "SELECT order_id FROM stock_freeze WHERE activity_id = $act AND state = 'FROZEN' ORDER BY order_id LIMIT 1")
U_status=$(q "$ORDERS_PG_URL" "SELECT status FROM trade_order WHERE order_id = $U")
check "a paid order ($P) and an unpaid one with its freeze ($U, $U_status) to work on" \
  test -n "$P" -a -n "$U" -a "$U_status" = UNPAID
ok "injections on order $P (qty $P_qty, bucket $P_bucket) and $U"

# expect_one KIND CHECK ORDER EXPECTED ACTUAL [BUCKET]: the last run found
# exactly that difference (ORDER "-": no order, BUCKET then checked).
expect_one() {
  local kind=$1 chk=$2 order=$3 exp=$4 act_=$5 bucket=${6:-}
  check "$kind: exit 1 (status $rc)" test "$rc" -eq 1
  if python3 - "$tmp/r.json" "$kind" "$chk" "$order" "$exp" "$act_" "$bucket" <<'EOF'; then
import json, sys
r = json.load(open(sys.argv[1])); kind, chk, order, exp, act, bucket = sys.argv[2:8]
d = r["differences"]
assert r["status"] == "differences" and r["total"] == 1 and len(d) == 1, d
d = d[0]
assert d["kind"] == kind and d["check"] == chk, d
assert d["order_id"] == (None if order == "-" else int(order)), d
assert d["expected"] == exp and d["actual"] == act, d
if bucket: assert d["bucket"] == int(bucket), d
assert r["by_kind"] == {kind: 1}, r["by_kind"]
assert d["reason"], d
print("  %s: %s" % (kind, d["reason"]))
EOF
    ok "$kind: exactly that difference, expected $exp, actual $act_"
  else
    fail "$kind: $(cat "$tmp/r.json")"
  fi
  local rid
  rid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$tmp/r.json")
  check "$kind: recorded in reconcile_difference (run $rid)" test "$(q "$ORDERS_PG_URL" \
    "SELECT string_agg(check_name || ' ' || kind || ' ' || coalesce(order_id::text, '-') || ' ' || expected || ' ' || actual, ';')
       || ' ' || (SELECT state || ' ' || differences FROM reconcile_run WHERE run_id = $rid)
       FROM reconcile_difference WHERE run_id = $rid")" = "$chk $kind $order $exp $act_ DONE 1"
  check "$kind: the alert line on stderr" python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
a = [l for l in lines if l.get("alert") == "reconciliation"]
assert len(a) == 1 and a[0]["level"] == "error" and a[0]["msg"] == "reconciliation found 1 difference", a
assert a[0]["differences"] == 1 and a[0]["by_kind"] == {sys.argv[2]: 1} and a[0]["svc"] == "txc-reconcile", a' \
    "$tmp/r.err" "$kind"
}
# back_to_zero KIND: after the undo, nothing to report
back_to_zero() {
  reconcile
  check "$1 taken back: exit 0 again (status $rc)" test "$rc" -eq 0
  [[ $rc -eq 0 ]] || cat "$tmp/r.json" >&2
}
# inject KIND URL SQL: run the discrepancy's SQL (one transaction)
inject() {
  psql -X -q -v ON_ERROR_STOP=1 -d "$2" -c "BEGIN; $3; COMMIT;" >/dev/null || fail "$1: could not inject"
}
# alone KIND URL BREAK_SQL UNDO_SQL CHECK ORDER EXPECTED ACTUAL [BUCKET]: one
# discrepancy on its own: BREAK_SQL on URL, a run that finds exactly it
# (expect_one), UNDO_SQL, and a run that finds nothing again.
alone() {
  local kind=$1 url=$2 break_sql=$3 undo_sql=$4
  shift 4
  inject "$kind" "$url" "$break_sql"
  reconcile; expect_one "$kind" "$@"
  inject undo "$url" "$undo_sql"
  back_to_zero "$kind"
}

amount=$((P_qty * 1250))
alone paid_without_ledger "$ORDERS_PG_URL" \
  "CREATE TABLE recon_saved AS SELECT * FROM payment_ledger WHERE order_id = $P; DELETE FROM payment_ledger WHERE order_id = $P" \
  "INSERT INTO payment_ledger SELECT * FROM recon_saved; DROP TABLE recon_saved" \
  payment "$P" "$amount" missing

alone ledger_without_order "$ORDERS_PG_URL" \
  "INSERT INTO payment_ledger (order_id, amount_cents, provider_ref) VALUES (987654321, 1250, 'test:stray')" \
  "DELETE FROM payment_ledger WHERE order_id = 987654321" \
  payment 987654321 PAID missing

alone ledger_order_not_paid "$ORDERS_PG_URL" \
  "INSERT INTO payment_ledger (order_id, amount_cents, provider_ref) VALUES ($U, 1250, 'test:unpaid')" \
  "DELETE FROM payment_ledger WHERE order_id = $U" \
  payment "$U" PAID UNPAID

alone amount_mismatch "$ORDERS_PG_URL" \
  "UPDATE payment_ledger SET amount_cents = amount_cents + 1 WHERE order_id = $P" \
  "UPDATE payment_ledger SET amount_cents = amount_cents - 1 WHERE order_id = $P" \
  payment "$P" "$amount" "$((amount + 1))"

# The stock side kept consistent with itself (the freeze and its bucket
# move together), so that only the order/stock difference shows.
bucket_of_p="activity_id = $act AND ticket_type = $P_tt AND bucket_id = $P_bucket"
alone paid_not_confirmed "$STOCK_PG_URL" \
  "UPDATE stock_freeze SET state = 'FROZEN', finished_at = NULL WHERE order_id = $P;
   UPDATE activity_ticket_bucket SET sold_count = sold_count - $P_qty, frozen_count = frozen_count + $P_qty WHERE $bucket_of_p" \
  "UPDATE stock_freeze SET state = 'CONFIRMED', finished_at = now() WHERE order_id = $P;
   UPDATE activity_ticket_bucket SET sold_count = sold_count + $P_qty, frozen_count = frozen_count - $P_qty WHERE $bucket_of_p" \
  stock "$P" CONFIRMED FROZEN

read -r U_qty U_tt U_bucket < <(q "$STOCK_PG_URL" "SELECT qty || ' ' || ticket_type || ' ' || bucket_id FROM stock_freeze WHERE order_id = $U")
alone confirmed_not_paid "$STOCK_PG_URL" \
  "SELECT stock_freeze_finish($U, NULL)" \
  "UPDATE stock_freeze SET state = 'FROZEN', finished_at = NULL WHERE order_id = $U;
   DELETE FROM stock_log WHERE order_id = $U AND op = 'confirm';
   UPDATE activity_ticket_bucket SET sold_count = sold_count - $U_qty, frozen_count = frozen_count + $U_qty
    WHERE activity_id = $act AND ticket_type = $U_tt AND bucket_id = $U_bucket" \
  stock "$U" PAID UNPAID

sold=$(q "$STOCK_PG_URL" "SELECT sold_count FROM activity_ticket_bucket WHERE $bucket_of_p")
alone sold_count_mismatch "$STOCK_PG_URL" \
  "UPDATE activity_ticket_bucket SET sold_count = sold_count - 1 WHERE $bucket_of_p" \
  "UPDATE activity_ticket_bucket SET sold_count = sold_count + 1 WHERE $bucket_of_p" \
  stock - "$sold" "$((sold - 1))" "$P_bucket"

points=$((P_qty * 100))
alone paid_without_points "$EVENTS_PG_URL" \
  "CREATE TABLE recon_saved AS SELECT * FROM points_ledger WHERE order_id = $P; DELETE FROM points_ledger WHERE order_id = $P" \
  "INSERT INTO points_ledger SELECT * FROM recon_saved; DROP TABLE recon_saved" \
  points "$P" "$points" missing

alone points_not_paid "$EVENTS_PG_URL" \
  "INSERT INTO points_ledger (order_id, user_id, activity_id, points, event_id) VALUES ($U, 1, $act, 100, 0)" \
  "DELETE FROM points_ledger WHERE order_id = $U" \
  points "$U" PAID UNPAID

alone points_mismatch "$EVENTS_PG_URL" \
  "UPDATE points_ledger SET points = points + 1 WHERE order_id = $P" \
  "UPDATE points_ledger SET points = points - 1 WHERE order_id = $P" \
  points "$P" "$points" "$((points + 1))"

# Two at once: both reported, each once.
inject two "$ORDERS_PG_URL" "UPDATE payment_ledger SET amount_cents = amount_cents + 1 WHERE order_id = $P"
inject two "$EVENTS_PG_URL" "UPDATE points_ledger SET points = points + 1 WHERE order_id = $P"
reconcile
check "two discrepancies at once: exit 1, both reported once each" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["total"] == 2 and r["by_kind"] == {"amount_mismatch": 1, "points_mismatch": 1}, r' "$tmp/r.json"

# --- 3. the schedule of order-service, meanwhile ---
metric() { # NAME{LABELS}: its value on order-service's /metrics, or ""
  curl -s "$ORDER_URL/metrics" | awk -v m="$1" '$1 == m {print $2}'
}
seen=
for ((i = 0; i < 100; i++)); do
  [[ $(metric 'txc_reconcile_differences{check="payment",kind="amount_mismatch"}') == 1 &&
     $(metric 'txc_reconcile_differences{check="points",kind="points_mismatch"}') == 1 ]] && { seen=1; break; }
  sleep 0.2
done
check "order-service's /metrics: the scheduled run's differences by kind" test -n "$seen"
inject undo "$ORDERS_PG_URL" "UPDATE payment_ledger SET amount_cents = amount_cents - 1 WHERE order_id = $P"
inject undo "$EVENTS_PG_URL" "UPDATE points_ledger SET points = points - 1 WHERE order_id = $P"
back_to_zero "both"
seen=
for ((i = 0; i < 100; i++)); do
  [[ $(metric 'txc_reconcile_last_differences') == 0 ]] && { seen=1; break; }
  sleep 0.2
done
check "order-service's /metrics: back to 0 differences" test -n "$seen"
runs_ok=$(metric 'txc_reconcile_runs_total{result="ok"}')
runs_diff=$(metric 'txc_reconcile_runs_total{result="differences"}')
check "txc_reconcile_runs_total: ok ${runs_ok:-none}, differences ${runs_diff:-none}" \
  test "${runs_ok:-0}" -ge 1 -a "${runs_diff:-0}" -ge 1
check "order-service logged the alert line" \
  grep -q '"level":"error".*"msg":"reconciliation found [0-9]* difference.*"alert":"reconciliation"\|"alert":"reconciliation".*"msg":"reconciliation found [0-9]* difference' \
  "$CLUSTER_DIR/order-service.log"
sched=$(q "$ORDERS_PG_URL" "SELECT count(*) FROM reconcile_run WHERE started_by = 'schedule' AND state = 'DONE'")
check "scheduled runs recorded ($sched)" test "$sched" -ge 2
check "no two runs overlapped (one at a time)" test "$(q "$ORDERS_PG_URL" \
  "SELECT count(*) FROM reconcile_run a JOIN reconcile_run b ON a.run_id < b.run_id
    AND a.started_at < coalesce(b.finished_at, 'infinity') AND b.started_at < coalesce(a.finished_at, 'infinity')")" = 0

# --- 4. could not run: exit 2 ---
rc=0
ORDERS_PG_URL=postgresql://postgres@127.0.0.1:1/none "$bin/txc-reconcile" >/dev/null 2>"$tmp/r.err" || rc=$?
check "an unreachable orders database: exit 2 (status $rc)" test "$rc" -eq 2
check "... saying so" grep -q 'could not connect to the orders database' "$tmp/r.err"
rc=0; "$bin/txc-reconcile" --day yesterday >/dev/null 2>&1 || rc=$?
check "--day yesterday: exit 2 (status $rc)" test "$rc" -eq 2
rc=0; "$bin/txc-reconcile" --day 2001-01-01 --since 2001-01-01 >/dev/null 2>&1 || rc=$?
check "--day with --since: exit 2 (status $rc)" test "$rc" -eq 2
rc=0; "$bin/txc-reconcile" --since 'not a time' >/dev/null 2>&1 || rc=$?
check "--since 'not a time': exit 2 (status $rc)" test "$rc" -eq 2

# --- 5. clean shutdown ---
stop_services order-service
checks_done
