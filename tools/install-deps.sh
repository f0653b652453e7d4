#!/usr/bin/env bash
# Installs the Debian packages that building, testing and the demo need, only when some
# are missing: idempotent, and silent when everything is already there.
# Used by the Makefile (`make demo`, `make test`); safe to run by hand. Where cuDNN is
# installed it also fetches cudnn-frontend (header-only, MIT) for the CUDA build's fused
# attention, from PyPI's nvidia-cudnn-frontend wheel, into RINGTRAIN_DEPS_DIR
# (/opt/ringtrain-deps); CMake finds it there (RINGTRAIN_CUDNN_FRONTEND_DIR).
set -euo pipefail

if [[ "${1:-}" == "--help" ]]; then
  echo "usage: tools/install-deps.sh   install missing build/test packages with apt (root or sudo),"
  echo "       and cudnn-frontend's headers into \${RINGTRAIN_DEPS_DIR:-/opt/ringtrain-deps} where cuDNN is"
  exit 0
fi

packages=(
  build-essential cmake pkg-config python3 procps
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev
  libopenblas-dev
  libdnnl-dev
  libgtest-dev
  libprotobuf-dev protobuf-compiler
  libonnx-dev
  zlib1g-dev
  nlohmann-json3-dev
  libsentencepiece-dev libssl-dev
  libpng-dev libjpeg62-turbo-dev libzip-dev
  dataset-fashion-mnist
  python3-h5py
  python3-numpy python3-pil python3-torch
  python3-venv python3-pip python3-dev
  slurm-wlm munge numactl python3-matplotlib
)

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cudnn-frontend: only the wheel's include/ and licences are kept (the wheel's Python
# module is not used). Skipped where no cudnn.h is found: the CUDA backend is not built there.
cudnn_frontend_version=1.32.0
cfe_dir="${RINGTRAIN_DEPS_DIR:-/opt/ringtrain-deps}/cudnn-frontend-$cudnn_frontend_version"
have_cudnn=0
for d in "${CUDNN_ROOT:-/nonexistent}/include" /usr/local/cuda/include /usr/include \
  /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu; do
  [[ -f "$d/cudnn.h" ]] && have_cudnn=1
done
if [[ $have_cudnn -eq 1 && ! -f "$cfe_dir/include/cudnn_frontend.h" ]]; then
  echo "install-deps: fetching nvidia-cudnn-frontend $cudnn_frontend_version into $cfe_dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # Optional: without it the CUDA build runs its own attention kernel (CMake says so), so a
  # PyPI that cannot be reached is reported and the install goes on.
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
    --python-version 3.11 --platform "manylinux_2_28_$(uname -m)" -d "$tmp" \
    "nvidia-cudnn-frontend==$cudnn_frontend_version"; then
    echo "install-deps: could not download nvidia-cudnn-frontend $cudnn_frontend_version from PyPI;" \
      "the CUDA build will use ringtrain's own attention kernel (docs/gpu.md)" >&2
  else
    $sudo mkdir -p "$cfe_dir"
    $sudo python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$cfe_dir" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    keep = [n for n in z.namelist() if n.startswith("include/") or "/licenses/" in n]
    if not any(n == "include/cudnn_frontend.h" for n in keep):
        sys.exit(f"install-deps: {wheel} has no include/cudnn_frontend.h")
    z.extractall(dest, keep)
PY
  fi
fi
