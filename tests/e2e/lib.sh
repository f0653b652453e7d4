#!/usr/bin/env bash
# Shared helpers of the end-to-end tests: where the binary and data are, how to start MPI
# jobs on this machine, and assertions that say what went wrong.
# Sourced by each test; expects RINGTRAIN_BIN and E2E_DIR from CTest.
set -euo pipefail

# shellcheck disable=SC2034  # used by the tests that source this file
BIN=${RINGTRAIN_BIN:?RINGTRAIN_BIN is not set}
E2E_DIR=${E2E_DIR:?E2E_DIR is not set}
# shellcheck disable=SC2034
DATA=$E2E_DIR/data

# Hermetic: nothing of the caller's environment that ringtrain, launch/ringrun, OpenMP or
# OpenBLAS read may change what a test sees (e.g. an exported OMP_NUM_THREADS=1 is kept by
# ringrun, RINGTRAIN_VERBOSE=1 adds lines to stderr, SLURM_* or a batch job's
# CUDA_VISIBLE_DEVICES change the rank placement). A test sets what it needs on the command
# it runs. The inputs from CTest (RINGTRAIN_BIN, RINGTRAIN_SLURM_DIR) were read above or by
# the sourcing lib before this point.
hermetic_env() {
  local v
  for v in $(compgen -v RINGTRAIN_) $(compgen -v OMP_) $(compgen -v GOMP_) \
    $(compgen -v OPENBLAS_) $(compgen -v GOTO_) $(compgen -v SLURM_) $(compgen -v PMIX_) \
    $(compgen -v PMI_) $(compgen -v OMPI_COMM_WORLD_) $(compgen -v MV2_); do
    unset "$v"
  done
  unset CUDA_VISIBLE_DEVICES
}
hermetic_env
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# mpi N CMD...: run CMD on N ranks (timeout so that a hang fails the test instead of CI).
mpi() {
  local n=$1
  shift
  timeout 300 mpirun -n "$n" "$@"
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

pass() { echo "ok: $*"; }

# A fresh directory for one test.
workdir() {
  local d=$E2E_DIR/$1
  rm -rf "$d"
  mkdir -p "$d"
  echo "$d"
}

# CMD | contains PATTERN: like grep -q, but reads all its input first, so that the writer
# never dies of SIGPIPE (which pipefail would report as a failure).
contains() {
  local input
  input=$(cat)
  grep -q -- "$1" <<<"$input"
}
