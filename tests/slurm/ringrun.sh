#!/usr/bin/env bash
# launch/ringrun under mpirun: local ranks from Open MPI's variables, one GPU per rank from
# the node's list (CUDA_VISIBLE_DEVICES as a site or user sets it), a mapping already made
# kept, shared GPUs said, OMP_NUM_THREADS set or kept, numactl run (or its absence said),
# and ringtrain's own placement line agreeing with the wrapper's, with and without it.
# (On a machine without GPUs, CUDA_VISIBLE_DEVICES is the only list a GPU mapping can see.)
source "$(dirname "$0")/lib.sh"
RR=$SRC/launch/ringrun
dir=$(tdir ringrun)

"$RR" --help | contains "CUDA_VISIBLE_DEVICES" || fail "--help"
rc=0
"$RR" 2>/dev/null || rc=$?
[[ $rc -eq 1 ]] || fail "no command: exit $rc, expected 1"
rc=0
"$RR" --gpu-map sometimes true 2>/dev/null || rc=$?
[[ $rc -eq 1 ]] || fail "bad --gpu-map: exit $rc, expected 1"
rc=0
"$RR" bash -c 'exit 7' || rc=$?
[[ $rc -eq 7 ]] || fail "the command's exit code: $rc, expected 7"
pass "usage, errors and the command's exit code"

# rank R's value of VAR as the command saw it, from "R VAR=VALUE" lines
seen() { sed -n "s/^$1 $2=//p" "$3"; }
# shellcheck disable=SC2016  # expanded by each rank's bash
show='echo "$OMPI_COMM_WORLD_RANK CVD=${CUDA_VISIBLE_DEVICES-unset}"; echo "$OMPI_COMM_WORLD_RANK OMP=$OMP_NUM_THREADS"'

# A node list of 3 GPUs, 3 ranks: 3, 5, 7.
mpi 3 -x CUDA_VISIBLE_DEVICES=3,5,7 "$RR" bash -c "$show" >"$dir/a" 2>&1
cat "$dir/a"
for r in 0 1 2; do
  want=$(cut -d, -f$((r + 1)) <<<"3,5,7")
  [[ "$(seen $r CVD "$dir/a")" == "$want" ]] || fail "rank $r: CUDA_VISIBLE_DEVICES $(seen $r CVD "$dir/a"), expected $want"
done
pass "3 ranks, GPUs 3,5,7: one each"

# 3 ranks, 2 GPUs: 3, 5, 3, and it is said once.
mpi 3 -x CUDA_VISIBLE_DEVICES=3,5 "$RR" bash -c "$show" >"$dir/b" 2>&1
cat "$dir/b"
[[ "$(seen 0 CVD "$dir/b") $(seen 1 CVD "$dir/b") $(seen 2 CVD "$dir/b")" == "3 5 3" ]] || fail "3 ranks on 2 GPUs"
[[ $(grep -c "3 ranks share 2 GPU(s)" "$dir/b") -eq 1 ]] || fail "sharing GPUs was not said exactly once"
pass "3 ranks on 2 GPUs: 3,5,3, said once"

# One GPU visible per rank already (a launcher's or Slurm's mapping): kept.
mpi 2 -x CUDA_VISIBLE_DEVICES=6 "$RR" bash -c "$show" >"$dir/c" 2>&1
[[ "$(seen 0 CVD "$dir/c") $(seen 1 CVD "$dir/c")" == "6 6" ]] || fail "a single visible GPU was not kept"
# --gpu-map off and no GPU at all: CUDA_VISIBLE_DEVICES untouched.
mpi 2 -x CUDA_VISIBLE_DEVICES=3,5 "$RR" --gpu-map off bash -c "$show" >"$dir/d" 2>&1
[[ "$(seen 1 CVD "$dir/d")" == "3,5" ]] || fail "--gpu-map off changed CUDA_VISIBLE_DEVICES"
if ! command -v nvidia-smi >/dev/null; then
  mpi 2 "$RR" bash -c "$show" >"$dir/e" 2>&1
  [[ "$(seen 1 CVD "$dir/e")" == unset ]] || fail "without GPUs CUDA_VISIBLE_DEVICES was set"
  pass "a mapping already made is kept; --gpu-map off; no GPUs: nothing set"
else
  pass "a mapping already made is kept; --gpu-map off (GPUs here: the no-GPU case not run)"
fi

