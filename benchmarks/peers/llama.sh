#!/usr/bin/env bash
# ringtrain's Llama training throughput against PyTorch's eager one on the CPU, in one run:
# `ringtrain train --model llama-tiny` (4 layers, width 128, 4 heads, 2 kv heads, ffn 352,
# T 64, 8 sequences per rank, AdamW) on a token dataset of random bytes, and
# benchmarks/peers/torch_llama.py (the same model, DDP over gloo) at the same ranks (1 thread
# each), shapes and precision, back to back. Prints tokens/s of each (the median over windows
# of 10 steps after 10 warm-up steps) and ringtrain's ratio to PyTorch's.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/peers/llama.sh [--build DIR] [--python PY] [--ranks N] [--steps N]
                                 [--precisions fp32,bf16] [--json FILE]
  --build DIR       ringtrain's build directory, with bin/ringtrain (default build)
  --python PY       a Python with PyTorch (default /usr/bin/python3; 2.x for fused AdamW)
  --ranks N         ranks per run under mpirun, 1 thread each (default 2)
  --steps N         steps per run, 10 of them warm-up (default 60)
  --precisions LIST comma-separated, of fp32 and bf16 (default fp32,bf16)
  --json FILE       append one JSON object per precision (JSON lines)
USAGE
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$here/build
py=/usr/bin/python3
ranks=2
steps=60
precisions=fp32,bf16
json=""
while [[ $# -gt 0 ]]; do
  [[ $1 == -h || $1 == --help ]] && { usage; exit 0; }
  [[ $# -ge 2 ]] || { echo "llama.sh: $1 needs a value (see --help)" >&2; exit 1; }
  case "$1" in
    --build) build=$(cd "$2" && pwd) ;;
    --python) py=$2 ;;
    --ranks) ranks=$2 ;;
    --steps) steps=$2 ;;
    --precisions) precisions=$2 ;;
    --json) json=$2 ;;
    *) echo "llama.sh: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
  shift 2
done
bin=$build/bin/ringtrain
[[ -x $bin ]] || { echo "llama.sh: no $bin: build first, or give --build" >&2; exit 1; }
"$py" -c 'import torch' 2>/dev/null || { echo "llama.sh: $py has no torch (--python)" >&2; exit 1; }
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "llama.sh: --ranks '$ranks': need a positive number" >&2; exit 1; }
[[ $steps =~ ^[0-9]+$ && $steps -ge 20 ]] || { echo "llama.sh: --steps '$steps': need 20 or more" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi() { mpirun --allow-run-as-root --oversubscribe -n "$ranks" "$@"; }

# 64 documents of 4 KiB random bytes: enough windows for every step
"$py" - "$work/corpus" <<'PY'
import os, random, sys
random.seed(0)
os.makedirs(sys.argv[1])
for d in range(64):
    with open(f"{sys.argv[1]}/doc{d:02d}.txt", "wb") as f:
        f.write(bytes(random.randrange(32, 127) for _ in range(4096)))
PY
mpi "$bin" convert text --input "$work/corpus/*.txt" --out "$work/data/c.h5" --shards "$ranks" >/dev/null
shape=(--set layers=4 --width 128 --set heads=4 --set kv_heads=2 --set ffn=352 --seq-len 64)
IFS=, read -r -a prec_arr <<<"$precisions"
printf '%-6s %14s %14s %7s\n' precision ringtrain pytorch ratio
for prec in "${prec_arr[@]}"; do
  [[ $prec == fp32 || $prec == bf16 ]] || { echo "llama.sh: --precisions: '$prec'" >&2; exit 1; }
  mpi "$bin" train --model llama-tiny "${shape[@]}" --data "$work/data/c-*-of-*.h5" \
    --batch-size 8 --steps "$steps" --optimizer adamw --lr 3e-4 --weight-decay 0.1 --threads 1 \
    --prefetch 2 --precision "$prec" --log-every 10 --metrics "$work/rt-$prec.jsonl" >/dev/null
  mpi -x MASTER_PORT=29513 "$py" "$here/benchmarks/peers/torch_llama.py" --layers 4 --width 128 \
    --heads 4 --kv-heads 2 --ffn 352 --seq-len 64 --batch-size 8 --steps "$steps" --threads 1 \
    --precision "$prec" --json "$work/pt-$prec.json" >/dev/null
  "$py" - "$work/rt-$prec.jsonl" "$work/pt-$prec.json" "$prec" "$json" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
rt = statistics.median(r["tokens_per_sec"] for r in steps if r["type"] == "step" and r["step"] > 10)
pt = json.load(open(sys.argv[2]))
print(f"{sys.argv[3]:6} {rt:14.1f} {pt['tokens_per_sec']:14.1f} {rt / pt['tokens_per_sec']:7.2f}"
      f"   (PyTorch {pt['torch']} eager, AdamW {pt['adamw']})")
if sys.argv[4]:
    with open(sys.argv[4], "a") as f:
        f.write(json.dumps({"model": "llama-tiny", "precision": sys.argv[3], "ringtrain_tokens_per_sec": rt,
                            "pytorch_tokens_per_sec": pt["tokens_per_sec"], "ratio": rt / pt["tokens_per_sec"],
                            "torch": pt["torch"], "adamw": pt["adamw"]}) + "\n")
PY
done
