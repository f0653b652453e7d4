#!/usr/bin/env bash
# Step speed while an --async-checkpoint save writes in the background, against the steps of
# the same run without one, and what each save blocked against a synchronous run's saves.
# One rank trains an MLP whose AdamW state is about 150 MB (--hidden 3072,3072) with
# --log-every 1, saving every 30 steps; a step counts as "during a write" when it starts
# before the save's background write (its `seconds`) has ended, by the sum of the step times
# after the save. Prints the median step_s of both kinds and their ratio (speed during a
# write / speed without), and each save's (step, seconds, blocking_s) for both runs.
set -euo pipefail

usage() {
  echo "usage: benchmarks/async_checkpoint_steps.sh [--bin RINGTRAIN] [--data FILE.h5] [--dir DIR]"
  echo "  defaults: build/bin/ringtrain, build/demo/data/fashion-train.h5, build/async-steps"
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$here/build/bin/ringtrain
data=$here/build/demo/data/fashion-train.h5
dir=$here/build/async-steps
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
[[ -f "$data" ]] || { echo "no $data: run 'make demo' first, or give --data" >&2; exit 1; }
mkdir -p "$dir"
common=(--data "$data" --hidden "3072,3072" --optimizer adamw --batch-size 32 --steps 120
  --log-every 1 --threads 2 --checkpoint-every 30)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in async sync; do
  rm -rf "${dir:?}/ck-$mode" "$dir/m-$mode.jsonl"
  extra=()
  [[ $mode == async ]] && extra=(--async-checkpoint)
  "$bin" train "${common[@]}" "${extra[@]}" --checkpoint-dir "$dir/ck-$mode" \
    --metrics "$dir/m-$mode.jsonl" >"$dir/out-$mode" 2>&1
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
for mode in ("async", "sync"):
    recs = [json.loads(l) for l in open(f"{d}/m-{mode}.jsonl")]
    steps = {r["step"]: r["step_s"] for r in recs if r["type"] == "step"}
    ck = [r for r in recs if r["type"] == "checkpoint"]
    during = set()
    for c in ck:
        if not c["async"]:
            continue
        t, s = 0.0, c["step"] + 1
        while s in steps and t < c["seconds"]:
            during.add(s)
            t += steps[s]
            s += 1
    inside = [steps[s] for s in during]
    outside = [v for s, v in steps.items() if s not in during and s > 5]
    line = f"{mode}: median step_s {med(outside):.4f} without a write"
    if inside:
        line += (f", {med(inside):.4f} during one ({len(inside)} steps); "
                 f"speed during / without {med(outside) / med(inside):.3f}")
    print(line)
    print("  saves (step, seconds, blocking_s):",
          [(c["step"], round(c["seconds"], 3), round(c["blocking_s"], 4)) for c in ck])
PY
