#!/usr/bin/env bash
# ringtrain's GPT training throughput against PyTorch's on the CPU, in one run: gpt_bench and
# benchmarks/peers/torch_gpt.py (PyTorch from PyPI, DDP over gloo, fused AdamW, eager and
# torch.compile) train the same GPT-2 on random tokens at the same ranks (1 thread each),
# shapes and precision. Two models: gpt-tiny (4 layers, width 128, 4 heads, T 64, batch 8
# per rank) and the mid GPT (6 layers, width 384, 6 heads, T 256, batch 4 per rank); fp32,
# and bf16 as ringtrain's --precision bf16 and torch.autocast(bfloat16). Each round runs
# every model/precision's three runs back to back (a change in the machine's load hits them
# alike) and prints tokens/s of each and ringtrain's ratio to the better PyTorch figure.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/peers/gpt.sh [--build DIR] [--venvs DIR] [--rounds N] [--ranks N]
                               [--models tiny,mid] [--precisions fp32,bf16] [--json FILE]
  --build DIR       ringtrain's build directory, with bin/gpt_bench (default build)
  --venvs DIR       holds DIR/torch, a virtual environment with PyTorch 2.4 or later
                    (benchmarks/peers/run.sh creates it; default build/peers)
  --rounds N        how many times to run the whole set (default 2)
  --ranks N         ranks per run under mpirun, 1 thread each (default 2)
  --models LIST     comma-separated, of tiny and mid (default tiny,mid)
  --precisions LIST comma-separated, of fp32 and bf16 (default fp32,bf16)
  --json FILE       append one JSON object per run (JSON lines)
USAGE
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$here/build
venvs=""
rounds=2
ranks=2
models=tiny,mid
precisions=fp32,bf16
json=""
while [[ $# -gt 0 ]]; do
  [[ $1 == -h || $1 == --help ]] && { usage; exit 0; }
  [[ $# -ge 2 ]] || { echo "gpt.sh: $1 needs a value (see --help)" >&2; exit 1; }
  case "$1" in
    --build) build=$(cd "$2" && pwd) ;;
    --venvs) venvs=$2 ;;
    --rounds) rounds=$2 ;;
    --ranks) ranks=$2 ;;
    --models) models=$2 ;;
    --precisions) precisions=$2 ;;
    --json) json=$2 ;;
    *) echo "gpt.sh: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
  shift 2
done
venvs=${venvs:-$build/peers}
py=$venvs/torch/bin/python
[[ -x $build/bin/gpt_bench ]] || { echo "gpt.sh: no $build/bin/gpt_bench: build first, or give --build" >&2; exit 1; }
[[ -x $py ]] || { echo "gpt.sh: no $py: create the venv (benchmarks/peers/run.sh does), or give --venvs" >&2; exit 1; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "gpt.sh: --rounds '$rounds': need a positive number" >&2; exit 1; }
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "gpt.sh: --ranks '$ranks': need a positive number" >&2; exit 1; }
IFS=, read -r -a model_arr <<<"$models"
IFS=, read -r -a prec_arr <<<"$precisions"
for m in "${model_arr[@]}"; do
  [[ $m == tiny || $m == mid ]] || { echo "gpt.sh: --models: unknown model '$m' (tiny, mid)" >&2; exit 1; }
done
for p in "${prec_arr[@]}"; do
  [[ $p == fp32 || $p == bf16 ]] || { echo "gpt.sh: --precisions: unknown precision '$p' (fp32, bf16)" >&2; exit 1; }
done

export OMP_NUM_THREADS=1
unset OPENBLAS_NUM_THREADS MKL_NUM_THREADS RINGTRAIN_GEMM RINGTRAIN_CPU_BF16 RINGTRAIN_THREADS
mpi=(mpirun -n "$ranks" --bind-to none)
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
((ranks > $(nproc))) && mpi+=(--oversubscribe)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shape flags: gpt_bench's, then torch_gpt.py's
shape() {
  case $1 in
    tiny) echo "--batch-size 8 --seq-len 64 --steps 40|--batch-size 8 --seq-len 64 --steps 40" ;;
    mid)
      echo "--batch-size 4 --seq-len 256 --var layers=6 --var width=384 --var heads=6 --steps 16 --warmup 4 --window 4|--batch-size 4 --seq-len 256 --layers 6 --width 384 --heads 6 --steps 16 --warmup 4 --window 4"
      ;;
  esac
}
rate() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_sec"])' "$1"; }

grep -m1 "model name" /proc/cpuinfo | sed 's/^.*: /cpu: /'
echo "cpu flags: $(grep -m1 -o -w -E 'avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "ranks $ranks x 1 thread; $("$py" -c 'import torch; print("PyTorch", torch.__version__)')"
printf '%-5s %-5s %5s %12s %14s %16s %7s\n' model prec round ringtrain "pytorch eager" "pytorch compile" ratio
port=29600
for ((r = 1; r <= rounds; ++r)); do
  for m in "${model_arr[@]}"; do
    IFS='|' read -r ours theirs <<<"$(shape "$m")"
    for p in "${prec_arr[@]}"; do
      # shellcheck disable=SC2086  # the shape flags are words
      "${mpi[@]}" "$build/bin/gpt_bench" --threads 1 --precision "$p" $ours \
        --json "$tmp/rt.json" >"$tmp/rt.log" 2>&1 || { cat "$tmp/rt.log" >&2; exit 1; }
      for c in eager compile; do
        flag=""
        [[ $c == compile ]] && flag=--compile
        port=$((port + 1))
        # shellcheck disable=SC2086
        "${mpi[@]}" -x OMP_NUM_THREADS -x MASTER_PORT=$port "$py" "$here/benchmarks/peers/torch_gpt.py" \
          --threads 1 --precision "$p" $theirs $flag --json "$tmp/pt-$c.json" >"$tmp/pt.log" 2>&1 ||
          { cat "$tmp/pt.log" >&2; exit 1; }
      done
      a=$(rate "$tmp/rt.json") e=$(rate "$tmp/pt-eager.json") c=$(rate "$tmp/pt-compile.json")
      printf '%-5s %-5s %5d %12.0f %14.0f %16.0f %7.2f\n' "$m" "$p" "$r" "$a" "$e" "$c" \
        "$("$py" -c "print($a / max($e, $c))")"
      if [[ -n $json ]]; then
        for f in rt pt-eager pt-compile; do
          "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); d.update(model=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(d))' \
            "$tmp/$f.json" "$m" "$r" >>"$json"
        done
      fi
    done
  done
done
