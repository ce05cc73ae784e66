#!/usr/bin/env bash
# test_local_metrics.sh - the local cluster serves /metrics on every node
# (issue 27): cluster/local/up writes a [metrics] listen per node and
# exports TC_METRICS_URLS; cluster/local/node still finds each node's
# server port (its helper read both "listen =" lines before); and tcctl
# across the cluster: stats --all, history, --watch.
#
# Needs TX_BIN_DIR and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_local_metrics
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"

harness_cluster_up
IFS=, read -r -a urls <<<"${TC_METRICS_URLS:-}"
IFS=, read -r -a nodes <<<"$TC_NODES"
check "TC_METRICS_URLS: one URL per node (${#urls[@]} for ${#nodes[@]})" test "${#urls[@]}" = "${#nodes[@]}" -a "${#urls[@]}" -gt 0
for i in "${!urls[@]}"; do
  page=$(curl -s --max-time 5 "${urls[$i]}" || true)
  check "node $((i + 1)): ${urls[$i]} serves the coordinator's metrics" \
    bash -c 'grep -q "^txc_" <<<"$1" && grep -q "^# HELP " <<<"$1"' _ "$page"
  check "  and the process_* families (CPU, memory, file descriptors, start time)" \
    bash -c 'for f in process_cpu_seconds_total process_resident_memory_bytes process_open_fds process_start_time_seconds; do
      grep -q "^$f [0-9]" <<<"$1" || exit 1; done' _ "$page"
done
port2=${nodes[1]##*:}
ctl() { "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock" "$@"; }

# Some finished transactions, begun on the nodes tc-bench spreads over.
"$bin/tc-bench" --clients 2 --duration 1 --warmup 0 --baseline-duration 0.2 --rounds 1 >"$tmp/bench.out" 2>&1 || true
check "stats --all: every node answers (exit 0)" ctl stats --all
ctl stats --all >"$tmp/all.txt" || true
check "  one column per node and a TOTAL" bash -c 'head -1 "$1" | grep -Eq "^COUNTER +NODE 1 +NODE 2 +NODE 3 +TOTAL$"' _ "$tmp/all.txt"
check "  TOTAL is the sum of the nodes' own stats (globals.begun, admin.requests aside)" python3 - "$bin/tcctl" "$CLUSTER_DIR" <<'PY'
import json, subprocess, sys
tcctl, d = sys.argv[1], sys.argv[2]
a = json.loads(subprocess.run([tcctl, "--socket", d + "/node1.sock", "--json", "stats", "--all"],
                              capture_output=True, text=True).stdout)
assert a["unreachable"] == 0 and len(a["nodes"]) == 3, a
per = [n["stats"]["globals"]["begun"] for n in a["nodes"]]
assert sum(per) == a["total"]["globals"]["begun"] > 0, (per, a["total"]["globals"])
assert sum(1 for p in per if p > 0) >= 2, per  # spread over the nodes
assert "batch_ms_avg" not in a["total"]["store"], a["total"]["store"]  # averages are not summed
PY
check "history: the finished transactions, latest first" \
  bash -c '"$@" history --since 5m --status Committed --limit 5 | grep -Eq "^[^ ]+ +Committed +20[0-9-]+T.* bench +2$"' _ "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
xid=$(ctl --json history --limit 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["history"][0]["xid"])')
check "  --xid finds one ($xid)" bash -c 'x=$1; shift; [ "$("$@" --json history --xid "$x" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"count\"])")" = 1 ]' _ "$xid" "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
check "  nothing ended before 2000" bash -c '"$@" history --until 2000-01-01 | grep -q "^0 finished transactions"' _ "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
check "  a bad time is a usage error (2)" bash -c '"$@" history --since 2026-02-31; [ $? = 2 ]' _ "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
check "--watch 0.2 --count 3 nodes: three rounds, each with its header" \
  bash -c '[ "$("$@" --watch 0.2 --count 3 nodes | grep -c "^every 0.2s: tcctl nodes")" = 3 ]' _ "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
check "  --watch refuses a repair (2)" bash -c '"$@" --watch 1 rollback x:1:2; [ $? = 2 ]' _ "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
pid2=$(cut -d, -f2 <<<"$TC_PIDS")
kill -STOP "$pid2"
ctl --timeout 2 stats --all >"$tmp/stalled.txt" 2>&1 && rc=0 || rc=$?
kill -CONT "$pid2"
check "stats --all with node 2 stopped: exit 1, node 2 named as not answering" \
  bash -c '[ "$1" = 1 ] && grep -q "^node 2: no answer" "$2" && grep -q "^2 of 3 nodes answered" "$2"' _ "$rc" "$tmp/stalled.txt"
node_state() { # N: its STATE in `tcctl nodes`, as node 1 sees it
  "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock" --json nodes |
    python3 -c 'import json,sys; print(next((n["state"] for n in json.load(sys.stdin)["nodes"] if n["node_id"] == int(sys.argv[1])), ""))' "$1"
}
check "tcctl nodes: node 2 is up" test "$(node_state 2)" = up
check "  the STATE column" bash -c "'$bin/tcctl' --socket '$CLUSTER_DIR/node1.sock' nodes | head -1 | grep -q '^NODE  STATE'"
"$src/cluster/local/node" kill 2 "$CLUSTER_DIR" >/dev/null
check "node 2 killed: no longer up at once (its store session is gone)" \
  wait_for 5 eval '[ "$(node_state 2)" != up ]'
check "  down once its heartbeat is older than the lease (5 s)" wait_for 15 eval '[ "$(node_state 2)" = down ]'
check "stats --all with node 2 down: not asked, exit 0" \
  bash -c '"$@" stats --all >"$0" && grep -q "^node 2: down" "$0"' "$tmp/down.txt" "$bin/tcctl" --socket "$CLUSTER_DIR/node1.sock"
"$src/cluster/local/node" start 2 "$CLUSTER_DIR" >/dev/null
check "node 2 restarted by cluster/local/node, on its server port $port2" \
  bash -c "exec 3<>/dev/tcp/127.0.0.1/$port2"
check "  and its metrics answer again" wait_for 10 eval 'curl -sf --max-time 2 "${urls[1]}" | grep -q "^txc_"'
check "  its configuration keeps two listen lines, server and metrics, apart" \
  test "$(grep -c '^listen = ' "$CLUSTER_DIR/node2.ini")" = 2

checks_done
