#!/usr/bin/env bash
# The training recipe end to end (issue 16), at 2 and 4 ranks, checked with h5py and json:
# gradient accumulation equals the larger batch (fp32, within 1e-6) and communicates only
# after the last micro-batch; a 4-rank run continues on 2 ranks with --grad-accum raised to
# keep the global batch (within 1e-6 of the uninterrupted run); CIFAR-shaped data with
# per-channel /mean,/std through crop+flip resumes bitwise; --keep-best and --early-stop
# pick the step the eval records say; a --keep-best failure on rank 1 ends the job with one
# message; bad recipe options are refused at 2 ranks.
source "$(dirname "$0")/lib.sh"
dir=$(workdir recipe)
unset RINGTRAIN_TEST_FAIL RINGTRAIN_TEST_STALL OPENBLAS_NUM_THREADS RINGTRAIN_DIRECT_READ
export OMP_NUM_THREADS=1
py=/usr/bin/python3  # Debian's, with python3-h5py

common=(--data "$DATA/train.h5" --model mlp --hidden 64 --threads 1 --optimizer sgd --lr 0.01
  --momentum 0.9 --log-every 5 --seed 7)

# maxdiff A B: the largest |a - b| over every /params dataset of two checkpoints.
maxdiff() {
  "$py" - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
assert sorted(a["params"]) == sorted(b["params"]), "different parameter sets"
print("%.3g" % max(float(np.max(np.abs(a["params"][k][()] - b["params"][k][()]))) for k in a["params"]))
PY
}
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d <= t) }'; }

# 1. Accumulation: 2 ranks x 32 x K=2 against 2 ranks x 64.
mpi 2 "$BIN" train "${common[@]}" --batch-size 64 --steps 20 --checkpoint-dir "$dir/b64" \
  >"$dir/b64.out"
mpi 2 "$BIN" train "${common[@]}" --batch-size 32 --grad-accum 2 --steps 20 \
  --checkpoint-dir "$dir/acc" --timeline "$dir/acc.json" --timeline-steps 3:6 >"$dir/acc.out"
contains "global batch 128 (32/rank x 2 micro-batches)" <"$dir/acc.out" ||
  fail "the start line does not say 32/rank x 2 micro-batches: $(sed -n 1p "$dir/acc.out")"
d=$(maxdiff "$dir/b64/ckpt-000000020.h5" "$dir/acc/ckpt-000000020.h5")
within "$d" 1e-6 || fail "2 ranks x 32 x 2 differs from 2 ranks x 64 by $d (> 1e-6)"
pass "2 ranks x 32 x K=2 equals 2 ranks x 64 after 20 steps: max |diff| $d"
# One reduction per step: every allreduce span of a step starts after its second forward.
"$py" - "$dir/acc.json" <<'PY' || fail "an allreduce started before the last micro-batch"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
for rank in {e["pid"] for e in ev}:
    for step in range(3, 7):
        mine = [e for e in ev if e["pid"] == rank and e["args"]["step"] == step]
        fwd = sorted(e["ts"] for e in mine if e["name"] == "forward + loss")
        red = [e["ts"] for e in mine if e["name"].startswith("allreduce bucket")]
        assert len(fwd) == 2 and red, (rank, step, len(fwd), len(red))
        assert min(red) >= fwd[1], (rank, step, min(red), fwd)
PY
pass "allreduce only after the last micro-batch (timeline of steps 3-6)"

# 2. 4 ranks x 32 for 30 steps, against 4 ranks to 15 and then 2 ranks (K raised to 2).
mpi 4 "$BIN" train "${common[@]}" --batch-size 32 --steps 30 --checkpoint-every 15 \
  --checkpoint-dir "$dir/w4" >"$dir/w4.out"
mkdir -p "$dir/w42"
cp "$dir/w4/ckpt-000000015.h5" "$dir/w42/"
mpi 2 "$BIN" train "${common[@]}" --batch-size 32 --steps 30 --checkpoint-dir "$dir/w42" \
  --metrics "$dir/w42.jsonl" >"$dir/w42.out"
