#!/usr/bin/env bash
# test_admin_mode.sh - the runtime switch of the fallback to local mode
# (issue 24): POST /admin/mode on running services (svc_admin.h), on a
# real local cluster (cluster/local/up) with the real services.
#
#   1. refused, and nothing changes: no credential, a buyer's order token,
#      a wrong token (401); a signature without at_ms or with a stale one
#      (401: no replays); malformed bodies with a valid token (400: not
#      JSON, an unknown mode, an unknown field, a bad operator); the mode
#      stays global and unforced (/healthz, /metrics), every refusal
#      counted and logged;
#   2. global: an order is a global transaction (no compensation record);
#   3. txc-mode local (signed with the services' key) on the running
#      order-service: 200, /metrics says local and forced, the JSON log
#      line names who and the operator; an order goes local: its
#      order_compensation row (orders database) and stock_compensation row
#      (stock database) appear, and the compensation is done;
#   4. the admin token (curl): {"mode":"auto"} hands the decision back to
#      detection: global again (the coordinator answers), the next order
#      is global; the counters of the changes;
#   5. stock-service: forced and handed back the same way (its /healthz,
#      /metrics), an unauthenticated call refused there too;
#   6. SIGTERM: the services stop cleanly, no sanitizer report.
#
# Needs TX_BIN_DIR (tcd, order-service, stock-service, txc-mode,
# txc-compensate) and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_admin_mode
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"


harness_services_up_with_admin_token
unset TXC_ADMIN_TOKEN_FILE # txc-mode below signs with the services' key
ok "cluster and services started ($ORDER_URL, $STOCK_URL)"

A=$(on_sale_activity 'admin mode test' 2 50)

# admin URL [CURL ARGS...]: the answer's status in $code, its body in $body
admin() {
  local url=$1 r
  shift
  r=$(curl -s -o - -w '\n%{http_code}' "$url/admin/mode" "$@")
  code=$(tail -1 <<<"$r")
  body=$(head -n -1 <<<"$r")
}
bearer=(-H "Authorization: Bearer $token")
# order USER: one ticket; the order id in $oid ("" when not 201)
order() {
  local r
  r=$(curl -s -XPOST "$ORDER_URL/orders" -d "{\"activity\":$A,\"ticket_type\":1,\"user\":$1,\"qty\":1}")
  oid=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("order_id") or "")' "$r")
  otoken=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("order_token") or "")' "$r")
}
metric() { # URL NAME{LABELS}: its value
  curl -s "$1/metrics" | awk -v m="$2" '$1 == m {print $2}'
}
healthz_mode() { curl -s "$1/healthz" | python3 -c 'import json,sys; print(json.load(sys.stdin)["mode"])'; }
comp_rows() { # ORDER: its order_compensation and stock_compensation rows
  echo "$(q "$ORDERS_PG_URL" "SELECT count(*) FROM order_compensation WHERE order_id = $1")/$(q "$STOCK_PG_URL" \
    "SELECT count(*) FROM stock_compensation WHERE order_id = $1")"
}

# --- 1. refused, nothing changes ---
order 201
check "an order in global mode (order $oid)" test -n "$oid"
check "  no compensation record: a global transaction" test "$(comp_rows "$oid")" = 0/0
buyer_token=$otoken
admin "$ORDER_URL" -XPOST -d '{"mode":"local"}'
check "no credential: 401" test "$code" = 401
admin "$ORDER_URL" -XPOST -H "Authorization: Bearer $buyer_token" -d '{"mode":"local"}'
check "a buyer's order token: 401 ($code)" test "$code" = 401
admin "$ORDER_URL" -XPOST -H "Authorization: Bearer ${token}x" -d '{"mode":"local"}'
check "a wrong admin token: 401" test "$code" = 401
admin "$ORDER_URL" -XGET
check "GET without a credential: 401" test "$code" = 401
sig() { # METHOD BODY: the services' signature of a call of /admin/mode
  python3 - "$TXC_SERVICE_KEY_FILE" "$1" "$2" <<'EOF'
import hashlib, hmac, struct, sys
key = bytes.fromhex(open(sys.argv[1]).readline().strip())
parts = [sys.argv[2].encode(), b"/admin/mode", b"", b"", sys.argv[3].encode()]
msg = b"".join(struct.pack("<Q", len(p)) + p for p in parts)
print(hmac.new(key, msg, hashlib.sha512).hexdigest()[:64])
EOF
}
b='{"mode":"local"}'
admin "$ORDER_URL" -XPOST -H "X-Txc-Signature: $(sig POST "$b")" -d "$b"
check "a signature without at_ms: 401 (no replays) ($code $body)" test "$code" = 401
b="{\"mode\":\"local\",\"at_ms\":$(( ($(date +%s) - 600) * 1000 ))}"
admin "$ORDER_URL" -XPOST -H "X-Txc-Signature: $(sig POST "$b")" -d "$b"
check "a signature with at_ms 10 minutes old: 401" test "$code" = 401
b="{\"mode\":\"local\",\"at_ms\":$(( $(date +%s) * 1000 ))}"
admin "$ORDER_URL" -XPOST -H "X-Txc-Signature: $(sig POST "$b")" -d "${b/local/global}"
check "a signature of another body: 401" test "$code" = 401
for bad in 'not json' '{"mode":"banana"}' '{"mode":"local","extra":1}' '{"mode":1}' '{}' \
           '{"mode":"local","operator":""}' '[]'; do
  admin "$ORDER_URL" -XPOST "${bearer[@]}" -d "$bad"
  check "malformed with the admin token, $bad: 400 ($code)" test "$code" = 400
