# shellcheck shell=bash
# cluster/local/lib.sh - helpers shared by cluster/local/up, down and node.
# Sourced, not run.  Expects $prog (the caller's name) and, where it says
# so, $DIR (the cluster directory).
# shellcheck disable=SC2154  # prog and DIR are the caller's

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

die() { echo "$prog: $*" >&2; exit 1; }

# Whether process $1 is alive: exists and is not a zombie.
alive() {
  local st
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  if [[ -r /proc/$1/stat ]]; then
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [[ ${st%% *} != [ZX] ]]
  else
    kill -0 "$1" 2>/dev/null
  fi
}

# Whether process $1 is stopped (SIGSTOP).
stopped() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st%% *} == T ]]
}

wait_gone() { # pid seconds
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    alive "$1" || return 0
    sleep 0.05
  done
  ! alive "$1"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Ports for the nodes come from outside the kernel's ephemeral range: a port
# that some client socket uses (or left in TIME_WAIT) as its local port
# cannot be bound by nanomsg, which has no SO_REUSEADDR for other owners.
port_range() {
  local lo=32768 hi=60999
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  if ((lo > 22000)); then
    echo "20000 $((lo - 1))"
  elif ((hi < 63000)); then
    echo "$((hi + 1)) 65535"
  else
    echo "20000 60000"
  fi
}
random_port() {
  local r
  read -r -a r <<<"$(port_range)"
  echo $((r[0] + ((RANDOM << 15) | RANDOM) % (r[1] - r[0] + 1)))
}

# A port nobody listens on and that is not in the list "$@".
free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$(random_port)
    [[ " $* " == *" $p "* ]] && continue
    port_busy "$p" && continue
    echo "$p"
    return 0
  done
  return 1
}

# The tcd binary: the one 'up' used for this cluster (DIR/tcd.bin), else
# $TX_BIN_DIR/tcd, else build/bin/tcd.
tcd_bin() {
  local b
  if [[ -n ${DIR:-} && -s $DIR/tcd.bin ]]; then
    b=$(cat "$DIR/tcd.bin")
  else
    b=${TX_BIN_DIR:-$root/build/bin}/tcd
  fi
  [[ -x $b ]] || die "no tcd binary at $b (run 'make build', or set TX_BIN_DIR)"
  echo "$b"
}

node_pid() { # N -> pid of node N if it runs
  local pid
  pid=$(cat "$DIR/node$1.pid" 2>/dev/null) || return 1
  alive "$pid" || return 1
  echo "$pid"
}

# ini_port N SECTION: the port of SECTION's "listen = HOST:PORT" in
# DIR/nodeN.ini ([server]: 127.0.0.1:PORT, or 0.0.0.0:PORT with
# TXC_EXTRA_LISTEN; [metrics]: 127.0.0.1:PORT).  Section-aware: both have a
# "listen" key.
ini_port() {
  awk -v want="[$2]" '/^\[/ { sec = $0; next }
    sec == want && $1 == "listen" && $2 == "=" { n = split($3, a, ":"); print a[n] }' "$DIR/node$1.ini"
}
node_port() { ini_port "$1" server; }
metrics_port() { ini_port "$1" metrics; }
# every port the nodes' configurations use (listen, bus, metrics)
used_ports() {
  local f
  for f in "$DIR"/node*.ini; do
    awk '/^\[/ { sec = $0; next } $1 == "listen" || $1 == "bus" { n = split($3, a, ":"); print a[n] }' "$f"
  done
}

psql_tc() { # SQL -> one value
  psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$TC_PG_URL" -c "$1" 2>/dev/null
}

# Start node N from DIR/nodeN.ini (log appended to DIR/nodeN.log); prints
# nothing; DIR/nodeN.pid gets the pid.
start_node() {
  local n=$1 bin pid
  bin=$(tcd_bin)
  {
    echo "--- $(date -u +%FT%TZ) cluster/local: starting node $n"
  } >>"$DIR/node$n.log"
  "$bin" -c "$DIR/node$n.ini" </dev/null >>"$DIR/node$n.log" 2>&1 &
  pid=$!
  echo "$pid" >"$DIR/node$n.pid"
}

# Start node N and wait until it is up; if its listen or bus port turned out
# to be taken (another program bound it between our probe and the node's
# bind), move it to another free port and try again (clients learn the new
# address from the export lines, the other nodes from node_table).
start_node_retrying() {
  local n=$1 attempt port used mark
  for attempt in 1 2 3 4 5; do
    mark=$(wc -l <"$DIR/node$n.log" 2>/dev/null || echo 0)
    start_node "$n"
    wait_node_up "$n" 2>"$DIR/node$n.start-err" && { rm -f "$DIR/node$n.start-err"; return 0; }
    ((attempt < 5)) || break
    mapfile -t used < <(used_ports)
    if tail -n +"$((mark + 1))" "$DIR/node$n.log" | grep -q 'could not bind the bus'; then
      port=$(free_port "${used[@]}") || break
      echo "$prog: node $n: bus port taken, moving it to $port" >&2
      sed -i "s|^bus = tcp://127.0.0.1:[0-9]*$|bus = tcp://127.0.0.1:$port|" "$DIR/node$n.ini"
      echo "--- (bus moved to port $port)" >>"$DIR/node$n.log"
      continue
    fi
    if tail -n +"$((mark + 1))" "$DIR/node$n.log" | grep -q 'could not listen on'; then
      port=$(free_port "${used[@]}") || break
      echo "$prog: node $n: listen port taken, moving it to $port" >&2
      # [server]'s listen only ([metrics] has one too)
      sed -i "/^\[server\]/,/^\[/ s|^listen = \([0-9.]*\):[0-9]*$|listen = \1:$port|; s|^advertise = 127.0.0.1:[0-9]*$|advertise = 127.0.0.1:$port|" \
        "$DIR/node$n.ini"
      echo "--- (listen moved to port $port)" >>"$DIR/node$n.log"
      continue
    fi
    break
  done
  cat "$DIR/node$n.start-err" >&2 2>/dev/null
  rm -f "$DIR/node$n.start-err"
  return 1
}

# Wait until node N serves (accepts connections) and is 'up' in tc_nodes;
# fails if the process exits or 30 s pass.
wait_node_up() {
  local n=$1 pid port i state
  pid=$(cat "$DIR/node$n.pid")
  port=$(node_port "$n")
  for ((i = 0; i < 600; i++)); do
    if ! alive "$pid"; then
      echo "$prog: node $n (pid $pid) exited at start-up; last lines of $DIR/node$n.log:" >&2
      tail -n 15 "$DIR/node$n.log" | sed 's/^/  /' >&2
      return 1
    fi
    if port_busy "$port"; then
      state=$(psql_tc "SELECT state FROM tc_nodes WHERE node_id = $n AND pid = $pid" || true)
      [[ $state == up ]] && return 0
    fi
    sleep 0.05
  done
  echo "$prog: node $n (pid $pid) did not come up within 30 s; see $DIR/node$n.log" >&2
  return 1
}

# Stop node N: SIGTERM (after SIGCONT if paused), SIGKILL after 10 s.
stop_node() {
  local n=$1 pid
  pid=$(node_pid "$n") || return 0
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" 10; then
    echo "$prog: node $n (pid $pid) did not stop within 10 s: SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 5 || true
  fi
}

load_env() { # the exports written by up
  [[ -f $DIR/cluster.env ]] || die "$DIR/cluster.env not found: is $DIR a cluster started by cluster/local/up?"
  # shellcheck disable=SC1091
  source "$DIR/cluster.env"
}
