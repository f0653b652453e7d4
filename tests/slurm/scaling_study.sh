#!/usr/bin/env bash
# slurm/scaling_study.sh on the local Slurm: a weak and a strong series at 1 and 2 tasks,
# each point its own job writing one JSON result, then the report job; the report's table
# holds every point with the efficiency recomputed here from the points, and both plots
# are PNG files. --dry-run prints the sbatch commands and submits nothing.
source "$(dirname "$0")/lib.sh"
dir=$(tdir slurm-scaling)
cd "$SRC" || exit 1
study=(--nodes 1 --tasks-per-node "1,2" --gpus-per-task 0 --steps 60 --log-every 20
       --batch-size 64 --time 5 --data "$DATA/train.h5" --bin "$BIN" --out "$dir/study")

before=$(squeue -h | wc -l)
out=$(slurm/scaling_study.sh "${study[@]}" --dry-run)
echo "$out"
[[ $(grep -c '^sbatch ' <<<"$out") -eq 5 ]] || fail "--dry-run: expected 4 point jobs and a report job"
grep -q -- '--dependency=afterany:JOB1:JOB2:JOB3:JOB4' <<<"$out" || fail "--dry-run: report dependency"
[[ $(squeue -h | wc -l) -eq $before && ! -e "$dir/study" ]] || fail "--dry-run submitted or wrote something"
pass "--dry-run prints the 5 sbatch commands only"

rc=0
timeout 360 slurm/scaling_study.sh "${study[@]}" --wait || rc=$?
for f in "$dir"/study/logs/*.out; do echo "== $f"; cat "$f"; done
[[ $rc -eq 0 ]] || fail "scaling_study.sh --wait exited $rc"
for p in weak-1x1 weak-1x2 strong-1x1 strong-1x2; do
  [[ $(wc -l <"$dir/study/points/$p.jsonl") -eq 1 ]] || fail "$p: expected one JSON result"
done
for png in throughput efficiency; do
  [[ "$(head -c 4 "$dir/study/$png.png" | od -An -c | tr -d ' ')" == '211PNG' ]] ||
    fail "$png.png is not a PNG file"
done
# Every point in the report, with speedup and efficiency recomputed from the points.
/usr/bin/python3 - "$dir/study" <<'PY' || fail "report.md does not match the points"
import glob, json, os, sys
d = sys.argv[1]
pts = {}
for f in glob.glob(os.path.join(d, "points", "*.jsonl")):
    [line] = open(f).read().splitlines()
    p = json.loads(line)
    assert p["type"] == "scaling_point" and p["launcher"] == "srun", p
    want = int(os.path.basename(f).split("x")[1].split(".")[0])
    assert p["ranks"] == want, p
    for k in ["samples_per_sec", "step_s", "compute_s", "exposed_comm_s", "data_wait_s",
              "grad_bytes", "ring_bytes_per_rank"]:
        assert p.get(k) is not None, (f, k)
    assert p["grad_bytes"] == p["params"] * 4, p  # fp32 on the wire
    pts[(p["mode"], p["ranks"])] = p
assert pts[("weak", 1)]["batch_per_rank"] == pts[("weak", 2)]["batch_per_rank"] == 64
assert pts[("strong", 1)]["global_batch"] == pts[("strong", 2)]["global_batch"] == 64
rows = [l for l in open(os.path.join(d, "report.md")) if l.startswith("| mlp-")]
assert len(rows) == 4, rows
for row in rows:
    c = [x.strip() for x in row.strip().strip("|").split("|")]
    mode, ranks = c[1], int(c[2])
    base = pts[(mode, 1)]["samples_per_sec"]
    eff = pts[(mode, ranks)]["samples_per_sec"] / base / ranks
    assert c[8] == f"{100 * eff:.1f}%", (row, eff)
    assert c[6] == f"{pts[(mode, ranks)]['samples_per_sec']:.0f}", row
print("report rows:", len(rows))
PY
pass "4 point jobs, one JSON result each, report with efficiencies and two PNG plots"
