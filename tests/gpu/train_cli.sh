#!/usr/bin/env bash
# `ringtrain train --device cuda` end to end, against `--device cpu` runs of the same job:
# W ranks (2 with --comm nccl when 2 GPUs are visible, else 1), SGD with momentum (linear in
# the gradient, so the runs stay comparable), a small synthetic dataset written here.
#   1. mlp fp32, NCCL: every step's loss within 1e-4 (relative) of the CPU's, /params
#      within 1e-4 (absolute; the values are of order 0.05);
#   2. cnn fp32 (dropout masks are the CPU's), --comm mpi staged through host memory: the
#      same tolerances;
#   3. mlp bf16 with --wire-dtype fp32 (buckets cast on the device): loss within 3e-2
#      (relative), /params within 5e-3;
#   4. a GPU run resumed from its step-4 checkpoint ends bitwise equal (h5diff, no tolerance)
#      to the uninterrupted GPU run of 1 (checkpoint download and upload);
#   5. `ringtrain eval --device cuda` of that checkpoint within 1e-4 of `--device cpu`;
#   6. --check-numerics names a nan injected into fc2's output on the GPU, and --tensorboard
#      writes histograms (read back from device memory);
#   7. --zero 1 on the device (reduce-scatter and all-gather on device buffers, the optimizer
#      on the shard, sharded checkpoint copies): the mlp of 1 in fp32 with small buckets
#      within 1e-6 of run 1 (losses relative, /params and /optimizer absolute), bf16 with
#      sharded fp32 masters within 1e-6 of run 3, and that bf16 run resumed at step 4 with
#      --zero 1 bitwise equal to it, with --zero 0 within 1e-6.
# Without a CUDA device (or in a build without CUDA) it prints "SKIPPED: no CUDA device
# (reason)" and exits 77, which ctest (SKIP_RETURN_CODE) reports as skipped; every other
# outcome is a pass (0) or a failure (1). Each run is bounded (60 s), the whole test by
# ctest's TIMEOUT (300 s).
# Self-test of the comparisons without a GPU: GPU_ARGS="--device cpu" GPU_COMM=mpi.
set -euo pipefail

BIN=${RINGTRAIN_BIN:?RINGTRAIN_BIN is not set}
dir=${GPU_TEST_DIR:?GPU_TEST_DIR is not set}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
read -r -a gpu_args <<<"${GPU_ARGS:---device cuda}"
rm -rf "$dir"
mkdir -p "$dir"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pass() { echo "ok: $*"; }
mpi() {
  local n=$1
  shift
  timeout 60 mpirun -n "$n" "$@"
}

