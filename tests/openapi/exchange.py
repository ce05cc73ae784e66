#!/usr/bin/python3
"""exchange.py - real requests to the running demo services, each answer
recorded (JSON lines: method, path, status, headers, body) for
openapi_check.py check, and the conventions the document promises checked
on the way (Location of a 201 leads to the order, a replay carries
Idempotent-Replayed, an unknown activity is 404, a held key is 409 with
Retry-After, a Redis that does not answer is 503 with Retry-After).

Usage: exchange.py OUTDIR ACTIVITY_SMALL ACTIVITY_BIG
  ACTIVITY_SMALL: on sale, one ticket type (1), 4 tickets, limit 2, loaded
  into Redis; ACTIVITY_BIG: the same with 100 tickets (stock-service's own
  calls).  Environment: ORDER_URL, STOCK_URL, EVENTS_URL, REDIS_URL,
  TXC_SERVICE_KEY_FILE, TXC_ADMIN_TOKEN_FILE (as tests/integration/
  test_openapi.sh sets them).  Writes OUTDIR/order-service.jsonl,
  stock-service.jsonl, event-consumers.jsonl.  Exit 1 when an answer was
  not the one expected.
"""
import hashlib
import hmac
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse

failures = 0


def note(ok, what):
    global failures
    if ok:
        print("ok - %s" % what)
    else:
        failures += 1
        print("FAILED - %s" % what)


class Service:
    """One service: its calls, each answer recorded."""

    def __init__(self, name, url, outdir):
        u = urllib.parse.urlsplit(url)
        self.name, self.host, self.port = name, u.hostname, u.port
        self.out = open(os.path.join(outdir, name + ".jsonl"), "w", encoding="utf-8")

    def call(self, method, path, body=None, headers=None, raw=None):
        """(status, headers with lower-case names, parsed body or text)."""
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        h = dict(headers or {})
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=20)
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            text = r.read().decode("utf-8", "replace")
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            status = r.status
        finally:
            conn.close()
        self.out.write(json.dumps({"method": method, "path": path, "status": status, "headers": hdrs,
                                   "body": text}) + "\n")
        self.out.flush()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return status, hdrs, parsed

    def expect(self, what, want, method, path, **kw):
        status, hdrs, body = self.call(method, path, **kw)
        wants = want if isinstance(want, tuple) else (want,)
        err = body.get("error") if isinstance(body, dict) else None
        note(status in wants, "%s %s %s: %s (%d%s)" % (self.name, method, path, what, status,
                                                       " " + err if err else ""))
        return status, hdrs, body


def sign(key, method, path, xid, extra, body):
    """order-service's X-Txc-Signature (examples/svc_auth.h)."""
    m = hmac.new(key, digestmod=hashlib.sha512)
    for part in (method, path, xid or "", extra or "", body):
        b = part.encode() if isinstance(part, str) else part
        m.update(len(b).to_bytes(8, "little"))
        m.update(b)
    return m.digest()[:32].hex()


def signed(key, path, body, xid=None, local=False):
    """Headers and raw body of a signed POST to stock-service."""
    raw = json.dumps(body) if not isinstance(body, str) else body
    h = {"X-Txc-Signature": sign(key, "POST", path, xid, "X-Txc-Local: 1" if local else "", raw)}
    if xid:
        h["X-Txc-Xid"] = xid
    if local:
        h["X-Txc-Local"] = "1"
    return {"headers": h, "raw": raw}


