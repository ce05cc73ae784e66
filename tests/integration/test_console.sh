#!/usr/bin/env bash
# test_console.sh - the web console (console/, issue 29) in a real
# browser: a local cluster, the demo services and a small flash sale;
# txc-console on them; headless Chromium loads each page while the sale
# runs and after it, and the test reads the DOM it rendered (the sale
# page's numbers must equal the stock and orders databases'), keeps a
# screenshot of each page (CONSOLE_ARTIFACTS, default build/artifacts)
# and checks that its pixels are not blank.  Also the console's HTTP
# side with curl: no credential, no data; a wrong token refused; problem
# bodies, Allow, bad parameters.
set -euo pipefail

TEST_NAME=test_console
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"

chromium=$(command -v chromium || true)
if [[ -z $chromium ]]; then
  echo "test_console: chromium is not installed (scripts/deps installs it)" >&2
  exit 1
fi
artifacts=${CONSOLE_ARTIFACTS:-$bin/../artifacts/console}
mkdir -p "$artifacts"

harness_cleanup_more() {
  [[ -z ${CONSOLE_PID:-} ]] || kill "$CONSOLE_PID" 2>/dev/null || true
  [[ -z ${SALE_PID:-} ]] || kill "$SALE_PID" 2>/dev/null || true
  wait 2>/dev/null || true
}

harness_cluster_up
out=$("$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")
eval "$out"
ok "cluster and services started ($TC_NODES; $ORDER_URL)"

# --- the console -------------------------------------------------------
token_file=$tmp/console.token
"$bin/txc-console" --token-file "$token_file" --listen 127.0.0.1:0 >"$tmp/console.out" 2>"$tmp/console.log" &
CONSOLE_PID=$!
wait_for 10 grep -q '^export CONSOLE_URL=' "$tmp/console.out" || {
  cat "$tmp/console.log" >&2
  fail "txc-console did not start"
  exit 1
}
eval "$(grep '^export CONSOLE_URL=' "$tmp/console.out")"
token=$(head -n1 "$token_file")
check "the token file was created with mode 0600" test "$(stat -c %a "$token_file")" = 600
ok "console on $CONSOLE_URL"

api() { # PATH [curl args...]: body in $tmp/api, code in $code
  local p=$1
  shift
  code=$(curl -s -o "$tmp/api" -D "$tmp/api.h" -w '%{http_code}' "$@" "$CONSOLE_URL$p") || code=000
}
answers() { # WANT WHAT PATH [curl args...]: api PATH answers status WANT
  local want=$1 what=$2
  shift 2
  api "$@"
  check "$what: $want ($code)" test "$code" = "$want"
}
answers 200 "healthz without a credential" /healthz
answers 401 "no credential" /api/overview
check "the 401 is a problem+json" grep -qi '^content-type: application/problem+json' "$tmp/api.h"
check "the 401 has no data in it" bash -c "! grep -q nodes '$tmp/api'"
answers 401 "a wrong token" /api/overview -H "Authorization: Bearer wrong-$token"
api / 
check "a page without a credential: 303 to /login ($code)" \
  bash -c "[[ $code == 303 ]] && grep -qi '^location: /login' '$tmp/api.h'"
answers 401 "login with a wrong token" "/login?token=nope"
api "/login?token=$token"
check "login with the token: 303 and a session cookie ($code)" \
  bash -c "[[ $code == 303 ]] && grep -qi '^set-cookie: txc_console=.*HttpOnly; SameSite=Strict' '$tmp/api.h'"
