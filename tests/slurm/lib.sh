#!/usr/bin/env bash
# Helpers of the launching tests: those of the e2e tests (binary, data, mpirun, fail/pass,
# contains), plus the local Slurm of slurm/local-cluster.sh and waiting for its jobs.
# Sourced by each test; CTest sets RINGTRAIN_BIN, E2E_DIR, SRC_DIR, WORK_DIR and
# RINGTRAIN_SLURM_DIR.
# Read before the e2e helpers clear every RINGTRAIN_* and SLURM_* variable (hermetic_env).
CLUSTER_DIR=${RINGTRAIN_SLURM_DIR:?RINGTRAIN_SLURM_DIR is not set}
# shellcheck source=../e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
SRC=${SRC_DIR:?SRC_DIR is not set}
WORK=${WORK_DIR:?WORK_DIR is not set}
# A port per build directory, so that the test clusters of two build trees never meet.
SLURM_PORT=$((20000 + $(cksum <<<"$CLUSTER_DIR" | cut -d' ' -f1) % 5000 * 2))
export SLURM_CONF=$CLUSTER_DIR/slurm.conf

cluster() { "$SRC/slurm/local-cluster.sh" "$1" --dir "$CLUSTER_DIR" --port "$SLURM_PORT"; }

# A fresh directory for one test.
tdir() {
  local d=$WORK/$1
  rm -rf "$d"
  mkdir -p "$d"
  echo "$d"
}

job_field() {  # job_field ID NAME: a field of `scontrol show job`, e.g. JobState, Restarts
  scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | sed -n 1p
}

# wait_job_end ID SECONDS: until the job has left the queue for good (not pending, running,
# requeued or completing); prints its final state.
wait_job_end() {
  local id=$1 state
  for _ in $(seq 1 $(($2 * 2))); do
    state=$(job_field "$id" JobState)
    case "$state" in
      PENDING | RUNNING | REQUEUED | COMPLETING | CONFIGURING | REQUEUE_HOLD | REQUEUE_FED | "") ;;
      *) echo "$state"; return 0 ;;
    esac
    sleep 0.5
  done
  echo "TIMEOUT($(job_field "$id" JobState))"
}

# submit_wait SECONDS SBATCH-ARGS...: submits a job, waits until it has ended (polling more
# often than sbatch --wait does), prints its id; fails unless it ended COMPLETED.
submit_wait() {
  local secs=$1 job state
  shift
  job=$(sbatch --parsable "$@" | cut -d';' -f1)
  state=$(wait_job_end "$job" "$secs")
  [[ "$state" == COMPLETED ]] || {
    echo "job $job ended $state (exit code $(job_field "$job" ExitCode))" >&2
    return 1
  }
  echo "$job"
}

# One line of a rank's placement: the "ringrun:" or "ringtrain:" line of rank R in FILE.
placement_line() { grep "^$1: .* rank=$2 " "$3" | sed -n 1p; }
# The value of KEY in a placement line.
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
