#!/usr/bin/env bash
# Packs the GPU check's programs, built here, for a GPU machine that cannot build them: the
# lent H200 machines run a CUDA/Python image (nvcc, CMake, PyTorch and NVIDIA's pip
# libraries) without MPI, HDF5, Boost, OpenBLAS, oneDNN, Protocol Buffers or GoogleTest,
# and cannot download them. The bundle holds gpu_tests and gpu_bench, every shared library
# they load except the CUDA ones (cudart, cuBLAS, cuBLASLt, cuDNN, NCCL: hundreds of MB,
# which the machine has) and the C/C++ runtime, the `gpu` ctest entries that run
# gpu_tests (their gtest filters and timeouts), and a manifest. check.sh --prebuilt FILE
# unpacks and runs it. About 23 MB as .tar.xz: it travels with the working tree (64 MiB).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/gpu/pack_prebuilt.sh [--build DIR] [--out FILE]

  --build DIR   a CUDA build (make build) holding bin/gpu_tests and bin/gpu_bench
                (default: build in the repository)
  --out FILE    the bundle, a .tar.xz (default .gpu-prebuilt/ringtrain-gpu.tar.xz in the
                repository; .gitignore ignores .gpu-prebuilt/, so the device tool's
                `carry` takes it)

Then, on the GPU machine: benchmarks/gpu/check.sh --prebuilt FILE (see its --help).
XZ_OPT sets the compression (default -6; -0 is fast and about twice the size).
USAGE
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build"
out="$root/.gpu-prebuilt/ringtrain-gpu.tar.xz"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build|--out)
      [[ $# -ge 2 ]] || { echo "pack_prebuilt.sh: $1 needs a value" >&2; exit 1; }
      if [[ $1 == --build ]]; then build="$2"; else out="$2"; fi
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pack_prebuilt.sh: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[[ -d $build ]] || { echo "pack_prebuilt.sh: --build '$build' is not a directory" >&2; exit 1; }
build="$(cd "$build" && pwd)"
for prog in gpu_tests gpu_bench; do
  if [[ ! -x $build/bin/$prog ]]; then
    echo "pack_prebuilt.sh: $build/bin/$prog is missing; build the CUDA configuration first" \
      "(make build) or name its directory with --build" >&2
    exit 1
  fi
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/bin/gpu_tests" "$build/bin/gpu_bench" "$stage/bin/"

# The libraries the loader resolves here, less the ones the GPU machine has: the CUDA
# libraries (its driver's and NVIDIA's pip packages') and the C/C++ runtime (newer there).
skip='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'
cuda_needed=()
while read -r name path; do
  if [[ $name =~ $skip ]]; then
    [[ $name =~ ^lib(cu|nccl|nvrtc) ]] && cuda_needed+=("$name")
    continue
  fi
  [[ $path == /* ]] || { echo "pack_prebuilt.sh: $name is not found here (ldd: $path)" >&2; exit 1; }
  cp -L "$path" "$stage/lib/$name"
done < <(ldd "$build/bin/gpu_tests" "$build/bin/gpu_bench" | awk '$2 == "=>" {print $1, $3}' |
  sort -u)

# The gpu ctest entries whose program is gpu_tests: name, timeout, arguments (tab-separated).
ctest --test-dir "$build" -L gpu --show-only=json-v1 >"$stage/ctest.json"
python3 - "$stage/ctest.json" "$build/bin/gpu_tests" >"$stage/tests.tsv" <<'PY'
import json, sys
tests, prog = json.load(open(sys.argv[1]))["tests"], sys.argv[2]
for t in tests:
    cmd = t.get("command", [])
    if not cmd or cmd[0] != prog:
        continue
    p = {q["name"]: q["value"] for q in t.get("properties", [])}
    print("\t".join([t["name"], str(int(p.get("TIMEOUT", 120)))] + cmd[1:]))
PY
rm "$stage/ctest.json"
[[ -s $stage/tests.tsv ]] || { echo "pack_prebuilt.sh: no gpu ctest entry runs gpu_tests" >&2; exit 1; }

glibc="$(objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' |
  sort -t. -k2 -n -u | tail -n 1)"
hdr() { sed -n "s/^#define $2 \([0-9]*\).*/\1/p" "$1" 2>/dev/null | head -n 1; }
cuda_inc="$(dirname "$(dirname "$(command -v nvcc)")")/include"
{
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(
    git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  echo "nvcc: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "cudnn headers: $(hdr "$cuda_inc/cudnn_version.h" CUDNN_MAJOR).$(hdr "$cuda_inc/cudnn_version.h" CUDNN_MINOR)"
  echo "nccl headers: $(hdr "$cuda_inc/nccl.h" NCCL_MAJOR).$(hdr "$cuda_inc/nccl.h" NCCL_MINOR)"
  echo "needs glibc: ${glibc#GLIBC_}"
  echo "cuda libraries needed from the machine: ${cuda_needed[*]}"
  echo "tests: $(cut -f1 "$stage/tests.tsv" | tr '\n' ' ')"
} >"$stage/manifest.txt"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out.tmp" bin lib tests.tsv manifest.txt
mv "$out.tmp" "$out"
cat "$stage/manifest.txt"
echo "wrote $out ($(du -h "$out" | cut -f1)): carry its folder and run" \
  "benchmarks/gpu/check.sh --prebuilt ${out#"$root"/}"