def redis(*args):
    return subprocess.run(["redis-cli", "-u", os.environ["REDIS_URL"], *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def order_service(o, a_small, admin):
    a = a_small
    unknown = 900000000 + a
    buy = lambda user, qty, act=a: {"activity": act, "ticket_type": 1, "user": user, "qty": qty}  # noqa: E731

    st, h, b = o.expect("an order: 201", 201, "POST", "/orders", body=buy(1, 1), headers={"Idempotency-Key": "oa-1"})
    oid, tok = (b.get("order_id"), b.get("order_token")) if isinstance(b, dict) else (None, None)
    note(h.get("location") == "/orders/%s" % oid, "the 201's Location is the order (%s)" % h.get("location"))
    bearer = {"Authorization": "Bearer %s" % tok}
    st, h2, b2 = o.expect("the same key again: the same 201", 201, "POST", "/orders", body=buy(1, 1),
                          headers={"Idempotency-Key": "oa-1"})
    note(h2.get("idempotent-replayed") == "true" and h2.get("location") == h.get("location") and b2 == b,
         "  replayed (Idempotent-Replayed: %s), same body and Location" % h2.get("idempotent-replayed"))
    o.expect("the key for another purchase: 422", 422, "POST", "/orders", body=buy(1, 2),
             headers={"Idempotency-Key": "oa-1"})
    o.expect("the order at its Location: 200", 200, "GET", h.get("location") or "/orders/0", headers=bearer)
    o.expect("without the order's token: 401", 401, "GET", "/orders/%s" % oid)
    o.expect("another order's token: 403", 403, "GET", "/orders/%s" % oid, headers={"Authorization": "Bearer " + "0" * 64})
    o.expect("an unknown order: 404", 404, "GET", "/orders/999999999", headers=bearer)
    o.expect("over the user's limit: 409 rejected", 409, "POST", "/orders", body=buy(1, 2))
    st, _, b = o.expect("an unknown activity: 404, not 503", 404, "POST", "/orders", body=buy(1, 1, unknown))
    o.expect("a truncated body: 400", 400, "POST", "/orders", raw='{"activity": 1')
    o.expect("qty 0: 400", 400, "POST", "/orders", body=buy(1, 0))
    o.expect("an array: 400", 400, "POST", "/orders", body=["x"])
    o.expect("a malformed Idempotency-Key: 400", 400, "POST", "/orders", body=buy(1, 1),
             headers={"Idempotency-Key": "no spaces"})
    o.expect("a body over 16384 bytes: 413", 413, "POST", "/orders", raw='{"pad":"%s"}' % ("x" * 20000))
    o.expect("GET /orders: 405", 405, "GET", "/orders")
    o.expect("DELETE an order: 405", 405, "DELETE", "/orders/%s" % oid)
    o.expect("POST /healthz: 405", 405, "POST", "/healthz", body={})
    o.expect("an unknown path: 404", 404, "GET", "/nowhere")
    o.expect("order 0 is no order id: 404", 404, "GET", "/orders/0")
    o.expect("pay: 200", 200, "POST", "/orders/%s/pay" % oid, headers=bearer)
    o.expect("pay again: 409 bad_state", 409, "POST", "/orders/%s/pay" % oid, headers=bearer)
    o.expect("cancel a paid order: 409 bad_state", 409, "POST", "/orders/%s/cancel" % oid, headers=bearer)
    st, _, b = o.expect("a second order: 201", 201, "POST", "/orders", body=buy(2, 1))
    o2 = b.get("order_id") if isinstance(b, dict) else 0
    tok2 = b.get("order_token") if isinstance(b, dict) else ""
    o.expect("cancel: 200", 200, "POST", "/orders/%s/cancel" % o2, headers={"Authorization": "Bearer %s" % tok2})
    o.expect("the rest: 201", 201, "POST", "/orders", body=buy(3, 2))
    o.expect("sold out: 409 rejected", 409, "POST", "/orders", body=buy(4, 2))
    o.expect("the waitlist: 202", 202, "POST", "/activities/%d/waitlist" % a, body={"user": 5, "ticket_type": 1})
    o.expect("the waitlist without a user: 400", 400, "POST", "/activities/%d/waitlist" % a, body={"ticket_type": 1})
    o.expect("the waitlist of an unknown activity: 404", 404, "POST", "/activities/%d/waitlist" % unknown,
             body={"user": 5, "ticket_type": 1})
    tickets = "/activities/%d/tickets" % a
    st, h, _ = o.expect("more tickets without the admin credential: 401", 401, "POST", tickets,
                        body={"ticket_type": 1, "qty": 2, "key": "t-1"})
    adm = {"Authorization": "Bearer " + admin}
    o.expect("more tickets, a bad body: 400", 400, "POST", tickets, body={"ticket_type": 1}, headers=adm)
    o.expect("more tickets: 200", 200, "POST", tickets, body={"ticket_type": 1, "qty": 2, "key": "t-1"}, headers=adm)
    o.expect("the same key, another qty: 409 key_reused", 409, "POST", tickets,
             body={"ticket_type": 1, "qty": 3, "key": "t-1"}, headers=adm)
    o.expect("an unknown ticket type: 404 no_buckets", 404, "POST", tickets,
             body={"ticket_type": 9, "qty": 3, "key": "t-2"}, headers=adm)
    o.expect("more tickets of an unknown activity: 404 unknown_activity", 404, "POST",
             "/activities/%d/tickets" % unknown, body={"ticket_type": 1, "qty": 2, "key": "t-3"}, headers=adm)
    o.expect("healthz: 200", 200, "GET", "/healthz")
    o.expect("metrics: 200", 200, "GET", "/metrics")
    o.expect("the mode without a credential: 401", 401, "GET", "/admin/mode")
    o.expect("the mode: 200", 200, "GET", "/admin/mode", headers=adm)
    o.expect("a bad mode: 400", 400, "POST", "/admin/mode", body={"mode": "sideways"}, headers=adm)
    o.expect("mode auto: 200", 200, "POST", "/admin/mode", body={"mode": "auto", "operator": "openapi"}, headers=adm)
    o.expect("PUT /admin/mode: 405", 405, "PUT", "/admin/mode", body={}, headers=adm)
    # a key another request holds (it died holding it): 409 in_progress
    redis("SET", "txc:idem:{7}:oa-held", "pending", "EX", "60")
    st, h, _ = o.expect("a key held by another request: 409 in_progress", 409, "POST", "/orders", body=buy(7, 1),
                        headers={"Idempotency-Key": "oa-held"})
    note(h.get("retry-after") == "1", "  with Retry-After: %s" % h.get("retry-after"))
    # Redis does not answer (paused longer than the prefilter waits): 503
    redis("CLIENT", "PAUSE", "1500", "ALL")
    st, h, _ = o.expect("Redis paused: 503", 503, "POST", "/orders", body=buy(8, 1))
    note(h.get("retry-after") == "1", "  with Retry-After: %s" % h.get("retry-after"))
    redis("PING")  # a paused Redis answers it when the pause ends: wait for that, not for a fixed time


def stock_service(s, a_big, key, admin):
    a = a_big
    unknown = 900000000 + a
    oid = 8000000000000 + os.getpid()
    freeze = {"order_id": oid, "activity": a, "ticket_type": 1, "bucket": 0, "qty": 1, "user": 99,
              "deadline_ms": int(time.time() * 1000) + 600000}
    s.expect("an unsigned freeze: 401", 401, "POST", "/freeze", body=freeze)
    s.expect("a forged signature: 401", 401, "POST", "/freeze", body=freeze,
             headers={"X-Txc-Signature": "0" * 64, "X-Txc-Local": "1"})
    s.expect("a body that is no JSON object: 400", 400, "POST", "/freeze", **signed(key, "/freeze", "[1]", xid="x"))
    s.expect("a freeze without its fields: 400", 400, "POST", "/freeze",
             **signed(key, "/freeze", {"order_id": oid}, xid="x"))
    st, _, b = s.expect("a local-mode freeze: 200", 200, "POST", "/freeze",
                        **signed(key, "/freeze", freeze, local=True))
    st, _, b = s.expect("the same local freeze again: 200", 200, "POST", "/freeze",
                        **signed(key, "/freeze", freeze, local=True))
    note(isinstance(b, dict) and b.get("before") is True, "  frozen before: %s" % (b.get("before") if isinstance(b, dict) else b))
    s.expect("a freeze of a global transaction nobody began: 409 or 503", (409, 503), "POST", "/freeze",
             **signed(key, "/freeze", dict(freeze, order_id=oid + 1), xid="127.0.0.1:1:424242"))
    s.expect("a confirm without its xid: 400", 400, "POST", "/confirm", **signed(key, "/confirm", {"order_id": oid}))
    s.expect("a confirm of an unknown order: 404", 404, "POST", "/confirm",
             **signed(key, "/confirm", {"order_id": oid + 2}, xid="127.0.0.1:1:424243"))
    s.expect("a release with a bad reason: 400", 400, "POST", "/release",
             **signed(key, "/release", {"order_id": oid, "reason": "whim"}, xid="127.0.0.1:1:424244"))
    s.expect("a release of a global transaction nobody began: 409 or 503", (409, 503), "POST", "/release",
             **signed(key, "/release", {"order_id": oid, "reason": "cancel"}, xid="127.0.0.1:1:424245"))
    t = {"activity": a, "ticket_type": 1, "qty": 5, "key": "s-1", "operator": "openapi"}
    s.expect("more tickets: 200", 200, "POST", "/tickets", **signed(key, "/tickets", t))
    s.expect("the same again: 200", 200, "POST", "/tickets", **signed(key, "/tickets", t))
    s.expect("the key, another qty: 409", 409, "POST", "/tickets", **signed(key, "/tickets", dict(t, qty=6)))
    s.expect("an unknown activity: 404", 404, "POST", "/tickets",
             **signed(key, "/tickets", dict(t, activity=unknown)))
    st, _, b = s.expect("the activity: 200", 200, "GET", "/activities/%d" % a)
    s.expect("an unknown activity: 404", 404, "GET", "/activities/%d" % unknown)
    s.expect("POST to an activity: 405", 405, "POST", "/activities/%d" % a, body={})
    s.expect("GET /freeze: 405", 405, "GET", "/freeze")
    s.expect("an unknown path: 404", 404, "GET", "/nowhere")
    s.expect("healthz: 200", 200, "GET", "/healthz")
    s.expect("metrics: 200", 200, "GET", "/metrics")
    s.expect("the mode without a credential: 401", 401, "GET", "/admin/mode")
    s.expect("the mode: 200", 200, "GET", "/admin/mode", headers={"Authorization": "Bearer " + admin})


def event_consumers(e):
    e.expect("healthz: 200", 200, "GET", "/healthz")
    e.expect("metrics: 200", 200, "GET", "/metrics")
    e.expect("POST /metrics: 405", 405, "POST", "/metrics", body={})
    e.expect("an unknown path: 404", 404, "GET", "/nowhere")


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    outdir, a_small, a_big = argv[1], int(argv[2]), int(argv[3])
    with open(os.environ["TXC_SERVICE_KEY_FILE"], encoding="ascii") as f:
        key = bytes.fromhex(f.readline().strip())
    with open(os.environ["TXC_ADMIN_TOKEN_FILE"], encoding="ascii") as f:
        admin = f.readline().strip()
    order_service(Service("order-service", os.environ["ORDER_URL"], outdir), a_small, admin)
    stock_service(Service("stock-service", os.environ["STOCK_URL"], outdir), a_big, key, admin)
    event_consumers(Service("event-consumers", os.environ["EVENTS_URL"], outdir))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
