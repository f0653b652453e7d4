#!/usr/bin/env bash
# SIGTERM to rank 1 only (a non-zero rank, as Slurm's preemption or a node's OOM killer may
# hit any rank): all ranks stop at the same step, the checkpoint of that step is written and
# validates, rank 0 says which signal reached which rank and where the checkpoint is, and
# the exit code is 75; the same command then continues to the end and exits 0.
source "$(dirname "$0")/lib.sh"
dir=$(workdir signal)
cmd=("$BIN" train --data "$DATA/train.h5" --steps 3000 --batch-size 32 --hidden 256 --threads 1
     --checkpoint-dir "$dir/ck" --log-every 10 --metrics "$dir/m.jsonl")
rc=0
tag=$(job_tag)
E2E_JOB=$tag mpi 2 "${cmd[@]}" >"$dir/out" 2>&1 &
job=$!
for _ in $(seq 1 150); do
  grep -q '"type":"step"' "$dir/m.jsonl" 2>/dev/null && break
  sleep 0.2
done
grep -q '"type":"step"' "$dir/m.jsonl" || fail "the job never trained: $(cat "$dir/out")"

# rank_pid R: the pid of rank R of this test's job (by its tag, lib.sh), from the
# OMPI_COMM_WORLD_RANK that mpirun puts in each rank's environment.
rank_pid() {
  local p
  p=$(job_pids "$tag" "OMPI_COMM_WORLD_RANK=$1")
  [[ -n $p ]] && echo "$p"
}
pid=$(rank_pid 1) || fail "no process of rank 1 found"
# Two signals in a row: the second arrives while the ranks agree or save, and must neither
# corrupt the checkpoint nor change the outcome. Rank 1 may already be gone by then.
kill -TERM "$pid"
sleep 0.05
kill -TERM "$pid" 2>/dev/null || echo "rank 1 had exited before the second SIGTERM"
wait "$job" || rc=$?
cat "$dir/out"
[[ $rc -eq 75 ]] || fail "exit code $rc after SIGTERM to rank 1, expected 75"

# Exactly one line names the signal, the rank it reached, the step and the checkpoint.
pattern="^stopped by SIGTERM on rank 1 at step \([0-9]*\); checkpoint $dir/ck/\(ckpt-[0-9]\{9\}\.h5\) saved"
[[ $(grep -c "$pattern" "$dir/out") -eq 1 ]] ||
  fail "expected one line 'stopped by SIGTERM on rank 1 at step N; checkpoint $dir/ck/ckpt-<9 digits>.h5 saved'"
step=$(sed -n "s|$pattern.*|\1|p" "$dir/out")
ck=$dir/ck/$(sed -n "s|$pattern.*|\2|p" "$dir/out")
(( step > 0 && step < 3000 )) || fail "stopped at step $step"
[[ $ck == "$dir/ck/ckpt-$(printf %09d "$step").h5" ]] || fail "checkpoint $ck is not the one of step $step"
[[ -f $ck ]] || fail "the checkpoint named, $ck, does not exist: $(ls "$dir/ck")"
"$BIN" inspect "$ck" >"$dir/inspect" || fail "inspect $ck exited $?: $(cat "$dir/inspect")"
contains "valid: yes" <"$dir/inspect" || fail "inspect $ck: $(cat "$dir/inspect")"
h5dump -a /step "$ck" | contains "(0): $step\$" || fail "$ck does not hold step $step"
newest=$(find "$dir/ck" -name 'ckpt-*.h5' | sort | tail -n 1)
[[ $newest == "$ck" ]] || fail "a newer checkpoint than the one named: $newest"
pass "SIGTERM to rank 1: stopped at step $step with exit 75, $ck named and valid"

rc=0
out=$(mpi 2 "${cmd[@]}" 2>&1) || rc=$?
[[ $rc -eq 0 ]] || fail "the rerun exited $rc: $out"
contains "resumed from $ck at step $step " <<<"$out" || fail "rerun did not continue from $ck: $out"
"$BIN" inspect "$dir/ck/ckpt-000003000.h5" >/dev/null || fail "rerun did not finish with a valid checkpoint"
pass "the same command continued to the end"
