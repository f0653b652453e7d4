#!/usr/bin/env bash
# Preemption and the time limit as slurm/train.sbatch handles them: USR1 to the batch
# script (what --signal=B:USR1@120 delivers before the limit, sent here with
# `scancel --signal=USR1 --batch`) is forwarded to the ranks, which checkpoint and exit 75;
# the script requeues the job, the requeued job resumes, and its final parameters,
# optimizer state, loss scaler and data position equal an uninterrupted run's bitwise
# (h5diff).
source "$(dirname "$0")/lib.sh"
dir=$(tdir slurm-requeue)
cd "$SRC" || exit 1
train=(--data "$DATA/train.h5" --steps 3000 --batch-size 32 --threads 1 --log-every 25
       --checkpoint-every 1000 --precision fp16 --seed 11)
sbatch_opts=(--nodes=1 --ntasks-per-node=2 --gpus-per-task=0 --cpus-per-task=1 --time=5)

rc=0
RINGTRAIN=$BIN RUN_DIR=$dir/ref submit_wait 300 "${sbatch_opts[@]}" --output="$dir/ref.out" \
  slurm/train.sbatch "${train[@]}" >/dev/null || rc=$?
[[ $rc -eq 0 ]] || { cat "$dir/ref.out"; fail "the uninterrupted job did not complete"; }
pass "uninterrupted reference job finished"

job=$(RINGTRAIN=$BIN RUN_DIR=$dir/int sbatch --parsable "${sbatch_opts[@]}" \
  --output="$dir/int.out" slurm/train.sbatch "${train[@]}" | cut -d';' -f1)
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
contains "USR1 received" <"$dir/int.out" || fail "the batch script did not see USR1"
contains "requeueing job $job" <"$dir/int.out" || fail "the batch script did not requeue"
step=$(sed -n 's/^stopped by SIGUSR1 on \(all 2 ranks\|rank [01]\) at step \([0-9]*\);.*/\2/p' "$dir/int.out")
[[ -n "$step" ]] || fail "ringtrain did not stop on the signal"
((step < 3000)) || fail "stopped at step $step, after the end"
contains "resumed from .*ckpt-0*$step.h5 at step $step" <"$dir/int.out" ||
  fail "the requeued run did not resume at step $step"
contains "training finished" <"$dir/int.out" || fail "the requeued run did not finish"
pass "job $job: USR1, checkpoint at step $step, exit 75, requeued, resumed, finished"

a=$dir/ref/ckpt/ckpt-000003000.h5
b=$dir/int/ckpt/ckpt-000003000.h5
for group in /params /optimizer /loss_scaler /data; do
  h5diff "$a" "$b" "$group" "$group" || fail "$group differs from the uninterrupted run"
done
pass "final state bitwise equal to the uninterrupted run"
