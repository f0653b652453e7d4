#!/usr/bin/env bash
# The demo behind `make gpt-demo`: converts the Python standard library's sources (the
# *.py files under /usr/lib/python3.11, in sorted byte order, so the corpus and its
# held-out documents are the same on every Debian 12 machine) to a byte-level token dataset
# with a validation split, trains models/gpt-tiny.pbtxt on 2 MPI ranks in bf16 (AdamW,
# linear warm-up then cosine decay), evaluates the last checkpoint on every window of the
# held-out split next to the unigram and bigram baselines counted on the training split,
# prints the ratio to the bigram and the wall time, then a sample of generated text.
# Exits 1 when the validation loss is above --max-ratio x the bigram baseline.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: tools/gpt-demo.sh [--steps N] [--ranks N] [--out DIR] [--max-ratio X] [--no-sample]
  --steps N      optimizer steps (default 2000: 2 ranks x 16 windows x 64 tokens = 2048
                 tokens a step, about 4.1M tokens, 0.4 epochs of the corpus)
  --ranks N      MPI ranks (default 2; each trains on 16 windows a step, one thread)
  --out DIR      where the data, checkpoints and metrics go (default build/gpt-demo)
  --max-ratio X  fail unless validation loss <= X x the bigram baseline (default 0.8)
  --no-sample    skip `ringtrain sample` at the end
environment: RINGTRAIN_BIN (default build/bin/ringtrain), PYTHON_LIB (default
/usr/lib/python3.11, the corpus)
USAGE
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${RINGTRAIN_BIN:-$here/build/bin/ringtrain}
pylib=${PYTHON_LIB:-/usr/lib/python3.11}
steps=2000
ranks=2
out=$here/build/gpt-demo
max_ratio=0.8
sample=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --max-ratio) max_ratio=$2; shift 2 ;;
    --no-sample) sample=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpt-demo.sh: unknown argument '$1'" >&2; usage >&2; exit 1 ;;
  esac
done
for v in "$steps" "$ranks"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "gpt-demo.sh: --steps and --ranks take a positive integer, got '$v'" >&2; exit 1; }
done
[[ -x $bin ]] || { echo "gpt-demo.sh: $bin is not built (make build, or set RINGTRAIN_BIN)" >&2; exit 1; }
[[ -d $pylib ]] || { echo "gpt-demo.sh: corpus directory $pylib does not exist (set PYTHON_LIB)" >&2; exit 1; }

mpi=(mpirun -n "$ranks" -x OMP_NUM_THREADS=1)
if [[ $(id -u) -eq 0 ]]; then mpi+=(--allow-run-as-root); fi
if (( ranks > $(nproc) )); then mpi+=(--oversubscribe); fi

start=$(date +%s.%N)
mkdir -p "$out/data"
if [[ ! -f "$out/data/pylib-val.h5" ]]; then
  # The file list in C-locale order, so the held-out documents do not depend on the locale.
  mapfile -d '' files < <(find "$pylib" -name '*.py' -type f -print0 | LC_ALL=C sort -z)
  (( ${#files[@]} > 0 )) || { echo "gpt-demo.sh: no *.py files under $pylib" >&2; exit 1; }
  "$bin" convert text --input "${files[@]}" --out "$out/data/pylib.h5" --val-fraction 0.1
fi

rm -rf "$out/ckpt" "$out/metrics.jsonl"
"${mpi[@]}" "$bin" train --model gpt-tiny --data "$out/data/pylib.h5" --precision bf16 \
  --steps "$steps" --batch-size 16 --optimizer adamw --lr 3e-3 --weight-decay 0.1 \
  --grad-clip 1 --lr-schedule cosine --warmup-steps 100 --min-lr 3e-4 \
  --checkpoint-dir "$out/ckpt" --checkpoint-every 1000 --keep 1 \
  --metrics "$out/metrics.jsonl" --log-every 100 --threads 1
trained=$(date +%s.%N)
latest=$(printf "%s\n" "$out"/ckpt/ckpt-*.h5 | sort | tail -n 1)
"${mpi[@]}" "$bin" eval --checkpoint "$latest" --data "$out/data/pylib-val.h5" \
  --baselines "$out/data/pylib.h5" --metrics "$out/metrics.jsonl" --threads 1
end=$(date +%s.%N)

# The eval record (the last line) holds the model's loss and both baselines.
read -r loss bigram unigram < <(tail -n 1 "$out/metrics.jsonl" |
  python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["loss"], r["bigram"], r["unigram"])')
# Steps/s of the training part alone, from the step records' mean step time.
step_s=$(grep '"type":"step"' "$out/metrics.jsonl" |
  python3 -c 'import json,sys; s=[json.loads(l)["step_s"] for l in sys.stdin]; print(sum(s)/len(s))')
python3 - "$loss" "$bigram" "$unigram" "$max_ratio" "$start" "$trained" "$end" "$step_s" "$steps" <<'PY'
import math, sys
loss, bigram, unigram, max_ratio, start, trained, end, step_s = map(float, sys.argv[1:9])
steps = int(sys.argv[9])
bits = 1 / math.log(2)
print(f"gpt-demo: validation loss {loss:.4f} nats/token ({loss * bits:.4f} bits/byte); "
      f"unigram {unigram:.4f} ({unigram * bits:.4f}), bigram {bigram:.4f} ({bigram * bits:.4f}); "
      f"loss / bigram = {loss / bigram:.3f} (goal <= {max_ratio})")
print(f"gpt-demo: wall time {end - start:.0f} s (training {trained - start:.0f} s incl. convert, "
      f"{steps} steps at {1 / step_s:.2f} steps/s); goal <= 900 s")
PY
if [[ $sample -eq 1 ]]; then
  echo "gpt-demo: sample (--prompt 'def ' --tokens 200 --temperature 0.8 --top-k 40 --seed 1):"
  "$bin" sample --checkpoint "$latest" --prompt "def " --tokens 200 --temperature 0.8 \
    --top-k 40 --seed 1
  echo
fi
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) * float(sys.argv[3]) else 1)" \
  "$loss" "$max_ratio" "$bigram" || { echo "gpt-demo: validation loss $loss is above $max_ratio x bigram $bigram" >&2; exit 1; }