check "the cookie is not the token" bash -c "! grep -q '$token' '$tmp/api.h'"
auth=(-H "Authorization: Bearer $token")
answers 200 "overview with the token" /api/overview "${auth[@]}"
check "the answers carry a Content-Security-Policy" grep -qi "^content-security-policy: default-src 'none'; script-src 'self'" "$tmp/api.h"
api /api/overview "${auth[@]}" -X POST
check "POST: 405 with Allow ($code)" bash -c "[[ $code == 405 ]] && grep -qi '^allow: GET, HEAD' '$tmp/api.h'"
answers 400 "history with an unknown status" "/api/history?status=NoSuchStatus" "${auth[@]}"
answers 400 "limit 0" "/api/globals?limit=0" "${auth[@]}"
answers 404 "an unknown xid" "/api/global?xid=none-such" "${auth[@]}"
answers 404 "an unknown activity" "/api/sale?activity=987654321" "${auth[@]}"
answers 400 "a malformed activity" "/api/sale?activity=1%27%3Bdrop" "${auth[@]}"
answers 400 "a parameter of 200 bytes" "/api/history?xid=$(head -c 200 /dev/zero | tr '\0' x)" "${auth[@]}"

# --- Chromium ------------------------------------------------------------
# One profile per run (profile lock); --no-sandbox as root; the login URL
# sets the cookie and redirects, so the page's own fetches are logged in.
browse() { # PAGE OUT.html [SCREENSHOT.png]
  local page=$1 dom=$2 shot=${3:-} prof next
  prof=$(mktemp -d "$tmp/chrome.XXXXXX")
  next=$(python3 -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$page")
  local url="$CONSOLE_URL/login?token=$token&next=$next"
  local flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
    --user-data-dir="$prof" --virtual-time-budget=6000 --window-size=1280,900)
  timeout 60 "$chromium" "${flags[@]}" --dump-dom "$url" >"$dom" 2>>"$tmp/chromium.log" || true
  if [[ -n $shot ]]; then
    timeout 60 "$chromium" "${flags[@]}" --screenshot="$shot" "$url" >/dev/null 2>>"$tmp/chromium.log" || true
  fi
  rm -rf -- "$prof"
}

# A small sale in the background: the pages are loaded while it runs.
"$bin/flashsale" --users 300 --window 6 --tickets 120 --buckets 4 --limit 2 --pay 50 --cancel 20 --again 20 \
  --think-ms 1500 --settle 30 --quiet --json "$tmp/sale.json" --html "$tmp/sale-report.html" >"$tmp/sale.out" 2>&1 &
SALE_PID=$!
sleep 3
browse /globals "$tmp/globals.html" "$artifacts/globals.png"
check "globals page rendered during the sale" grep -q 'data-ready="1"' "$tmp/globals.html"
check "globals page shows the live count" grep -q 'data-k="globals_count"' "$tmp/globals.html"
browse /sale "$tmp/sale-live.html" "$artifacts/sale-live.png"
check "sale page rendered during the sale" grep -q 'data-ready="1"' "$tmp/sale-live.html"
rc=0
wait "$SALE_PID" || rc=$?
SALE_PID=
check "flashsale exits 0 (status $rc)" test "$rc" -eq 0
act=$(sale_activity "$tmp/sale.json")

# The report as a page (flashsale --html): every chart drawn, its accepted
# orders per slot add up to the report's count, and a browser renders it
# (report.png, checked with the console's screenshots below).
if python3 - "$tmp/sale.json" "$tmp/sale-report.html" <<'EOF'; then ok "the HTML report draws the sale"; else fail "the HTML report"; fi
import json, re, sys
r = json.load(open(sys.argv[1]))
tl = r["timeline"]
drawn = sum(v for v in tl["accepted_per_s"] if v is not None) * tl["slot_ms"] / 1000
assert round(drawn) == r["accepted"], (drawn, r["accepted"])
pts = dict(re.findall(r'data-chart="([^"]+)" data-points="(\d+)"', open(sys.argv[2]).read()))
want = {"orders per second", "latency of POST /orders", "requests in flight", "tickets", "available per bucket"}
assert want <= set(pts) and all(int(pts[k]) > 0 for k in want), pts
print(f"  report: {r['accepted']} accepted drawn over {len(tl['t_ms'])} slots of {tl['slot_ms']} ms; charts {pts}")
EOF
prof=$(mktemp -d "$tmp/chrome.XXXXXX")
timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
  --user-data-dir="$prof" --window-size=1280,1100 --screenshot="$artifacts/report.png" \
  "file://$tmp/sale-report.html" >/dev/null 2>>"$tmp/chromium.log" || true
