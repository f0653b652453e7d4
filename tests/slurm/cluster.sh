#!/usr/bin/env bash
# Fixture of the slurm tests: `cluster.sh start` starts a fresh one-node Slurm (munged,
# slurmctld, slurmd) with slurm/local-cluster.sh; `cluster.sh stop` cancels what is left
# and stops the daemons (CTest runs it after the last slurm test, pass or fail).
source "$(dirname "$0")/lib.sh"
case "${1:-}" in
  start)
    [[ $(id -u) -eq 0 ]] || fail "the local Slurm runs its daemons as root; run the slurm tests as root"
    # The leftovers of an interrupted earlier run, if any, go first (stop exits 0 when
    # nothing runs, 1 when a daemon outlives it).
    cluster stop >/dev/null || fail "could not stop the daemons left by an earlier run in $CLUSTER_DIR"
    rm -rf "$CLUSTER_DIR"
    cluster start
    cluster status
    srun --mpi=list 2>&1 | contains pmix || fail "this Slurm has no pmix plugin (srun --mpi=list)"
    pass "Slurm running in $CLUSTER_DIR, port $SLURM_PORT"
    ;;
  stop)
    cluster stop
    if cluster status >/dev/null 2>&1; then fail "daemons still running after stop"; fi
    pass "Slurm stopped"
    ;;
  *) fail "usage: cluster.sh start|stop" ;;
esac
