#!/usr/bin/env bash
# The scaling harness across emulated nodes: benchmarks/scaling/run --launcher netns trains
# weak-scaling points on 1 and 2 nodes (one rank each) and records the nodes and the link
# shaping; report --predict puts the model's prediction, fitted from allreduce_bench across
# the same 2 nodes, next to them. No figure is judged (the machine is shared); what is
# checked is that the points come from 1 and 2 nodes and the prediction follows the model.
source "$(dirname "$0")/lib.sh"
need_cluster
dir=$(tdir multinode-scaling)
S=$SRC/benchmarks/scaling
mn_mpirun 1 "$BENCH" -b 64K -e 4M -f 4 -w 1 -n 3 --json >"$dir/ar.json" || fail "allreduce_bench"
"$S/run" --launcher netns --ranks-per-node 1 --ranks 1,2 --mode weak --batch-size 64 --steps 60 \
  --log-every 20 --bin "$BIN" --data "$DATA/train.h5" --series net --out "$dir/results.jsonl" \
  -- --hidden 64 || fail "run --launcher netns failed"
"$S/report" "$dir/results.jsonl" --out "$dir" --predict "net=$dir/ar.json" || fail "report failed"
/usr/bin/python3 - "$dir" <<'PY' || fail "points or prediction do not add up"
import json, os, sys
d = sys.argv[1]
pts = {p["ranks"]: p for p in map(json.loads, open(os.path.join(d, "results.jsonl")))}
assert sorted(pts) == [1, 2] and [pts[n]["nodes"] for n in (1, 2)] == [1, 2], pts
assert all(p["link_rate"] == "none" and p["launcher"] == "netns" for p in pts.values()), pts
sys.path.insert(0, os.path.join(os.environ["SRC_DIR"], "benchmarks/scaling"))
import scaling_lib as lib
rows = [(r["ranks"], r["count"] * 4, r["time_us"] * 1e-6) for r in json.load(open(os.path.join(d, "ar.json")))
        if r["backend"] == "ringtrain-mpi" and r["type"] == "fp32"]
assert rows and all(r["nodes"] == 2 for r in json.load(open(os.path.join(d, "ar.json"))))
alpha, beta, _ = lib.fit_alpha_beta(rows)
compute = pts[1]["step_s"] - pts[1]["exposed_comm_s"]
p2 = pts[2]
step = compute + p2["buckets"] * 2 * alpha + p2["grad_bytes"] * beta  # 2 ranks, overlap 0
line = [l for l in open(os.path.join(d, "report.md")) if l.startswith("| net | 2 | 2 |")]
assert len(line) == 1, line
c = [x.strip() for x in line[0].strip().strip("|").split("|")]
assert c[7] == f"{step * 1e3:.2f}", (c, step)
assert c[9] == f"{100 * compute / step:.1f}%", (c, compute / step)
print("ok")
PY
pass "run --launcher netns: 1 and 2 nodes; report --predict: step and efficiency of the model"
