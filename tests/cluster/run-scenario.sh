#!/usr/bin/env bash
# run-scenario.sh - start a local cluster (cluster/local/up), run a test
# program against it with the cluster's environment, stop the cluster.
#
# Usage: tests/cluster/run-scenario.sh PROGRAM [ARGS...]
#
# PROGRAM is run as is (a path, or a name found in $TX_BIN_DIR).  The
# cluster is stopped whatever happens (and, through 'up --watch', even if
# this script is killed).  On failure the end of each node's log is
# printed and the cluster directory is kept for a post-mortem.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export TX_SOURCE_DIR=${TX_SOURCE_DIR:-$root}
[[ $# -ge 1 ]] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
prog=$1; shift
if [[ $prog != */* ]]; then
  prog=${TX_BIN_DIR:?TX_BIN_DIR must be set}/$prog
fi

unset CLUSTER_DIR # a fresh temporary directory, removed by down
out=$("$root/cluster/local/up" --watch $$) || { echo "run-scenario: the cluster did not start" >&2; exit 1; }
eval "$out"
echo "run-scenario: cluster in $CLUSTER_DIR (nodes $TC_NODES)"

# shellcheck disable=SC2317  # invoked by trap
finish() {
  local rc=$?
  trap - EXIT
  if [[ $rc -ne 0 ]]; then
    for f in "$CLUSTER_DIR"/node*.log; do
      echo "--- last warnings of $f"
      grep -E '"level":"(warn|error)"' "$f" | tail -n 15 || true
      tail -n 3 "$f"
    done
    echo "run-scenario: failed ($rc); cluster directory kept: $CLUSTER_DIR"
    KEEP=1 "$root/cluster/local/down" "$CLUSTER_DIR" || true
  else
    "$root/cluster/local/down" "$CLUSTER_DIR" || true
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$prog" "$@"
