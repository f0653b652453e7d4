#!/usr/bin/env bash
# Training throughput of the Fashion-MNIST MLP (784-512-256-10) at 1 and 2 ranks in fp32,
# fp16 and bf16, --threads 1 per rank, against the best GEMM rate (oneDNN or OpenBLAS)
# reached in the same run on one core (a 2048^3 SGEMM, from gemm_bench): samples/s, the FLOP rate each rank
# achieves, and its ratio to that practical limit. Then, at 2 ranks, the exposed gradient
# communication (the part of the bucketed allreduce not hidden behind backward) as a share
# of the step time, with overlap and with --no-overlap. Writes tables and, with --json
# FILE, one JSON object per configuration.
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
# The median of a step-record field over the 50-step windows after the first (start-up).
median() {
  python3 -c 'import json,sys,statistics
r=[json.loads(l) for l in open(sys.argv[1])]
print(statistics.median([x[sys.argv[2]] for x in r if x["type"]=="step"][1:]))' "$1" "$2"
}

flops=$(( 2 * (784*512 + 512*256 + 256*10) * 2 + 2 * (512*256 + 256*10) ))
gemm=$("$bin/gemm_bench" --threads 1 --json | python3 -c \
  'import json,sys; print(max(r["gflops"] for r in json.load(sys.stdin) if r["shape"]=="square2048"))')
printf '# MLP 784-512-256-10, %d steps, batch %d per rank, 1 thread per rank\n' "$steps" "$batch"
printf '# reference: the best SGEMM 2048^3 on 1 core in this run (gemm_bench): %.1f GFLOP/s\n' "$gemm"
printf '%-6s %-9s %12s %16s %8s\n' ranks precision samples/s GFLOP/s/rank "of GEMM"
[[ -n "$json" ]] && : >"$json"
for ranks in 1 2; do
  for prec in fp32 fp16 bf16; do
    m=$tmp/m-$ranks-$prec.jsonl
    mpirun -n "$ranks" "$bin/ringtrain" train --data "$data" --precision "$prec" \
      --batch-size "$batch" --steps "$steps" --threads 1 --log-every 50 --metrics "$m" >/dev/null
    sps=$(median "$m" samples_per_sec)
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

printf '\n# 2 ranks: exposed gradient communication per step (median of 50-step windows)\n'
printf '%-9s %-10s %10s %10s %12s %9s\n' precision overlap step_ms comm_ms exposed_ms exposed_pct
for prec in fp32 fp16; do
  for overlap in on off; do
    m=$tmp/x-$prec-$overlap.jsonl
    extra=()
    [[ $overlap == off ]] && extra=(--no-overlap)
    mpirun -n 2 "$bin/ringtrain" train --data "$data" --precision "$prec" --batch-size "$batch" \
      --steps "$steps" --threads 1 --log-every 50 --metrics "$m" "${extra[@]}" >/dev/null
    read -r step comm exposed < <(echo "$(median "$m" step_s) $(median "$m" comm_s) $(median "$m" exposed_comm_s)")
    frac=$(python3 -c "print(f'{100*$exposed/$step:.1f}')")
    printf '%-9s %-10s %10.3f %10.3f %12.3f %9s\n' "$prec" "$overlap" "$(python3 -c "print($step*1e3)")" \
      "$(python3 -c "print($comm*1e3)")" "$(python3 -c "print($exposed*1e3)")" "$frac"
    if [[ -n "$json" ]]; then
      printf '{"model":"mlp","ranks":2,"precision":"%s","overlap":"%s","step_s":%s,"comm_s":%s,"exposed_comm_s":%s,"exposed_percent":%s}\n' \
        "$prec" "$overlap" "$step" "$comm" "$exposed" "$frac" >>"$json"
    fi
  done
done

# The timeline's cost: off, on but outside its window (the cost of the checks alone), and
# recording every step. 1 rank, fp32.
printf '\n# 1 rank fp32: step time with the timeline off / outside its window / recording\n'
printf '%-22s %10s %8s\n' timeline step_ms ratio
base=""
for mode in off outside recording; do
  m=$tmp/t-$mode.jsonl
  extra=()
  [[ $mode == outside ]] && extra=(--timeline "$tmp/t.json" --timeline-steps 999999:1000000)
  [[ $mode == recording ]] && extra=(--timeline "$tmp/t.json" --timeline-steps "1:$steps")
  "$bin/ringtrain" train --data "$data" --batch-size "$batch" --steps "$steps" --threads 1 \
    --log-every 50 --metrics "$m" "${extra[@]}" >/dev/null
  step=$(median "$m" step_s)
  [[ -z "$base" ]] && base=$step
  printf '%-22s %10.4f %8.3f\n' "$mode" "$(python3 -c "print($step*1e3)")" "$(python3 -c "print($step/$base)")"
  if [[ -n "$json" ]]; then
    printf '{"model":"mlp","ranks":1,"timeline":"%s","step_s":%s,"ratio":%s}\n' "$mode" "$step" \
      "$(python3 -c "print($step/$base)")" >>"$json"
  fi
done
