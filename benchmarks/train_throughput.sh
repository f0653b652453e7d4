#!/usr/bin/env bash
# Training throughput of the Fashion-MNIST MLP (784-512-256-10) at 1 and 2 ranks in fp32,
# fp16 and bf16, --threads 1 per rank, against the GEMM rate OpenBLAS reaches in the same
# run on one core (a 2048^3 SGEMM, from gemm_bench): samples/s, the FLOP rate each rank
# achieves, and its ratio to that practical limit. Writes a table and, with --json FILE,
# one JSON object per configuration.
set -euo pipefail

usage() {
  echo "usage: benchmarks/train_throughput.sh [--steps N] [--batch-size N] [--json FILE]"
  echo "  needs a build (make) and the Fashion-MNIST HDF5 files of 'make demo' (build/demo/data)"
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$here/build/bin
data=$here/build/demo/data/fashion-train.h5
steps=400
batch=64
json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
[[ -f "$data" ]] || { echo "no $data: run 'make demo' first" >&2; exit 1; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# FLOPs of one training sample: forward GEMMs, weight gradients, and input gradients of
# every layer but the first (ringtrain skips that one).
flops=$(( 2 * (784*512 + 512*256 + 256*10) * 2 + 2 * (512*256 + 256*10) ))
gemm=$("$bin/gemm_bench" --threads 1 --json | python3 -c \
  'import json,sys; print([r["gflops"] for r in json.load(sys.stdin) if r["shape"]=="square2048"][0])')
printf '# MLP 784-512-256-10, %d steps, batch %d per rank, 1 thread per rank\n' "$steps" "$batch"
printf '# reference: OpenBLAS SGEMM 2048^3 on 1 core in this run: %.1f GFLOP/s\n' "$gemm"
printf '%-6s %-9s %12s %16s %8s\n' ranks precision samples/s GFLOP/s/rank "of GEMM"
[[ -n "$json" ]] && : >"$json"
for ranks in 1 2; do
  for prec in fp32 fp16 bf16; do
    m=$tmp/m-$ranks-$prec.jsonl
    mpirun -n "$ranks" "$bin/ringtrain" train --data "$data" --precision "$prec" \
      --batch-size "$batch" --steps "$steps" --threads 1 --log-every 50 --metrics "$m" >/dev/null
    # The median of the 50-step windows after the first (which includes start-up).
    sps=$(python3 -c 'import json,sys,statistics
r=[json.loads(l) for l in open(sys.argv[1])]
s=[x["samples_per_sec"] for x in r if x["type"]=="step"][1:]
print(statistics.median(s))' "$m")
    read -r per ratio < <(python3 -c 'import sys
sps,ranks,flops,gemm=map(float,sys.argv[1:])
per=sps*flops/ranks*1e-9
print(f"{per:.2f} {per/gemm:.3f}")' "$sps" "$ranks" "$flops" "$gemm")
    printf '%-6s %-9s %12.0f %16s %8s\n' "$ranks" "$prec" "$sps" "$per" "$ratio"
    if [[ -n "$json" ]]; then
      printf '{"model":"mlp","ranks":%d,"precision":"%s","batch_per_rank":%d,"samples_per_sec":%.1f,"gflops_per_rank":%s,"gemm_gflops":%s,"ratio_to_gemm":%s}\n' \
        "$ranks" "$prec" "$batch" "$sps" "$per" "$gemm" "$ratio" >>"$json"
    fi
  done
done
