#!/usr/bin/env bash
# ZeRO-1 (--zero 1) end to end: a run restarted 4 -> 3 -> 2 ranks switching --zero 1, 1, 0
# ends within 1e-6 (relative, whole vectors) of the uninterrupted --zero 0 run, masters and
# optimizer state, read back by h5py; a bad --zero value is exit 1; a failure injected in the
# all-gather on rank 1, a stall there and a rank killed there all end the job within seconds.
source "$(dirname "$0")/lib.sh"
dir=$(workdir zero)
PY=/usr/bin/python3
$PY -c 'import numpy, h5py' || fail "needs Debian's python3-numpy and python3-h5py (tools/install-deps.sh)"
args=(--data "$DATA/train.h5" --hidden "33,17" --global-batch-size 48 --threads 1 --optimizer adamw
  --lr 3e-3 --grad-clip 1 --bucket-mb 0.004 --log-every 10)

rc=0
out=$("$BIN" train "${args[@]}" --steps 1 --zero 2 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "--zero 2 exited $rc: $out"
contains "\-\-zero 2 is not valid; expected 0 or 1" <<<"$out" || fail "--zero 2: $out"
pass "--zero 2 refused with exit 1"

# The restart matrix against one uninterrupted run.
mpi 2 "$BIN" train "${args[@]}" --steps 30 --checkpoint-dir "$dir/ref" >"$dir/ref.out" 2>&1 ||
  fail "the uninterrupted run failed: $(cat "$dir/ref.out")"
d=$dir/restart
mpi 4 "$BIN" train "${args[@]}" --steps 10 --zero 1 --checkpoint-dir "$d" >"$dir/r1.out" 2>&1 ||
  fail "4 ranks --zero 1 failed: $(cat "$dir/r1.out")"
contains "memory/rank: .*optimizer state .* (shard of .*--zero 1" <"$dir/r1.out" ||
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
grep -q "stall: rank 0 on .* in the weight all-gather of step 3 bucket 0; not arrived: rank 1 on " "$dir/stall.err" ||
  fail "the stall message does not name the all-gather and rank 1: $(cat "$dir/stall.err")"
pass "stall in the all-gather detected, rank 1 named, exit 2 in $took s"

# kill -9 of rank 1 while rank 0 waits in the all-gather (no stall watch): the job ends.
mpi 2 -x RINGTRAIN_TEST_STALL=1:3:300:gather "$BIN" train "${args[@]}" --steps 10 --zero 1 \
  --stall-timeout 0 >"$dir/kill.out" 2>"$dir/kill.err" &
job=$!
pid=""
for _ in $(seq 1 300); do
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
