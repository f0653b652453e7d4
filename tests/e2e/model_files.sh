#!/usr/bin/env bash
# Model files end to end: malformed files (each exit 1 with FILE:LINE:COLUMN and the node),
# `model show` of the shipped models (parameter totals computed here by hand), a user model
# written only as a file trains on 2 ranks, and a checkpoint with the old model JSON still
# evaluates and resumes.
source "$(dirname "$0")/lib.sh"
dir=$(workdir model_files)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unset RINGTRAIN_GEMM RINGTRAIN_CONV

# bad NAME WANT_LOCATION WANT_NODE [WANT_MORE]: `model show` of $dir/NAME.pbtxt on 2 ranks
# exits 1 with one message holding the location, the node (unless empty) and WANT_MORE.
bad() {
  local name=$1 loc=$2 node=$3 more=${4:-}
  local rc=0
  (cd "$dir" && mpi 2 "$BIN" model show "$name.pbtxt" --input 1,28,28) >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -eq 1 ]] || { cat "$dir/err"; fail "$name: exited $rc, expected 1"; }
  local msg
  msg=$(grep '^ringtrain: error:' "$dir/err" || true)
  [[ $(grep -c . <<<"$msg") -eq 1 ]] || { cat "$dir/err"; fail "$name: expected one error line"; }
  grep -qF -- "ringtrain: error: $loc" <<<"$msg" || fail "$name: '$msg' does not start at $loc"
  [[ -z $node ]] || grep -qF -- "$node" <<<"$msg" || fail "$name: '$msg' does not name $node"
  [[ -z $more ]] || grep -qF -- "$more" <<<"$msg" || fail "$name: '$msg' does not say '$more'"
  pass "$name: $msg"
}

