#!/usr/bin/env bash
# test_local_metrics.sh - the local cluster serves /metrics on every node
# (issue 27): cluster/local/up writes a [metrics] listen per node and
# exports TC_METRICS_URLS; cluster/local/node still finds each node's
# server port (its helper read both "listen =" lines before).
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
"$src/cluster/local/node" start 2 "$CLUSTER_DIR" >/dev/null
check "node 2 restarted by cluster/local/node, on its server port $port2" \
  bash -c "exec 3<>/dev/tcp/127.0.0.1/$port2"
check "  and its metrics answer again" wait_for 10 eval 'curl -sf --max-time 2 "${urls[1]}" | grep -q "^txc_"'
check "  its configuration keeps two listen lines, server and metrics, apart" \
  test "$(grep -c '^listen = ' "$CLUSTER_DIR/node2.ini")" = 2

if [[ $failures -ne 0 ]]; then
  echo "$TEST_NAME: $failures check(s) FAILED" >&2
  exit 1
fi
echo "$TEST_NAME: all checks passed"
