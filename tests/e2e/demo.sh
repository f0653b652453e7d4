#!/usr/bin/env bash
# The demo of `make demo` with fewer steps: 2 ranks, fp16, checkpoints, evaluation on the
# 10,000 test images; checks the accuracy the demo reports and its metrics file.
source "$(dirname "$0")/lib.sh"
dir=$(workdir demo)
out=$(RINGTRAIN_BIN=$BIN "$(dirname "$0")/../../tools/demo.sh" --steps 400 --min-accuracy 0.80 \
  --out "$dir")
echo "$out"
acc=$(sed -n 's/^test accuracy: \([0-9.]*\).*/\1/p' <<<"$out")
[[ -n "$acc" ]] || fail "the demo printed no test accuracy"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.80 && a <= 1.0) }' || fail "accuracy $acc"
ls "$dir"/ckpt/ckpt-000000400.h5 >/dev/null || fail "no final checkpoint"
/usr/bin/python3 - "$dir/metrics.jsonl" "$acc" <<'PY' || fail "metrics file"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
types = {r["type"] for r in recs}
assert {"step", "checkpoint", "eval"} <= types, types
steps = [r for r in recs if r["type"] == "step"]
assert steps[-1]["step"] == 400 and steps[-1]["world_size"] == 2, steps[-1]
for key in ("epoch", "loss", "loss_scale", "lr", "samples_per_sec"):
    assert key in steps[-1], key
ev = [r for r in recs if r["type"] == "eval"][-1]
assert abs(ev["accuracy"] - float(sys.argv[2])) < 1e-4, (ev, sys.argv[2])
PY
pass "demo reached test accuracy $acc"
