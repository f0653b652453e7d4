#!/usr/bin/env bash
# Tensor parallelism (--tensor-parallel T, docs/scaling.md) on a small GPT (gpt-tiny with 2
# layers, 4 heads, width 32, context 16) in fp32 against the same run without it:
# - T = 2 (2 ranks) and T = 2 x D = 2 (4 ranks) against T = 1: the gradient of the first
#   step within 1e-6 per tensor (relative L2; g = p(lr 1) - p(lr 2) of one SGD step from the
#   same initial weights), the loss of each of 16 AdamW steps within 1e-6 (relative), and
#   the parameters and AdamW state after them within 1e-5 (see close_params);
# - checkpoints stay global: a 2 x 2 run's checkpoint continues on 1 x 3 ranks, and a
#   1 x 1 run's on 2 x 1, each leg's losses within 1e-6 of the uninterrupted T = 1 run's;
# - a rank of a tensor-parallel group failing in backward or forward, or stalling before a
#   step, ends the job (exit 2, one message, within seconds), and bad groupings are exit 1
#   naming the option and the node;
# - `model show --tensor-parallel 2` lists the split nodes and the parameters per rank.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir tensor_parallel)
cd "$dir" || exit 1

$PY - <<'PYEOF'
import os, random
random.seed(7)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(24):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(60)) + "\n")
PYEOF
mpi 1 "$BIN" convert text --input 'corpus/*.py' --out data/c.h5 >/dev/null ||
  fail "convert text exited $?"
tiny=(--model gpt-tiny --set layers=2 --set heads=4 --set width=32 --set context=16)
common=("${tiny[@]}" --data data/c.h5 --threads 1 --seed 11 --prefetch 0 --log-every 1
  --global-batch-size 12)
adamw=(--optimizer adamw --lr 0.003 --weight-decay 0.1)
steps=16

# train NAME RANKS T ARGS...: a run into NAME/ (checkpoints) and NAME.jsonl (metrics).
train() {
  local name=$1 n=$2 t=$3
  shift 3
  local rc=0
  mpi "$n" "$BIN" train "${common[@]}" --tensor-parallel "$t" --checkpoint-dir "$name" \
    --metrics "$name.jsonl" "$@" >"$name.out" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { cat "$name.out"; fail "$name exited $rc"; }
}
# close_losses A.jsonl B.jsonl FIRST LAST: the step losses of B at steps FIRST..LAST within
# 1e-6 (relative) of A's; prints the largest difference.
close_losses() {
  $PY - "$@" <<'PYEOF'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if r["type"] == "step"}
a, b, lo, hi = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
worst = 0.0
for s in range(lo, hi + 1):
    if s not in a or s not in b:
        print(f"step {s} missing"); sys.exit(1)
    worst = max(worst, abs(a[s] - b[s]) / abs(a[s]))
print(f"{worst:.3g}")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF
}
# close_params A.h5 B.h5 TOL [BASE.h5]: every /params tensor of B within TOL (relative L2)
# of A's, and the optimizer state; with BASE, the differences A - BASE and B - BASE compared
# instead (BASE one SGD step with lr 2, A and B with lr 1 from the same weights: A - BASE is
# A's gradient g_A, B - BASE is 2 g_A - g_B, so their difference is g_B - g_A). After AdamW
# steps the key part of each qkv bias is left out: its gradient is zero in exact arithmetic
# (softmax ignores a score added to every key), about 1e-11 here, so AdamW's normalised
# update makes its values rounding noise under any change of summation order (data
# parallelism too: 2e-4 relative between 1 and 2 ranks). Prints the largest.
close_params() {
  $PY - "$@" <<'PYEOF'
import sys, h5py, numpy as np
a, b, tol = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), float(sys.argv[3])
base = h5py.File(sys.argv[4], "r") if len(sys.argv) > 4 else None
C = 32
names = []
groups = ["params"] if base else ["params", "optimizer"]
for g in groups:
    a[g].visititems(lambda n, o: names.append(g + "/" + n) if isinstance(o, h5py.Dataset) else None)
assert len([n for n in names if n.startswith("params/")]) == 4 + 12 * 2, names
worst, where = 0.0, ""
for n in names:
    x, y = a[n][...].astype(np.float64), b[n][...].astype(np.float64)
    if base is not None:
        x, y = x - base[n][...], y - base[n][...]
    elif "qkv.bias" in n:
        x, y = np.delete(x, range(C, 2 * C)), np.delete(y, range(C, 2 * C))
    if np.linalg.norm(x) == 0:
        assert np.linalg.norm(y) == 0, n
        continue
    rel = np.linalg.norm(x - y) / np.linalg.norm(x)
    if rel > worst:
        worst, where = rel, n
