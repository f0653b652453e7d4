#!/usr/bin/env bash
# A real Slurm on this machine, for the tests (ctest labels `slurm` and `multinode`) and for
# trying the templates of this folder before a cluster: munged, slurmctld and slurmd from
# Debian's slurm-wlm, started as root with their own munge key, socket, ports, configuration
# and state in one directory, so that nothing in /etc is touched and a system Slurm is left
# alone. One node "localhost", or (--netns K) K emulated nodes of tools/netns-cluster.sh,
# one slurmd in each network namespace.
#   slurm/local-cluster.sh start|stop|status|env [--dir DIR] [--port P] [--netns K]
# Clients find this cluster through SLURM_CONF: `eval "$(slurm/local-cluster.sh env)"`.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: slurm/local-cluster.sh start|stop|status|env [--dir DIR] [--port P] [--cpus N] [--netns K]

  start    write DIR/slurm.conf, start munged, slurmctld and slurmd (as root), wait until
           the node "localhost" (or every emulated node) is idle
  stop     cancel the jobs still there, shut the daemons down and wait until they are gone
  status   the daemons' pids, `scontrol ping` and `sinfo`; exit 1 if any daemon is down
  env      print `export SLURM_CONF=DIR/slurm.conf` (use: eval "$(slurm/local-cluster.sh env)")

options
  --dir DIR   where configuration, state, logs and the munge key live
              (default: $RINGTRAIN_SLURM_DIR or /tmp/ringtrain-slurm)
  --port P    slurmctld listens on P, slurmd on P+1 (default 16817, away from Slurm's 6817)
  --cpus N    CPUs each node offers (default: what `slurmd -C` finds)
  --netns K   K nodes instead of one: the emulated nodes PREFIX0 ... PREFIX(K-1) that
              `tools/netns-cluster.sh up --nodes K` made (PREFIX and subnet from
              RINGTRAIN_NETNS_PREFIX and RINGTRAIN_NETNS_SUBNET, default rtnode, 10.77.0).
              One slurmd per namespace, NodeAddr its address; slurmctld and munged stay in
              this namespace, reached at the bridge's address SUBNET.254. Every node shares
              this machine's CPUs and file system (DIR, the data, the repository).

The node is called "localhost" (slurmd -N localhost), whatever the hostname is. Plugins:
proctrack/linuxproc and task/none (no cgroups needed), select/cons_tres; `srun --mpi=pmix`
starts Open MPI ranks. Needs Debian's slurm-wlm and munge (tools/install-deps.sh).
EOF
}

cmd=${1:-}
[[ "$cmd" == -h || "$cmd" == --help ]] && { usage; exit 0; }
[[ -n "$cmd" ]] || { usage >&2; exit 1; }
shift
dir=${RINGTRAIN_SLURM_DIR:-/tmp/ringtrain-slurm}
port=16817
cpus=""
netns=0
prefix=${RINGTRAIN_NETNS_PREFIX:-rtnode}
subnet=${RINGTRAIN_NETNS_SUBNET:-10.77.0}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --netns) netns=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "local-cluster.sh: unknown option '$1'" >&2; usage >&2; exit 1 ;;
  esac
