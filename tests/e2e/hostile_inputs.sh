#!/usr/bin/env bash
# Hostile inputs on 2 ranks end with exit 1 and one "ringtrain: error:" line naming the
# file, the place or the limit, in seconds: model-file expressions that overflow 64 bits
# (train, model show, and eval and export of a checkpoint whose model text was edited),
# expressions nested 200,000 deep, pow with a huge exponent, 3,000 nested repeats, 10^10
# repeat iterations, a FIFO or /dev/zero as --model or convert text --input, and a PNG
# whose header declares 60000x60000 pixels (on rank 1). When one rank fails with exit 2
# and another with exit 1 in the same phase, the message shown is the one of exit 2.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir hostile-inputs)
cd "$dir" || exit 1

# run WANT_RC WANT_SUBSTRING MPIRUN-ARGS...: under `timeout 60`, exit WANT_RC and exactly one
# error line, which contains the substring.
run() {
  local want_rc=$1 want=$2
  shift 2
  local rc=0
  timeout 60 mpirun "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -ne 124 ]] || { cat "$dir/err"; fail "'$*' hung (timeout 60 s)"; }
  [[ $rc -eq $want_rc ]] || { cat "$dir/err"; fail "'$*' exited $rc, expected $want_rc"; }
  local count
  count=$(grep -c '^ringtrain: error:' "$dir/err" || true)
  [[ $count -eq 1 ]] || { cat "$dir/err"; fail "'$*' printed $count error messages, expected 1"; }
  grep '^ringtrain: error:' "$dir/err" | grep -F -- "$want" >/dev/null ||
    { cat "$dir/err"; fail "'$*': the message does not name '$want'"; }
  pass "$(grep '^ringtrain: error:' "$dir/err" | cut -c1-200)"
}

train=(--data "$DATA/train.h5" --steps 2 --batch-size 16 --threads 1)

# model EXPR: an MLP whose hidden width is EXPR.
model() {
  cat <<EOF
node { name: "flat" flatten {} }
node { name: "fc1" linear { activation: RELU }
  set { field: "out_features" expr: "$1" } }
node { name: "out" linear {} set { field: "out_features" expr: "classes" } }
EOF
}

# ---- expressions: train (the model file on rank 1 only) and model show ---------------
model "8" >good.pbtxt
model "(-9223372036854775807 - 1) / -1" >div.pbtxt
model "pow(2, 64) + 16" >pow.pbtxt
model "9223372036854775807 * 4 + 20" >mul.pbtxt
model "$(printf '(%.0s' $(seq 200000))8$(printf ')%.0s' $(seq 200000))" >parens.pbtxt
model "$(printf -- '-%.0s' $(seq 200000))8" >minus.pbtxt
for m in div pow mul; do
  run 1 "$m.pbtxt:3:3: node 'fc1': expression '" -n 1 "$BIN" train "${train[@]}" \
    --model good.pbtxt : -n 1 "$BIN" train "${train[@]}" --model "$m.pbtxt"
  contains "integer overflow" <"$dir/err" || fail "$m.pbtxt: $(cat "$dir/err")"
  run 1 "integer overflow" -n 2 "$BIN" model show "$m.pbtxt" --input 1,28,28
done
for m in parens minus; do
  run 1 "characters)': nested deeper than 100 levels" -n 1 "$BIN" train "${train[@]}" --model good.pbtxt \
    : -n 1 "$BIN" train "${train[@]}" --model "$m.pbtxt"
done
# pow by squaring: 9e18 as exponent is 63 steps, not 9e18.
model "pow(1, 9000000000000000000) * 8" >one.pbtxt
out=$(timeout 60 mpirun -n 2 "$BIN" model show one.pbtxt --input 1,28,28) ||
  fail "model show one.pbtxt exited $?"
contains "total: 3 nodes, 6370 parameters" <<<"$out" || fail "model show one.pbtxt: $out"
pass "pow(1, 9000000000000000000) * 8 is 8"

