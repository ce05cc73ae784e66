#!/usr/bin/env bash
# test_observability.sh - the alert rules, the dashboard and every /metrics
# page (issue 27):
#   1. packaging/prometheus/txc-alerts.yml: promtool check rules, and its
#      unit tests (txc-alerts.test.yml: each alert fires on its series and
#      stays quiet on healthy ones);
#   2. packaging/grafana/txc-dashboard.json: valid JSON, every panel's
#      query valid PromQL (promtool, as recording rules);
#   3. a local cluster with the services, one order placed: promtool check
#      metrics says nothing about any node's or service's page (HELP on
#      every family, names and types as Prometheus wants them);
#   4. every metric the rules and the dashboard name exists on those pages.
#
# Needs TX_BIN_DIR and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_observability
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"
rules=$src/packaging/prometheus/txc-alerts.yml
dash=$src/packaging/grafana/txc-dashboard.json

if ! command -v promtool >/dev/null; then
  fail "promtool is not installed (scripts/deps installs Debian's prometheus)"
  exit 1
fi

# --- 1. the rules ---
out=$(promtool check rules "$rules" 2>&1) && ok "promtool check rules: $(grep -o '[0-9]* rules found' <<<"$out")" ||
  fail "promtool check rules: $out"
out=$(cd "$(dirname "$rules")" && promtool test rules txc-alerts.test.yml 2>&1) && ok "promtool test rules: the alerts' unit tests pass" ||
  fail "promtool test rules: $out"

# --- 2. the dashboard ---
python3 - "$dash" "$tmp/dash-rules.yml" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
with open(sys.argv[2], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        f.write("      - record: dashboard:q%d\n        expr: %s\n" % (i, json.dumps(e)))
print(len(d["panels"]), len(exprs))
PY
out=$(promtool check rules "$tmp/dash-rules.yml" 2>&1) && ok "the dashboard's queries are valid PromQL ($(grep -o '[0-9]* rules found' <<<"$out"))" ||
  fail "the dashboard's queries: $out"

# --- 3. every page ---
harness_cluster_up
out=$("$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
eval "$out"
A=$(on_sale_activity 'observability test' 1 5)
code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$ORDER_URL/orders" -d "{\"activity\":$A,\"ticket_type\":1,\"user\":1,\"qty\":1}")
check "an order placed (the histograms have series): $code" test "$code" = 201
pages=()
IFS=, read -r -a urls <<<"$TC_METRICS_URLS"
urls+=("$ORDER_URL/metrics" "$STOCK_URL/metrics")
[[ -z ${EVENTS_URL:-} ]] || urls+=("$EVENTS_URL/metrics")
for u in "${urls[@]}"; do
  f=$tmp/page$((${#pages[@]} + 1)).txt
  curl -s --max-time 5 "$u" >"$f" || true
  pages+=("$f")
  lint=$(promtool check metrics <"$f" 2>&1 || true)
  check "promtool check metrics $u: nothing to say${lint:+ ($(head -3 <<<"$lint" | tr '\n' ';'))}" test -z "$lint" -a -s "$f"
done

# --- 4. the names the rules and the dashboard use ---
names=$(cat "$rules" "$dash" | grep -oE '\b(txc|process)_[a-z0-9_]+' | sed -E 's/_(bucket|count|sum)$//' | sort -u)
served() { grep -qh "^# TYPE $1 " "${pages[@]}"; }
check_every "every metric the rules and the dashboard name is served" names "$names" served

checks_done
