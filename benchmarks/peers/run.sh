#!/usr/bin/env bash
# ringtrain against its peer, PyTorch DistributedDataParallel (Debian's python3-torch, CPU,
# gloo): the same models (the 784-512-256-10 MLP and the CNN), per-rank batch, data file,
# optimizer (SGD, momentum 0.9, lr 0.01), precision and thread count (1 per rank), at 1 and
# 2 ranks under mpirun. Prints samples/s of both and their ratio, and for each framework the
# GFLOP/s one rank achieves and its fraction of the GEMM GFLOP/s OpenBLAS reaches in the
# same run on a 2048^3 SGEMM on one core (gemm_bench), the practical limit. Both frameworks
# use that same OpenBLAS (PyTorch through libblas.so.3; its convolutions through oneDNN).
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
# optimizer are left out (a few percent at most).
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
# GFLOP/s per rank and its fraction of the GEMM rate: gflops sps ranks flops gemm
rate() {
  "$py" -c 'import sys
sps,ranks,flops,gemm=map(float,sys.argv[1:])
per=sps*flops/ranks*1e-9
print(f"{per:.1f} {per/gemm:.3f}")' "$@"
}
rt_help=$("$bin/ringtrain" train --help 2>&1 || true)
has_model() { grep -E -q -- "--model .*model: .*\\b$1\\b" <<<"$rt_help"; }

gemm=$("$bin/gemm_bench" --threads 1 --json | "$py" -c \
  'import json,sys; print([r["gflops"] for r in json.load(sys.stdin) if r["shape"]=="square2048"][0])')
tv=$("$py" -c 'import torch; print(torch.__version__)')
printf '# ringtrain vs PyTorch %s DDP (gloo), fp32, batch %d per rank, 1 thread per rank, SGD momentum 0.9\n' "$tv" "$batch"
printf '# reference: OpenBLAS SGEMM 2048^3 on 1 core in this run: %.1f GFLOP/s; load average at start: %s\n' \
  "$gemm" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %5s %12s %12s %6s %10s %7s %10s %7s\n' model ranks ringtrain/s pytorch/s ratio \
  rt_GF/rank rt_frac pt_GF/rank pt_frac
[[ -n "$json" ]] && : >"$json"
for model in "${model_arr[@]}"; do
  s=$steps
  [[ -z "$s" ]] && { [[ $model == mlp ]] && s=400 || s=100; }
  flops=$(flops_per_sample "$model")
  rt_ok=1
  has_model "$model" || { rt_ok=0; echo "# $bin/ringtrain has no --model $model yet: its columns are '-'" >&2; }
  for ranks in "${rank_arr[@]}"; do
    rt_sps="" rt_per="-" rt_frac="-"
    if ((rt_ok)); then
      m=$tmp/rt-$model-$ranks.jsonl
      mpirun -n "$ranks" "$bin/ringtrain" train --data "$data" --model "$model" --batch-size "$batch" \
        --steps "$s" --threads 1 --precision fp32 --optimizer sgd --lr 0.01 --momentum 0.9 \
        --log-every "$window" --metrics "$m" >"$tmp/rt.log" 2>&1 ||
        { cat "$tmp/rt.log" >&2; echo "ringtrain failed ($model, $ranks ranks)" >&2; exit 2; }
      rt_sps=$(rt_median "$m")
      read -r rt_per rt_frac < <(rate "$rt_sps" "$ranks" "$flops" "$gemm")
    fi
    p=$tmp/pt-$model-$ranks.json
    mpirun -n "$ranks" -x MASTER_ADDR -x MASTER_PORT="$(free_port)" -x OMP_NUM_THREADS \
      -x OPENBLAS_NUM_THREADS "$py" "$peer" --data "$data" --model "$model" --batch-size "$batch" \
      --steps "$s" --warmup "$window" --window "$window" --threads 1 --precision fp32 \
      --json "$p" >"$tmp/pt.log" 2>&1 ||
      { cat "$tmp/pt.log" >&2; echo "torch_ddp.py failed ($model, $ranks ranks)" >&2; exit 2; }
    pt_sps=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_sec"])' "$p")
    read -r pt_per pt_frac < <(rate "$pt_sps" "$ranks" "$flops" "$gemm")
    ratio="-"
    [[ -n "$rt_sps" ]] && ratio=$("$py" -c "print(f'{$rt_sps/$pt_sps:.2f}')")
    printf '%-5s %5d %12s %12.0f %6s %10s %7s %10s %7s\n' "$model" "$ranks" \
      "$([[ -n "$rt_sps" ]] && printf '%.0f' "$rt_sps" || echo -)" "$pt_sps" "$ratio" \
      "$rt_per" "$rt_frac" "$pt_per" "$pt_frac"
    if [[ -n "$json" ]]; then
      "$py" -c 'import json,sys
a=sys.argv[1:]
num=lambda v: None if v in ("","-") else float(v)
print(json.dumps(dict(model=a[0], ranks=int(a[1]), precision="fp32", batch_per_rank=int(a[2]),
  steps=int(a[3]), flops_per_sample=int(a[4]), gemm_gflops=float(a[5]),
  ringtrain_samples_per_sec=num(a[6]), pytorch_samples_per_sec=float(a[7]),
  ratio=num(a[6]) and num(a[6]) / float(a[7]),
  ringtrain_gflops_per_rank=num(a[8]), ringtrain_fraction_of_gemm=num(a[9]),
  pytorch_gflops_per_rank=float(a[10]), pytorch_fraction_of_gemm=float(a[11]), torch_version=a[12])))' \
        "$model" "$ranks" "$batch" "$s" "$flops" "$gemm" "$rt_sps" "$pt_sps" \
        "$rt_per" "$rt_frac" "$pt_per" "$pt_frac" "$tv" >>"$json"
    fi
  done
done
printf '# goals: ratio >= 1.0 at 1 rank and >= 1.5 at 2 ranks; rt_frac >= 0.70 on the cnn\n'