# OMP_NUM_THREADS: mpirun binds 2 ranks to a core each: 1 thread; a value given is kept.
mpi 2 "$RR" bash -c "$show" >"$dir/f" 2>&1
[[ "$(seen 0 OMP "$dir/f") $(seen 1 OMP "$dir/f")" == "1 1" ]] || fail "OMP_NUM_THREADS with 2 ranks on 1 core each"
mpi 2 -x OMP_NUM_THREADS=3 "$RR" bash -c "$show" >"$dir/g" 2>&1
[[ "$(seen 1 OMP "$dir/g")" == 3 ]] || fail "a given OMP_NUM_THREADS was not kept"
cores=$(getconf _NPROCESSORS_ONLN)
mpi 1 --bind-to none "$RR" bash -c "$show" >"$dir/h" 2>&1
[[ "$(seen 0 OMP "$dir/h")" == "$cores" ]] || fail "1 unbound rank: OMP_NUM_THREADS $(seen 0 OMP "$dir/h"), expected $cores"
pass "OMP_NUM_THREADS: the rank's share of the cores, or the value given"

# NUMA binding through numactl (--numa rank: without GPUs, by local rank), and its absence.
# numactl is a test dependency (tools/install-deps.sh installs it): missing, the test fails.
command -v numactl >/dev/null || fail "numactl is not installed (tools/install-deps.sh installs it)"
mpi 2 "$RR" --numa rank --verbose bash -c 'grep Cpus_allowed_list /proc/self/status' >"$dir/n" 2>&1
cat "$dir/n"
[[ $(grep -c "numa=0 " "$dir/n") -eq 2 ]] || fail "--numa rank did not choose node 0"
"$RR" --numa rank --print true | contains "exec numactl --.*=0 true" || fail "--numa rank: no numactl"
mpi 2 "$RR" --numa rank --numactl /nonexistent/numactl true >"$dir/m" 2>&1
[[ $(grep -c "numactl not found: CPUs not bound to NUMA node 0" "$dir/m") -eq 1 ]] ||
  { cat "$dir/m"; fail "a missing numactl was not said once"; }
pass "numactl binding, and a missing numactl said once per node"

# ringtrain finds what the wrapper finds: with the wrapper (one GPU left visible) and without
# it (the node's list), rank r uses GPU r of "3,5", on the same CPUs.
t=(train --data "$DATA/train.h5" --steps 2 --batch-size 16 --threads 1 --log-every 1)
mpi 2 -x CUDA_VISIBLE_DEVICES=3,5 -x RINGTRAIN_VERBOSE=1 "$RR" "$BIN" "${t[@]}" >"$dir/w" 2>&1
mpi 2 -x CUDA_VISIBLE_DEVICES=3,5 -x RINGTRAIN_VERBOSE=1 "$BIN" "${t[@]}" >"$dir/x" 2>&1
cat "$dir/w" "$dir/x" | grep host=
for r in 0 1; do
  a=$(placement_line ringrun "$r" "$dir/w")
  b=$(placement_line ringtrain "$r" "$dir/w")
  c=$(placement_line ringtrain "$r" "$dir/x")
  want=$(cut -d, -f$((r + 1)) <<<"3,5")
  for line in "$a" "$b" "$c"; do
    [[ "$(field "$line" gpu)" == "$want" ]] || fail "rank $r: '$line' does not name GPU $want"
    [[ "$(field "$line" local_rank) $(field "$line" local_size) $(field "$line" source)" == "$r 2 ompi" ]] ||
      fail "rank $r: '$line'"
    [[ "$(field "$line" cpus)" == "$(field "$a" cpus)" ]] || fail "rank $r: CPU sets differ: '$line' vs '$a'"
  done
  [[ "$(field "$b" device)" == 0 && "$(field "$c" device)" == "$r" ]] ||
    fail "rank $r: CUDA device $(field "$b" device) under ringrun (expected 0), $(field "$c" device) without (expected $r)"
done
pass "ringtrain's placement agrees with ringrun's, with and without the wrapper"

# The task counts of a multi-node Slurm step ("4(x3),2": nodes 0-2 run 4 tasks, node 3 runs
# 2), as srun sets them on each node, read alike by ringrun and by ringtrain (a singleton).
for case in "1 4" "3 2"; do
  read -r node want <<<"$case"
  slurm_env=(SLURM_LOCALID=1 SLURM_NODEID="$node" SLURM_STEP_TASKS_PER_NODE='4(x3),2')
  a=$(env "${slurm_env[@]}" "$RR" --print true | sed -n 1p)
  out=$(env "${slurm_env[@]}" RINGTRAIN_VERBOSE=1 "$BIN" train --data "$DATA/train.h5" --steps 1 \
    --batch-size 8 --threads 1 2>&1) || fail "node $node of 4(x3),2: ringtrain exited $?: $out"
  b=$(grep '^ringtrain: host=' <<<"$out") || fail "node $node of 4(x3),2: no placement line: $out"
  for line in "$a" "$b"; do
    [[ "$(field "$line" source) $(field "$line" local_rank) $(field "$line" local_size)" == "slurm 1 $want" ]] ||
      fail "node $node of 4(x3),2: '$line', expected local rank 1 of $want"
  done
done
pass "Slurm's task counts per node (4(x3),2) read alike by ringrun and ringtrain"