contains "global batch 128 kept: 4 ranks x 32 x 1 micro-batch(es) then, 2 ranks x 32 x 2 now (--grad-accum 2)" \
  <"$dir/w42.out" || { cat "$dir/w42.out"; fail "the resume line does not say how the global batch is kept"; }
"$py" - "$dir/w42.jsonl" <<'PY' || fail "no resume record with grad_accum 2"
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "resume"][0]
assert (r["step"], r["saved_world_size"], r["world_size"], r["grad_accum"], r["global_batch"]) == (15, 4, 2, 2, 128), r
PY
d=$(maxdiff "$dir/w4/ckpt-000000030.h5" "$dir/w42/ckpt-000000030.h5")
within "$d" 1e-6 || fail "4 -> 2 ranks differs from the uninterrupted 4-rank run by $d (> 1e-6)"
pass "4 ranks x 32 -> 2 ranks x 32 x 2 at step 15: step 30 within $d of the 4-rank run"

# 3. CIFAR-shaped synthetic data (per-channel /mean,/std) through crop+flip; resume bitwise.
"$py" - "$dir/cifar.h5" <<'PY'
import sys, h5py, numpy as np
rng = np.random.default_rng(3)
n = 384
x = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
x[:, 1] //= 2  # channels with different statistics
y = rng.integers(0, 10, size=n).astype(np.int32)
v = x.astype(np.float64) / 255
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["format"] = "ringtrain-dataset"
    f.attrs["format_version"] = np.int64(1)
    f.attrs["num_classes"] = np.int64(10)
    f.create_dataset("images", data=x, chunks=(64, 3, 32, 32))
    f.create_dataset("labels", data=y)
    f.create_dataset("mean", data=v.mean(axis=(0, 2, 3)))
    f.create_dataset("std", data=v.std(axis=(0, 2, 3)))
PY
cifar=(--data "$dir/cifar.h5" --model cnn --batch-size 16 --threads 1 --augment 'crop:4,flip'
  --lr 1e-3 --seed 5 --log-every 4)
mpi 2 "$BIN" train "${cifar[@]}" --steps 16 --checkpoint-dir "$dir/c_all" >"$dir/c_all.out"
mpi 2 "$BIN" train "${cifar[@]}" --steps 8 --checkpoint-dir "$dir/c_res" >/dev/null
mpi 2 "$BIN" train "${cifar[@]}" --steps 16 --checkpoint-dir "$dir/c_res" >"$dir/c_res.out"
contains "resumed from" <"$dir/c_res.out" || fail "the CIFAR-shaped run did not resume"
d=$(maxdiff "$dir/c_all/ckpt-000000016.h5" "$dir/c_res/ckpt-000000016.h5")
[[ $d == 0 ]] || fail "crop+flip: the resumed run differs from the uninterrupted one by $d"
"$py" - "$dir/c_all/ckpt-000000016.h5" <<'PY' || fail "per-channel normalisation not in the checkpoint"
import sys, h5py
assert len(h5py.File(sys.argv[1], "r").attrs["input_channel_mean"]) == 3
PY
pass "CIFAR-shaped [3, 32, 32] with crop:4,flip: 8 + 8 steps resumed bitwise equal to 16"

# 4. --keep-best val_loss and --early-stop 2 against the eval records.
mpi 2 "$BIN" train --data "$DATA/train.h5" --val-data "$DATA/test.h5" --model mlp --hidden 32 \
  --threads 1 --batch-size 32 --steps 400 --lr 0.05 --eval-every 10 --keep-best val_loss \
  --early-stop 2 --keep 100 --checkpoint-dir "$dir/best" --metrics "$dir/best.jsonl" \
  --log-every 10 >"$dir/best.out"
