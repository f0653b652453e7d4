#!/usr/bin/env bash
# Test accuracy each model reaches on Fashion-MNIST in fp32, fp16 and bf16: trains on the
# 60,000 training images on 2 ranks (--threads 1 each) and evaluates on the 10,000 test
# images after every epoch; prints a Markdown table (the last epoch's accuracy and the
# wall time) and, with --json FILE, one JSON object per run.
#   usage: benchmarks/accuracy.sh [--models mlp,cnn,resnet] [--precisions fp32,fp16,bf16]
#                                 [--epochs N] [--ranks N] [--json FILE] [--bin PATH]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$here/build/bin/ringtrain
data=$here/build/demo/data
models=mlp,cnn,resnet
precisions=fp32,fp16,bf16
epochs=""
ranks=2
json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 1 ;;
  esac
done
[[ -f $data/fashion-train.h5 ]] || { echo "no $data/fashion-train.h5: run 'make demo' first" >&2; exit 1; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[[ -n "$json" ]] && : >"$json"

# The options each model trains with (per-rank batch 64, AdamW).
opts_for() {
  case "$1" in
    mlp) echo "--model mlp --epochs ${epochs:-3}" ;;
    cnn) echo "--model cnn --epochs ${epochs:-4}" ;;
    resnet) echo "--model resnet --depth 1 --width 16 --epochs ${epochs:-3}" ;;
  esac
}
echo "| model | precision | ranks | epochs | test accuracy | wall s | command |"
echo "|---|---|---|---|---|---|---|"
for model in ${models//,/ }; do
  for prec in ${precisions//,/ }; do
    read -r -a opts <<<"$(opts_for "$model")"
    m=$tmp/$model-$prec.jsonl
    cmd=(mpirun -n "$ranks" "$bin" train --data "$data/fashion-train.h5"
         --val-data "$data/fashion-test.h5" "${opts[@]}" --precision "$prec" --batch-size 64
         --optimizer adamw --lr 1e-3 --threads 1 --log-every 100 --progress lines --metrics "$m")
    t0=$(date +%s.%N)
    "${cmd[@]}" >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
    t1=$(date +%s.%N)
    acc=$(python3 -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "\"eval\"" in l][-1]["accuracy"])' "$m")
    wall=$(python3 -c "print(f'{$t1-$t0:.0f}')")
    shown="ringtrain train ${opts[*]} --precision $prec --batch-size 64 --optimizer adamw --lr 1e-3"
    printf '| %s | %s | %s | %s | %.4f | %s | `mpirun -n %s %s` |\n' "$model" "$prec" "$ranks" \
      "${opts[-1]}" "$acc" "$wall" "$ranks" "$shown"
    [[ -n "$json" ]] && printf '{"model":"%s","precision":"%s","ranks":%s,"epochs":%s,"accuracy":%s,"wall_s":%s}\n' \
      "$model" "$prec" "$ranks" "${opts[-1]}" "$acc" "$wall" >>"$json"
  done
done
