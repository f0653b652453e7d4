#!/usr/bin/env bash
# Installs the Debian packages that building, testing and the demo need, only when some
# are missing: idempotent, and silent when everything is already there.
# Used by the Makefile (`make demo`, `make test`); safe to run by hand.
set -euo pipefail

if [[ "${1:-}" == "--help" ]]; then
  echo "usage: tools/install-deps.sh   install missing build/test packages with apt (root or sudo)"
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
  libpng-dev libjpeg62-turbo-dev libzip-dev
  dataset-fashion-mnist
  python3-h5py
  python3-numpy python3-pil python3-torch
  python3-venv
  slurm-wlm munge numactl python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