"$py" - "$dir/best.jsonl" "$dir/best" <<'PY' || fail "best checkpoint or early stop is not what the evaluations say"
import json, sys, h5py, numpy as np
recs = [json.loads(l) for l in open(sys.argv[1])]
evals = [r for r in recs if r["type"] == "eval"]
best, since, stop = None, 0, None
for e in evals:
    if best is None or e["loss"] < best["loss"]:
        best, since = e, 0
    else:
        since += 1
        if since >= 2:
            stop = e["step"]
            break
assert stop is not None and stop < 400, "the run never stopped early; choose a noisier setting"
end = [r for r in recs if r["type"] == "stop"][-1]
assert end["reason"] == "early_stop" and end["step"] == stop, (end, stop)
f = h5py.File(sys.argv[2] + "/best.h5", "r")
assert f.attrs["best_metric"] in ("val_loss", b"val_loss")
assert int(f.attrs["best_step"]) == best["step"], (f.attrs["best_step"], best["step"])
assert abs(float(f.attrs["best_value"]) - best["loss"]) < 1e-6 * max(1, best["loss"])
g = h5py.File(sys.argv[2] + "/ckpt-%09d.h5" % best["step"], "r")
for k in g["params"]:
    assert np.array_equal(f["params"][k][()], g["params"][k][()]), k
print("best step", best["step"], "loss", best["loss"], "early stop at", stop)
PY
# best.h5's best_* attributes are rewritten after the copy, and its meta_checksum with them.
"$BIN" inspect "$dir/best/best.h5" >"$dir/best.inspect" || fail "inspect best.h5: $(tail -n 1 "$dir/best.inspect")"
contains "valid: yes" <"$dir/best.inspect" || fail "best.h5 is not valid: $(tail -n 1 "$dir/best.inspect")"
pass "--keep-best val_loss and --early-stop 2 agree with the eval records; best.h5 is valid"

# 5. Failures and bad input at 2 ranks, on rank 1.
rc=0
RINGTRAIN_TEST_FAIL=1:best timeout 60 mpirun -n 2 "$BIN" train --data "$DATA/train.h5" \
  --val-data "$DATA/test.h5" --hidden 16 --threads 1 --batch-size 32 --steps 20 --eval-every 10 \
  --keep-best val_accuracy --checkpoint-dir "$dir/fail" >"$dir/fail.out" 2>"$dir/fail.err" || rc=$?
[[ $rc -eq 2 ]] || { cat "$dir/fail.err"; fail "a --keep-best failure on rank 1: exit $rc, expected 2"; }
if [[ $(grep -c '^ringtrain: error:' "$dir/fail.err") -ne 1 ]] ||
  ! grep '^ringtrain: error:' "$dir/fail.err" | contains "injected test failure at 'best' on rank 1"; then
  cat "$dir/fail.err"
  fail "a --keep-best failure on rank 1: not exactly one error line naming it"
fi
pass "a --keep-best failure on rank 1 ends the job (exit 2, one message)"
bad() {
  local want=$1 rc=0
  shift
  timeout 60 mpirun -n 2 "$BIN" train --data "$DATA/train.h5" --steps 1 "$@" >/dev/null \
    2>"$dir/bad.err" || rc=$?
  if [[ $rc -ne 1 || $(grep -c '^ringtrain: error:' "$dir/bad.err") -ne 1 ]] ||
    ! grep '^ringtrain: error:' "$dir/bad.err" | contains "$want"; then
    cat "$dir/bad.err"
    fail "$* : exit $rc, expected 1 and one error naming '$want'"
  fi
}
bad "--lr-schedule 'cosin' is not known" --lr-schedule cosin
bad "--augment 'crop': 'crop' is not valid" --augment crop
bad "--label-smoothing 1 is not valid" --label-smoothing 1
bad "--keep-best, --early-stop and --eval-every need --val-data" --keep-best val_loss --checkpoint-dir "$dir/x"
bad "--lr-schedule step needs --step-every" --lr-schedule step
bad "--warmup-init-lr 1 is not valid" --warmup-init-lr 1 --lr 0.01
bad "--grad-accum 0 is not valid" --grad-accum 0
pass "bad recipe options refused at 2 ranks with one message"