print(f"{worst:.3g} ({where})")
sys.exit(0 if worst <= tol else 1)
PYEOF
}

# ---- the first step's gradient: one SGD step, p0 - lr g --------------------------------
sgd=(--optimizer sgd --momentum 0 --weight-decay 0 --steps 1)
train g2 1 1 "${sgd[@]}" --lr 2
train g1 1 1 "${sgd[@]}" --lr 1
for grid in "2 2" "4 2"; do
  read -r n t <<<"$grid"
  train "g-$n-$t" "$n" "$t" "${sgd[@]}" --lr 1
  contains "tensor-parallel $t x data-parallel $((n / t))" <"g-$n-$t.out" ||
    fail "the start-up line does not show the grid: $(head -3 "g-$n-$t.out")"
  d=$(close_params g1/ckpt-000000001.h5 "g-$n-$t/ckpt-000000001.h5" 1e-6 g2/ckpt-000000001.h5) ||
    fail "T=$t x D=$((n / t)): the first step's gradient differs from T=1 by $d (relative L2) > 1e-6"
  pass "T=$t x D=$((n / t)) first-step gradient = T=1's: worst tensor relative L2 $d (<= 1e-6)"
done

# ---- AdamW: losses of every step and the final parameters and optimizer state ------------
# The losses within 1e-6; the state after 16 steps within 1e-5 (AdamW divides by the root of
# the second moment, which grows rounding differences in small gradients); data parallelism
# without tensor parallelism (1 x 2) measured beside it as the reference for that growth.
train ref 1 1 "${adamw[@]}" --steps $steps --checkpoint-every 8
train dp 2 1 "${adamw[@]}" --steps $steps --checkpoint-every 8
dpl=$(close_losses ref.jsonl dp.jsonl 1 $steps) || true
dpp=$(close_params ref/ckpt-0000000$steps.h5 dp/ckpt-0000000$steps.h5 1) || true
echo "reference: 1 x 2 (data-parallel only) against 1 x 1: losses within $dpl, state within $dpp"
for grid in "2 2" "4 2"; do
  read -r n t <<<"$grid"
  train "a-$n-$t" "$n" "$t" "${adamw[@]}" --steps $steps --checkpoint-every 8
  d=$(close_losses ref.jsonl "a-$n-$t.jsonl" 1 $steps) ||
    fail "T=$t x D=$((n / t)): losses differ from T=1 by $d (relative) > 1e-6"
  p=$(close_params ref/ckpt-0000000$steps.h5 "a-$n-$t/ckpt-0000000$steps.h5" 1e-5) ||
    fail "T=$t x D=$((n / t)): the state after $steps steps differs from T=1 by $p > 1e-5"
  pass "T=$t x D=$((n / t)) = T=1 over $steps AdamW steps: losses within $d (<= 1e-6), parameters and optimizer state within $p (<= 1e-5)"
done
first=$($PY -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][1]["loss"])' ref.jsonl)
$PY -c 'import sys,json
r=[json.loads(l) for l in open("ref.jsonl") if json.loads(l)["type"]=="step"]
sys.exit(not r[-1]["loss"] < r[0]["loss"] - 0.3)' || fail "the reference did not learn (first loss $first)"

# ---- restarts: the checkpoint of step 8 continued under another grid ---------------------
mkdir -p r22 r11
cp a-4-2/ckpt-000000008.h5 r22/
train r22 3 1 "${adamw[@]}" --steps $steps --checkpoint-every 8
contains "resumed from r22/ckpt-000000008.h5 at step 8" <r22.out || fail "2x2 -> 1x3 did not resume"
d=$(close_losses ref.jsonl r22.jsonl 9 $steps) || fail "2x2 -> 1x3: losses differ by $d > 1e-6"
p=$(close_params ref/ckpt-0000000$steps.h5 r22/ckpt-0000000$steps.h5 1e-5) ||
  fail "2x2 -> 1x3: the final state differs by $p > 1e-5"
pass "restart 2x2 -> 1x3 at step 8: losses of steps 9-$steps within $d, final state within $p of T=1"
cp ref/ckpt-000000008.h5 r11/
train r11 2 2 "${adamw[@]}" --steps $steps --checkpoint-every 8
contains "resumed from r11/ckpt-000000008.h5 at step 8" <r11.out || fail "1x1 -> 2x1 did not resume"
d=$(close_losses ref.jsonl r11.jsonl 9 $steps) || fail "1x1 -> 2x1: losses differ by $d > 1e-6"
p=$(close_params ref/ckpt-0000000$steps.h5 r11/ckpt-0000000$steps.h5 1e-5) ||
  fail "1x1 -> 2x1: the final state differs by $p > 1e-5"
