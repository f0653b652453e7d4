#!/usr/bin/env bash
# `sbatch slurm/train.sbatch` as a user runs it (from the repository root, the template's
# #SBATCH block overridden on the command line for a 2-core machine without GPUs) trains
# to the end under srun --mpi=pmix and launch/ringrun; every rank's placement line from
# ringrun and from ringtrain itself agree; the job is requeueable as the template asks.
source "$(dirname "$0")/lib.sh"
dir=$(tdir slurm-train)
cd "$SRC" || exit 1
rc=0
job=$(RINGTRAIN=$BIN RUN_DIR=$dir/run RINGTRAIN_VERBOSE=1 submit_wait 300 \
  --nodes=1 --ntasks-per-node=2 --gpus-per-task=0 --cpus-per-task=1 --time=5 \
  --output="$dir/job.out" slurm/train.sbatch --data "$DATA/train.h5" --steps 200 \
  --batch-size 32 --threads 1 --log-every 50 --checkpoint-every 100) || rc=$?
[[ -f $dir/job.out ]] && cat "$dir/job.out"
[[ $rc -eq 0 ]] || fail "the job did not complete"
[[ "$(job_field "$job" Requeue)" == 1 ]] || fail "the template's --requeue is not in effect"
contains "training finished" <"$dir/job.out" || fail "no 'training finished' in the job output"
ck=$dir/run/ckpt/ckpt-000000200.h5
[[ -f "$ck" ]] || fail "no final checkpoint $ck"
"$BIN" inspect "$ck" | contains "valid: yes" || fail "$ck is not valid"
contains '"world_size":2' <"$dir/run/metrics.jsonl" || fail "metrics do not come from 2 ranks"
pass "job $job trained 200 steps on 2 tasks and wrote a valid checkpoint"

for r in 0 1; do
  a=$(placement_line ringrun "$r" "$dir/job.out")
  b=$(placement_line ringtrain "$r" "$dir/job.out")
  [[ -n "$a" && -n "$b" ]] || fail "rank $r: no ringrun or ringtrain placement line"
  for key in local_rank local_size source gpu; do
    [[ "$(field "$a" "$key")" == "$(field "$b" "$key")" ]] ||
      fail "rank $r: ringrun says $key=$(field "$a" "$key"), ringtrain $key=$(field "$b" "$key")"
  done
  [[ "$(field "$a" local_rank)" == "$r" && "$(field "$a" local_size)" == 2 ]] ||
    fail "rank $r: local rank/size $(field "$a" local_rank)/$(field "$a" local_size), expected $r/2"
  [[ "$(field "$a" source)" == slurm ]] || fail "rank $r: found through $(field "$a" source), not Slurm"
  [[ "$(field "$a" threads)" == 1 ]] || fail "rank $r: OMP_NUM_THREADS $(field "$a" threads), expected 1 (--cpus-per-task=1)"
done
pass "ringrun and ringtrain agree: local ranks 0 and 1 of 2 from SLURM_LOCALID, 1 thread each"

# Open MPI's mpirun inside an allocation (it starts its daemons through Slurm): the ranks
# inherit the batch step's SLURM_LOCALID=0, and ringrun and ringtrain must take the local
# rank from Open MPI's variables instead.
job=$(submit_wait 300 --ntasks=2 --time=5 --output="$dir/mpirun.out" --export=ALL,RINGTRAIN_VERBOSE=1 \
  --wrap "mpirun $(printf '%q ' "$SRC/launch/ringrun" "$BIN" train --data "$DATA/train.h5" --steps 20 \
  --batch-size 16 --threads 1 --log-every 10)") || { cat "$dir/mpirun.out"; fail "mpirun job failed"; }
cat "$dir/mpirun.out"
for r in 0 1; do
  for who in ringrun ringtrain; do
    line=$(placement_line "$who" "$r" "$dir/mpirun.out")
    [[ "$(field "$line" source) $(field "$line" local_rank) $(field "$line" local_size)" == "ompi $r 2" ]] ||
      fail "mpirun in an allocation, rank $r: '$line'"
  done
done
pass "job $job: mpirun inside the allocation, local ranks from Open MPI's variables"
