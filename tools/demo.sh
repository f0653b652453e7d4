#!/usr/bin/env bash
# The demo behind `make demo`: converts Fashion-MNIST (Debian's dataset-fashion-mnist) to
# HDF5, trains the 784-512-256-10 MLP on 2 MPI ranks in mixed fp16 with checkpoints,
# evaluates the last checkpoint on the 10,000 test images and prints the test accuracy.
# Exits 1 when the accuracy is below --min-accuracy, whose default is scaled to the length of
# the run (a 300-step run cannot reach what 3 epochs reach).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: tools/demo.sh [--epochs N | --steps N] [--ranks N] [--out DIR] [--min-accuracy X]
  --epochs N        epochs to train (default 3)
  --steps N         train N steps instead of whole epochs
  --ranks N         MPI ranks (default 2; each takes batches of 64)
  --out DIR         where data, checkpoints and metrics go (default build/demo)
  --min-accuracy X  fail unless the test accuracy reaches X; the default depends on the
                    number of steps the run trains: 0.85 from 1,400 steps (the full demo:
                    3 epochs on 2 ranks are 1,404 steps), 0.80 from 300, 0.65 from 50,
                    0.20 below that (chance is 0.10)
USAGE
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${RINGTRAIN_BIN:-$here/build/bin/ringtrain}
length=(--epochs 3)
ranks=2
out=$here/build/demo
min_acc=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs|--steps) length=("$1" "$2"); shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --min-accuracy) min_acc=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1'" >&2; usage >&2; exit 1 ;;
  esac
done

if [[ -z "$min_acc" ]]; then
  if [[ ${length[0]} == --steps ]]; then
    steps=${length[1]}
  else  # 60,000 training images, a global batch of 64 per rank
    steps=$(( length[1] * (60000 / (64 * ranks)) ))
  fi
  if (( steps >= 1400 )); then min_acc=0.85
  elif (( steps >= 300 )); then min_acc=0.80
  elif (( steps >= 50 )); then min_acc=0.65
  else min_acc=0.20
  fi
fi

mpi=(mpirun -n "$ranks")
if [[ $(id -u) -eq 0 ]]; then mpi+=(--allow-run-as-root); fi
if (( ranks > $(nproc) )); then mpi+=(--oversubscribe); fi

src=$(dpkg -L dataset-fashion-mnist 2>/dev/null | grep 'train-images-idx3-ubyte.gz$' | xargs -r dirname)
if [[ -z "$src" ]]; then
  echo "demo.sh: Debian package dataset-fashion-mnist is not installed (run tools/install-deps.sh)" >&2
  exit 1
fi
mkdir -p "$out/data"
for split in train t10k; do
  name=$([[ $split == train ]] && echo train || echo test)
  if [[ ! -f "$out/data/fashion-$name.h5" ]]; then
    "$bin" convert idx --images "$src/$split-images-idx3-ubyte.gz" \
      --labels "$src/$split-labels-idx1-ubyte.gz" --out "$out/data/fashion-$name.h5"
  fi
done

rm -rf "$out/ckpt" "$out/metrics.jsonl"
start=$(date +%s.%N)
"${mpi[@]}" "$bin" train --data "$out/data/fashion-train.h5" --model mlp --hidden 512,256 \
  --precision fp16 "${length[@]}" --batch-size 64 --optimizer adamw --lr 1e-3 \
  --checkpoint-dir "$out/ckpt" --checkpoint-every 500 --keep 2 \
  --metrics "$out/metrics.jsonl" --log-every 100 --threads 1
latest=$(printf "%s\n" "$out"/ckpt/ckpt-*.h5 | sort | tail -n 1)
result=$("${mpi[@]}" "$bin" eval --checkpoint "$latest" --data "$out/data/fashion-test.h5" \
  --metrics "$out/metrics.jsonl" --threads 1)
end=$(date +%s.%N)
echo "$result"
acc=$(sed -n 's/.*accuracy \([0-9.]*\).*/\1/p' <<<"$result")
printf 'test accuracy: %s (10,000 Fashion-MNIST test images; training + evaluation took %.1f s; required: %s)\n' \
  "$acc" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$min_acc"
if ! awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }'; then
  echo "demo.sh: test accuracy $acc is below $min_acc" >&2
  exit 1
fi
