#!/usr/bin/env bash
# ZeRO-1 (--zero 1) end to end: a run restarted 4 -> 3 -> 2 ranks switching --zero 1, 1, 0
# ends within 1e-6 (relative, whole vectors) of the uninterrupted --zero 0 run, masters and
# optimizer state, read back by h5py; in bf16 (sharded fp32 masters) a resume on the same
# ranks is bitwise and the restart 4 -> 3 -> 2 ranks works; --comm hierarchical with --zero 1
# equals --comm mpi with --zero 1 bitwise; a bad --zero value is exit 1; a failure injected
# in the all-gather on rank 1, a stall there and a rank killed there all end the job.
source "$(dirname "$0")/lib.sh"
dir=$(workdir zero)
PY=/usr/bin/python3
$PY -c 'import numpy, h5py' || fail "needs Debian's python3-numpy and python3-h5py (tools/install-deps.sh)"
args=(--data "$DATA/train.h5" --hidden "33,17" --global-batch-size 48 --threads 1 --optimizer adamw
  --lr 3e-3 --grad-clip 1 --bucket-mb 0.004 --log-every 10)

rc=0
out=$("$BIN" train "${args[@]}" --steps 1 --zero 5 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "--zero 5 exited $rc: $out"
contains "\-\-zero 5 is not valid; expected 0, 1, 2 or 3" <<<"$out" || fail "--zero 5: $out"
pass "--zero 5 refused with exit 1"

# The restart matrix against one uninterrupted run.
mpi 2 "$BIN" train "${args[@]}" --steps 30 --checkpoint-dir "$dir/ref" >"$dir/ref.out" 2>&1 ||
  fail "the uninterrupted run failed: $(cat "$dir/ref.out")"
d=$dir/restart
mpi 4 "$BIN" train "${args[@]}" --steps 10 --zero 1 --checkpoint-dir "$d" >"$dir/r1.out" 2>&1 ||
  fail "4 ranks --zero 1 failed: $(cat "$dir/r1.out")"
contains "memory/rank: masters [0-9]* B (shard of .*--zero 1; wire/step/rank: reduce-scatter" <"$dir/r1.out" ||
  fail "no sharded memory line: $(cat "$dir/r1.out")"
mpi 3 "$BIN" train "${args[@]}" --steps 20 --zero 1 --checkpoint-dir "$d" >"$dir/r2.out" 2>&1 ||
  fail "3 ranks --zero 1 failed: $(cat "$dir/r2.out")"
contains "resumed from .*ckpt-000000010.h5 at step 10 (saved by 4 ranks" <"$dir/r2.out" ||
  fail "3 ranks did not resume step 10: $(cat "$dir/r2.out")"
mpi 2 "$BIN" train "${args[@]}" --steps 30 --zero 0 --checkpoint-dir "$d" >"$dir/r3.out" 2>&1 ||
  fail "2 ranks --zero 0 failed: $(cat "$dir/r3.out")"
contains "resumed from .*ckpt-000000020.h5 at step 20 (saved by 3 ranks" <"$dir/r3.out" ||
  fail "2 ranks did not resume step 20: $(cat "$dir/r3.out")"
$PY - "$dir/ref/ckpt-000000030.h5" "$d/ckpt-000000030.h5" <<'PYEOF' || fail "the restarted run differs from the uninterrupted one"
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:])
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) and n.split("/")[0] in ("params", "optimizer") else None)
assert len(names) >= 12, names
worst = 0.0
for n in names:
    x, y = a[n][()].astype(np.float64), b[n][()].astype(np.float64)
    assert x.shape == y.shape, (n, x.shape, y.shape)
    ref = np.linalg.norm(x)
    rel = np.linalg.norm(x - y) / ref if ref > 0 else np.linalg.norm(y)
    worst = max(worst, rel)
    if rel > 1e-6:
        print(f"{n}: relative difference {rel:.3g}")
        sys.exit(1)
