#!/usr/bin/env bash
# ZeRO-3 (--zero 3) end to end, checkpoints read back by h5py: against --zero 0 on 2 and 3
# ranks in fp32 and bf16 with --grad-accum 2 and --grad-clip on the MLP (fp32 within 1e-6;
# bf16 the masters within 5e-2, as in zero2.sh: the micro-batches' sums taken in another
# order); one micro-batch on 3 ranks: bitwise --zero 2 in fp32 and bf16 (the same
# reduce-scatter buckets), fp32 within 1e-6 of --zero 0; gpt-tiny (tied head: embed.wte gathered again for the head) bitwise
# --zero 0, also with --recompute blocks, and with --grad-accum 2 within 1e-6 (qkv biases
# 1e-3, see zero2.sh); evaluation during training equal to --zero 0's; the memory line's wire
# bytes; --no-overlap and --comm hierarchical bitwise --comm mpi; the restart 4 ranks --zero 3 -> 1 rank --zero 0 -> 3 ranks --zero 2 -> 2 ranks
# --zero 3, each leg within 1e-6 of the uninterrupted run; and a failure injected in a
# parameter all-gather on rank 1, a stall there, and rank 1 killed there each end the job;
# --recompute blocks on a model without repeat body refused on 2 ranks.
source "$(dirname "$0")/lib.sh"
dir=$(workdir zero3)
PY=/usr/bin/python3
$PY -c 'import numpy, h5py' || fail "needs Debian's python3-numpy and python3-h5py (tools/install-deps.sh)"
args=(--data "$DATA/train.h5" --hidden "33,17" --global-batch-size 48 --threads 1 --optimizer adamw
  --lr 3e-3 --grad-clip 1 --bucket-mb 0.004 --log-every 100 --prefetch 0)

# cmp A.h5 B.h5 TOL [GROUPS [-TEXT|+TEXT]]: every dataset of B under /params and /optimizer
# (or the space-separated GROUPS) within TOL (relative L2) of A's; -TEXT: but those whose
# name contains TEXT, +TEXT: only those; prints "bitwise" when all are equal, else the
# largest relative difference.
cmp() {
  $PY - "$@" <<'PYEOF'
import sys, h5py, numpy as np
a, b, tol = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), float(sys.argv[3])
groups = sys.argv[4].split() if len(sys.argv) > 4 else ["params", "optimizer"]
sel = sys.argv[5] if len(sys.argv) > 5 else ""
keep = lambda n: not sel or (sel[1:] in n) == (sel[0] == "+")
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) and n.split("/")[0] in groups and keep(n) else None)
assert len(names) >= (2 if sel.startswith("+") else 6 * len(groups)), names
worst, same = 0.0, True
for n in names:
    x, y = a[n][()].astype(np.float64), b[n][()].astype(np.float64)
    assert x.shape == y.shape, (n, x.shape, y.shape)
    same = same and np.array_equal(x, y)
    ref = np.linalg.norm(x)
    rel = np.linalg.norm(x - y) / ref if ref > 0 else np.linalg.norm(y)
    worst = max(worst, rel)
    if rel > tol:
        print(f"{n}: relative difference {rel:.3g} > {tol}")
        sys.exit(1)
print("bitwise" if same else f"within {worst:.3g}")
PYEOF
}

