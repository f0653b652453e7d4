#!/usr/bin/env bash
# The CLI contract: --version lists every library; inspect shows a dataset and a
# checkpoint; options come from the INI file and the command line wins; eval reports loss
# and accuracy; the metrics file is JSON lines with the documented fields; --help exits 0.
source "$(dirname "$0")/lib.sh"
dir=$(workdir cli)

v=$("$BIN" --version)
for lib in ringtrain MPI HDF5 BLAS CUDA cuDNN NCCL; do
  grep -q "$lib" <<<"$v" || fail "--version does not mention $lib"
done
grep -q "Open MPI" <<<"$v" || fail "--version: MPI library"
grep -q "parallel" <<<"$v" || fail "--version: HDF5 is not parallel"
grep -q "OpenBLAS" <<<"$v" || fail "--version: BLAS"
pass "--version"

"$BIN" train --help | contains "--global-batch-size" || fail "train --help"
"$BIN" --help | contains "convert idx" || fail "--help"
pass "--help"

# INI file: precision and steps from the file, --steps from the command line wins.
cat >"$dir/run.ini" <<'INI'
# a comment
precision = bf16
steps = 9
hidden = 64,32
batch-size = 16
log-every = 1
INI
mpi 2 "$BIN" train --config "$dir/run.ini" --data "$DATA/train.h5" --steps 4 --threads 1 \
  --checkpoint-dir "$dir/ck" --metrics "$dir/m.jsonl" --val-data "$DATA/test.h5" >"$dir/out"
[[ -f "$dir/ck/ckpt-000000004.h5" ]] || fail "command line --steps 4 did not win over the file's 9"
h5dump -a /precision "$dir/ck/ckpt-000000004.h5" | contains '"bf16"' || fail "precision from the file"
grep -q "global batch 32 (16/rank)" "$dir/out" || fail "batch-size from the file"
pass "config file, command line wins"

/usr/bin/python3 - "$dir/m.jsonl" <<'PY' || fail "metrics JSON lines"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in recs if r["type"] == "step"]
assert [r["step"] for r in steps] == [1, 2, 3, 4], steps
for r in steps:
    assert set(r) >= {"step", "epoch", "loss", "loss_scale", "lr", "samples_per_sec", "world_size"}, r
    assert r["world_size"] == 2 and r["loss"] > 0
ck = [r for r in recs if r["type"] == "checkpoint"]
assert ck and ck[-1]["step"] == 4 and ck[-1]["bytes"] > 0 and ck[-1]["path"].endswith("ckpt-000000004.h5"), ck
ev = [r for r in recs if r["type"] == "eval"]
assert ev and ev[-1]["split"] == "val" and 0 <= ev[-1]["accuracy"] <= 1, ev
PY
pass "metrics records"

# eval of the step-4 checkpoint in bf16 (as trained) prints the loss and accuracy of the
# run's own validation at step 4 on the same file (the metrics record), on 2 ranks and on 1.
want=$(/usr/bin/python3 -c 'import json,sys
[ev] = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "eval" and r["step"] == 4]
print("loss %.4f accuracy %.4f" % (ev["loss"], ev["accuracy"]))' "$dir/m.jsonl")
for n in 2 1; do
  out=$(mpi "$n" "$BIN" eval --checkpoint "$dir/ck/ckpt-000000004.h5" --data "$DATA/test.h5" \
    --precision bf16 --threads 1)
  contains "^eval $dir/ck/ckpt-000000004.h5 on $DATA/test.h5 (10000 samples, computed in bf16): $want\$" <<<"$out" ||
    fail "eval on $n rank(s): '$out', expected '... (10000 samples, computed in bf16): $want' as the run's validation"
done
pass "eval: $want on 2 ranks and on 1, as the run's own validation of the same weights"

i=$("$BIN" inspect "$dir/ck/ckpt-000000004.h5")
for want in "ringtrain-checkpoint" "/params/fc1.weight  fp32 \[64, 784\]" "valid: yes"; do
  grep -q "$want" <<<"$i" || fail "inspect checkpoint shows no '$want': $i"
done
"$BIN" inspect "$DATA/test.h5" | contains "/images  uint8 \[10000, 1, 28, 28\]" || fail "inspect dataset"
pass "inspect"

# --checkpoint-secs: a tiny interval saves after (nearly) every step, agreed by all ranks.
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 6 --hidden 32 --threads 1 --keep 10 \
  --checkpoint-dir "$dir/secs" --checkpoint-secs 0.000001 >/dev/null
n=$(find "$dir/secs" -name 'ckpt-*.h5' | wc -l)
(( n >= 5 )) || fail "--checkpoint-secs: $n checkpoints after 6 steps"
pass "--checkpoint-secs saved $n checkpoints in 6 steps"

# A loss scale so large that fp16 gradients overflow: every step is skipped with a record,
# the scale backs off to its floor and the run warns once.
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 6 --hidden 32 --threads 1 --precision fp16 \
  --init-scale 1e30 --min-scale 1e29 --metrics "$dir/skip.jsonl" >"$dir/skip.out" 2>"$dir/skip.err"
[[ $(grep -c 'loss scale is at its floor' "$dir/skip.err") -eq 1 ]] || fail "floor warning: $(cat "$dir/skip.err")"
/usr/bin/python3 - "$dir/skip.jsonl" <<'PY' || fail "skip records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
skips = [r for r in recs if r["type"] == "skip"]
assert [r["step"] for r in skips] == [1, 2, 3, 4, 5, 6], skips
assert all(r["reason"] == "non-finite gradients" for r in skips)
scales = [r["loss_scale"] for r in skips]
want = [5e29, 2.5e29, 1.25e29, 1e29, 1e29, 1e29]  # x0.5 per overflow, floor 1e29
assert all(abs(s - w) <= 1e-6 * w for s, w in zip(scales, want)), scales
assert sum(r["type"] == "warning" for r in recs) == 1, recs
PY
pass "overflowing steps are skipped, recorded, and the floor is reported once"