print(f"{len(names)} datasets, largest relative difference {worst:.3g}")
PYEOF
pass "4 ranks --zero 1 -> 3 ranks --zero 1 -> 2 ranks --zero 0 matches the uninterrupted run within 1e-6"

# bf16: the masters are sharded; a checkpoint holds every rank's shard at full shape.
same() { # two checkpoints' params and optimizer datasets bitwise equal
  $PY - "$1" "$2" <<'PYEOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:])
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) and n.split("/")[0] in ("params", "optimizer") else None)
assert len(names) >= 12, names
for n in names:
    if not np.array_equal(a[n][()], b[n][()]):
        print(f"{n} differs"); sys.exit(1)
PYEOF
}
bf=(--precision bf16 --zero 1)
mpi 3 "$BIN" train "${args[@]}" "${bf[@]}" --steps 20 --checkpoint-dir "$dir/bf_ref" >"$dir/bf_ref.out" 2>&1 ||
  fail "bf16 --zero 1 on 3 ranks failed: $(cat "$dir/bf_ref.out")"
contains "memory/rank: masters .* B (shard of .*, optimizer state .* + fp32-read parameters .*--zero 1; wire/step/rank: reduce-scatter" <"$dir/bf_ref.out" ||
  fail "no sharded-masters memory line: $(cat "$dir/bf_ref.out")"
mpi 3 "$BIN" train "${args[@]}" "${bf[@]}" --steps 10 --checkpoint-dir "$dir/bf" >"$dir/bf1.out" 2>&1 ||
  fail "bf16 --zero 1 10 steps failed: $(cat "$dir/bf1.out")"
mpi 3 "$BIN" train "${args[@]}" "${bf[@]}" --steps 20 --checkpoint-dir "$dir/bf" >"$dir/bf2.out" 2>&1 ||
  fail "bf16 --zero 1 resume failed: $(cat "$dir/bf2.out")"
same "$dir/bf_ref/ckpt-000000020.h5" "$dir/bf/ckpt-000000020.h5" ||
  fail "bf16 --zero 1 resumed on 3 ranks is not bitwise the uninterrupted run"
pass "bf16 --zero 1 (sharded masters): 10 + 10 steps on 3 ranks bitwise equal to 20 steps"
mpi 4 "$BIN" train "${args[@]}" "${bf[@]}" --steps 30 --checkpoint-dir "$dir/bf" >"$dir/bf3.out" 2>&1 ||
  fail "bf16 --zero 1 on 4 ranks from 3 failed: $(cat "$dir/bf3.out")"
contains "resumed from .*ckpt-000000020.h5 at step 20 (saved by 3 ranks" <"$dir/bf3.out" || fail "$(cat "$dir/bf3.out")"
mpi 2 "$BIN" train "${args[@]}" --precision bf16 --zero 0 --steps 40 --checkpoint-dir "$dir/bf" >"$dir/bf4.out" 2>&1 ||
  fail "bf16 --zero 0 on 2 ranks from 4 failed: $(cat "$dir/bf4.out")"
contains "resumed from .*ckpt-000000030.h5 at step 30 (saved by 4 ranks" <"$dir/bf4.out" || fail "$(cat "$dir/bf4.out")"
pass "bf16 restart 3 ranks --zero 1 -> 4 ranks --zero 1 -> 2 ranks --zero 0"

# --comm hierarchical (2 "nodes" of 2 ranks) with --zero 1: the reduce-scatter and all-gather
# run on its world communicator, so the run is bitwise the --comm mpi one.
mpi 4 -x RINGTRAIN_RANKS_PER_NODE=2 "$BIN" train "${args[@]}" --zero 1 --comm hierarchical --steps 20 \
  --checkpoint-dir "$dir/hier" >"$dir/hier.out" 2>&1 || fail "--comm hierarchical --zero 1 failed: $(cat "$dir/hier.out")"
