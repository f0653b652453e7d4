#!/usr/bin/env bash
# ZeRO-2 (--zero 2) end to end, checkpoints read back by h5py: --zero 0|1|2 x fp32/bf16 on 2
# and 3 ranks with --grad-accum 2 and --grad-clip on the MLP, the masters and optimizer state
# after 12 steps against --zero 0 (fp32 within 1e-6; bf16 the masters within 5e-2: bf16 sums
# taken in another order, which AdamW's moments amplify where gradients are near zero, leave
# up to 3e-2, while a run that dropped a micro-batch is 0.4 off); --zero 2 bitwise equal to
# --zero 1 where both reduce the same buckets (one micro-batch); the memory line with the
# reduce-scatter at half the ring allreduce's bytes; --comm hierarchical bitwise --comm mpi;
# gpt-tiny (tied head) on 2 ranks against --zero 0; the restart 2 ranks --zero 2 -> 1 rank
# --zero 0 -> 3 ranks --zero 2 within 1e-6 of the uninterrupted run; and --zero 4 refused at
# 2 ranks, one message, exit 1; an injected failure in the reduce-scatter on rank 1, exit 2.
source "$(dirname "$0")/lib.sh"
dir=$(workdir zero2)
PY=/usr/bin/python3
$PY -c 'import numpy, h5py' || fail "needs Debian's python3-numpy and python3-h5py (tools/install-deps.sh)"
args=(--data "$DATA/train.h5" --hidden "33,17" --global-batch-size 48 --threads 1 --optimizer adamw
  --lr 3e-3 --grad-clip 1 --bucket-mb 0.004 --log-every 100 --prefetch 0)

