#!/usr/bin/env bash
# The GPU check of the CUDA backend, for one GPU (written for an H200; under 8 minutes with
# the build): configures and builds the GPU targets, runs the `gpu` tests (every CUDA op
# against the CPU backend, the allocator, 10 training steps per model against the CPU,
# NCCL at 1 rank, and gpu_train_cli: `ringtrain train --device cuda` against
# `--device cpu`), then gpu_bench: GEMM TFLOP/s of our path against direct cuBLAS, step
# time and samples/s of the MLP, the CNN and a GEMM-bound MLP in fp32/fp16/bf16, and the
# share of the step in unscale + check + optimizer. Writes summary.json and prints a table.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/gpu/check.sh [--build DIR] [--out DIR] [--arch LIST] [--quick] [--jobs N]

  --build DIR   build directory (default build-gpu-check)
  --out DIR     where test logs, bench.json and summary.json go (default $OUT if set,
                else DIR/gpu-check)
  --arch LIST   CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200; use 80 for A100)
  --quick       smaller benchmark (fewer shapes and steps)
  --jobs N      build jobs (default: all cores)

Exit status: 0 when the gpu tests passed (goals missed by the benchmark are reported, not
fatal), 1 when a test failed or was skipped (there is no usable GPU), 2 on a build error.
USAGE
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build-gpu-check"
out="${OUT:-}"
arch=90
quick=()
jobs="$(nproc)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check.sh: unknown option '$1'" >&2; usage >&2; exit 1 ;;
  esac
done
[[ -n "$out" ]] || out="$build/gpu-check"
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start))s] $*"; }

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv \
    | tee "$out/nvidia-smi.txt" || true
fi

stamp "configure ($build, sm $arch)"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DRINGTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$out/configure.log" 2>&1; then
  cat "$out/configure.log"; exit 2
fi
grep -E '✓|✗' "$out/configure.log" | sed 's/^-- //'
stamp "build gpu_tests gpu_nccl_tests gpu_bench ringtrain"
if ! cmake --build "$build" -j"$jobs" --target gpu_tests gpu_nccl_tests gpu_bench ringtrain \
    >"$out/build.log" 2>&1; then
  tail -50 "$out/build.log"; exit 2
fi
"$build/bin/ringtrain" --version | tee "$out/version.txt"

stamp "ctest -L gpu (gpu_train_cli: ringtrain train --device cuda against --device cpu)"
tests_rc=0
(cd "$build" && ctest -L gpu --output-on-failure --timeout 400) 2>&1 | tee "$out/ctest.log" \
  || tests_rc=$?
if grep -q "Skipped" "$out/ctest.log"; then
  echo "check.sh: GPU tests were skipped: there is no usable CUDA device here" >&2
  tests_rc=1
fi

stamp "gpu_bench"
bench_rc=0
timeout 300 "$build/bin/gpu_bench" --json "$out/bench.json" "${quick[@]}" 2>&1 \
  | tee "$out/bench.log" || bench_rc=$?

passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$out/ctest.log" || true)
failed=$(grep -cE '\*\*\*(Failed|Timeout|Exception)|Failed +[0-9.]+ sec' "$out/ctest.log" || true)
skipped=$(grep -cE '\*\*\*Skipped' "$out/ctest.log" || true)
bench_json="null"
[[ -s "$out/bench.json" ]] && bench_json="$(cat "$out/bench.json")"
cat >"$out/summary.json" <<JSON
{"seconds": $(($(date +%s) - start)), "tests": {"passed": $passed, "failed": $failed, "skipped": $skipped, "rc": $tests_rc}, "bench_rc": $bench_rc, "bench": $bench_json}
JSON
stamp "done: tests passed $passed, failed $failed, skipped $skipped; summary in $out/summary.json"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]] || exit 1