done
[[ "$netns" =~ ^[0-9]+$ ]] || { echo "local-cluster.sh: --netns '$netns': expected a number of nodes" >&2; exit 1; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
export SLURM_CONF=$dir/slurm.conf

say() { echo "local-cluster: $*"; }

# The node names: localhost, or the emulated nodes.
node_names() {
  if ((netns == 0)); then
    echo localhost
  else
    for ((i = 0; i < netns; i++)); do echo "$prefix$i"; done
  fi
}
# slurmd's pid file name for a node (slurm.conf's SlurmdPidFile with %n).
slurmd_pidname() { if ((netns == 0)); then echo slurmd; else echo "slurmd-$1"; fi; }
die() {
  echo "local-cluster: error: $*" >&2
  exit 1
}

# pid_of NAME: the pid in DIR/NAME.pid if that process is alive, else nothing.
pid_of() {
  local f=$dir/$1.pid pid
  [[ -f "$f" ]] || return 0
  pid=$(cat "$f")
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

write_config() {
  local hw nodes="" ctld=localhost name i=0 names pernode=""
  # slurmd -C describes this machine (CPUs, sockets, cores, threads); the node is named
  # localhost because that name resolves on every machine, whatever the hostname.
  hw=$(slurmd -C | sed -n 1p | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//')
  [[ -z "$cpus" ]] || hw="CPUs=$cpus"
  names=$(node_names | paste -sd, -)
  if ((netns == 0)); then
    nodes="NodeName=localhost $hw State=UNKNOWN"
  else
    # slurmctld keeps the name localhost (it checks its own name against SlurmctldHost)
    # and is reached at the bridge's address; each slurmd at its namespace's address.
    ctld="localhost($subnet.254)"
    for name in $(node_names); do
      i=$((i + 1))
      nodes+="NodeName=$name NodeAddr=$subnet.$i $hw State=UNKNOWN"$'\n'
    done
    # Every node on one file system: what Slurm keeps per node gets the node's name (%n),
    # PMIx's per-job directories included (TmpFS).
    pernode="TmpFS=$dir/tmp-%n"
  fi
  cat >"$SLURM_CONF" <<EOF
# Written by slurm/local-cluster.sh: a one-node Slurm on localhost for tests.
ClusterName=ringtrain-local
SlurmctldHost=$ctld
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool$( ((netns == 0)) || echo "-%n")
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/$(slurmd_pidname %n).pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/$(slurmd_pidname %n).log
$pernode
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes are tracked through /proc, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (defaults 60 and 30 s): a requeued job starts soon after
# its begin time, and tests do not wait for the scheduler.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Job ids of their own per port: two of these clusters never share a job id (nor the
# per-job directories in /tmp that PMIx and slurmstepd name after it).
FirstJobId=$((port * 100))
JobRequeue=1
KillWait=10
MinJobAge=600
InactiveLimit=0
MailProg=/bin/true
$nodes
PartitionName=local Nodes=$names Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
  [[ -n "$(pid_of munged)" ]] && return 0
  mkdir -p "$dir/munge"
  chmod 700 "$dir/munge"
  if [[ ! -f "$dir/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 600 "$dir/munge/munge.key"
  fi
  # --force: munged refuses some ownership layouts of a root-run daemon otherwise. The
  # daemons' own output goes to files: whoever started this script (ctest) may wait for its
  # stdout to close.
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" \
    </dev/null >>"$dir/munged.out" 2>&1
}

wait_for() {  # wait_for SECONDS CMD...: poll CMD every 0.5 s until it succeeds
  local secs=$1
  shift
  for _ in $(seq 1 $((secs * 2))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

# Every node idle.
nodes_idle() {
  local st
  st=$(sinfo -h -N -o %T) || return 1
  [[ -n "$st" ]] && ! grep -qvx idle <<<"$st"
}
# The pids of the live slurmds, one per node (whichever layout started them).
slurmd_pids() {
  local f
  for f in "$dir"/slurmd*.pid; do
    [[ -f "$f" ]] && pid_of "$(basename "$f" .pid)"
  done
  return 0
}
no_jobs() { [[ -z "$(squeue -h -o %A)" ]]; }

start() {
  [[ $(id -u) -eq 0 ]] || die "start needs root (slurmd runs jobs as any user)"
  command -v slurmctld >/dev/null || die "slurmctld not found; install slurm-wlm (tools/install-deps.sh)"
  command -v munged >/dev/null || die "munged not found; install munge (tools/install-deps.sh)"
  local name missing=0 here
  for name in $(node_names); do [[ -n "$(pid_of "$(slurmd_pidname "$name")")" ]] || missing=1; done
  if [[ -n "$(pid_of slurmctld)" && $missing -eq 0 ]]; then
    say "already running in $dir"
    return 0
  fi
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if ((netns > 0)); then
    for name in $(node_names); do
      ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$name" ||
        die "no emulated node $name: run tools/netns-cluster.sh up --nodes $netns first"
    done
  fi
  mkdir -p "$dir/state"
  write_config
  start_munge
  # -c: no jobs from an earlier run
  [[ -n "$(pid_of slurmctld)" ]] || slurmctld -c </dev/null >>"$dir/slurmctld.out" 2>&1
  for name in $(node_names); do
    [[ -z "$(pid_of "$(slurmd_pidname "$name")")" ]] || continue
    if ((netns == 0)); then
      mkdir -p "$dir/spool"
      slurmd -N localhost </dev/null >>"$dir/slurmd.out" 2>&1
    else
      # In the node's network namespace and under its hostname, which the job steps inherit.
      mkdir -p "$dir/spool-$name" "$dir/tmp-$name"
      "$here/tools/netns-cluster.sh" exec "$name" slurmd -N "$name" </dev/null \
        >>"$dir/slurmd-$name.out" 2>&1
    fi
  done
  if ! wait_for 30 scontrol ping; then
    tail -n 20 "$dir/slurmctld.log" >&2 || true
    die "slurmctld did not answer within 30 s (log: $dir/slurmctld.log)"
  fi
  # A node left down or drained by an earlier run comes back here.
  scontrol update nodename="$(node_names | paste -sd, -)" state=resume >/dev/null 2>&1 || true
  if ! wait_for 30 nodes_idle; then
    sinfo -N -l >&2 || true
    tail -n 20 "$dir"/slurmd*.log >&2 || true
    die "not every node is idle within 30 s (logs: $dir/slurmd*.log)"
  fi
  say "running in $dir (slurmctld port $port); clients need: export SLURM_CONF=$SLURM_CONF"
}

stop() {
  local ctld slurmd munge pid
  ctld=$(pid_of slurmctld)
  if [[ -n "$ctld" ]]; then
    # Jobs first, so that no slurmstepd and no rank outlives the daemons.
    scancel --full --partition=local >/dev/null 2>&1 || true
    wait_for 60 no_jobs ||
      echo "local-cluster: warning: jobs still listed after 60 s" >&2
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  slurmd=$(slurmd_pids)
  munge=$(pid_of munged)
  for pid in $ctld $slurmd; do
    wait_for 30 bash -c "! kill -0 $pid" || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $(slurmd_pids); do kill -TERM "$pid" 2>/dev/null || true; done
  ctld=$(pid_of slurmctld)
  if [[ -n "$ctld" ]]; then kill -TERM "$ctld" 2>/dev/null || true; fi
  slurmd=$(slurmd_pids)
  for pid in $ctld $slurmd; do wait_for 10 bash -c "! kill -0 $pid" || true; done
  if [[ -n "$munge" ]]; then
    kill -TERM "$munge" 2>/dev/null || true
    wait_for 10 bash -c "! kill -0 $munge" || true
  fi
  for name in slurmctld munged; do
    [[ -z "$(pid_of "$name")" ]] || die "$name is still running (pid $(pid_of "$name"))"
  done
  [[ -z "$(slurmd_pids)" ]] || die "slurmd is still running (pid $(slurmd_pids | paste -sd' ' -))"
  say "stopped ($dir)"
}

status() {
  local ok=0 name pid
  local daemons=(munged slurmctld) f
  for f in "$dir"/slurmd*.pid; do [[ -f "$f" ]] && daemons+=("$(basename "$f" .pid)"); done
  for name in "${daemons[@]}"; do
    pid=$(pid_of "$name")
    if [[ -n "$pid" ]]; then echo "$name: running (pid $pid)"; else echo "$name: not running"; ok=1; fi
  done
  [[ -n "$(slurmd_pids)" ]] || { echo "slurmd: not running"; ok=1; }
  if [[ $ok -eq 0 ]]; then
    scontrol ping || ok=1
    sinfo
  fi
  return $ok
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "local-cluster.sh: unknown command '$cmd'" >&2; usage >&2; exit 1 ;;
esac
