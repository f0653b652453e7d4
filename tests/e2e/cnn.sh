#!/usr/bin/env bash
# The convolutional models end to end: --model cnn learns (test accuracy after a short run),
# a resumed cnn run (dropout) and a resumed resnet run (BatchNorm running averages in
# /buffers) are bitwise identical to uninterrupted ones (h5diff), `eval` reads the running
# averages back, and bad model options end with exit 1 and one message.
source "$(dirname "$0")/lib.sh"
dir=$(workdir cnn)

# A short cnn run on 2 ranks in fp16 learns: accuracy on the 10,000 test images.
mpi 2 "$BIN" train --data "$DATA/train.h5" --val-data "$DATA/test.h5" --model cnn \
  --precision fp16 --batch-size 32 --steps 150 --threads 1 --log-every 50 \
  --metrics "$dir/cnn.jsonl" >"$dir/cnn.out"
acc=$(python3 -c 'import json,sys
ev=[json.loads(l) for l in open(sys.argv[1]) if "\"eval\"" in l]
print(ev[-1]["accuracy"])' "$dir/cnn.jsonl")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.70 && a <= 1.0) }' || fail "cnn test accuracy $acc after 150 steps"
pass "cnn, 2 ranks, fp16: test accuracy $acc after 150 steps"

# Bitwise resume: dropout masks (cnn) and BatchNorm running averages (resnet).
for case in "cnn fp16" "resnet bf16"; do
  read -r model prec <<<"$case"
  common=(--data "$DATA/train.h5" --model "$model" --precision "$prec" --batch-size 16
          --threads 1 --log-every 1000 --seed 3)
  [[ $model == resnet ]] && common+=(--depth 1 --width 4)
  mpi 2 "$BIN" train "${common[@]}" --steps 16 --checkpoint-dir "$dir/full-$model" >/dev/null
  mpi 2 "$BIN" train "${common[@]}" --steps 7 --checkpoint-dir "$dir/split-$model" >/dev/null
  out=$(mpi 2 "$BIN" train "${common[@]}" --steps 16 --checkpoint-dir "$dir/split-$model")
  contains "resumed from .*ckpt-000000007.h5 at step 7" <<<"$out" || fail "$model: no resume"
  a=$dir/full-$model/ckpt-000000016.h5
  b=$dir/split-$model/ckpt-000000016.h5
  groups=(/params /optimizer)
  [[ $model == resnet ]] && groups+=(/buffers)
  for g in "${groups[@]}"; do
    h5diff "$a" "$b" "$g" "$g" || fail "$model $prec: $g differs after resume"
  done
  pass "$model, $prec: resumed run bitwise identical (${groups[*]})"
done

# The running averages are in the checkpoint, moved from their initial 0 and 1.
ck=$dir/full-resnet/ckpt-000000016.h5
/usr/bin/python3 - "$ck" <<'PY' || fail "running averages in /buffers"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    m = f["buffers/stem.bn.running_mean"][()]
    v = f["buffers/stage2.block1.down.bn.running_var"][()]
    assert m.dtype == np.float32 and m.shape == (4,), (m.dtype, m.shape)
    assert np.abs(m).max() > 0 and np.abs(v - 1).max() > 0, (m, v)
    model = f.attrs["model"]
    model = model.decode() if isinstance(model, bytes) else model
    assert 'name: "resnet"' in model and "node {" in model, model
PY
out=$("$BIN" eval --checkpoint "$ck" --data "$DATA/test.h5")
contains "accuracy" <<<"$out" || fail "eval of a resnet checkpoint: $out"
pass "resnet running averages saved in /buffers and read by eval"

# A checkpoint of another model configuration is an error on resume, not a silent restart.
set +e
err=$(mpi 1 "$BIN" train --data "$DATA/train.h5" --model resnet --depth 1 --width 8 \
  --precision bf16 --batch-size 16 --steps 20 --threads 1 --checkpoint-dir "$dir/full-resnet" 2>&1)
code=$?
set -e
[[ $code -eq 1 ]] || fail "resume with another --width exited $code: $err"
contains "holds another model.*node 'stem.conv'" <<<"$err" ||
  fail "the message does not name the first differing node: $err"
pass "another --width is refused on resume"

# Bad model options: exit 1, one message naming the option.
check_bad() {
  local want=$1
  shift
  set +e
  err=$("$BIN" train --data "$DATA/train.h5" --steps 1 --threads 1 "$@" 2>&1 >/dev/null)
  code=$?
  set -e
  [[ $code -eq 1 ]] || fail "$* exited $code"
  contains "$want" <<<"$err" || fail "$*: message '$err' does not mention $want"
  [[ $(grep -c . <<<"$err") -eq 1 ]] || fail "$*: more than one line: $err"
}
check_bad "--dropout" --model cnn --dropout 1.5
check_bad "--depth" --model resnet --depth 0
check_bad "--activation" --model resnet --activation swish
check_bad "--layer-precision" --model cnn --layer-precision conv7=fp32
check_bad "--layer-precision" --model cnn --layer-precision conv1=fp8
check_bad "--model" --model vgg
check_bad "--hidden: model 'cnn'" --model cnn --hidden 64
check_bad "--depth: model 'mlp'" --model mlp --depth 2
set +e
err=$(RINGTRAIN_CONV=winograd "$BIN" train --data "$DATA/train.h5" --model cnn --steps 1 \
  --threads 1 2>&1 >/dev/null)
code=$?
set -e
[[ $code -eq 1 && $(grep -c . <<<"$err") -eq 1 ]] || fail "RINGTRAIN_CONV=winograd: exit $code, '$err'"
contains "RINGTRAIN_CONV" <<<"$err" || fail "the message does not name RINGTRAIN_CONV: $err"
pass "bad model options and a bad RINGTRAIN_CONV exit 1 with one message"
