#!/usr/bin/env bash
# Emulated nodes on one machine: K network namespaces joined by veth pairs to a private
# bridge, each with its own address, hostname and (optionally) a bandwidth-shaped link, so
# that Open MPI and Slurm run across real separate network stacks (ctest label `multinode`,
# docs/launching.md#emulated-nodes). All traffic stays inside the bridge of this machine.
#   tools/netns-cluster.sh up|down|status|exec|link|check ... [--nodes K] [--link-rate R]
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/netns-cluster.sh up|down|status|check [options]
       tools/netns-cluster.sh exec NODE CMD [ARGS...]
       tools/netns-cluster.sh link NODE up|down

  up       create (or update) K nodes: network namespaces PREFIX0 ... PREFIX(K-1), each
           with loopback up and eth0 = one end of a veth pair whose other end is on the
           bridge PREFIXbr; node i has address SUBNET.(i+1)/24 and, in every command run
           through `exec` or tools/netns-rsh, the hostname PREFIXi (a UTS namespace) and
           an /etc/hosts that names every node (a private mount namespace).
           The bridge itself has SUBNET.254, so that daemons of this (root) namespace,
           e.g. mpirun or slurmctld, reach the nodes.
           Running `up` again changes the link rate and adds missing nodes.
  down     remove every namespace, veth, bridge and hosts file of PREFIX (also what a
           failed `up` left); kills the processes still running inside the namespaces
  status   list the nodes, their addresses, link state and shaping; exit 1 if none
  check    exit 0 if network namespaces can be made here, else print why and exit 4
  exec     run CMD on NODE: in its network namespace, with its hostname
  link     set NODE's link (the bridge end of its veth, as if its switch port went down)
           down or up; its processes keep running but reach no other node

options
  --nodes K        number of nodes for `up` (default 2)
  --link-rate R    shape each node's link to R in each direction with tc's tbf qdisc
                   (tc rate units: 1gbit, 10gbit, 500mbit; `none`, the default, removes it)
  --tcp-retries N  net.ipv4.tcp_retries2 inside every node (default: the kernel's, 15,
                   which keeps retransmitting to a vanished peer for about 15 minutes; 5
                   gives up after about 12 s, so that a job whose node is cut off ends)
  --prefix NAME    node and interface name prefix (default rtnode; at most 9 characters)
  --subnet A.B.C   the /24 the nodes live on (default 10.77.0: a private range)
The defaults of --prefix and --subnet can also come from RINGTRAIN_NETNS_PREFIX and
RINGTRAIN_NETNS_SUBNET (slurm/local-cluster.sh --netns and the harness read them too).

Exit codes: 0 done, 1 bad usage, 2 a command failed, 4 namespaces cannot be created here
(not root, no `ip`, or the kernel refuses; the multinode tests then skip).
Open MPI across the nodes: tools/netns-rsh (docs/launching.md).
EOF
}

die() {
  echo "netns-cluster: error: $1" >&2
  exit "${2:-2}"
}
bad() {
  echo "netns-cluster: $*" >&2
  echo "run 'tools/netns-cluster.sh --help' for usage" >&2
  exit 1
}

