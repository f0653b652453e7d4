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

# Processes are found by a tag in their environment, never by name or command line: another
# job (a second checkout's tests, a user's run) may be running the same binary with the same
# arguments. A test starts a job as `E2E_JOB=$(job_tag) mpirun ...` (mpirun passes its
# environment to the ranks it starts on this machine); job_pids TAG [VAR=VALUE] lists that
# job's live processes (mpirun, its daemons, the ranks), those with VAR=VALUE in their
# environment too when given (OMPI_COMM_WORLD_RANK=1: rank 1).
job_tag() { echo "$$-${BASHPID}-$RANDOM$RANDOM"; }
job_pids() {
  local files f
  files=$(grep -lsxzF "E2E_JOB=$1" /proc/[0-9]*/environ || true)
  for f in $files; do
    [[ -z ${2:-} ]] || grep -qsxzF "$2" "$f" || continue
    f=${f#/proc/}
    echo "${f%/environ}"
  done
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

pass() { echo "ok: $*"; }

# tmpfs_mountpoint DIR: makes DIR a directory the test may mount tmpfs file systems of a
# chosen size on (it checks that mounting works: these tests need root, as CI and the
# multinode tests run), and unmounts it when the script exits.
tmpfs_mountpoint() {
  mkdir -p "$1"
  mount -t tmpfs -o size=64k tmpfs "$1" 2>"$1.err" ||
    fail "mount -t tmpfs is not permitted here (the full-disk tests need root): $(cat "$1.err")"
  umount "$1"
  # shellcheck disable=SC2064  # the path now, not at exit
  trap "umount '$1' 2>/dev/null || true" EXIT
}

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

# hf_venv: prints the python of a venv (under E2E_DIR, made once) with Hugging Face
# transformers and safetensors from PyPI on top of Debian's python3-torch, numpy and h5py
# (--system-site-packages: torch is not downloaded again). transformers 4.44 is the last
# line that supports torch 1.13, Debian's.
hf_venv() {
  local venv=$E2E_DIR/hf-venv
  if [[ ! -x $venv/bin/python ]] ||
    ! "$venv/bin/python" -c 'import transformers, safetensors, torch, h5py' 2>/dev/null; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
    "$venv/bin/pip" install -q --progress-bar off "transformers==4.44.2" safetensors >&2 ||
      fail "pip install transformers safetensors"
  fi
  echo "$venv/bin/python"
}