pass "restart 1x1 -> 2x1 at step 8: losses of steps 9-$steps within $d, final state within $p of T=1"

# ---- failures and refusals: exit code, one message, every rank ends ----------------------
# expect_error LABEL CODE PATTERN N ARGS...: `train` on N ranks ends with CODE within 30 s
# and one error line matching PATTERN; no process of the job is left.
expect_error() {
  local label=$1 want=$2 pattern=$3 n=$4 rc=0 tag start took
  shift 4
  tag=$(job_tag)
  start=$(date +%s)
  E2E_JOB=$tag timeout 60 mpirun -n "$n" "$@" >"$label.out" 2>"$label.err" || rc=$?
  took=$(($(date +%s) - start))
  [[ $rc -ne 124 ]] || fail "$label: the job hung (killed after 60 s)"
  [[ $rc -eq $want ]] || { cat "$label.err"; fail "$label: exit code $rc, expected $want"; }
  [[ $(grep -c '^ringtrain: error:' "$label.err") -eq 1 ]] ||
    { cat "$label.err"; fail "$label: expected one error line"; }
  grep '^ringtrain: error:' "$label.err" | contains "$pattern" ||
    { cat "$label.err"; fail "$label: the error does not match '$pattern'"; }
  [[ $took -lt 30 ]] || fail "$label: the job took $took s to end"
  [[ -z $(job_pids "$tag") ]] || fail "$label: processes of the job still running"
  pass "$label: exit $rc in ${took} s: $(grep '^ringtrain: error:' "$label.err" | cut -c1-160)"
}
run=("$BIN" train "${common[@]}" "${adamw[@]}" --steps 6)
expect_error fail-backward 2 "injected test failure at 'backward' on rank 1" 2 \
  -x RINGTRAIN_TEST_FAIL=1:backward:3 "${run[@]}" --tensor-parallel 2
expect_error fail-forward-2x2 2 "injected test failure at 'forward' on rank 3" 4 \
  -x RINGTRAIN_TEST_FAIL=3:forward:2 "${run[@]}" --tensor-parallel 2
expect_error stall 2 "waited 3 s (--stall-timeout) in the tensor-parallel allreduce" 2 \
  -x RINGTRAIN_TEST_STALL=1:3:40 "${run[@]}" --tensor-parallel 2 --stall-timeout 3
expect_error not-dividing 1 "--tensor-parallel 3 does not divide the 2 ranks" 2 \
  "${run[@]}" --tensor-parallel 3
expect_error span-node 1 "--tensor-parallel 2 does not divide the 1 ranks of node" 2 \
  -x RINGTRAIN_RANKS_PER_NODE=1 "${run[@]}" --tensor-parallel 2
expect_error heads 1 "node 'block0.attn' (attention) has 4 heads, which do not divide into 3" 3 \
  "${run[@]}" --tensor-parallel 3
expect_error zero 1 "--tensor-parallel 2 with --zero 1" 2 "${run[@]}" --tensor-parallel 2 --zero 1

# ---- model show ----------------------------------------------------------------------
out=$("$BIN" model show gpt-tiny "${tiny[@]:2}" --tensor-parallel 2 2>&1) || fail "model show: $out"
contains "block0.qkv .*\[column-parallel\]" <<<"$out" || fail "model show: qkv not column-parallel: $out"
contains "block1.fc_proj .*\[row-parallel\]" <<<"$out" || fail "model show: fc_proj not row-parallel"
contains "block0.attn .*\[heads split\]" <<<"$out" || fail "model show: attention heads not split"
# C = 32, L = 2, V = 256, context 16: whole wte + wpe + 2 x 2 norms of C x 2 + ln_f + the
# row-parallel biases (C each); split: qkv (3C x C + 3C)/2, proj C x C / 2, fc (4C x C + 4C)/2,
# fc_proj 4C x C / 2, per layer.
want=$($PY -c 'C,L,V,T=32,2,256,16
whole = V*C + T*C + L*(2*2*C + 2*C) + 2*C
split = L*((3*C*C + 3*C)//2 + C*C//2 + (4*C*C + 4*C)//2 + 4*C*C//2)
print(whole + split, split)')
read -r total split <<<"$want"
contains "$total parameters per rank ($split in parts of split tensors" <<<"$out" ||
  fail "model show: expected $total parameters per rank ($split split): $(tail -2 <<<"$out")"
pass "model show --tensor-parallel 2: split nodes marked, $total parameters per rank"