rc=0
out=$(mpi 2 "$BIN" train "${args[@]}" --steps 1 --zero 4 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "--zero 4 on 2 ranks exited $rc: $out"
[[ $(grep -c "^ringtrain: error: .*--zero 4 is not valid; expected 0, 1, 2 or 3" <<<"$out") -eq 1 ]] ||
  fail "--zero 4: not one message: $out"
pass "--zero 4 refused on 2 ranks with one message, exit 1"

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

# A failure in the reduce-scatter of rank 1 (while backward may wait for a bucket buffer):
# one error line, exit 2, every rank ended.
start=$(date +%s)
rc=0
timeout 60 mpirun -n 2 -x RINGTRAIN_TEST_FAIL=1:reduce:3 "$BIN" train "${args[@]}" \
  --steps 6 --zero 2 >"$dir/fail.out" 2>"$dir/fail.err" || rc=$?
[[ $rc -eq 2 ]] || fail "injected reduce failure: exit $rc, expected 2: $(cat "$dir/fail.err")"
[[ $(grep -c '^ringtrain: error:' "$dir/fail.err") -eq 1 ]] || fail "not one error line: $(cat "$dir/fail.err")"
grep '^ringtrain: error:' "$dir/fail.err" | contains "injected test failure at 'reduce' on rank 1" ||
  fail "the error line does not name the reduce on rank 1: $(cat "$dir/fail.err")"
pass "failure in the --zero 2 reduce-scatter on rank 1 ended the job in $(($(date +%s) - start)) s, exit 2"

# The matrix: 12 steps, 2 micro-batches per step, clipping.
for prec in fp32 bf16; do
  tol=1e-6 groups="params optimizer"
  [[ $prec == bf16 ]] && tol=5e-2 groups=params
  for n in 2 3; do
    for z in 0 1 2; do
      d=$dir/m-$prec-$n-$z
      mpi "$n" "$BIN" train "${args[@]}" --precision "$prec" --grad-accum 2 --steps 12 --zero "$z" \
        --checkpoint-dir "$d" >"$d.out" 2>&1 || fail "$prec $n ranks --zero $z failed: $(cat "$d.out")"
    done
    for z in 1 2; do
      r=$(cmp "$dir/m-$prec-$n-0/ckpt-000000012.h5" "$dir/m-$prec-$n-$z/ckpt-000000012.h5" "$tol" "$groups") ||
        fail "$prec $n ranks --grad-accum 2: --zero $z differs from --zero 0: $r"
      pass "$prec $n ranks --grad-accum 2 --grad-clip 1: --zero $z against --zero 0 ($groups): $r"
    done
  done
done
grep -q "2 micro-batches.*--zero 2; wire/step/rank: reduce-scatter [0-9]* B (2 micro-batches)" \
  "$dir/m-fp32-2-2.out" || fail "no --zero 2 memory line with its micro-batches: $(cat "$dir/m-fp32-2-2.out")"

# One micro-batch: --zero 2 reduces exactly the buckets --zero 1 does.
for prec in fp32 bf16; do
  for z in 1 2; do
    d=$dir/b-$prec-$z
    mpi 3 "$BIN" train "${args[@]}" --precision "$prec" --steps 12 --zero "$z" --checkpoint-dir "$d" \
      >"$d.out" 2>&1 || fail "$prec 3 ranks --zero $z failed: $(cat "$d.out")"
  done
  r=$(cmp "$dir/b-$prec-1/ckpt-000000012.h5" "$dir/b-$prec-2/ckpt-000000012.h5" 0) ||
    fail "$prec 3 ranks: --zero 2 is not bitwise --zero 1: $r"
  [[ $r == bitwise ]] || fail "$prec: $r"
  pass "$prec 3 ranks: --zero 2 bitwise equal to --zero 1"
done
line=$(grep -o "gradients [0-9]* B (fp32 shard) + buckets in flight <= [0-9]* B; --zero 2; wire/step/rank: reduce-scatter [0-9]* B + all-gather [0-9]* B (ring model: allreduce [0-9]* B)" "$dir/b-fp32-2.out") ||
  fail "no --zero 2 memory line: $(cat "$dir/b-fp32-2.out")"
rs=${line#*reduce-scatter }
rs=${rs%% B*}
ar=${line##*allreduce }
ar=${ar%% B*}
(( rs > 0 && (2 * rs - ar) * (2 * rs - ar) <= 4 )) || fail "reduce-scatter $rs B is not half the allreduce's $ar B: $line"
pass "memory line: $line"

# --comm hierarchical (2 "nodes" of 2 ranks): the reduce-scatter runs on its world
# communicator, so the run is bitwise the --comm mpi one.
for c in hierarchical mpi; do
  mpi 4 -x RINGTRAIN_RANKS_PER_NODE=2 "$BIN" train "${args[@]}" --grad-accum 2 --zero 2 --comm "$c" \
    --steps 6 --checkpoint-dir "$dir/comm-$c" >"$dir/comm-$c.out" 2>&1 ||
    fail "--comm $c --zero 2 failed: $(cat "$dir/comm-$c.out")"
done
contains "comm hierarchical" <"$dir/comm-hierarchical.out" || fail "not hierarchical: $(cat "$dir/comm-hierarchical.out")"
r=$(cmp "$dir/comm-mpi/ckpt-000000006.h5" "$dir/comm-hierarchical/ckpt-000000006.h5" 0) ||
  fail "--comm hierarchical --zero 2 differs from --comm mpi: $r"
[[ $r == bitwise ]] || fail "--comm hierarchical --zero 2: $r"
pass "--comm hierarchical --zero 2 on 2 nodes x 2 ranks bitwise equal to --comm mpi"

# gpt-tiny, whose head shares embed.wte: 2 ranks, clipping; bitwise --zero 0 with one
# micro-batch. With --grad-accum 2 within 1e-6 but the attention's qkv biases: the key part
# of that bias has a zero gradient in exact arithmetic (softmax ignores a constant added to
# every score), so what it gets is rounding noise, which AdamW turns into steps of size lr
# whatever the summation order (1.4e-4 relative measured); they are held to 1e-3.
(
  cd "$dir"
  $PY - <<'EOF'
import os, random
random.seed(3)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(16):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(90)) + "\n")
EOF
  "$BIN" convert text --input 'corpus/*.py' --out tok.h5 >/dev/null
) || fail "convert text failed"
gpt=(--model gpt-tiny --set layers=2 --set heads=2 --set width=32 --set context=16 --data "$dir/tok.h5"
  --threads 1 --prefetch 0 --optimizer adamw --lr 3e-3 --global-batch-size 8 --grad-clip 1
  --bucket-mb 0.01 --steps 8 --log-every 100)
for k in 1 2; do
  for z in 0 2; do
    mpi 2 "$BIN" train "${gpt[@]}" --grad-accum "$k" --zero "$z" --checkpoint-dir "$dir/gpt-$k-$z"       >"$dir/gpt-$k-$z.out" 2>&1 || fail "gpt-tiny --grad-accum $k --zero $z failed: $(cat "$dir/gpt-$k-$z.out")"
  done
done
g0=$dir/gpt-1-0/ckpt-000000008.h5 g2=$dir/gpt-1-2/ckpt-000000008.h5
r=$(cmp "$g0" "$g2" 0) || fail "gpt-tiny --zero 2 is not bitwise --zero 0: $r"
[[ $r == bitwise ]] || fail "gpt-tiny --zero 2: $r"
pass "gpt-tiny 2 ranks --grad-clip 1: --zero 2 bitwise equal to --zero 0"
g0=$dir/gpt-2-0/ckpt-000000008.h5 g2=$dir/gpt-2-2/ckpt-000000008.h5
r=$(cmp "$g0" "$g2" 1e-6 "params optimizer" -qkv.bias) || fail "gpt-tiny --grad-accum 2: $r"
r2=$(cmp "$g0" "$g2" 1e-3 params +qkv.bias) || fail "gpt-tiny --grad-accum 2 qkv biases: $r2"
pass "gpt-tiny 2 ranks --grad-accum 2 --grad-clip 1: --zero 2 against --zero 0: $r (qkv biases $r2)"

# Restart across stages and rank counts, against one uninterrupted run.
mpi 2 "$BIN" train "${args[@]}" --steps 30 --checkpoint-dir "$dir/ref" >"$dir/ref.out" 2>&1 ||
  fail "the uninterrupted run failed: $(cat "$dir/ref.out")"
d=$dir/restart
mpi 2 "$BIN" train "${args[@]}" --steps 10 --zero 2 --checkpoint-dir "$d" >"$dir/r1.out" 2>&1 ||
  fail "2 ranks --zero 2 failed: $(cat "$dir/r1.out")"
"$BIN" train "${args[@]}" --steps 20 --zero 0 --checkpoint-dir "$d" >"$dir/r2.out" 2>&1 ||
  fail "1 rank --zero 0 failed: $(cat "$dir/r2.out")"
contains "resumed from .*ckpt-000000010.h5 at step 10 (saved by 2 ranks" <"$dir/r2.out" ||
  fail "1 rank did not resume step 10: $(cat "$dir/r2.out")"
mpi 3 "$BIN" train "${args[@]}" --steps 30 --zero 2 --checkpoint-dir "$d" >"$dir/r3.out" 2>&1 ||
  fail "3 ranks --zero 2 failed: $(cat "$dir/r3.out")"
contains "resumed from .*ckpt-000000020.h5 at step 20 (saved by 1 rank" <"$dir/r3.out" ||
  fail "3 ranks did not resume step 20: $(cat "$dir/r3.out")"
r=$(cmp "$dir/ref/ckpt-000000030.h5" "$d/ckpt-000000030.h5" 1e-6) ||
  fail "the restarted run differs from the uninterrupted one: $r"
pass "2 ranks --zero 2 -> 1 rank --zero 0 -> 3 ranks --zero 2 against the uninterrupted run: $r"