cmd=${1:-}
[[ "$cmd" == -h || "$cmd" == --help ]] && { usage; exit 0; }
[[ -n "$cmd" ]] || bad "missing command (up, down, status, check, exec or link)"
shift
nodes=2
rate=none
tcp_retries=""
prefix=${RINGTRAIN_NETNS_PREFIX:-rtnode}
subnet=${RINGTRAIN_NETNS_SUBNET:-10.77.0}
exec_args=()
if [[ "$cmd" == exec ]]; then
  [[ $# -ge 2 ]] || bad "exec needs a node and a command: exec NODE CMD [ARGS...]"
  exec_args=("$@")
  set --
elif [[ "$cmd" == link ]]; then
  [[ $# -ge 2 && ("$2" == up || "$2" == down) ]] || bad "link needs a node and up or down: link NODE up|down"
  exec_args=("$1" "$2")
  shift 2
fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) [[ $# -ge 2 ]] || bad "--nodes needs a value"; nodes=$2; shift 2 ;;
    --link-rate) [[ $# -ge 2 ]] || bad "--link-rate needs a value"; rate=$2; shift 2 ;;
    --tcp-retries) [[ $# -ge 2 ]] || bad "--tcp-retries needs a value"; tcp_retries=$2; shift 2 ;;
    --prefix) [[ $# -ge 2 ]] || bad "--prefix needs a value"; prefix=$2; shift 2 ;;
    --subnet) [[ $# -ge 2 ]] || bad "--subnet needs a value"; subnet=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) bad "unknown option '$1'" ;;
  esac
done
if ! [[ "$nodes" =~ ^[0-9]+$ ]] || ((nodes < 1 || nodes > 200)); then
  bad "--nodes '$nodes': expected a whole number from 1 to 200"
fi
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,8}$ ]] ||
  bad "--prefix '$prefix': expected a lower-case letter, then at most 8 letters or digits"
[[ "$subnet" =~ ^(10\.[0-9]+\.[0-9]+|192\.168\.[0-9]+|172\.(1[6-9]|2[0-9]|3[01])\.[0-9]+)$ ]] ||
  bad "--subnet '$subnet': expected the first three numbers of a private /24 (10.x.y, 172.16-31.y or 192.168.y)"
if [[ "$rate" != none ]]; then
  [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] ||
    bad "--link-rate '$rate': expected a tc rate such as 1gbit, 10gbit or 500mbit, or none"
fi
if [[ -n "$tcp_retries" ]] && { ! [[ "$tcp_retries" =~ ^[0-9]+$ ]] || ((tcp_retries < 1 || tcp_retries > 15)); }; then
  bad "--tcp-retries '$tcp_retries': expected a whole number from 1 to 15"
fi
bridge=${prefix}br

# The namespaces of PREFIX that exist, in node order.
existing_nodes() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" | sort -V || true
}

# can_create: whether this process may make namespaces; prints the reason when not.
can_create() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "network namespaces need root (this is uid $(id -u))"
    return 1
  fi
  command -v ip >/dev/null || { echo "'ip' (iproute2) is not installed"; return 1; }
  command -v unshare >/dev/null || { echo "'unshare' (util-linux) is not installed"; return 1; }
  local probe=${prefix}probe out
  ip netns del "$probe" 2>/dev/null || true
  if ! out=$(ip netns add "$probe" 2>&1); then
    echo "the kernel refuses a network namespace: $out"
    return 1
  fi
  if ! out=$(ip netns exec "$probe" unshare --uts true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "the kernel refuses a UTS namespace inside one: $out"
    return 1
  fi
  ip netns del "$probe"
}

# bytes of a tc rate, per second (1gbit -> 125000000)
rate_bytes() {
  local n u mult=1
  n=${1%%[a-z]*}
  u=${1#"$n"}
  case "$u" in
    bit) mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;; tbit) mult=1000000000000 ;;
    bps) mult=8 ;; kbps) mult=8000 ;; mbps) mult=8000000 ;; gbps) mult=8000000000 ;; tbps) mult=8000000000000 ;;
  esac
  awk -v n="$n" -v m="$mult" 'BEGIN { printf "%d\n", n * m / 8 }'
}

# shape DEV NETNS-ARGS...: tbf on DEV's egress at $rate, or none. The bucket holds 4 ms of
# traffic (at least 64 KiB, for the 64 KiB segments that veth's offloads pass as one
# packet), the queue 20 ms more.
shape() {
  local dev=$1
  shift
  "$@" tc qdisc del dev "$dev" root 2>/dev/null || true
  [[ "$rate" == none ]] && return 0
  local bps burst
  bps=$(rate_bytes "$rate")
  burst=$((bps / 250))
  ((burst >= 65536)) || burst=65536
  "$@" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms ||
    die "tc could not shape $dev to $rate"
}

