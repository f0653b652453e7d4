#!/usr/bin/env bash
# ringtrain against its peer, PyTorch DistributedDataParallel (Debian's python3-torch, CPU,
# gloo): the same models (the 784-512-256-10 MLP and the CNN), per-rank batch, data file,
# optimizer (SGD, momentum 0.9, lr 0.01), precision and thread count (1 per rank), at 1 and
# 2 ranks under mpirun. Prints samples/s of both and their ratio, and for each framework the
# GFLOP/s one rank achieves and its fraction of the GEMM GFLOP/s OpenBLAS reaches in the
# same run on a 2048^3 SGEMM on one core (gemm_bench, before and after the training runs,
# the higher of the two), the practical limit. Both frameworks use that same OpenBLAS
# (PyTorch through libblas.so.3; its convolutions through oneDNN). Runs alternate between
# the frameworks so that a change in the machine's load hits both alike.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/peers/run.sh [--steps N] [--models mlp,cnn] [--ranks 1,2] [--json FILE]
  --steps N        training steps per run, the first 20 untimed (default: mlp 400, cnn 100)
  --models LIST    comma-separated, of mlp and cnn (default mlp,cnn)
  --ranks LIST     comma-separated rank counts (default 1,2)
  --json FILE      write one JSON object per row (JSON lines)
needs a build (make), the Fashion-MNIST HDF5 file of 'make demo'
(build/demo/data/fashion-train.h5) and Debian's python3-torch and python3-h5py;
PYTHON overrides the interpreter that runs the peer (default /usr/bin/python3)
USAGE
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$here/build/bin
data=$here/build/demo/data/fashion-train.h5
peer=$here/benchmarks/peers/torch_ddp.py
py=${PYTHON:-/usr/bin/python3}
steps=""
models=mlp,cnn
ranks_list=1,2
json=""
batch=128
window=20 # steps per timing window, both frameworks; the first window is start-up
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
[[ -f "$data" ]] || { echo "no $data: run 'make demo' first" >&2; exit 1; }
[[ -x "$bin/ringtrain" && -x "$bin/gemm_bench" ]] || { echo "no $bin/ringtrain: run 'make' first" >&2; exit 1; }
"$py" -c 'import torch, h5py' 2>/dev/null ||
  { echo "$py cannot import torch and h5py: apt-get install python3-torch python3-h5py libopenblas0" >&2; exit 1; }
if [[ -n "$steps" ]] && ! [[ "$steps" =~ ^[0-9]+$ && "$steps" -ge $((2 * window)) ]]; then
  echo "--steps $steps: need a whole number of at least $((2 * window))" >&2; exit 1
fi
IFS=, read -r -a model_arr <<<"$models"
IFS=, read -r -a rank_arr <<<"$ranks_list"
for m in "${model_arr[@]}"; do
  [[ $m == mlp || $m == cnn ]] || { echo "--models: unknown model '$m' (mlp, cnn)" >&2; exit 1; }
