#!/usr/bin/env bash
# Slurm across 2 emulated nodes (one slurmd in each namespace): `sbatch -N 2` of
# slurm/train.sbatch trains on 2 nodes x 2 tasks under srun --mpi=pmix, every rank's
# ringrun and ringtrain placement lines name its own node and local rank; and USR1 to the
# batch script of a 2-node job checkpoints, requeues and finishes with a final state
# bitwise equal (h5diff) to an uninterrupted 2-node job's.
source "$(dirname "$0")/lib.sh"
need_cluster
dir=$(tdir multinode-slurm)
cd "$SRC" || exit 1

rc=0
job=$(RINGTRAIN=$BIN RUN_DIR=$dir/run RINGTRAIN_VERBOSE=1 submit_wait 240 \
  --nodes=2 --ntasks-per-node=2 --gpus-per-task=0 --cpus-per-task=1 --time=5 \
  --output="$dir/job.out" slurm/train.sbatch --data "$DATA/train.h5" --hidden 64 --steps 40 \
  --batch-size 16 --threads 1 --log-every 20 --checkpoint-every 20) || rc=$?
cat "$dir/job.out" || true
[[ $rc -eq 0 ]] || fail "the 2-node job did not complete"
[[ "$(job_field "$job" NodeList)" == "${P}[0-1]" ]] || fail "job $job ran on $(job_field "$job" NodeList)"
contains "4 rank(s) on 2 node(s)" <"$dir/job.out" || fail "ringtrain does not count 4 ranks on 2 nodes"
contains "training finished" <"$dir/job.out" || fail "no 'training finished' in the job output"
for r in 0 1 2 3; do
  for who in ringrun ringtrain; do
    line=$(placement_line "$who" "$r" "$dir/job.out")
    [[ "$(field "$line" host) $(field "$line" local_rank) $(field "$line" local_size) $(field "$line" source)" == \
      "$P$((r / 2)) $((r % 2)) 2 slurm" ]] ||
      fail "rank $r: '$line', expected host $P$((r / 2)), local rank $((r % 2)) of 2 from Slurm"
  done
done
pass "job $job: 2 nodes x 2 tasks trained; ranks 0,1 on ${P}0 and 2,3 on ${P}1"

# USR1 -> checkpoint -> requeue -> finish, on 2 nodes x 1 task.
train=(--data "$DATA/train.h5" --hidden 64 --steps 1500 --batch-size 32 --threads 1
       --log-every 25 --checkpoint-every 500 --precision fp16 --seed 11)
opts=(--nodes=2 --ntasks-per-node=1 --gpus-per-task=0 --cpus-per-task=1 --time=5)
RINGTRAIN=$BIN RUN_DIR=$dir/ref submit_wait 300 "${opts[@]}" --output="$dir/ref.out" \
  slurm/train.sbatch "${train[@]}" >/dev/null || { cat "$dir/ref.out"; fail "the uninterrupted 2-node job did not complete"; }
pass "uninterrupted 2-node reference job finished"
job=$(RINGTRAIN=$BIN RUN_DIR=$dir/int sbatch --parsable "${opts[@]}" --output="$dir/int.out" \
  slurm/train.sbatch "${train[@]}" | cut -d';' -f1)
for _ in $(seq 1 240); do
  grep -q '"type":"step"' "$dir/int/metrics.jsonl" 2>/dev/null && break
  sleep 0.25
done
grep -q '"type":"step"' "$dir/int/metrics.jsonl" || { cat "$dir/int.out"; fail "job $job never trained"; }
scancel --signal=USR1 --batch "$job"
state=$(wait_job_end "$job" 300)
cat "$dir/int.out"
[[ "$state" == COMPLETED ]] || fail "job $job ended $state"
[[ "$(job_field "$job" Restarts)" == 1 ]] || fail "job $job restarted $(job_field "$job" Restarts) times, expected 1"
contains "2 node(s), 2 task(s)" <"$dir/int.out" || fail "the job did not run on 2 nodes"
contains "requeueing job $job" <"$dir/int.out" || fail "the batch script did not requeue"
step=$(sed -n 's/^stopped by SIGUSR1 .* at step \([0-9]*\);.*/\1/p' "$dir/int.out" | sed -n 1p)
[[ -n "$step" ]] || fail "ringtrain did not stop on the signal"
((step < 1500)) || fail "stopped at step $step, after the end"
contains "resumed from .*ckpt-0*$step.h5 at step $step" <"$dir/int.out" ||
  fail "the requeued run did not resume at step $step"
contains "training finished" <"$dir/int.out" || fail "the requeued run did not finish"
pass "job $job on 2 nodes: USR1, checkpoint at step $step, exit 75, requeued, resumed, finished"
a=$dir/ref/ckpt/ckpt-000001500.h5
b=$dir/int/ckpt/ckpt-000001500.h5
for group in /params /optimizer /loss_scaler /data; do
  h5diff "$a" "$b" "$group" "$group" || fail "$group differs from the uninterrupted 2-node run"
done
pass "final state bitwise equal to the uninterrupted 2-node run"