contains "comm hierarchical" <"$dir/hier.out" || fail "not hierarchical: $(cat "$dir/hier.out")"
mpi 4 "$BIN" train "${args[@]}" --zero 1 --steps 20 --checkpoint-dir "$dir/flat" >"$dir/flat.out" 2>&1 ||
  fail "--comm mpi --zero 1 failed: $(cat "$dir/flat.out")"
same "$dir/hier/ckpt-000000020.h5" "$dir/flat/ckpt-000000020.h5" ||
  fail "--comm hierarchical --zero 1 differs from --comm mpi --zero 1"
pass "--comm hierarchical --zero 1 on 2 nodes x 2 ranks bitwise equal to --comm mpi --zero 1"

# Failure in the all-gather on rank 1 of 2: one error line, exit 2.
start=$(date +%s)
rc=0
timeout 60 mpirun -n 2 -x RINGTRAIN_TEST_FAIL=1:gather:3 "$BIN" train "${args[@]}" --steps 6 --zero 1 \
  >"$dir/fail.out" 2>"$dir/fail.err" || rc=$?
[[ $rc -eq 2 ]] || fail "injected gather failure: exit $rc, expected 2: $(cat "$dir/fail.err")"
[[ $(grep -c '^ringtrain: error:' "$dir/fail.err") -eq 1 ]] || fail "not one error line: $(cat "$dir/fail.err")"
grep '^ringtrain: error:' "$dir/fail.err" | contains "injected test failure at 'gather' on rank 1" ||
  fail "the error line does not name the gather on rank 1: $(cat "$dir/fail.err")"
pass "failure in the all-gather on rank 1 ended the job in $(( $(date +%s) - start )) s, exit 2"

# Rank 1 of 2 held before the all-gather of step 3: rank 0 waits in it and the stall watch ends the job.
start=$(date +%s)
rc=0
timeout 60 mpirun -n 2 -x RINGTRAIN_TEST_STALL=1:3:120:gather "$BIN" train "${args[@]}" --steps 10 --zero 1 \
  --stall-timeout 2 >"$dir/stall.out" 2>"$dir/stall.err" || rc=$?
took=$(( $(date +%s) - start ))
[[ $rc -eq 2 ]] || fail "stall in the all-gather: exit $rc, expected 2: $(cat "$dir/stall.err")"
(( took < 40 )) || fail "the stalled job took $took s to end"
grep -q "stall: rank 0 on .* in the weight all-gather of step 3 bucket 1; not arrived: rank 1 on " "$dir/stall.err" ||
  fail "the stall message does not name the all-gather and rank 1: $(cat "$dir/stall.err")"
pass "stall in the all-gather detected, rank 1 named, exit 2 in $took s"

# kill -9 of rank 1 while rank 0 waits in the all-gather (no stall watch): the job ends.
mpi 2 -x RINGTRAIN_TEST_STALL=1:3:300:gather "$BIN" train "${args[@]}" --steps 10 --zero 1 \
  --stall-timeout 0 >"$dir/kill.out" 2>"$dir/kill.err" &
job=$!
pid=""
for _ in $(seq 1 300); do
  # (the background job may not have opened kill.err yet)
  [[ -f $dir/kill.err ]] &&
    pid=$(sed -n 's/^ringtrain: test: rank 1 (pid \([0-9]*\)) held before the all-gather.*/\1/p' "$dir/kill.err")
  [[ -n $pid ]] && break
  sleep 0.2
done
[[ -n $pid ]] || fail "rank 1 never reached the all-gather: $(cat "$dir/kill.err")"
sleep 1 # rank 0 is inside the all-gather of step 3 by now
start=$(date +%s)
kill -9 "$pid"
rc=0
wait "$job" || rc=$?
took=$(( $(date +%s) - start ))
(( rc != 0 && rc != 124 )) || fail "the job with rank 1 killed in the all-gather exited $rc"
(( took <= 30 )) || fail "the job took $took s to end after kill -9"
pass "kill -9 of rank 1 during the all-gather ended the job in $took s (exit $rc)"
