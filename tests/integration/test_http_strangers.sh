#!/usr/bin/env bash
# test_http_strangers.sh - tcd's /healthz, /readyz and /metrics keep
# answering while 64 strangers dribble headers (security review, finding
# 5; issue 20).
#
# Usage: scripts/with-servers --pg -- tests/integration/test_http_strangers.sh
#
# A tcd with metrics.listen on 127.0.0.1; 64 sockets from 127.0.0.1 each
# send a request line and then one header byte a second for 12 s (a
# slowloris that never trips an idle timeout); meanwhile a probe from
# another address (127.0.0.2) asks /healthz every second: every probe must
# get 200 within 2 s.  And one address gets at most its share of the
# connections: of the 64 slow ones, most were refused.  Then 64 strangers
# from 64 addresses dribble the same way: the total deadline of a
# request's arrival cuts each within seconds, the probes answer meanwhile.
set -euo pipefail

TEST_NAME=test_http_strangers
# shellcheck source=tests/integration/proc_harness.sh
. "$(dirname "$0")/proc_harness.sh"
mport=$(free_port)
tcd_ini "$tmp/tcd.ini" "[metrics]" "listen = 127.0.0.1:$mport"
"$bin/tcd" -c "$tmp/tcd.ini" 2>"$tmp/tcd.log" &
pids+=($!)
python3 - "$mport" <<'PY'
import socket, sys, threading, time
port = int(sys.argv[1])

def probe(src):
    t0 = time.monotonic()
    try:
        s = socket.socket()
        s.settimeout(2)
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
        s.close()
        return data.split(b"\r\n", 1)[0].decode(errors="replace"), time.monotonic() - t0
    except OSError as e:
        return "error: %s" % e, time.monotonic() - t0

for _ in range(100):  # tcd up and serving /healthz
    line, _ = probe("127.0.0.1")
    if " 200 " in line or " 503 " in line:
        break
    time.sleep(0.1)
else:
    sys.exit("tcd's /healthz never answered")

slow, refused = [], 0
for i in range(64):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        slow.append(s)
    except OSError:
        refused += 1
stop = time.monotonic() + 12

def dribble():
    while time.monotonic() < stop:
        for s in list(slow):
            try:
                s.sendall(b"X")
            except OSError:
                slow.remove(s)
        time.sleep(1)

th = threading.Thread(target=dribble)
th.start()
time.sleep(0.5)
results = []
while time.monotonic() < stop - 1:
    results.append(probe("127.0.0.2"))
    time.sleep(1)
th.join()
alive = len(slow)
bad = [r for r in results if not (" 200 " in r[0] or " 503 " in r[0]) or r[1] > 2]
print("probes from 127.0.0.2: %d, failed or slow: %d %s" % (len(results), len(bad), bad[:3]))
print("slow connections from 127.0.0.1: 64 tried, %d still open at the end, %d refused at connect" % (alive, refused))
ok = True
if not results or bad:
    print("FAILED - /healthz did not answer every probe within 2 s while 64 strangers dribbled headers")
    ok = False
else:
    print("ok - /healthz answered every probe within 2 s")
if alive > 8:
    print("FAILED - one address kept %d connections (the per-address cap is 8)" % alive)
    ok = False
else:
    print("ok - one address kept at most its share (%d)" % alive)
for s in slow:
    s.close()

# Phase 2: 64 strangers from 64 addresses (the per-address cap does not
# stop them), each sending a header byte every second, so that the idle
# timeout never fires: the total deadline of a request's arrival (5 s
# from connect) cuts every one, and the probes answer meanwhile.
many = []
for i in range(64):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.bind(("127.0.1.%d" % (i + 1), 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        many.append((s, time.monotonic()))
    except OSError as e:
        print("FAILED - stranger %d could not connect: %s" % (i, e))
        ok = False
cut_after = []
results = []
t_end = time.monotonic() + 10
while many and time.monotonic() < t_end:
    for s, t0 in list(many):
        try:
            s.sendall(b"X")
            s.setblocking(False)
            try:
                if s.recv(64) == b"":
                    raise ConnectionResetError("closed")
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
                s.settimeout(2)
        except OSError:
            cut_after.append(time.monotonic() - t0)
            many.remove((s, t0))
            s.close()
    results.append(probe("127.0.0.2"))
    time.sleep(1)
bad = [r for r in results if not (" 200 " in r[0] or " 503 " in r[0]) or r[1] > 2]
if many or bad:
    print("FAILED - of 64 strangers from 64 addresses %d still connected after 10 s; probes failed: %s"
          % (len(many), bad[:3]))
    ok = False
else:
    print("ok - 64 strangers from 64 addresses cut after %.1f-%.1f s (deadline 5 s); %d probes answered"
          % (min(cut_after), max(cut_after), len(results)))
    if max(cut_after) > 8:
        print("FAILED - a stranger lasted %.1f s (deadline 5 s)" % max(cut_after))
        ok = False
sys.exit(0 if ok else 1)
PY
