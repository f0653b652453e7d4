#!/usr/bin/env bash
# Seeing what a run does: TensorBoard event files read back with the real `tensorboard`
# package (PyPI, in a venv this test makes) - every tag and value against the metrics
# file; --check-numerics names the layer and rank where a nan was injected on purpose
# (RINGTRAIN_TEST_INJECT_NAN); the progress line as a bar on a terminal and as plain lines
# otherwise, with an ETA.
source "$(dirname "$0")/lib.sh"
dir=$(workdir observe)
venv=$E2E_DIR/tb-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import tensorboard, h5py' 2>/dev/null; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q tensorboard h5py || fail "pip install tensorboard h5py"
fi

RINGTRAIN_TEST_INJECT_NAN=1:5:fc2 mpi 2 -x RINGTRAIN_TEST_INJECT_NAN "$BIN" train \
  --data "$DATA/train.h5" --val-data "$DATA/test.h5" --steps 20 --log-every 5 --hidden 64,32 \
  --threads 1 --precision fp16 --tensorboard "$dir/tb" --histogram-every 10 --check-numerics \
  --checkpoint-dir "$dir/ck" --metrics "$dir/m.jsonl" >"$dir/out" 2>"$dir/err"
grep -c "non-finite activations first appear in layer fc2 (forward) on rank 1" "$dir/err" \
  | contains "^1$" || fail "--check-numerics: $(cat "$dir/err")"
grep -q '"type":"skip","step":5' "$dir/m.jsonl" || fail "the step with the nan was not skipped"
pass "--check-numerics named layer fc2 on rank 1 once, and step 5 was skipped"

"$venv/bin/python" - "$dir" <<'PY' || fail "TensorBoard files"
import glob, json, math, sys
import h5py, numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
d = sys.argv[1]
files = glob.glob(d + "/tb/events.out.tfevents.*")
assert len(files) == 1, files
ea = EventAccumulator(files[0], size_guidance={"scalars": 0, "histograms": 0})
ea.Reload()
recs = [json.loads(l) for l in open(d + "/m.jsonl")]
steps = [r for r in recs if r["type"] == "step"]
fields = {"train/loss": "loss", "train/learning_rate": "lr", "train/loss_scale": "loss_scale",
          "train/samples_per_sec": "samples_per_sec", "time/step_s": "step_s",
          "time/compute_s": "compute_s", "time/exposed_comm_s": "exposed_comm_s",
          "time/data_wait_s": "data_wait_s"}
for tag, key in fields.items():
    got = [(e.step, e.value) for e in ea.Scalars(tag)]
    want = [(r["step"], r[key]) for r in steps]
    assert [s for s, _ in got] == [s for s, _ in want] == [5, 10, 15, 20], (tag, got)
    for (s, g), (_, w) in zip(got, want):
        if w is None:  # JSON null: a non-finite value
            assert math.isnan(g), (tag, s, g)
        else:
            assert math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-12), (tag, s, g, w)
ev = [r for r in recs if r["type"] == "eval"][-1]
assert math.isclose(ea.Scalars("val/loss")[-1].value, ev["loss"], rel_tol=1e-6)
assert math.isclose(ea.Scalars("val/accuracy")[-1].value, ev["accuracy"], rel_tol=1e-6)
hist = ea.Tags()["histograms"]
with h5py.File(d + "/ck/ckpt-000000020.h5") as f:
    for name, ds in f["params"].items():
        w = ds[...].astype(np.float64).ravel()
        for kind in ("weights", "gradients"):
            h = ea.Histograms(f"{kind}/{name}")
            assert [x.step for x in h] == [10, 20], (kind, name)
            assert h[-1].histogram_value.num == w.size
        hv = ea.Histograms(f"weights/{name}")[-1].histogram_value
        assert math.isclose(hv.min, w.min()) and math.isclose(hv.max, w.max()), name
        assert math.isclose(hv.sum, w.sum(), rel_tol=1e-9, abs_tol=1e-9), name
        assert sum(hv.bucket) == w.size, name
print("tensorboard: %d scalar tags, %d histogram tags checked" % (len(ea.Tags()["scalars"]), len(hist)))
PY
pass "TensorBoard event files: every scalar equals the metrics record; histograms match the checkpoint"

# Progress: plain lines with an ETA when stdout is not a terminal ...
out=$("$BIN" train --data "$DATA/train.h5" --steps 20 --log-every 10 --hidden 32 --threads 1)
grep -q "^step 20/20 epoch 0 .* samples/s ETA 0s$" <<<"$out" || fail "plain progress line: $out"
[[ "$out" != *$'\r'* ]] || fail "a carriage return in non-terminal output"
# ... and a bar redrawn in place on a terminal (script gives the process a pty).
script -qec "$BIN train --data $DATA/train.h5 --steps 20 --log-every 10 --hidden 32 --threads 1" \
  /dev/null >"$dir/tty.out" </dev/null
grep -q $'\r\\[##########..........\\] step 10/20' "$dir/tty.out" || fail "no progress bar: $(cat -v "$dir/tty.out")"
grep -q $'\r\\[####################\\] step 20/20' "$dir/tty.out" || fail "bar did not reach 100%"
pass "progress: a bar on a terminal, plain lines with an ETA otherwise"

# Timeline: 3 ranks, steps 3..5, a checkpoint at step 4; valid JSON with spans from every
# rank, per rank in order within each step, and nothing outside the window.
mpi 3 "$BIN" train --data "$DATA/train.h5" --steps 8 --global-batch-size 96 --threads 1 \
  --hidden 64,32 --bucket-mb 0.05 --timeline "$dir/trace.json" --timeline-steps 3:5 \
  --checkpoint-dir "$dir/tl-ck" --checkpoint-every 4 >"$dir/tl.out"
grep -q "timeline of steps 3:5 written to $dir/trace.json" "$dir/tl.out" || fail "timeline not announced"
/usr/bin/python3 - "$dir/trace.json" <<'PY' || fail "timeline contents"
import json, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in spans} == {0, 1, 2}, "spans from every rank"
assert {e["args"]["step"] for e in spans} == {3, 4, 5}, "only the window"
main_order = ["data wait", "forward + loss", "backward fc3", "backward fc2", "backward fc1",
              "wait for gradients", "unscale/check", "optimizer"]
for rank in range(3):
    for step in (3, 4, 5):
        mine = sorted((e for e in spans if e["pid"] == rank and e["args"]["step"] == step
                       and e["tid"] == 0 and e["name"] != "checkpoint"), key=lambda e: e["ts"])
        assert [e["name"] for e in mine] == main_order, (rank, step, [e["name"] for e in mine])
        for a, b in zip(mine, mine[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (rank, step, a["name"], b["name"])
        buckets = [e for e in spans if e["pid"] == rank and e["args"]["step"] == step and e["tid"] == 1]
        names = [e["name"] for e in sorted(buckets, key=lambda e: e["ts"])]
        assert len(names) >= 2 and names == [f"allreduce bucket {i}" for i in range(len(names))], names
    ck = [e for e in spans if e["pid"] == rank and e["name"] == "checkpoint"]
    assert [e["args"]["step"] for e in ck] == [4], ck
print("timeline: %d spans checked" % len(spans))
PY
pass "timeline: spans from every rank, in order, only for steps 3..5"