done
admin "$ORDER_URL" -XPUT "${bearer[@]}" -d '{"mode":"local"}'
check "PUT: 405" test "$code" = 405
check "after the refusals: still global, not forced" test "$(healthz_mode "$ORDER_URL") $(metric "$ORDER_URL" txc_client_mode_forced)" = "global 0"
check "  refusals counted: 7 unauthenticated, 7 bad requests" test \
  "$(metric "$ORDER_URL" 'txc_admin_refused_total{reason="unauthenticated"}') $(metric "$ORDER_URL" 'txc_admin_refused_total{reason="bad_request"}')" = "7 7"
check "  and logged" grep -q '"msg":"refused an admin call: mode must be' "$CLUSTER_DIR/order-service.log"
order 202
check "  an order is still global" test -n "$oid" -a "$(comp_rows "$oid")" = 0/0

# --- 3. local, by txc-mode ---
out=$("$bin/txc-mode" local --url "$ORDER_URL" --operator alice 2>&1) || true
check "txc-mode local: $out" grep -q ': mode local (forced local, detected global)$' <<<"$out"
check "  /metrics: local, forced (2)" test "$(metric "$ORDER_URL" 'txc_client_mode{mode="local"}') $(metric "$ORDER_URL" txc_client_mode_forced)" = "1 2"
check "  /healthz: local" test "$(healthz_mode "$ORDER_URL")" = local
check "  the log line: who, operator, previous, forced" grep -q \
  '"msg":"transaction mode forced to local".*"admin":"mode","who":"service-key","operator":"alice","previous":"auto","forced":"local"' \
  "$CLUSTER_DIR/order-service.log"
order 203
check "an order in forced local mode (order $oid)" test -n "$oid"
check "  its compensation records appear (orders and stock databases)" test "$(comp_rows "$oid")" = 1/1
check "  decided: FROZEN in the stock database, DONE in the orders database" test "$(q "$STOCK_PG_URL" \
  "SELECT state FROM stock_compensation WHERE order_id = $oid") $(q "$ORDERS_PG_URL" \
  "SELECT state || ' ' || outcome FROM order_compensation WHERE order_id = $oid")" = "FROZEN DONE FROZEN"
out=$("$bin/txc-mode" status --url "$ORDER_URL" 2>&1) || true
check "txc-mode status: $out" grep -q ': mode local (forced local, detected global)$' <<<"$out"

# --- 4. auto, by the admin token ---
admin "$ORDER_URL" -XPOST "${bearer[@]}" -d '{"mode":"auto","operator":"bob"}'
check "the admin token, auto: 200 ($body)" test "$code" = 200
check "  global again (detection: the coordinator answers)" python3 -c '
import json, sys
a = json.loads(sys.argv[1])
assert a["mode"] == "global" and a["forced"] == "auto" and a["previous"] == "local", a' "$body"
check "  /metrics: global, not forced" test "$(metric "$ORDER_URL" 'txc_client_mode{mode="global"}') $(metric "$ORDER_URL" txc_client_mode_forced)" = "1 0"
check "  the log line" grep -q '"msg":"transaction mode handed back to detection (auto)".*"who":"admin-token","operator":"bob"' \
  "$CLUSTER_DIR/order-service.log"
order 204
check "an order after auto is global again (order $oid)" test -n "$oid" -a "$(comp_rows "$oid")" = 0/0
check "changes counted: local 1, auto 1, global 0" test "$(metric "$ORDER_URL" 'txc_admin_mode_changes_total{mode="local"}') $(metric "$ORDER_URL" 'txc_admin_mode_changes_total{mode="auto"}') $(metric "$ORDER_URL" 'txc_admin_mode_changes_total{mode="global"}')" = "1 1 0"
admin "$ORDER_URL" -XPOST "${bearer[@]}" -d '{"mode":"global"}'
check "forced global: 200, forced global" test "$code $(metric "$ORDER_URL" txc_client_mode_forced)" = "200 1"
admin "$ORDER_URL" -XPOST "${bearer[@]}" -d '{"mode":"auto"}'

# --- 5. stock-service ---
admin "$STOCK_URL" -XPOST -d '{"mode":"local"}'
check "stock-service: no credential: 401" test "$code" = 401
out=$("$bin/txc-mode" local --url "$STOCK_URL" --operator alice 2>&1) || true
check "stock-service: txc-mode local: $out" grep -q ': mode local (forced local' <<<"$out"
check "  its /healthz and /metrics" test "$(healthz_mode "$STOCK_URL") $(metric "$STOCK_URL" txc_client_mode_forced) $(metric "$STOCK_URL" 'txc_admin_mode_changes_total{mode="local"}')" = "local 2 1"
admin "$STOCK_URL" -XPOST "${bearer[@]}" -d '{"mode":"auto"}'
check "  auto again: 200, not forced" test "$code $(metric "$STOCK_URL" txc_client_mode_forced)" = "200 0"

# --- 6. stop ---
stop_services order-service stock-service
checks_done