# ---- the model text of a checkpoint is parsed again by eval and export --------------
timeout 60 mpirun -n 2 "$BIN" train "${train[@]}" --model good.pbtxt --checkpoint-dir ck \
  >/dev/null || fail "training good.pbtxt"
ck=$dir/ck/ckpt-000000002.h5
cp "$ck" hostile.h5
"$PY" - hostile.h5 <<'EOF' || fail "editing the checkpoint's model text"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    m = f.attrs["model"]
    m = m.decode() if isinstance(m, bytes) else m
    assert 'expr: "8"' in m, m
    f.attrs["model"] = np.bytes_(m.replace('expr: "8"', 'expr: "(-9223372036854775807 - 1) / -1"'))
    # Without its metadata checksum, as a checkpoint of an older version: the model text,
    # not the checksum, is what must be refused here.
    del f.attrs["meta_checksum"]
EOF
run 1 "integer overflow" -n 2 "$BIN" eval --checkpoint hostile.h5 --data "$DATA/test.h5"
run 1 "integer overflow" -n 2 "$BIN" export --checkpoint hostile.h5 --out x.onnx

# ---- nesting and expansion ------------------------------------------------------------
nest() {  # nest DEPTH COUNT: DEPTH repeats of COUNT iterations around one flatten
  local k
  for ((k = 0; k < $1; k++)); do
    echo "node { name: \"r$k\" repeat { count: $2 index: \"i$k\" prefix: \"l${k}_{i$k}.\""
  done
  echo 'node { name: "f" flatten {} }'
  for ((k = 0; k < $1; k++)); do echo "} }"; done
  echo 'node { name: "out" linear {} set { field: "out_features" expr: "classes" } }'
}
nest 3000 1 >deep.pbtxt
nest 2 100000 >wide.pbtxt
run 1 "deep.pbtxt:" -n 1 "$BIN" train "${train[@]}" --model good.pbtxt \
  : -n 1 "$BIN" train "${train[@]}" --model deep.pbtxt
contains "recursion limit of 100" <"$dir/err" || fail "deep.pbtxt: $(cat "$dir/err")"
run 1 "nodes after expansion (the limit" -n 2 "$BIN" model show wide.pbtxt --input 1,28,28

# ---- files that are not regular files --------------------------------------------------
mkfifo fifo
run 1 "--model '$dir/fifo' is not a regular file" -n 2 "$BIN" train "${train[@]}" \
  --model "$dir/fifo"
run 1 "--model '/dev/zero' is not a regular file" -n 2 "$BIN" model show /dev/zero
for f in "$dir/fifo" /dev/zero; do
  run 1 "--input '$f' is not a regular file" -n 2 "$BIN" convert text --input "$f" --out t.h5
done
[[ -z $(find . -name 't*.h5*') ]] || fail "a refused convert text left files: $(find . -name 't*.h5*')"

# ---- an image whose header declares 60000 x 60000 pixels, decoded by rank 1 ----------
mkdir -p img/a img/b
"$PY" - <<'EOF'
import struct, zlib
def png(h, w, rows):
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
open("img/a/0.png", "wb").write(png(4, 4, b"\0\1\2\3\4" * 4))
open("img/b/1.png", "wb").write(png(60000, 60000, b"\0" * 64))
EOF
run 1 "image 'img/b/1.png' declares 60000x60000 (HxW) pixels; at most 268435456" \
  -n 2 "$BIN" convert images --root img --out i.h5 --grayscale

# ---- exit 2 on rank 1 and exit 1 on rank 0 in one phase: rank 1's message -------------
run 2 "injected test failure at 'export' on rank 1" \
  -n 1 "$BIN" export --checkpoint "$dir/missing.h5" --out y.onnx \
  : -n 1 -x RINGTRAIN_TEST_FAIL=1:export "$BIN" export --checkpoint "$ck" --out y.onnx
[[ ! -e y.onnx ]] || fail "a failed export left y.onnx"
