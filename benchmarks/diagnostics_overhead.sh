#!/usr/bin/env bash
# The cost of the diagnostics that are on by default: the same training run (the
# Fashion-MNIST MLP 784-512-256-10, fp32, --threads 1 per rank) with the flight recorder
# (--flight-recorder 4096) and straggler detection (--straggler-window 10, five times as
# often as the default) and, as the reference in the same run, with both off
# (--flight-recorder 0 --straggler-window 0). The two alternate, REPS times each; the figure
# of one run is its median step time (step_s) over the --log-every 50 records after the
# first; the table gives the median over the repetitions and the ratio on/off.
set -euo pipefail

usage() {
  echo "usage: benchmarks/diagnostics_overhead.sh [--ranks N] [--steps N] [--reps R] [--bin DIR] [--data FILE]"
  echo "  needs a build (make; --bin DIR for another build's bin/) and the Fashion-MNIST HDF5"
  echo "  file of 'make demo' (build/demo/data/fashion-train.h5; --data for another)"
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$here/build/bin
data=$here/build/demo/data/fashion-train.h5
ranks=2
steps=400
reps=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
[[ -f "$data" ]] || { echo "no $data: run 'make demo' first, or give --data" >&2; exit 1; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median_step_s() {
  python3 -c 'import json,sys,statistics
r=[json.loads(l) for l in open(sys.argv[1])]
print(statistics.median([x["step_s"] for x in r if x["type"]=="step"][1:]))' "$1"
}

declare -A runs=([off]="--flight-recorder 0 --straggler-window 0"
  [on]="--flight-recorder 4096 --straggler-window 10")
off=() on=()
for ((i = 0; i < reps; i++)); do
  for mode in off on; do
    m=$tmp/$mode-$i.jsonl
    # shellcheck disable=SC2086  # the mode's options, split on purpose
    mpirun -n "$ranks" "$bin/ringtrain" train --data "$data" --steps "$steps" --threads 1 \
      --batch-size 64 --log-every 50 --metrics "$m" ${runs[$mode]} >/dev/null
    v=$(median_step_s "$m")
    if [[ $mode == off ]]; then off+=("$v"); else on+=("$v"); fi
  done
done
python3 - "$ranks" "$steps" "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
ranks, steps = sys.argv[1], sys.argv[2]
off = [float(x) for x in sys.argv[3].split()]
on = [float(x) for x in sys.argv[4].split()]
mo, mn = statistics.median(off), statistics.median(on)
print(f"# MLP 784-512-256-10, {ranks} ranks, {steps} steps, batch 64 per rank; median step_s per run")
print(f"{'diagnostics':<40} {'step ms (median)':>16} {'runs (ms)':>30}")
print(f"{'off (reference)':<40} {mo*1e3:16.3f} {' '.join(f'{x*1e3:.3f}' for x in off):>30}")
print(f"{'flight recorder + straggler window 10':<40} {mn*1e3:16.3f} {' '.join(f'{x*1e3:.3f}' for x in on):>30}")
print(f"ratio on/off: {mn/mo:.4f} ({(mn/mo-1)*100:+.2f} %)")
PY