# --recompute blocks on a model without repeat body (cnn) with --zero 3 on 2 ranks: one
# message, exit 1.
rc=0
out=$(mpi 2 "$BIN" train --model cnn --data "$DATA/train.h5" --threads 1 --steps 1 --zero 3 \
  --recompute blocks 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "--zero 3 --recompute blocks on cnn exited $rc: $out"
[[ $(grep -c "^ringtrain: error: .*--recompute blocks: model 'cnn' has no repeat body" <<<"$out") -eq 1 ]] ||
  fail "--zero 3 --recompute blocks on cnn: not one message: $out"
pass "--zero 3 --recompute blocks on cnn (no repeat body) refused on 2 ranks with one message, exit 1"

# The MLP matrix: 12 steps, 2 micro-batches per step, clipping.
for prec in fp32 bf16; do
  tol=1e-6 groups="params optimizer"
  [[ $prec == bf16 ]] && tol=5e-2 groups=params
  for n in 2 3; do
    for z in 0 3; do
      d=$dir/m-$prec-$n-$z
      mpi "$n" "$BIN" train "${args[@]}" --precision "$prec" --grad-accum 2 --steps 12 --zero "$z" \
        --checkpoint-dir "$d" >"$d.out" 2>&1 || fail "$prec $n ranks --zero $z failed: $(cat "$d.out")"
    done
    r=$(cmp "$dir/m-$prec-$n-0/ckpt-000000012.h5" "$dir/m-$prec-$n-3/ckpt-000000012.h5" "$tol" "$groups") ||
      fail "$prec $n ranks --grad-accum 2: --zero 3 differs from --zero 0: $r"
    pass "$prec $n ranks --grad-accum 2 --grad-clip 1: --zero 3 against --zero 0 ($groups): $r"
  done
done

# One micro-batch on 3 ranks: bitwise --zero 2 in fp32 and bf16 (the same buckets
# reduce-scattered, the same shard updates, the working weights gathered instead of kept),
# and in fp32 within 1e-6 of --zero 0 (whose allreduce sums in another order on 3 ranks).
for prec in fp32 bf16; do
  for z in 0 2 3; do
    [[ $prec == bf16 && $z == 0 ]] && continue
    d=$dir/b-$prec-$z
    mpi 3 "$BIN" train "${args[@]}" --precision "$prec" --steps 12 --zero "$z" --checkpoint-dir "$d" \
      >"$d.out" 2>&1 || fail "$prec 3 ranks --zero $z failed: $(cat "$d.out")"
  done
  r=$(cmp "$dir/b-$prec-2/ckpt-000000012.h5" "$dir/b-$prec-3/ckpt-000000012.h5" 0) ||
    fail "$prec 3 ranks: --zero 3 is not bitwise --zero 2: $r"
  [[ $r == bitwise ]] || fail "$prec 3 ranks --zero 3: $r"
  pass "$prec 3 ranks --grad-clip 1: --zero 3 bitwise equal to --zero 2"
done
r=$(cmp "$dir/b-fp32-0/ckpt-000000012.h5" "$dir/b-fp32-3/ckpt-000000012.h5" 1e-6) ||
  fail "fp32 3 ranks: --zero 3 differs from --zero 0: $r"
pass "fp32 3 ranks --grad-clip 1: --zero 3 against --zero 0: $r"

# The memory line: reduce-scatter half the ring allreduce, and the parameter all-gathers
# (forward's, and backward's but the unit it keeps) between one and two gradients' worth,
# in all at most 1.5 allreduces.
line=$(grep -o "gathered unit <= [0-9]* B (3 units, not prefetched), gradients [0-9]* B (fp32 shard) + buckets in flight <= [0-9]* B; --zero 3; wire/step/rank: reduce-scatter [0-9]* B + parameter all-gather [0-9]* B (ring model: allreduce [0-9]* B)" "$dir/b-fp32-3.out") ||
  fail "no --zero 3 memory line: $(cat "$dir/b-fp32-3.out")"
rs=${line#*reduce-scatter }
rs=${rs%% B*}
ag=${line#*parameter all-gather }
ag=${ag%% B*}
ar=${line##*allreduce }
ar=${ar%% B*}
(( rs > 0 && (2 * rs - ar) * (2 * rs - ar) <= 4 )) || fail "reduce-scatter $rs B is not half the allreduce's $ar B: $line"
(( ag > rs && ag < 2 * rs && 2 * (rs + ag) <= 3 * ar + 2 )) ||
  fail "parameter all-gather $ag B: not between one and two gradients, or more than 1.5 allreduces: $line"
pass "memory line: $line"

# --no-overlap (the reductions on the training thread) and --comm hierarchical (2 "nodes" of
# 2 ranks: the gathers and reduce-scatters on its world communicator) bitwise the overlapped
# --comm mpi run, 4 ranks, --grad-accum 2.
for v in "mpi" "mpi --no-overlap" "hierarchical"; do
  d=$dir/comm-${v// /}
  # shellcheck disable=SC2086
  mpi 4 -x RINGTRAIN_RANKS_PER_NODE=2 "$BIN" train "${args[@]}" --grad-accum 2 --steps 6 --zero 3 --comm $v \
    --checkpoint-dir "$d" >"$d.out" 2>&1 || fail "--zero 3 --comm $v failed: $(cat "$d.out")"
done
contains "comm hierarchical" <"$dir/comm-hierarchical.out" || fail "not hierarchical: $(cat "$dir/comm-hierarchical.out")"
for v in mpi--no-overlap hierarchical; do
  r=$(cmp "$dir/comm-mpi/ckpt-000000006.h5" "$dir/comm-$v/ckpt-000000006.h5" 0) || fail "--zero 3 $v: $r"
  [[ $r == bitwise ]] || fail "--zero 3 $v: $r"
done
pass "--zero 3 --no-overlap and --comm hierarchical (2 nodes x 2 ranks) bitwise equal to --comm mpi"

# Evaluation during training gathers the whole weights: the same figures as --zero 0.
for z in 0 3; do
  mpi 2 "$BIN" train "${args[@]}" --steps 6 --eval-every 3 --val-data "$DATA/test.h5" --zero "$z" \
    >"$dir/eval-$z.out" 2>&1 || fail "--zero $z with --val-data failed: $(cat "$dir/eval-$z.out")"
done
e0=$(grep "^eval step" "$dir/eval-0.out") e3=$(grep "^eval step" "$dir/eval-3.out")
[[ $(grep -c . <<<"$e0") -ge 2 && "$e0" == "$e3" ]] ||
  fail "--zero 3 evaluation differs from --zero 0's: '$e3' vs '$e0'"
pass "evaluation during training with --zero 3 equal to --zero 0's: $(tr '\n' ' ' <<<"$e3")"

# gpt-tiny, whose head shares embed.wte: 2 ranks, clipping.
(
  cd "$dir"
  $PY - <<'PYEOF'
import os, random
random.seed(3)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(16):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(90)) + "\n")
PYEOF
  "$BIN" convert text --input 'corpus/*.py' --out tok.h5 >/dev/null
) || fail "convert text failed"
gpt=(--model gpt-tiny --set layers=2 --set heads=2 --set width=32 --set context=16 --data "$dir/tok.h5"
  --threads 1 --prefetch 0 --optimizer adamw --lr 3e-3 --global-batch-size 8 --grad-clip 1
  --bucket-mb 0.01 --steps 8 --log-every 100)
run_gpt() {  # NAME ARGS...
  local name=$1
  shift
  mpi 2 "$BIN" train "${gpt[@]}" "$@" --checkpoint-dir "$dir/$name" >"$dir/$name.out" 2>&1 ||
    fail "gpt-tiny $*: $(cat "$dir/$name.out")"
}
run_gpt gpt-0 --zero 0
run_gpt gpt-3 --zero 3
run_gpt gpt-3r --zero 3 --recompute blocks
for v in gpt-3 gpt-3r; do
  r=$(cmp "$dir/gpt-0/ckpt-000000008.h5" "$dir/$v/ckpt-000000008.h5" 0) || fail "gpt-tiny $v is not bitwise --zero 0: $r"
  [[ $r == bitwise ]] || fail "gpt-tiny $v: $r"
done
pass "gpt-tiny 2 ranks --grad-clip 1: --zero 3, and --zero 3 --recompute blocks, bitwise equal to --zero 0"
run_gpt gpt-a0 --zero 0 --grad-accum 2
run_gpt gpt-a3 --zero 3 --grad-accum 2 --recompute blocks
g0=$dir/gpt-a0/ckpt-000000008.h5 g3=$dir/gpt-a3/ckpt-000000008.h5
r=$(cmp "$g0" "$g3" 1e-6 "params optimizer" -qkv.bias) || fail "gpt-tiny --grad-accum 2: $r"
r2=$(cmp "$g0" "$g3" 1e-3 params +qkv.bias) || fail "gpt-tiny --grad-accum 2 qkv biases: $r2"
pass "gpt-tiny 2 ranks --grad-accum 2 --grad-clip 1 --recompute blocks: --zero 3 against --zero 0: $r (qkv biases $r2)"
run_gpt gpt-b2 --zero 2 --precision bf16
run_gpt gpt-b3 --zero 3 --precision bf16 --recompute blocks
r=$(cmp "$dir/gpt-b2/ckpt-000000008.h5" "$dir/gpt-b3/ckpt-000000008.h5" 0) || fail "gpt-tiny bf16: $r"
[[ $r == bitwise ]] || fail "gpt-tiny bf16 --zero 3: $r"
pass "gpt-tiny 2 ranks bf16: --zero 3 --recompute blocks bitwise equal to --zero 2"

# Restart across stages and rank counts, each leg against the uninterrupted run.
mpi 2 "$BIN" train "${args[@]}" --steps 40 --checkpoint-every 10 --keep 10 --checkpoint-dir "$dir/ref" \
  >"$dir/ref.out" 2>&1 || fail "the uninterrupted run failed: $(cat "$dir/ref.out")"
d=$dir/restart
leg=0
for spec in "4 3 10" "1 0 20" "3 2 30" "2 3 40"; do
  read -r n z steps <<<"$spec"
  leg=$((leg + 1))
  mpi "$n" "$BIN" train "${args[@]}" --steps "$steps" --zero "$z" --checkpoint-dir "$d" >"$dir/r$leg.out" 2>&1 ||
    fail "leg $leg, $n ranks --zero $z failed: $(cat "$dir/r$leg.out")"
  if (( leg > 1 )); then
    contains "resumed from .*ckpt-0000000$((steps - 10)).h5 at step $((steps - 10))" <"$dir/r$leg.out" ||
      fail "leg $leg did not resume step $((steps - 10)): $(cat "$dir/r$leg.out")"
  fi
  c=ckpt-0000000$steps.h5
  r=$(cmp "$dir/ref/$c" "$d/$c" 1e-6) || fail "leg $leg ($n ranks --zero $z) differs from the uninterrupted run: $r"
  pass "restart leg $leg, $n rank(s) --zero $z to step $steps, against the uninterrupted run: $r"
done

# A failure in a parameter all-gather of rank 1: one error line, exit 2, every rank ended.
start=$(date +%s)
rc=0
timeout 60 mpirun -n 2 -x RINGTRAIN_TEST_FAIL=1:paramgather:3 "$BIN" train "${args[@]}" \
  --steps 6 --zero 3 >"$dir/fail.out" 2>"$dir/fail.err" || rc=$?
[[ $rc -eq 2 ]] || fail "injected parameter gather failure: exit $rc, expected 2: $(cat "$dir/fail.err")"
[[ $(grep -c '^ringtrain: error:' "$dir/fail.err") -eq 1 ]] || fail "not one error line: $(cat "$dir/fail.err")"
grep '^ringtrain: error:' "$dir/fail.err" | contains "injected test failure at 'paramgather' on rank 1" ||
  fail "the error line does not name the parameter gather on rank 1: $(cat "$dir/fail.err")"
pass "failure in a --zero 3 parameter all-gather on rank 1 ended the job in $(($(date +%s) - start)) s, exit 2"

# Rank 1 held before its first parameter all-gather of step 3: the stall watch ends the job.
start=$(date +%s)
rc=0
timeout 60 mpirun -n 2 -x RINGTRAIN_TEST_STALL=1:3:120:gather "$BIN" train "${args[@]}" --steps 10 --zero 3 \
  --stall-timeout 2 >"$dir/stall.out" 2>"$dir/stall.err" || rc=$?
took=$(($(date +%s) - start))
[[ $rc -eq 2 ]] || fail "stall in the parameter all-gather: exit $rc, expected 2: $(cat "$dir/stall.err")"
(( took < 40 )) || fail "the stalled job took $took s to end"
grep -q "stall: rank 0 on .* in the parameter all-gather of step 3 .*; not arrived: rank 1 on " "$dir/stall.err" ||
  fail "the stall message does not name the parameter all-gather and rank 1: $(cat "$dir/stall.err")"
pass "stall in a parameter all-gather detected, rank 1 named, exit 2 in $took s"

# kill -9 of rank 1 while rank 0 waits in the parameter all-gather (no stall watch).
mpi 2 -x RINGTRAIN_TEST_STALL=1:3:300:gather "$BIN" train "${args[@]}" --steps 10 --zero 3 \
  --stall-timeout 0 >"$dir/kill.out" 2>"$dir/kill.err" &
job=$!
pid=""
for _ in $(seq 1 300); do
  [[ -f $dir/kill.err ]] &&
    pid=$(sed -n 's/^ringtrain: test: rank 1 (pid \([0-9]*\)) held before the all-gather.*/\1/p' "$dir/kill.err")
  [[ -n $pid ]] && break
  sleep 0.2
done
[[ -n $pid ]] || fail "rank 1 never reached the parameter all-gather: $(cat "$dir/kill.err")"
sleep 1 # rank 0 is inside the parameter all-gather of step 3 by now
start=$(date +%s)
kill -9 "$pid"
rc=0
wait "$job" || rc=$?
took=$(($(date +%s) - start))
(( rc != 0 && rc != 124 )) || fail "the job with rank 1 killed in the parameter all-gather exited $rc"
(( took <= 30 )) || fail "the job took $took s to end after kill -9"
pass "kill -9 of rank 1 during a parameter all-gather ended the job in $took s (exit $rc)"