# GPUs visible to this process: CUDA_VISIBLE_DEVICES if set, else nvidia-smi's list.
gpus=1
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  IFS=, read -r -a list <<<"$CUDA_VISIBLE_DEVICES"
  gpus=${#list[@]}
elif command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [[ $gpus -ge 2 ]]; then ranks=2; else ranks=1; fi
comm=${GPU_COMM:-nccl}

# A synthetic 10-class dataset of 16x16 images (class-dependent blobs plus noise), as IDX
# files converted by ringtrain itself.
python3 - "$dir" <<'PY'
import random, struct, sys
d = sys.argv[1]
rng = random.Random(5)
n, h, w = 1024, 16, 16
labels, pixels = [], bytearray()
for i in range(n):
    c = rng.randrange(10)
    labels.append(c)
    cy, cx = 3 + (c // 5) * 8, 2 + (c % 5) * 3
    for y in range(h):
        for x in range(w):
            v = 200 if abs(y - cy) < 3 and abs(x - cx) < 2 else 0
            pixels.append(min(255, v + rng.randrange(40)))
with open(f"{d}/images.idx", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, h, w) + bytes(pixels))
with open(f"{d}/labels.idx", "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(labels))
PY
"$BIN" convert idx --images "$dir/images.idx" --labels "$dir/labels.idx" --out "$dir/data.h5" \
  >/dev/null

common=(--data "$dir/data.h5" --optimizer sgd --lr 0.05 --momentum 0.9 --log-every 1
  --threads 1 --resume never --seed 3)

# run NAME RANKS ARGS...: one training run; its checkpoints in $dir/NAME, metrics in NAME.jsonl.
run() {
  local name=$1 n=$2
  shift 2
  mpi "$n" "$BIN" train "${common[@]}" --checkpoint-dir "$dir/$name" \
    --metrics "$dir/$name.jsonl" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
}

# The first GPU run decides whether there is a device at all.
rc=0
run gpu_mlp "$ranks" --model mlp --hidden 64,32 --steps 8 --comm "$comm" "${gpu_args[@]}" \
  || rc=$?
if [[ $rc -ne 0 ]]; then
  if grep -qE "no usable CUDA device|has no CUDA backend" "$dir/gpu_mlp.err"; then
    echo "SKIPPED: no CUDA device ($(grep -m1 'ringtrain: error' "$dir/gpu_mlp.err"))"
    exit 77
  fi
  cat "$dir/gpu_mlp.out" "$dir/gpu_mlp.err"
  fail "--device cuda mlp run exited $rc"
fi
grep -E '^gpu: ' "$dir/gpu_mlp.out" || [[ ${gpu_args[*]} != "--device cuda" ]] \
  || fail "no start-up GPU line in $dir/gpu_mlp.out"

# compare NAME_A NAME_B LOSS_RTOL PARAM_ATOL: every step's loss and the final /params.
compare() {
  python3 - "$dir/$1.jsonl" "$dir/$2.jsonl" "$3" <<'PY' || fail "losses of $1 and $2 differ"
import json, sys
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "step"]
la, lb = losses(a), losses(b)
assert len(la) == len(lb) and la, f"{len(la)} vs {len(lb)} step records"
for i, (x, y) in enumerate(zip(la, lb), 1):
    assert abs(x - y) <= tol * abs(y), f"step {i}: loss {x} vs {y} (relative tolerance {tol})"
print(f"{len(la)} step losses within {tol}: last {la[-1]:.6f} vs {lb[-1]:.6f}")
PY
  local ca=("$dir/$1"/ckpt-*.h5) cb=("$dir/$2"/ckpt-*.h5)
  h5diff -d "$4" "${ca[-1]}" "${cb[-1]}" /params /params >"$dir/$1.h5diff" \
    || { head -20 "$dir/$1.h5diff"; fail "/params of $1 and $2 differ by more than $4"; }
}

run cpu_mlp "$ranks" --model mlp --hidden 64,32 --steps 8 --device cpu
compare gpu_mlp cpu_mlp 1e-4 1e-4
pass "mlp fp32 on $ranks rank(s), --comm $comm: losses and parameters match the CPU"

run gpu_cnn "$ranks" --model cnn --steps 6 --comm mpi "${gpu_args[@]}" \
  || { cat "$dir/gpu_cnn.err"; fail "cnn run"; }
run cpu_cnn "$ranks" --model cnn --steps 6 --device cpu
compare gpu_cnn cpu_cnn 1e-4 1e-4
pass "cnn fp32 on $ranks rank(s), --comm mpi (staged): losses and parameters match the CPU"

run gpu_bf16 "$ranks" --model mlp --hidden 64,32 --steps 8 --precision bf16 --wire-dtype fp32 \
  --comm "$comm" "${gpu_args[@]}" || { cat "$dir/gpu_bf16.err"; fail "bf16 run"; }
run cpu_bf16 "$ranks" --model mlp --hidden 64,32 --steps 8 --precision bf16 --wire-dtype fp32 \
  --device cpu
compare gpu_bf16 cpu_bf16 3e-2 5e-3
pass "mlp bf16 with an fp32 wire: losses and parameters match the CPU within bf16 tolerances"

# Resume: 4 steps, then the same command to 8 (--resume auto) against the run above.
run gpu_resume "$ranks" --model mlp --hidden 64,32 --steps 4 --comm "$comm" "${gpu_args[@]}" \
  || fail "resume, first half"
mpi "$ranks" "$BIN" train "${common[@]/never/auto}" --checkpoint-dir "$dir/gpu_resume" \
  --model mlp --hidden 64,32 --steps 8 --comm "$comm" "${gpu_args[@]}" \
  >"$dir/gpu_resume2.out" 2>"$dir/gpu_resume2.err" \
  || { cat "$dir/gpu_resume2.err"; fail "resume, second half"; }
grep -q "resumed from" "$dir/gpu_resume2.out" || fail "the second half did not resume"
for group in /params /optimizer; do
  h5diff "$dir/gpu_resume/ckpt-000000008.h5" "$dir/gpu_mlp/ckpt-000000008.h5" "$group" "$group" \
    >/dev/null || fail "resumed GPU run differs from the uninterrupted one in $group"
done
pass "a GPU run resumed at step 4 ends bitwise equal to the uninterrupted one"

evals=()
for dev in "${gpu_args[*]}" "--device cpu"; do
  read -r -a dargs <<<"$dev"
  out=$(mpi 1 "$BIN" eval --checkpoint "$dir/gpu_mlp/ckpt-000000008.h5" --data "$dir/data.h5" \
    --threads 1 "${dargs[@]}") || fail "eval $dev"
  # (the first line: eval goes on with per-class figures and the confusion matrix)
  evals+=("$(sed -nE '1s/.*loss ([0-9.]+).*/\1/p' <<<"$out")")
done
python3 -c "import sys; a, b = map(float, sys.argv[1:]); assert abs(a - b) <= 1e-4 * b, (a, b)" \
  "${evals[@]}" || fail "eval losses ${evals[*]}"
pass "eval on the GPU: loss ${evals[0]}, on the CPU ${evals[1]}"

RINGTRAIN_TEST_INJECT_NAN=0:2:fc2 mpi "$ranks" -x RINGTRAIN_TEST_INJECT_NAN "$BIN" train \
  "${common[@]}" --checkpoint-dir "$dir/gpu_obs" --model mlp --hidden 64,32 --steps 3 \
  --comm "$comm" "${gpu_args[@]}" --check-numerics --tensorboard "$dir/tb" --histogram-every 1 \
  >"$dir/obs.out" 2>"$dir/obs.err" || { cat "$dir/obs.err"; fail "--check-numerics run"; }
grep -q "non-finite activations first appear in layer fc2 (forward) on rank 0" "$dir/obs.err" \
  || { cat "$dir/obs.err"; fail "--check-numerics did not name fc2"; }
[[ $(stat -c %s "$dir"/tb/events.out.tfevents.*) -gt 10000 ]] || fail "no histograms written"
pass "--check-numerics and --tensorboard histograms on the device"
# 7. --zero 1. compare checks losses and /params; /optimizer here (SGD's momentum).
same_optimizer() { # NAME_A NAME_B TOL: the last checkpoints' /optimizer within TOL (absolute)
  local ca=("$dir/$1"/ckpt-*.h5) cb=("$dir/$2"/ckpt-*.h5)
  h5diff -d "$3" "${ca[-1]}" "${cb[-1]}" /optimizer /optimizer >"$dir/$1.opt.h5diff" \
    || { head -20 "$dir/$1.opt.h5diff"; fail "/optimizer of $1 and $2 differ by more than $3"; }
}
small=(--bucket-mb 0.004)  # several buckets, cut across by the shards
run gpu_zero "$ranks" --model mlp --hidden 64,32 --steps 8 --comm "$comm" --zero 1 "${small[@]}" \
  "${gpu_args[@]}" || { cat "$dir/gpu_zero.err"; fail "--zero 1 fp32 run"; }
grep -q "; --zero 1; wire/step/rank: reduce-scatter" "$dir/gpu_zero.out" \
  || fail "no --zero 1 memory line in $dir/gpu_zero.out"
compare gpu_zero gpu_mlp 1e-6 1e-6
same_optimizer gpu_zero gpu_mlp 1e-6
pass "mlp fp32 --zero 1 on $ranks rank(s), --comm $comm: within 1e-6 of --zero 0"
bf=(--model mlp --hidden "64,32" --precision bf16 --wire-dtype fp32 --comm "$comm" "${small[@]}")
run gpu_zbf "$ranks" "${bf[@]}" --zero 1 --steps 8 "${gpu_args[@]}" \
  || { cat "$dir/gpu_zbf.err"; fail "--zero 1 bf16 run"; }
compare gpu_zbf gpu_bf16 1e-6 1e-6
same_optimizer gpu_zbf gpu_bf16 1e-6
pass "mlp bf16 --zero 1 (sharded fp32 masters): within 1e-6 of --zero 0"
for z in 1 0; do
  run "gpu_zres$z" "$ranks" "${bf[@]}" --zero 1 --steps 4 "${gpu_args[@]}" \
    || { cat "$dir/gpu_zres$z.err"; fail "--zero 1 bf16, first half"; }
  mpi "$ranks" "$BIN" train "${common[@]/never/auto}" --checkpoint-dir "$dir/gpu_zres$z" \
    "${bf[@]}" --zero "$z" --steps 8 "${gpu_args[@]}" >"$dir/gpu_zres$z.2.out" \
    2>"$dir/gpu_zres$z.2.err" || { cat "$dir/gpu_zres$z.2.err"; fail "--zero $z, second half"; }
  grep -q "resumed from" "$dir/gpu_zres$z.2.out" || fail "the --zero $z half did not resume"
done
for group in /params /optimizer; do
  h5diff "$dir/gpu_zres1/ckpt-000000008.h5" "$dir/gpu_zbf/ckpt-000000008.h5" "$group" "$group" \
    >/dev/null || fail "--zero 1 resumed with --zero 1 differs from the uninterrupted run in $group"
  h5diff -d 1e-6 "$dir/gpu_zres0/ckpt-000000008.h5" "$dir/gpu_zbf/ckpt-000000008.h5" "$group" \
    "$group" >/dev/null || fail "--zero 1 resumed with --zero 0 differs by more than 1e-6 in $group"
done
pass "bf16 --zero 1 resumed at step 4: with --zero 1 bitwise, with --zero 0 within 1e-6"
echo "all --device cuda checks passed"