# reachable NS ADDR: whether a TCP connection from NS to ADDR is refused (or accepted)
# rather than left unanswered.
reachable() {
  local out
  out=$(ip netns exec "$1" timeout 3 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
  grep -q "refused" <<<"$out"
}

up() {
  local why
  why=$(can_create) || die "cannot create network namespaces here: $why" 4
  # A failed `up` takes down what it made so far, whatever step failed.
  trap 'rc=$?; if ((rc != 0)); then echo "netns-cluster: up failed; removing what it made" >&2; down >/dev/null 2>&1 || true; fi' EXIT
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip addr replace "$subnet.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i ns host peer hosts
  hosts=$(mktemp)
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < nodes; i++)); do echo "$subnet.$((i + 1)) ${prefix}$i"; done
    echo "$subnet.254 ${prefix}host"
  } >"$hosts"
  for ((i = 0; i < nodes; i++)); do
    ns=${prefix}$i
    host=${prefix}h$i
    peer=${prefix}p$i
    ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    if ! ip link show "$host" >/dev/null 2>&1; then
      ip link add "$host" type veth peer name "$peer"
      ip link set "$peer" netns "$ns"
      ip -n "$ns" link set "$peer" name eth0
    fi
    ip link set "$host" master "$bridge"
    ip link set "$host" up
    ip -n "$ns" addr replace "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [[ -n "$tcp_retries" ]]; then
      ip netns exec "$ns" sh -c "echo $tcp_retries >/proc/sys/net/ipv4/tcp_retries2"
    fi
    shape "$host"              # traffic into the node
    shape eth0 ip netns exec "$ns"  # traffic out of it
    mkdir -p "/etc/netns/$ns"
    cp "$hosts" "/etc/netns/$ns/hosts"
  done
  rm -f "$hosts"
  # Each node reaches the others before `up` returns: a TCP connection to a port nobody
  # listens on is refused at once by a reachable node and times out otherwise.
  for ((i = 0; i < nodes; i++)); do
    reachable "${prefix}0" "$subnet.$((i + 1))" ||
      die "node ${prefix}0 cannot reach ${prefix}$i at $subnet.$((i + 1))"
  done
  trap - EXIT
  echo "netns-cluster: $nodes node(s) ${prefix}0..${prefix}$((nodes - 1)) on $subnet.0/24 (bridge $bridge at $subnet.254), link rate $rate"
}

down() {
  local ns pid host
  for ns in $(existing_nodes) "${prefix}probe"; do
    ip netns list | awk '{print $1}' | grep -qx "$ns" || continue
    # Daemons left inside (slurmd, orted, ranks) would keep the namespace's network alive.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 20); do
      [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break
      sleep 0.25
    done
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" || echo "netns-cluster: warning: could not delete namespace $ns" >&2
    rm -rf "/etc/netns/$ns"
  done
  # Host ends of veth pairs whose namespace went away first are gone with it; any left over:
  for host in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${prefix}h[0-9]+$" || true); do
    ip link del "$host" 2>/dev/null || true
  done
  ip link show "$bridge" >/dev/null 2>&1 && ip link del "$bridge"
  rmdir /etc/netns 2>/dev/null || true
  echo "netns-cluster: removed the nodes of ${prefix}"
}

status() {
  local ns n=0 addr state qdisc retries
  for ns in $(existing_nodes); do
    n=$((n + 1))
    addr=$(ip -n "$ns" -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}')
    state=$(ip -n "$ns" -o link show dev eth0 2>/dev/null | grep -o 'state [A-Z]*' | cut -d' ' -f2 || true)
    qdisc=$(ip netns exec "$ns" tc qdisc show dev eth0 2>/dev/null | grep -o 'tbf .*rate [^ ]*' | sed 's/.*rate /tbf /' || true)
    retries=$(ip netns exec "$ns" cat /proc/sys/net/ipv4/tcp_retries2 2>/dev/null || echo '?')
    echo "$ns ${addr:-no-address} link=${state:-missing} shaping=${qdisc:-none} tcp_retries2=$retries processes=$(ip netns pids "$ns" | wc -l)"
  done
  ((n > 0)) || { echo "netns-cluster: no nodes of ${prefix}"; return 1; }
}

run_exec() {
  local node=${exec_args[0]}
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$node" ||
    die "no emulated node '$node' (tools/netns-cluster.sh status lists them)" 1
  # The node's network namespace only (nsenter, not `ip netns exec`, which would also mount
  # a sysfs of its own and hide the cgroup file systems slurmd needs), plus a private mount
  # namespace for the node's /etc/hosts and a fresh UTS namespace named after the node.
  # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
  exec nsenter --net="/run/netns/$node" unshare --mount --uts sh -c '
    if [ -f "/etc/netns/$0/hosts" ]; then mount --bind "/etc/netns/$0/hosts" /etc/hosts; fi
    hostname "$0" && exec "$@"' "${exec_args[@]}"
}

set_link() {
  local node=${exec_args[0]} state=${exec_args[1]}
  existing_nodes | grep -qx "$node" || die "no emulated node '$node' (tools/netns-cluster.sh status lists them)" 1
  ip link set "${prefix}h${node#"$prefix"}" "$state"
  echo "netns-cluster: link of $node $state"
}

case "$cmd" in
  up) up ;;
  link) set_link ;;
  down) down ;;
  status) status ;;
  check)
    why=$(can_create) || { echo "netns-cluster: cannot create network namespaces here: $why"; exit 4; }
    echo "netns-cluster: network namespaces can be created here"
    ;;
  exec) run_exec ;;
  *) bad "unknown command '$cmd'" ;;
esac
