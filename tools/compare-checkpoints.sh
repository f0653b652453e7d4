#!/usr/bin/env bash
# Trains the same short runs with two ringtrain binaries and compares their checkpoints
# value for value: for a restructuring that must not change what training computes. Runs
# --steps 50 of each model in fp32 and bf16, on 1 and 2 ranks, with --zero 0 and 1, and
# compares every dataset (/params, /optimizer, /buffers, ...) and every attribute except the
# ones that name the build (ringtrain_version, git_commit, versions) bit for bit (h5py).
# --ignore-attr NAME (repeatable) also skips an attribute that one version writes and the other
# does not (e.g. meta_checksum, new in a later version).
# Usage: tools/compare-checkpoints.sh [--models "mlp cnn"] [--ignore-attr NAME]... REF_BIN NEW_BIN DATA.h5 [WORKDIR]
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
models="mlp cnn"
ignore=""
while [[ $# -gt 0 ]]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --models) models=$2; shift 2 ;;
    --ignore-attr) ignore="$ignore $2"; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 3 ]] || { usage >&2; exit 1; }
ref=$1 new=$2 data=$3 work=${4:-$(mktemp -d /tmp/compare-ckpt.XXXXXX)}
for f in "$ref" "$new"; do [[ -x $f ]] || { echo "not an executable: $f" >&2; exit 1; }; done
[[ -f $data ]] || { echo "not a file: $data" >&2; exit 1; }
PY=${PYTHON:-/usr/bin/python3}  # Debian's, with python3-h5py and python3-numpy
"$PY" -c 'import h5py, numpy' || { echo "needs $PY with h5py and numpy (PYTHON=...)" >&2; exit 1; }

export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset "${!OPENBLAS_@}" "${!RINGTRAIN_@}"
fails=0 runs=0
for model in $models; do
  for precision in fp32 bf16; do
    for ranks in 1 2; do
      for zero in 0 1; do
        name=$model-$precision-np$ranks-zero$zero
        for which in ref new; do
          bin=$ref
          [[ $which == new ]] && bin=$new
          dir=$work/$which/$name
          rm -rf "$dir" && mkdir -p "$dir"
          timeout 900 mpirun --oversubscribe -n "$ranks" "$bin" train --data "$data" \
            --model "$model" --precision "$precision" --zero "$zero" --steps 50 \
            --global-batch-size 32 --optimizer adamw --lr 1e-3 --threads 1 --seed 7 \
            --checkpoint-dir "$dir" --checkpoint-every 50 --log-every 50 >"$dir.out" 2>&1 ||
            { echo "$name: the $which run failed:"; tail -5 "$dir.out"; exit 2; }
        done
        runs=$((runs + 1))
        if IGNORE=$ignore "$PY" - "$work/ref/$name/ckpt-000000050.h5" "$work/new/$name/ckpt-000000050.h5" <<'PY'; then
import os, sys, h5py, numpy as np
skip = {"ringtrain_version", "git_commit", "versions"} | set(os.environ["IGNORE"].split())
a, b = (h5py.File(p, "r") for p in sys.argv[1:])
bad = []
def attrs(x, y, where):
    if (set(x.attrs) ^ set(y.attrs)) - skip:
        bad.append(f"{where}: attributes {sorted((set(x.attrs) ^ set(y.attrs)) - skip)}")
    for k in x.attrs:
        if k in skip or k not in y.attrs:
            continue
        u, v = np.asarray(x.attrs[k]), np.asarray(y.attrs[k])
        if u.shape != v.shape or u.tobytes() != v.tobytes():
            bad.append(f"{where}@{k}")
def walk(x, y, where):
    attrs(x, y, where or "/")
    if set(x) != set(y):
        bad.append(f"{where}: members {sorted(set(x) ^ set(y))}")
    for k in x:
        if k not in y:
            continue
        if isinstance(x[k], h5py.Group):
            walk(x[k], y[k], f"{where}/{k}")
        else:
            u, v = x[k][()], y[k][()]
            if u.dtype != v.dtype or u.shape != v.shape or u.tobytes() != v.tobytes():
                bad.append(f"{where}/{k}")
            attrs(x[k], y[k], f"{where}/{k}")
walk(a, b, "")
if bad:
    print("  differ:", ", ".join(bad[:8]), "..." if len(bad) > 8 else "")
    sys.exit(1)
PY
          echo "$name: bitwise equal"
        else
          echo "$name: DIFFERENT"
          fails=$((fails + 1))
        fi
      done
    done
  done
done
echo "$((runs - fails)) of $runs configurations bitwise equal ($work)"
[[ $fails -eq 0 ]]