cp "$tmp/sale-report.html" "$artifacts/report.html"

# After the sale: every page, and the sale page's numbers against the databases.
sleep 2 # at least two samples after the last order
browse / "$tmp/overview.html" "$artifacts/overview.png"
browse /locks "$tmp/locks.html" "$artifacts/locks.png"
browse "/sale?activity=$act" "$tmp/sale.html" "$artifacts/sale.png"
xid=$(q "$TC_PG_URL" "SELECT xid FROM global_history WHERE status = 9 ORDER BY end_time DESC LIMIT 1")
browse "/history?xid=$(python3 -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$xid")" \
  "$tmp/history.html" "$artifacts/history.png"

# The sampler's series against the order-service's own counters: the
# console started before the first order, so the per-second requests it
# drew add up to the POST /orders count the service reports, and every
# second with requests has a p99.
api "/api/series?activity=$act&seconds=600" "${auth[@]}"
cp "$tmp/api" "$tmp/series.json"
curl -fsS "$ORDER_URL/metrics" >"$tmp/order-metrics.txt"
if python3 - "$tmp/series.json" "$tmp/order-metrics.txt" <<'EOF'; then ok "the series add up to the order-service's counters"; else fail "the series against the order-service's counters"; fi
import json, re, sys
s = json.load(open(sys.argv[1]))
drawn = sum(v for v in s["requests_per_s"] if v is not None) * s["interval_ms"] / 1000
told = sum(float(m.group(1)) for m in re.finditer(
    r'^txc_http_request_duration_seconds_count\{method="POST",route="/orders",status="\d+"\} (\S+)$',
    open(sys.argv[2]).read(), re.M))
busy = [k for k, v in enumerate(s["requests_per_s"]) if v]
no_p99 = [k for k in busy if s["p99_ms"][k] is None]
p99s = [v for v in s["p99_ms"] if v is not None]
print(f"  series: {drawn:.0f} POST /orders drawn over {len(busy)} busy seconds, the service counted {told:.0f}; "
      f"max p99 {max(p99s, default=None)} ms")
assert told > 0 and abs(drawn - told) < 0.5, (drawn, told)
assert not no_p99, no_p99
EOF

nodes_up=$(q "$TC_PG_URL" "SELECT count(*) FROM tc_cluster_nodes() WHERE state = 'up'")
leader=$(q "$TC_PG_URL" "SELECT node_id FROM tc_cluster_nodes() WHERE is_leader")
stock_sums=$(q "$STOCK_PG_URL" "SELECT sum(stock)||' '||sum(frozen_count)||' '||sum(sold_count)||' '||sum(stock-frozen_count-sold_count) FROM activity_ticket_bucket WHERE activity_id = $act")
buckets=$(q "$STOCK_PG_URL" "SELECT string_agg(ticket_type||':'||bucket_id||':'||stock||':'||frozen_count||':'||sold_count||':'||(stock-frozen_count-sold_count), ' ' ORDER BY ticket_type, bucket_id) FROM activity_ticket_bucket WHERE activity_id = $act")
orders=$(q "$ORDERS_PG_URL" "SELECT count(*) FILTER (WHERE status='UNPAID')||' '||count(*) FILTER (WHERE status='PAID')||' '||count(*) FILTER (WHERE status IN ('CANCELLED','EXPIRED')) FROM trade_order WHERE activity_id = $act")

if python3 - "$tmp" "$act" "$nodes_up" "$leader" "$stock_sums" "$buckets" "$orders" "$xid" <<'EOF'; then ok "the DOM shows the databases' numbers"; else fail "the DOM against the databases"; fi
import sys
from html.parser import HTMLParser

tmp, act, nodes_up, leader, stock_sums, buckets, orders, xid = sys.argv[1:]

