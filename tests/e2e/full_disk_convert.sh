#!/usr/bin/env bash
# Writers on a full file system (docs/usage.md, "Exit codes and errors"): convert idx (1
# rank, and --shards 2 on 2 ranks), convert text, convert npy, predict (.h5 and .npy) and
# export, each into a tmpfs too small for its output, must exit 2 with one message that
# names the output and says the file system is full, print nothing as written, and leave no
# file behind (no .tmp, no partial output). convert text is also swept over the sizes where
# it used to exit 0 with every token read back as 0, and where it fits it must read back
# exactly.
source "$(dirname "$0")/lib.sh"
dir=$(workdir full_disk_convert)
mnt=$dir/mnt
tmpfs_mountpoint "$mnt"

# The inputs, on the ordinary disk: Fashion-MNIST's test IDX files, a checkpoint, a corpus
# of 150,000 bytes and an .npy pair.
src=$(dpkg -L dataset-fashion-mnist | grep 't10k-images-idx3-ubyte.gz$' | xargs dirname)
mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 8 --batch-size 16 --threads 1 --steps 2 \
  --checkpoint-dir "$dir/ck" >/dev/null
ck=$dir/ck/ckpt-000000002.h5
/usr/bin/python3 - "$dir" <<'EOF'
import sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
words = [bytes(rng.integers(97, 123, size=int(n))) for n in rng.integers(2, 9, size=40000)]
open(f"{d}/corpus.txt", "wb").write(b" ".join(words)[:150000])
np.save(f"{d}/x.npy", rng.integers(0, 256, size=(2000, 1, 28, 28), dtype=np.uint8))
np.save(f"{d}/y.npy", rng.integers(0, 10, size=2000).astype(np.int64))
EOF

# refused LABEL SIZE_KIB NAMED RANKS ARGS...: on a fresh tmpfs of SIZE_KIB, `ringtrain
# ARGS` exits 2 with one error line "writing '<mnt>/<NAMED>' failed; the file system ... is
# full (ENOSPC", reports nothing as written and leaves no file.
refused() {
  local label=$1 size=$2 named=$3 n=$4
  shift 4
  mount -t tmpfs -o "size=${size}k" tmpfs "$mnt"
  local rc=0
  timeout 60 mpirun -n "$n" "$BIN" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -ne 124 ]] || fail "$label: hung"
  [[ $rc -eq 2 ]] || { cat "$dir/out" "$dir/err"; fail "$label: exit code $rc, expected 2"; }
  local count
  count=$(grep -c '^ringtrain: error:' "$dir/err" || true)
  [[ $count -eq 1 ]] || { cat "$dir/err"; fail "$label: $count error lines, expected 1"; }
  grep '^ringtrain: error:' "$dir/err" |
    contains "writing '$mnt/$named' failed; the file system holding '.*' is full (ENOSPC" ||
    { cat "$dir/err"; fail "$label: the error does not name $named and say the disk is full"; }
  ! grep -Eq '^(wrote|predicted|exported)' "$dir/out" ||
    fail "$label: reported as written: $(cat "$dir/out")"
  local left
  left=$(find "$mnt" -type f)
  [[ -z $left ]] || fail "$label: files left behind: $left"
  umount "$mnt"
  pass "$label: exit 2, one full-disk message naming $named, nothing left"
}

refused "convert idx" 8192 out/test.h5 1 convert idx \
  --images "$src/t10k-images-idx3-ubyte.gz" --labels "$src/t10k-labels-idx1-ubyte.gz" \
  --out "$mnt/out/test.h5"
refused "convert idx --shards 2, 2 ranks" 8192 'out/test-0000[01]-of-00002.h5' 2 convert idx \
  --images "$src/t10k-images-idx3-ubyte.gz" --labels "$src/t10k-labels-idx1-ubyte.gz" \
  --out "$mnt/out/test.h5" --shards 2
refused "convert npy, 2 ranks" 1024 out/x.h5 2 convert npy --images "$dir/x.npy" \
  --labels "$dir/y.npy" --out "$mnt/out/x.h5"
refused "predict .h5, 2 ranks" 256 p.h5 2 predict --checkpoint "$ck" --data "$DATA/test.h5" \
  --out "$mnt/p.h5"
refused "predict .npy, 2 ranks" 256 p.npy 2 predict --checkpoint "$ck" \
  --data "$DATA/test.h5" --out "$mnt/p.npy"
refused "export" 8 m.onnx 2 export --checkpoint "$ck" --out "$mnt/m.onnx"
for size in 64 80 96 100; do
  refused "convert text into $size KiB" "$size" 't.h5' 1 convert text \
    --input "$dir/corpus.txt" --out "$mnt/t.h5"
done
refused "convert text, 2 ranks" 96 't.h5' 2 convert text --input "$dir/corpus.txt" \
  --out "$mnt/t.h5"

# Where it fits, every token reads back.
mount -t tmpfs -o size=1m tmpfs "$mnt"
mpi 1 "$BIN" convert text --input "$dir/corpus.txt" --out "$mnt/t.h5" --val-fraction 0 >/dev/null
/usr/bin/python3 - "$mnt/t.h5" "$dir/corpus.txt" <<'EOF' || fail "convert text into 1 MiB: the tokens differ"
import sys
import h5py
import numpy as np
tokens = h5py.File(sys.argv[1], "r")["tokens"][:]
text = np.frombuffer(open(sys.argv[2], "rb").read(), dtype=np.uint8)
sys.exit(0 if np.array_equal(tokens, text) else 1)
EOF
umount "$mnt"
pass "convert text into 1 MiB: every token reads back"
