#!/usr/bin/env bash
# Helpers of the multinode tests: those of the launching tests (binary, data, fail/pass,
# the Slurm job helpers), plus the emulated nodes of tools/netns-cluster.sh, mpirun across
# them through tools/netns-rsh, and a Slurm with one slurmd per node.
# Sourced by each test; CTest sets RINGTRAIN_BIN, ALLREDUCE_BENCH, E2E_DIR, SRC_DIR,
# WORK_DIR and RINGTRAIN_SLURM_DIR.
# shellcheck source=../slurm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../slurm/lib.sh"
# shellcheck disable=SC2034  # used by the tests that source this file
BENCH=${ALLREDUCE_BENCH:?ALLREDUCE_BENCH is not set}
NETNS=$SRC/tools/netns-cluster.sh
NODES=2
# Names, subnet and Slurm port of their own per build directory, so that the test clusters
# of two build trees never meet.
build_id=$(($(cksum <<<"$CLUSTER_DIR" | cut -d' ' -f1) % 200 + 1))
export RINGTRAIN_NETNS_PREFIX=rt${build_id}n RINGTRAIN_NETNS_SUBNET=10.77.$build_id
P=$RINGTRAIN_NETNS_PREFIX
SUBNET=$RINGTRAIN_NETNS_SUBNET
SLURM_PORT=$((30000 + build_id * 2))
HOSTFILE=$WORK/hosts-$P

# Hermetic: one thread per rank, no RINGTRAIN_* setting from the caller's environment.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for v in $(compgen -e | grep '^RINGTRAIN_' | grep -vE '^RINGTRAIN_(BIN|SLURM_DIR|NETNS_PREFIX|NETNS_SUBNET)$' || true); do
  unset "$v"
done
unset SLURM_JOB_ID SLURM_JOBID SLURM_NODELIST

cluster() { "$SRC/slurm/local-cluster.sh" "$1" --dir "$CLUSTER_DIR" --port "$SLURM_PORT" --netns "$NODES"; }

# Skips the test (exit 77, which CTest reports as skipped) where this machine cannot make
# network namespaces, and only then.
skip_unless_netns() {
  local out rc=0
  out=$("$NETNS" check) || rc=$?
  if [[ $rc -eq 4 ]]; then
    echo "SKIPPED: $out"
    exit 77
  fi
  [[ $rc -eq 0 ]] || fail "tools/netns-cluster.sh check failed ($rc): $out"
}

# The cluster the fixture made is there (a test run on its own says what is missing).
need_cluster() {
  skip_unless_netns
  "$NETNS" status >/dev/null || fail "no emulated nodes of $P: run the fixture (ctest -L multinode)"
}

write_hostfile() {
  mkdir -p "$WORK"
  for ((i = 0; i < NODES; i++)); do echo "$P$i slots=2"; done >"$HOSTFILE"
}

# mn_mpirun PER_NODE [MPIRUN OPTIONS] CMD...: mpirun on node 0, NODES x PER_NODE ranks,
# remote daemons started through tools/netns-rsh, TCP between nodes on the bridge's subnet.
# --bind-to none: every emulated node sees the same cores, and each would bind its first
# rank to core 0. The remote ranks get a login's environment: pass variables with -x.
# Keepalives on the daemons' connections: mpirun notices a node it cannot reach within
# about 16 s (Open MPI's default: 480 s) while the job is quiet.
mn_mpirun() {
  local per=$1
  shift
  write_hostfile
  timeout "${MN_TIMEOUT:-300}" "$NETNS" exec "${P}0" mpirun -n $((per * NODES)) \
    --hostfile "$HOSTFILE" --map-by "ppr:$per:node" --bind-to none \
    --mca plm_rsh_agent "$SRC/tools/netns-rsh" \
    --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" \
    --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x OMPI_MCA_rmaps_base_oversubscribe "$@"
}

# The last checkpoint step in a directory (0 if none).
last_ckpt_step() {
  local f
  f=$(find "$1" -maxdepth 1 -name 'ckpt-*.h5' 2>/dev/null | sort | tail -n 1)
  [[ -n "$f" ]] || { echo 0; return 0; }
  f=${f##*/ckpt-}
  echo $((10#${f%.h5}))
}