class Dom(HTMLParser):
    """data-k cells: (key, attrs) -> text; rows with data-xid."""
    def __init__(self):
        super().__init__()
        self.cells, self.stack, self.xids, self.charts, self.ready = [], [], [], {}, False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-ready") == "1":
            self.ready = True
        if "data-chart" in a:
            self.charts[a["data-chart"]] = int(a.get("data-points", "0"))
        if "data-xid" in a:
            self.xids.append(a["data-xid"])
        self.stack.append((tag, a, []))
    def handle_data(self, d):
        if self.stack:
            self.stack[-1][2].append(d)
    def handle_endtag(self, tag):
        while self.stack:
            t, a, text = self.stack.pop()
            if "data-k" in a:
                self.cells.append((a["data-k"], a, "".join(text).strip()))
            if self.stack:
                self.stack[-1][2].extend(text)
            if t == tag:
                break

def load(name):
    d = Dom()
    d.feed(open(f"{tmp}/{name}.html").read())
    assert d.ready, f"{name}: the page never set data-ready"
    return d

def cell(d, key, **attrs):
    for k, a, text in d.cells:
        if k == key and all(a.get(n) == v for n, v in attrs.items()):
            return text
    raise AssertionError(f"no cell {key} {attrs}")

o = load("overview")
n_up = cell(o, "nodes_up").split(" / ")[0]
assert n_up == nodes_up, (n_up, nodes_up)
assert cell(o, "leader") == f"node {leader}", (cell(o, "leader"), leader)
print(f"  overview: {n_up} nodes up, leader node {leader}")

s = load("sale")
stock, frozen, sold, avail = stock_sums.split()
got = [cell(s, k) for k in ("total_stock", "total_frozen", "total_sold", "total_available")]
assert got == [stock, frozen, sold, avail], (got, stock_sums)
for b in buckets.split():
    t, bid, *vals = b.split(":")
    row = [cell(s, k, **{"data-type": t, "data-bucket": bid}) for k in ("stock", "frozen", "sold", "available")]
    assert row == vals, (b, row)
unpaid, paid, ended = orders.split()
got = [cell(s, k) for k in ("orders_UNPAID", "orders_PAID", "orders_ended")]
assert got == [unpaid, paid, ended], (got, orders)
print(f"  sale {act}: stock {stock} frozen {frozen} sold {sold} available {avail}; "
      f"orders unpaid {unpaid} paid {paid} ended {ended}; {len(buckets.split())} buckets equal")
pts = s.charts
assert pts.get("orders per second", 0) > 0 and pts.get("latency of POST /orders", 0) > 0 and pts.get("tickets", 0) > 0, pts
print(f"  charts drawn with points: {pts}")

live = load("sale-live")
g = load("globals")
print("  during the sale: globals page said", cell(g, "globals_count"))
h = load("history")
assert xid in h.xids, (xid, h.xids[:3])
print(f"  history finds {xid}")
l = load("locks")
cell(l, "locks_count")
EOF

# Screenshots: PNGs that are not blank (FIELD-NOTES-2 7: no fonts = white and rc 0).
if python3 - "$artifacts" <<'EOF'; then ok "screenshots are not blank ($artifacts)"; else fail "screenshots"; fi
import struct, sys, zlib, os
def pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (path, depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * bpp
    colours, dark, prev = set(), 0, bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):  # undo the PNG filters
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1: line[x] = (line[x] + a) & 255
            elif f == 2: line[x] = (line[x] + b) & 255
            elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, bpp * 7):
            px = tuple(line[x:x + 3]); colours.add(px)
            if sum(px) < 200: dark += 1
        prev = line
    return w, h, len(colours), dark
for name in ("overview", "globals", "locks", "history", "sale", "report"):
    p = os.path.join(sys.argv[1], name + ".png")
    w, h, ncol, dark = pixels(p)
    print(f"  {name}.png {w}x{h}: {ncol} colours, {dark} dark samples")
    assert ncol >= 8 and dark > 100, (name, ncol, dark)
EOF

echo "test_console: $failures failure(s); screenshots in $artifacts"
[[ $failures -eq 0 ]]