done
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# One thread per rank for every library either framework loads (ringtrain sets its own).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 MASTER_ADDR=127.0.0.1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Training FLOPs of one sample. Forward: 2 FLOPs per multiply-add (MAC) of every Linear
# and Conv2d; backward: twice the forward (input gradient + weight gradient) except the
# first layer's input gradient, which neither framework computes (its input is the data).
# So 6 * MACs - 2 * MACs(first layer). Biases, ReLU, pooling, dropout, the loss and the
# optimizer are left out (under 1% of these counts for both models).
#   mlp: 784*512 + 512*256 + 256*10 = 535,040 MACs, first 401,408
#   cnn: conv1 26*26*32*(1*9) = 194,688; conv2 24*24*64*(32*9) = 10,616,832;
#        fc1 9216*128 = 1,179,648; fc2 128*10 = 1,280; 11,992,448 MACs, first 194,688
flops_per_sample() {
  case "$1" in
    mlp) echo $((6 * (784 * 512 + 512 * 256 + 256 * 10) - 2 * 784 * 512)) ;;
    cnn) echo $((6 * (26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9 + 9216 * 128 + 128 * 10) - 2 * 26 * 26 * 32 * 9)) ;;
  esac
}
# ringtrain: the median samples_per_sec of the step records after the first (start-up).
rt_median() {
  "$py" -c 'import json,sys,statistics
r=[json.loads(l) for l in open(sys.argv[1])]
print(statistics.median([x["samples_per_sec"] for x in r if x["type"]=="step"][1:]))' "$1"
}
free_port() {
  "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
rt_help=$("$bin/ringtrain" train --help 2>&1 || true)
has_model() { grep -E -q -- "--model .*model: .*\\b$1\\b" <<<"$rt_help"; }
gemm_rate() {
  "$bin/gemm_bench" --threads 1 --json | "$py" -c \
    'import json,sys; print([r["gflops"] for r in json.load(sys.stdin) if r["shape"]=="square2048"][0])'
}

# The reference is measured before and after the training runs; the higher of the two is
# the practical limit (a neighbour's burst of load lowers it, nothing raises it).
gemm_start=$(gemm_rate)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$tmp/rows"
for model in "${model_arr[@]}"; do
  s=$steps
  [[ -z "$s" ]] && { [[ $model == mlp ]] && s=400 || s=100; }
  rt_ok=1
  has_model "$model" || { rt_ok=0; echo "# $bin/ringtrain has no --model $model yet: its columns are '-'" >&2; }
  for ranks in "${rank_arr[@]}"; do
    rt_sps=-
    if ((rt_ok)); then
      m=$tmp/rt-$model-$ranks.jsonl
      mpirun -n "$ranks" "$bin/ringtrain" train --data "$data" --model "$model" --batch-size "$batch" \
        --steps "$s" --threads 1 --precision fp32 --optimizer sgd --lr 0.01 --momentum 0.9 \
        --log-every "$window" --metrics "$m" >"$tmp/rt.log" 2>&1 ||
        { cat "$tmp/rt.log" >&2; echo "ringtrain failed ($model, $ranks ranks)" >&2; exit 2; }
      rt_sps=$(rt_median "$m")
    fi
    p=$tmp/pt-$model-$ranks.json
    mpirun -n "$ranks" -x MASTER_ADDR -x MASTER_PORT="$(free_port)" -x OMP_NUM_THREADS \
      -x OPENBLAS_NUM_THREADS "$py" "$peer" --data "$data" --model "$model" --batch-size "$batch" \
      --steps "$s" --warmup "$window" --window "$window" --threads 1 --precision fp32 \
      --json "$p" >"$tmp/pt.log" 2>&1 ||
      { cat "$tmp/pt.log" >&2; echo "torch_ddp.py failed ($model, $ranks ranks)" >&2; exit 2; }
    pt_sps=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_sec"])' "$p")
    echo "$model $ranks $s $(flops_per_sample "$model") $rt_sps $pt_sps" >>"$tmp/rows"
    printf '# %s, %d rank(s): ringtrain %s, pytorch %.0f samples/s\n' "$model" "$ranks" \
      "$([[ $rt_sps == - ]] && echo - || printf '%.0f' "$rt_sps")" "$pt_sps" >&2
  done
done
gemm_end=$(gemm_rate)

# The table (and JSON lines): GFLOP/s per rank = FLOPs per sample * samples/s / ranks.
"$py" - "$tmp/rows" "$gemm_start" "$gemm_end" "$load_start" "$batch" "$json" <<'PY'
import json, sys
import torch
rows_file, g0, g1, load, batch, out = sys.argv[1:]
gemm = max(float(g0), float(g1))
print(f"# ringtrain vs PyTorch {torch.__version__} DDP (gloo), fp32, batch {batch} per rank, "
      "1 thread per rank, SGD momentum 0.9")
print(f"# reference: OpenBLAS SGEMM 2048^3 on 1 core, {gemm:.1f} GFLOP/s (before the runs "
      f"{float(g0):.1f}, after {float(g1):.1f}); load average at start {load}")
print(f"{'model':5} {'ranks':>5} {'ringtrain/s':>12} {'pytorch/s':>12} {'ratio':>6} "
      f"{'rt_GF/rank':>10} {'rt_frac':>7} {'pt_GF/rank':>10} {'pt_frac':>7}")
fmt = lambda v, f: "-" if v is None else format(v, f)
recs = []
for line in open(rows_file):
    model, ranks, steps, flops, rt, pt = line.split()
    ranks, flops, pt = int(ranks), int(flops), float(pt)
    rt = None if rt == "-" else float(rt)
    gf = lambda sps: None if sps is None else sps * flops / ranks * 1e-9
    r = dict(model=model, ranks=ranks, precision="fp32", batch_per_rank=int(batch),
             steps=int(steps), flops_per_sample=flops, gemm_gflops=gemm,
             ringtrain_samples_per_sec=rt, pytorch_samples_per_sec=pt,
             ratio=None if rt is None else rt / pt,
             ringtrain_gflops_per_rank=gf(rt), pytorch_gflops_per_rank=gf(pt),
             ringtrain_fraction_of_gemm=None if rt is None else gf(rt) / gemm,
             pytorch_fraction_of_gemm=gf(pt) / gemm, torch_version=str(torch.__version__))
    recs.append(r)
    print(f"{model:5} {ranks:5d} {fmt(rt, '12.0f'):>12} {pt:12.0f} {fmt(r['ratio'], '.2f'):>6} "
          f"{fmt(gf(rt), '.1f'):>10} {fmt(r['ringtrain_fraction_of_gemm'], '.3f'):>7} "
          f"{gf(pt):10.1f} {r['pytorch_fraction_of_gemm']:7.3f}")
print("# goals: ratio >= 1.0 at 1 rank and >= 1.5 at 2 ranks; rt_frac >= 0.70 on the cnn")
if out:
    with open(out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
PY
