#!/usr/bin/env bash
# SIGUSR1 to one rank: all ranks stop at the same step, a checkpoint is written, the exit
# code is 75; the same command then continues to the end and exits 0.
source "$(dirname "$0")/lib.sh"
dir=$(workdir signal)
cmd=("$BIN" train --data "$DATA/train.h5" --steps 3000 --batch-size 32 --hidden 256 --threads 1
     --checkpoint-dir "$dir/ck" --log-every 10 --metrics "$dir/m.jsonl")
rc=0
mpi 2 "${cmd[@]}" >"$dir/out" 2>&1 &
job=$!
for _ in $(seq 1 100); do
  grep -q '"type":"step"' "$dir/m.jsonl" 2>/dev/null && break
  sleep 0.2
done
pid=$(pgrep -f "^$BIN train --data $DATA/train.h5 --steps 3000" | sed -n 1p)
[[ -n "$pid" ]] || fail "no rank process found"
# Two signals in a row: the second arrives while the ranks agree or save, and must neither
# corrupt the checkpoint nor change the outcome.
kill -USR1 "$pid"
sleep 0.05
kill -USR1 "$pid" 2>/dev/null || true
wait "$job" || rc=$?
cat "$dir/out"
[[ $rc -eq 75 ]] || fail "exit code $rc after SIGUSR1, expected 75"
ck=$(find "$dir/ck" -name 'ckpt-*.h5' | sort | tail -n 1)
[[ -n "$ck" ]] || fail "no checkpoint after the signal"
step=$(h5dump -a /step "$ck" | sed -n 's/.*(0): \([0-9]*\).*/\1/p')
(( step > 0 && step < 3000 )) || fail "checkpoint step $step"
"$BIN" inspect "$ck" | contains "valid: yes" || fail "the checkpoint after two signals is not valid"
pass "stopped at step $step with exit 75, checkpoint valid"
out=$(mpi 2 "${cmd[@]}" 2>&1)
grep -q "resumed from .* at step $step" <<<"$out" || fail "rerun did not continue"
[[ -f "$dir/ck/ckpt-000003000.h5" ]] || fail "rerun did not finish"
pass "the same command continued to the end"
