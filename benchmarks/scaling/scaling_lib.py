"""Shared pieces of the scaling harness (benchmarks/scaling/run, report, model): reading
ringtrain's metrics into one result per point, reading and grouping results.jsonl, and the
allreduce cost model. Standard library only, so that `run` works on any cluster node."""
import json
import math
import os
import re
import statistics

# Fields of ringtrain's "step" metrics records that a point keeps (window means, seconds).
TIME_FIELDS = ["step_s", "compute_s", "comm_s", "exposed_comm_s", "data_wait_s"]
WIRE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def summarize_metrics(path, skip_windows=1):
    """The median over the step records' windows, after the first `skip_windows` (start-up),
    of samples_per_sec and the step-time fields; plus how many windows were used."""
    steps = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if rec.get("type") == "step":
                    steps.append(rec)
    used = steps[skip_windows:]
    if not used:
        raise ValueError(f"{path}: {len(steps)} step record(s), none after the first "
                         f"{skip_windows}; train more steps or log more often")
    out = {"windows": len(used)}
    for k in ["samples_per_sec"] + TIME_FIELDS:
        vals = [r[k] for r in used if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    # What the step spent outside data wait, compute and exposed communication: unscale,
    # clipping, the optimizer, the cast to the working copy, metrics.
    if out["step_s"] is not None:
        out["other_s"] = max(0.0, out["step_s"] - sum(out[k] or 0.0 for k in
                                                      ["compute_s", "exposed_comm_s", "data_wait_s"]))
    return out


def parse_banner(text):
    """From ringtrain's first two lines: parameters, wire dtype, buckets, global batch."""
    info = {}
    m = re.search(r"with (?:\d+ nodes, )?(\d+) parameters", text)
    if m:
        info["params"] = int(m.group(1))
    m = re.search(r"comm (\w+) in (fp32|fp16|bf16)", text)
    if m:
        info["comm"], info["wire_dtype"] = m.group(1), m.group(2)
    m = re.search(r"(\d+) gradient bucket", text)
    if m:
        info["buckets"] = int(m.group(1))
    m = re.search(r"global batch (\d+) \((\d+)/rank\)", text)
    if m:
        info["global_batch"], info["batch_per_rank"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"(\d+) rank\(s\) on (\d+) node\(s\)", text)
    if m:
        info["ranks"], info["nodes"] = int(m.group(1)), int(m.group(2))
    return info


def gradient_bytes(params, wire_dtype):
    """Bytes of the gradient allreduce payload per step (every rank's whole gradient)."""
    return params * WIRE_BYTES[wire_dtype]


def ring_bytes_per_rank(grad_bytes, ranks):
    """Bytes each rank sends per step in a ring allreduce: 2(n-1)/n of the payload."""
    return 0 if ranks <= 1 else 2.0 * (ranks - 1) / ranks * grad_bytes


def read_results(paths):
    """Every JSON object of the given files (results.jsonl, or one point per file);
    directories contribute their *.jsonl and *.json files."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p)
                            if f.endswith(".jsonl") or f.endswith(".json"))
        else:
            files.append(p)
    out = []
    for f in files:
        with open(f) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    rec = json.loads(line)
                    if isinstance(rec, dict) and rec.get("type") == "scaling_point":
                        out.append(rec)
    return out


def best_points(records):
    """One record per (series, mode, ranks): the fastest of the repeats (the least disturbed
    by anything else on the machine), with how many repeats there were and their spread,
    (max - min) / median of their samples/s (None from a single repeat: unknown)."""
    groups = {}
    for r in records:
        groups.setdefault((r["series"], r["mode"], r["ranks"]), []).append(r)
    out = []
    for key in sorted(groups):
        rs = groups[key]
        best = dict(max(rs, key=lambda r: r["samples_per_sec"]))
        sps = [r["samples_per_sec"] for r in rs]
        best["repeats"] = len(rs)
        best["samples_per_sec_min"] = min(sps)
        best["samples_per_sec_max"] = max(sps)
        best["spread"] = (max(sps) - min(sps)) / statistics.median(sps) if len(rs) > 1 else None
        out.append(best)
    return out


def with_efficiency(points):
    """Adds speedup and efficiency against the smallest rank count of the same series and
    mode: speedup = X(n) / X(n0), efficiency = speedup / (n / n0), X in samples/s. Weak
    scaling (fixed batch per rank) and strong scaling (fixed global batch) alike."""
    base = {}
    for p in points:
        k = (p["series"], p["mode"])
        if k not in base or p["ranks"] < base[k]["ranks"]:
            base[k] = p
    out = []
    for p in points:
        b = base[(p["series"], p["mode"])]
        q = dict(p)
        q["base_ranks"] = b["ranks"]
        q["base_repeats"] = b.get("repeats", 1)
        q["base_spread"] = b.get("spread")
        q["speedup"] = p["samples_per_sec"] / b["samples_per_sec"]
        q["efficiency"] = q["speedup"] / (p["ranks"] / b["ranks"])
        out.append(q)
    return out


# Repeats whose samples/s differ by more than this fraction of their median are flagged.
MAX_SPREAD = 0.10


def flag_points(points, max_spread=MAX_SPREAD):
    """Adds `flags`, the reasons not to trust a point's efficiency, to each point of
    with_efficiency: its repeats disagree (spread above max_spread) or there was one, so
    nobody knows; or its reference point (the series' smallest rank count) is noisier than
    the effect measured against it: the reference's spread at least |efficiency - 1|, or the
    reference ran once. An empty list: nothing known against the point."""
    out = []
    for p in points:
        q = dict(p, flags=[])
        spread = p.get("spread")
        if p.get("repeats", 1) <= 1:
            q["flags"].append("1 repeat: no spread known")
        elif spread > max_spread:
            q["flags"].append(f"repeats disagree: spread {100 * spread:.1f}% > "
                              f"{100 * max_spread:.1f}%")
        if p["ranks"] != p["base_ranks"]:
            base = f"reference ({p['base_ranks']} rank{'s' if p['base_ranks'] > 1 else ''})"
            effect = abs(p["efficiency"] - 1.0)
            if p.get("base_repeats", 1) <= 1:
                q["flags"].append(f"{base} from 1 repeat: no spread known")
            elif p["base_spread"] >= effect:
                q["flags"].append(f"{base} noisier than the effect: its spread "
                                  f"{100 * p['base_spread']:.1f}% >= {100 * effect:.1f}%, the "
                                  "efficiency's distance from 100%")
        out.append(q)
    return out


# ---- the allreduce cost model (docs/scaling.md) --------------------------------------------
# alpha: seconds per message step (latency); beta: seconds per byte on the slowest link of the
# ring (1 / bandwidth). A ring allreduce of m bytes over n ranks takes 2(n-1) steps, each
# moving m/n bytes: T = 2(n-1) alpha + 2(n-1)/n m beta.


def ring_time(n, m, alpha, beta):
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * m * beta


def fit_alpha_beta(rows):
    """Least squares of T = 2(n-1) alpha + 2(n-1)/n m beta over (n, m, T) rows, each weighted
    by 1/T so that small (latency-bound) and large (bandwidth-bound) sizes count alike.
    Returns alpha, beta and the largest relative error of the fit."""
    rows = [(n, m, t) for n, m, t in rows if n > 1 and t > 0]
    if len(rows) < 2:
        raise ValueError("need at least two allreduce timings on 2 or more ranks to fit")
    s11 = s12 = s22 = b1 = b2 = 0.0
    for n, m, t in rows:
        w = 1.0 / t
        x1, x2 = 2.0 * (n - 1) * w, 2.0 * (n - 1) / n * m * w
        y = t * w
        s11, s12, s22, b1, b2 = s11 + x1 * x1, s12 + x1 * x2, s22 + x2 * x2, b1 + x1 * y, b2 + x2 * y
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-300:
        raise ValueError("the timings do not separate latency from bandwidth: give several sizes")
    alpha = (b1 * s22 - b2 * s12) / det
    beta = (s11 * b2 - s12 * b1) / det
    if alpha < 0:  # latency below resolution: bandwidth alone
        alpha = 0.0
        beta = sum(2.0 * (n - 1) / n * m * t / t**2 for n, m, t in rows) / \
            sum((2.0 * (n - 1) / n * m / t) ** 2 for n, m, t in rows)
    worst = max(abs(ring_time(n, m, alpha, beta) - t) / t for n, m, t in rows)
    return alpha, beta, worst


def predict_point(compute_s, n, grad_bytes, buckets, alpha, beta, overlap=0.0, cores=0):
    """The model's allreduce time, step time and weak-scaling efficiency at n ranks, from the
    1-rank compute time: each bucket is its own allreduce (the latency term once per
    bucket); compute slowed by n / cores where ranks exceed the cores (cores 0: never)."""
    t = 0.0 if n <= 1 else buckets * 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * grad_bytes * beta
    c = compute_s * (max(1.0, n / cores) if cores else 1.0)
    step = c + max(0.0, t - overlap * c)
    return {"allreduce_s": t, "step_s": step, "efficiency": compute_s / step}


def bench_rows(files, backend="ringtrain-mpi", dtype="fp32", min_bytes=0, max_bytes=0):
    """(ranks, payload bytes, seconds) of the allreduce_bench --json rows of one backend and
    wire dtype on 2 or more ranks, payloads within [min_bytes, max_bytes] (0: no limit)."""
    rows = []
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        for r in data:
            if r["backend"] == backend and r["type"] == dtype and r["ranks"] > 1:
                payload = r["count"] * WIRE_BYTES.get(dtype, 4)
                if payload >= min_bytes and (not max_bytes or payload <= max_bytes):
                    rows.append((r["ranks"], payload, r["time_us"] * 1e-6))
    return rows


def cluster_allreduce(p, m, algo, gpus_per_node, alpha_intra, alpha_inter, bw_intra, bw_nic,
                      nics_per_node):
    """Seconds for an allreduce of m bytes over p GPUs, gpus_per_node per node.
    ring: one flat ring (NCCL style, one ring per NIC): 2(p-1) steps, each as slow as the
      slowest hop (alpha_inter once the ring leaves the node); bandwidth per ring step the
      smaller of the node's bus bandwidth and its NICs together.
    hierarchical: reduce-scatter inside the node, a ring allreduce of each GPU's 1/G shard
      across nodes (each GPU on its share of the node's NICs), allgather inside the node."""
    g = min(p, gpus_per_node)
    nodes = math.ceil(p / gpus_per_node)
    if p <= 1:
        return 0.0
    if nodes == 1:
        return ring_time(p, m, alpha_intra, 1.0 / bw_intra)
    if algo == "ring":
        bw = min(bw_intra, nics_per_node * bw_nic)
        return 2 * (p - 1) * alpha_inter + 2.0 * (p - 1) / p * m / bw
    if algo == "hierarchical":
        intra = (g - 1) * alpha_intra + (g - 1) / g * m / bw_intra  # reduce-scatter (= allgather)
        per_gpu_nic = nics_per_node * bw_nic / g
        inter = ring_time(nodes, m / g, alpha_inter, 1.0 / per_gpu_nic)
        return 2 * intra + inter
    raise ValueError(f"unknown algorithm {algo}")
