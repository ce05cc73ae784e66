#!/usr/bin/env bash
# test_systemd.sh - tcd under systemd's notify protocol, without systemd
# (issue 27): a datagram socket stands in for systemd's NOTIFY_SOCKET.
#
#   1. tcd with NOTIFY_SOCKET and WATCHDOG_USEC=400000: READY=1 with its
#      STATUS once it serves (the port answers by then), WATCHDOG=1 every
#      ~200 ms, STOPPING=1 on SIGTERM, exit 0;
#   2. a tcd whose store does not answer never says READY=1 (exit 69);
#   3. the installed unit tcd@.service: `systemd-analyze verify` says
#      nothing against it, and it runs tcd Type=notify with the watchdog
#      and the hardening options; tmpfiles.d makes /run/txc for the
#      admin sockets.
#
# Needs TX_BIN_DIR, TX_BUILD_DIR and TC_PG_URL (scripts/with-servers --pg).
set -euo pipefail

TEST_NAME=test_systemd
# shellcheck source=tests/integration/proc_harness.sh
. "$(dirname "$0")/proc_harness.sh"
build=${TX_BUILD_DIR:?TX_BUILD_DIR not set}

# listen SOCKET OUT: systemd's side, every datagram a line "<unix ms> <text>"
listen() {
  python3 - "$1" "$2" <<'EOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        d = s.recv(4096).decode(errors="replace").replace("\n", "|")
        out.write("%d %s\n" % (time.time() * 1000, d))
EOF
  pids+=($!)
  wait_for 5 test -S "$1"
}
count() { grep -c -- "$2" "$1" 2>/dev/null || true; }

tcd_ini "$tmp/tcd.ini"

# --- 1. ready, watchdog, stopping ---
listen "$tmp/notify" "$tmp/got"
NOTIFY_SOCKET=$tmp/notify WATCHDOG_USEC=400000 env -u TC_NODES "$bin/tcd" -c "$tmp/tcd.ini" 2>>"$tmp/tcd.log" &
tcd=$!
pids+=("$tcd")
check "READY=1 with its status" wait_for 20 grep -q "READY=1|STATUS=node 1 serving on 127.0.0.1:$port" "$tmp/got"
check "  the port answers once READY was said" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"
check "WATCHDOG=1 comes again and again" wait_for 10 bash -c "[ \$(grep -c WATCHDOG=1 '$tmp/got') -ge 4 ]"
# every half period (200 ms of WATCHDOG_USEC=400000): the first four pings
# span at least 3 x 150 ms (not a flood) and at most 3 x 400 ms plus slack
span=$(grep WATCHDOG=1 "$tmp/got" | head -4 | awk 'NR == 1 {a = $1} {b = $1} END {print b - a}')
check "  spaced at half the period: 4 pings over $span ms" test "$span" -ge 450 -a "$span" -le 2000
kill -TERM "$tcd"
rc=0
wait "$tcd" || rc=$?
check "SIGTERM: exit 0" test "$rc" = 0
check "  STOPPING=1 said" grep -q "STOPPING=1" "$tmp/got"
check "  no WATCHDOG=1 after STOPPING=1" \
  bash -c "awk '/STOPPING=1/ {s=1; next} s && /WATCHDOG=1/ {bad=1} END {exit bad}' '$tmp/got'"

# --- 2. a store that does not answer: never ready ---
listen "$tmp/notify2" "$tmp/got2"
dead=$(free_port)
rc=0
NOTIFY_SOCKET=$tmp/notify2 env -u TC_NODES timeout 60 "$bin/tcd" -c "$tmp/tcd.ini" \
  -s "store.pg_url=postgresql://127.0.0.1:$dead/tc?connect_timeout=2" 2>>"$tmp/tcd2.log" || rc=$?
check "no store: tcd exits 69 ($rc)" test "$rc" = 69
check "  without saying READY=1" test "$(count "$tmp/got2" READY=1)" = 0

# --- 3. the unit ---
root=$tmp/root
DESTDIR=$root cmake --install "$build" --prefix /usr --component server >/dev/null
unit=$root/usr/lib/systemd/system/tcd@.service
check "the unit is installed" test -f "$unit"
check "  it runs the installed tcd on /etc/txc/<instance>.ini" grep -qx 'ExecStart=/usr/sbin/tcd -c /etc/txc/%i.ini' "$unit"
for want in Type=notify WatchdogSec=10s NoNewPrivileges=yes ProtectSystem=strict 'ExecReload=/bin/kill -HUP $MAINPID'; do
  check "  $want" grep -qx -- "$want" "$unit"
done
if command -v systemd-analyze >/dev/null; then
  # verify against this build's tcd (the unit's own path is the install's)
  sed "s|^ExecStart=/usr/sbin/tcd|ExecStart=$bin/tcd|" "$unit" >"$tmp/tcd@.service"
  out=$(systemd-analyze verify --man=no "$tmp/tcd@.service" 2>&1) || true
  check "systemd-analyze verify says nothing${out:+: $out}" test -z "$out"
else
  fail "systemd-analyze is not installed (scripts/deps installs systemd)"
fi
check "tmpfiles.d: /run/txc for the admin sockets" \
  grep -qx 'd /run/txc 0750 txc txc -' "$root/usr/lib/tmpfiles.d/txc.conf"

checks_done