# b01: a syntax error (unclosed brace)
cat >"$dir/b01.pbtxt" <<'EOF'
node { name: "fc" linear { out_features: 10 }
EOF
bad b01 "b01.pbtxt:2:1:" ""

# b02: an unknown field
cat >"$dir/b02.pbtxt" <<'EOF'
node {
  name: "fc"
  colour: 3
  linear { out_features: 10 }
}
EOF
bad b02 "b02.pbtxt:3:9:" "" 'no field named "colour"'

# b03: an unknown op
cat >"$dir/b03.pbtxt" <<'EOF'
node { name: "flat" flatten {} }
node {
  name: "magic"
  custom { type: "frobnicate" }
}
EOF
bad b03 "b03.pbtxt:2:1:" "node 'magic'"

# b04: a missing input
cat >"$dir/b04.pbtxt" <<'EOF'
node { name: "flat" flatten {} }
node {
  name: "fc"
  input: "flatt"
  linear { out_features: 10 }
}
EOF
bad b04 "b04.pbtxt:4:3:" "node 'fc'"

# b05: a cycle
cat >"$dir/b05.pbtxt" <<'EOF'
node { name: "a" input: "b" linear { out_features: 10 } }
node { name: "b" input: "a" linear { out_features: 10 } }
node { name: "out" input: "b" linear { out_features: 10 } }
EOF
bad b05 "b05.pbtxt:1:18:" "node 'a'" 'cycle'

# b06: a shape mismatch (both shapes)
cat >"$dir/b06.pbtxt" <<'EOF'
node { name: "conv" conv { out_channels: 4 kernel: 3 } }
node { name: "flat" input: "input" flatten {} }
node {
  name: "sum"
  add {}
  input: "conv"
  input: "flat"
}
node { name: "fc" linear { out_features: 10 } }
EOF
bad b06 "b06.pbtxt:3:1:" "node 'sum'" '[4, 26, 26] but input 2 is [784]'

# b07: out_features 0
cat >"$dir/b07.pbtxt" <<'EOF'
node { name: "flat" flatten {} }
node { name: "fc" linear { out_features: 0 } }
EOF
bad b07 "b07.pbtxt:2:1:" "node 'fc'"

# b08: a dropout probability out of range
cat >"$dir/b08.pbtxt" <<'EOF'
node { name: "flat" flatten {} }
node { name: "drop" dropout { p: 1.5 } }
node { name: "fc" linear { out_features: 10 } }
EOF
bad b08 "b08.pbtxt:2:1:" "node 'drop'"

# b09: a convolution of flat samples
cat >"$dir/b09.pbtxt" <<'EOF'
node { name: "flat" flatten {} }
node { name: "conv" conv { out_channels: 8 kernel: 3 } }
node { name: "fc" linear { out_features: 10 } }
EOF
bad b09 "b09.pbtxt:2:1:" "node 'conv'"

# b10: a kernel larger than the image
cat >"$dir/b10.pbtxt" <<'EOF'
node { name: "conv" conv { out_channels: 8 kernel: 40 } }
node { name: "fc" linear { out_features: 10 } }
EOF
bad b10 "b10.pbtxt:1:1:" "node 'conv'"

# b11: a duplicate node name
cat >"$dir/b11.pbtxt" <<'EOF'
node { name: "fc" linear { out_features: 10 } }
node { name: "fc" linear { out_features: 10 } }
EOF
bad b11 "b11.pbtxt:2:8:" "node 'fc'"

# b12: set of an unknown field
cat >"$dir/b12.pbtxt" <<'EOF'
node {
  name: "fc"
  linear {}
  set { field: "out_feature" expr: "classes" }
}
EOF
bad b12 "b12.pbtxt:4:3:" "node 'fc'"

# b13: an unknown var in an expression
cat >"$dir/b13.pbtxt" <<'EOF'
var { name: "width" int_value: 8 }
node {
  name: "fc"
  linear {}
  set { field: "out_features" expr: "widht * 2" }
}
EOF
bad b13 "b13.pbtxt:5:3:" "node 'fc'"

# b14: an output that is not [classes]
cat >"$dir/b14.pbtxt" <<'EOF'
node { name: "fc1" linear { out_features: 32 activation: RELU } }
node { name: "fc2" linear { out_features: 7 } }
EOF
bad b14 "b14.pbtxt:2:1:" "node 'fc2'"

# b15: a var default outside its range
cat >"$dir/b15.pbtxt" <<'EOF'
var {
  name: "width"
  int_value: 0
  min: 1
}
node { name: "fc" linear { out_features: 10 } }
EOF
bad b15 "b15.pbtxt:1:1:" "var 'width'"

# b16: a node whose output is unused
cat >"$dir/b16.pbtxt" <<'EOF'
node { name: "side" linear { out_features: 5 } }
node { name: "fc" input: "input" linear { out_features: 10 } }
EOF
bad b16 "b16.pbtxt:1:1:" "node 'side'"

# b17: an unknown precision
cat >"$dir/b17.pbtxt" <<'EOF'
node {
  name: "fc"
  precision: "fp8"
  linear { out_features: 10 }
}
EOF
bad b17 "b17.pbtxt:3:3:" "node 'fc'"

# b18: sharing a parameter no earlier node has
cat >"$dir/b18.pbtxt" <<'EOF'
node { name: "fc1" linear { out_features: 10 } }
node {
  name: "fc2"
  linear { out_features: 10 }
  share { param: "weight" from: "fc9.weight" }
}
EOF
bad b18 "b18.pbtxt:5:27:" "node 'fc2'"

# b19: init of a parameter the node lacks
cat >"$dir/b19.pbtxt" <<'EOF'
node {
  name: "fc"
  linear { out_features: 10 }
  init { param: "gamma" kind: ZEROS }
}
EOF
bad b19 "b19.pbtxt:4:10:" "node 'fc'"

# b20: an unknown format_version
cat >"$dir/b20.pbtxt" <<'EOF'
format_version: 2
node { name: "fc" linear { out_features: 10 } }
EOF
bad b20 "b20.pbtxt:1:1:" "" 'format_version 2'

# b21: repeat over a var that is not a list
cat >"$dir/b21.pbtxt" <<'EOF'
var { name: "depth" int_value: 2 }
node {
  name: "blocks"
  repeat {
    over: "depth"
    node { name: "fc{i}" linear { out_features: 10 } }
  }
}
EOF
bad b21 "b21.pbtxt:5:5:" "node 'blocks'"

# b22: sharing parameters of different shapes
cat >"$dir/b22.pbtxt" <<'EOF'
node { name: "fc1" linear { out_features: 10 } }
node { name: "fc2" linear { out_features: 10 } share { param: "weight" from: "fc1.weight" } }
EOF
bad b22 "b22.pbtxt:2:48:" "node 'fc2'" "has shape [10, 10] but 'fc1.weight' has [10, 784]"

# The shipped models: parameter totals computed here from the layer shapes.
show() { mpi 2 "$BIN" model show "$@"; }
want_total() {  # want_total N ARGS...: `model show ARGS` reports N parameters
  local n=$1
  shift
  local out
  out=$(show "$@")
  contains "total: .* $n parameters" <<<"$out" || fail "model show $*: want $n parameters: $out"
  pass "model show $*: $n parameters"
}
want_total $((784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10)) mlp --input 1,28,28
want_total $((784 * 64 + 64 + 64 * 10 + 10)) mlp --input 784 --hidden 64
want_total $((9 * 32 + 32 + 32 * 9 * 64 + 64 + 9216 * 128 + 128 + 128 * 10 + 10)) cnn --input 1,28,28
# resnet width 8, depth 1, 3 input channels: convs without bias, BatchNorm 2 per channel.
rn=$((3 * 9 * 8 + 2 * 8))                                  # stem
rn=$((rn + 2 * (8 * 9 * 8 + 2 * 8)))                       # stage 1
rn=$((rn + 8 * 9 * 16 + 16 * 9 * 16 + 4 * 16 + 8 * 16 + 2 * 16))   # stage 2 + shortcut
rn=$((rn + 16 * 9 * 32 + 32 * 9 * 32 + 4 * 32 + 16 * 32 + 2 * 32)) # stage 3 + shortcut
rn=$((rn + 32 * 10 + 10))                                  # fc
want_total "$rn" resnet --input 3,32,32 --width 8

# --layer-precision on model show: the dtype column shows each override (an exact name, a
# prefix at a dot) and --precision elsewhere; bad items are train's input errors (exit 1).
# dtypes ARGS...: "node=dtype" of every row of `model show ARGS` (the dtype column follows
# the FLOPs after two spaces; shapes hold spaces, so no field number finds it).
dtypes() { show "$@" | sed -nE 's/^([^ ]+) .*  (fp32|fp16|bf16) .*/\1=\2/p'; }
# want_dtypes WANT ARGS...: the rows of `model show ARGS` are "node=dtype ..." as WANT.
want_dtypes() {
  local want=$1 got
  shift
  got=$(dtypes "$@" | paste -sd ' ')
  [[ $got == "$want" ]] || fail "model show $*: dtypes '$got', want '$want'"
  pass "model show $*: $got"
}
want_dtypes "conv1=fp32 conv2=bf16 pool=bf16 dropout=bf16 flatten=bf16 fc1=bf16 fc2=fp16" \
  cnn --input 1,28,28 --precision bf16 --layer-precision conv1=fp32,fc2=fp16
want_dtypes "fc1=fp32 fc2=fp32" mlp --input 784 --hidden 16
got=$(dtypes resnet --input 3,32,32 --width 8 --precision fp16 --layer-precision stage2=fp32)
grep -q '^stage2\.' <<<"$got" || fail "resnet: no stage2 rows: $got"
bad_rows=$(awk -F= '($1 ~ /^stage2\./) != ($2 == "fp32")' <<<"$got")
[[ -z $bad_rows && $(grep -c fp16 <<<"$got") -gt 0 ]] ||
  fail "resnet --layer-precision stage2=fp32: want fp32 exactly on stage2.*: $got"
pass "model show resnet --layer-precision stage2=fp32: every stage2.* row fp32, the rest fp16"
# bad_lp LIST WANT: `model show cnn --layer-precision LIST` exits 1 with one error saying WANT.
bad_lp() {
  local rc=0
  mpi 2 "$BIN" model show cnn --input 1,28,28 --layer-precision "$1" >"$dir/out" 2>"$dir/err" ||
    rc=$?
  [[ $rc -eq 1 ]] || { cat "$dir/err"; fail "--layer-precision $1: exited $rc, expected 1"; }
  if [[ $(grep -c '^ringtrain: error:' "$dir/err") -ne 1 ]] || ! grep -qF -- "$2" "$dir/err"; then
    fail "--layer-precision $1: want one error saying '$2': $(cat "$dir/err")"
  fi
  pass "model show --layer-precision $1: exit 1, '$2'"
}
bad_lp conv9=fp32 "the model has no layer 'conv9'; its layers are conv1, conv2, pool"
bad_lp conv1=fp8 "--layer-precision 'conv1=fp8': 'fp8' is not fp32, fp16 or bf16"
bad_lp conv1 "--layer-precision 'conv1' is not LAYER=DTYPE (e.g. conv1=fp32)"

# A user model written only as a file (BatchNorm, a residual add, widths no built-in has)
# trains on 2 ranks in bf16 and evaluates from its checkpoint alone.
src=$(dirname "$0")/../../examples/lenet_bn.pbtxt
mpi 2 "$BIN" train --data "$DATA/train.h5" --model "$src" --precision bf16 --steps 30 \
  --batch-size 32 --threads 1 --log-every 10 --checkpoint-dir "$dir/lenet" >"$dir/lenet.out"
contains "model 'lenet_bn'" <"$dir/lenet.out" || fail "lenet_bn did not train: $(cat "$dir/lenet.out")"
out=$(mpi 2 "$BIN" eval --checkpoint "$dir/lenet/ckpt-000000030.h5" --data "$DATA/test.h5")
contains "accuracy" <<<"$out" || fail "eval of the lenet_bn checkpoint: $out"
pass "a file-only model trains on 2 ranks and evaluates from its checkpoint"

# A checkpoint from before model files (its model attribute is JSON) evaluates and resumes.
mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 32 --steps 4 --threads 1 \
  --checkpoint-dir "$dir/old" >/dev/null
/usr/bin/python3 - "$dir/old/ckpt-000000004.h5" <<'PY' || fail "rewriting the model attribute"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:  # a fixed-length string, as ringtrain writes
    f.attrs["model"] = np.bytes_('{"name":"mlp","input":[1,28,28],"hidden":[32],"classes":10}')
    del f.attrs["meta_checksum"]  # which checkpoints of that time did not have
PY
out=$(mpi 2 "$BIN" eval --checkpoint "$dir/old/ckpt-000000004.h5" --data "$DATA/test.h5")
contains "accuracy" <<<"$out" || fail "eval of an old-format checkpoint: $out"
out=$(mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 32 --steps 6 --threads 1 \
  --checkpoint-dir "$dir/old")
contains "resumed from .*ckpt-000000004.h5 at step 4" <<<"$out" || fail "no resume: $out"
/usr/bin/python3 - "$dir/old/ckpt-000000006.h5" <<'PY' || fail "the new checkpoint's model text"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    m = f.attrs["model"]
    m = m.decode() if isinstance(m, bytes) else m
    assert m.startswith("format_version: 1") and 'int_list {\n    value: [32]' in m, m
PY
pass "an old-format checkpoint (model JSON) evaluates and resumes; the next one holds model text"
