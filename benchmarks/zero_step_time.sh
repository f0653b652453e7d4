#!/usr/bin/env bash
# Step time of --zero 2 and --zero 3 against --zero 0 on 2 ranks, gpt-tiny on byte tokens, in
# one run: the stages alternate for --rounds rounds of --steps steps each (so a load that
# changes during the run hits every stage alike); each run's median step_s after the first 5
# steps (metrics records, --log-every 1), then per stage the median over rounds and its ratio
# to --zero 0's. Extra arguments after -- go to every run (e.g. --precision bf16,
# --set width=384 --set layers=6 --seq-len 256 for the mid GPT of docs/benchmarks.md).
set -euo pipefail

usage() {
  echo "usage: benchmarks/zero_step_time.sh [--bin RINGTRAIN] [--dir DIR] [--steps N] [--rounds R] [-- TRAIN ARGS]"
  echo "  defaults: build/bin/ringtrain, build/zero-steps, 30 steps, 3 rounds"
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$here/build/bin/ringtrain
dir=$here/build/zero-steps
steps=30 rounds=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
mkdir -p "$dir/corpus"
py=/usr/bin/python3
[[ -x $py ]] || py=python3
# A byte-token corpus of 64 KiB of pseudo-random words.
$py - "$dir/corpus" <<'PY'
import random, sys
random.seed(1)
words = "def return self import class lambda yield for while with if else try".split()
for d in range(8):
    with open(f"{sys.argv[1]}/doc{d}.txt", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(1600)) + "\n")
PY
"$bin" convert text --input "$dir/corpus/*.txt" --out "$dir/tok.h5" >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common=(--model gpt-tiny --data "$dir/tok.h5" --threads 1 --optimizer adamw --global-batch-size 8
  --steps "$steps" --log-every 1 --resume never "$@")
median_step() {  # METRICS.jsonl: the median step_s of the steps after the 5th
  $py - "$1" <<'PY'
import json, sys, statistics
s = [r["step_s"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step" and r["step"] > 5]
print(f"{statistics.median(s):.6f}")
PY
}
declare -A times
for r in $(seq 1 "$rounds"); do
  for z in 0 2 3; do
    m=$dir/metrics-$z-$r.jsonl
    rm -f "$m"
    mpirun --allow-run-as-root --oversubscribe -n 2 "$bin" train "${common[@]}" --zero "$z" \
      --metrics "$m" >"$dir/run-$z-$r.out" 2>&1 || { cat "$dir/run-$z-$r.out" >&2; exit 1; }
    times[$z]+="$(median_step "$m") "
  done
done
# (the space-separated figures split into arguments on purpose)
# shellcheck disable=SC2086
ref=$($py -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' ${times[0]})
for z in 0 2 3; do
  # shellcheck disable=SC2086
  t=$($py -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' ${times[$z]})
  $py -c 'import sys; z, t, ref, runs = sys.argv[1:5]; print(f"--zero {z}: median step {float(t)*1e3:.2f} ms over rounds ({runs.strip()}), ratio to --zero 0: {float(t)/float(ref):.3f}")' \
    "$z" "$t" "$ref" "${times[$z]}"
done
