#!/usr/bin/env bash
# The convolutional models end to end: --model cnn learns (test accuracy after a short run,
# and `eval` of its checkpoint prints the same accuracy), a resumed cnn run (dropout) and a
# resumed resnet run (BatchNorm running averages in /buffers) are bitwise identical to
# uninterrupted ones (h5diff), `eval` reads the running averages back (the accuracy of the
# run's own validation, chance when they are reset), and bad model options end with exit 1
# and one message.
source "$(dirname "$0")/lib.sh"
dir=$(workdir cnn)

# metric FILE STEP KEY: KEY of the eval record of STEP in a metrics file, as eval prints it
# (4 decimals).
metric() {
  /usr/bin/python3 -c 'import json,sys
ev=[r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "eval" and r["step"] == int(sys.argv[2])]
assert len(ev) == 1, ev
print("%.4f" % ev[0][sys.argv[3]])' "$@"
}
# eval_result CHECKPOINT PRECISION: "LOSS ACCURACY" that `ringtrain eval` prints on 2 ranks
# (call it as an assignment, so that a failure ends the test).
eval_result() {
  local out res
  out=$(mpi 2 "$BIN" eval --checkpoint "$1" --data "$DATA/test.h5" --precision "$2" --threads 1) ||
    fail "eval $1 exited $?"
  res=$(sed -n 's/^eval .* (10000 samples, computed in '"$2"'): loss \([0-9.]*\) accuracy \([0-9.]*\)$/\1 \2/p' <<<"$out")
  [[ -n $res ]] || fail "eval $1: no 'loss L accuracy A' line for 10000 samples: $out"
  echo "$res"
}

# A short cnn run on 2 ranks in fp16 learns: accuracy on the 10,000 test images, from the
# run's validation and from `eval` of the checkpoint it wrote (the same weights: the same
# figures, and far above the 0.10 of chance).
mpi 2 "$BIN" train --data "$DATA/train.h5" --val-data "$DATA/test.h5" --model cnn \
  --precision fp16 --batch-size 32 --steps 150 --threads 1 --log-every 50 \
  --checkpoint-dir "$dir/cnn-ck" --metrics "$dir/cnn.jsonl" >"$dir/cnn.out"
acc=$(metric "$dir/cnn.jsonl" 150 accuracy)
awk -v a="$acc" 'BEGIN { exit !(a >= 0.70 && a <= 1.0) }' || fail "cnn test accuracy $acc after 150 steps"
res=$(eval_result "$dir/cnn-ck/ckpt-000000150.h5" fp16)
read -r loss eacc <<<"$res"
[[ $eacc == "$acc" && $loss == "$(metric "$dir/cnn.jsonl" 150 loss)" ]] ||
  fail "eval of the step-150 checkpoint: loss $loss accuracy $eacc; the run's validation: $(metric "$dir/cnn.jsonl" 150 loss) $acc"
pass "cnn, 2 ranks, fp16: test accuracy $acc after 150 steps, the same from eval of its checkpoint"

# Bitwise resume: dropout masks (cnn) and BatchNorm running averages (resnet).
for case in "cnn fp16" "resnet bf16"; do
  read -r model prec <<<"$case"
  common=(--data "$DATA/train.h5" --model "$model" --precision "$prec" --batch-size 16
          --threads 1 --log-every 1000 --seed 3)
  [[ $model == resnet ]] && common+=(--depth 1 --width 4)
  # The uninterrupted run also validates at its end (for the eval check below); the h5diff
  # then shows too that validation leaves the training state alone.
  mpi 2 "$BIN" train "${common[@]}" --steps 16 --checkpoint-dir "$dir/full-$model" \
    --val-data "$DATA/test.h5" --metrics "$dir/full-$model.jsonl" >/dev/null
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
# eval of the checkpoint prints the loss and accuracy of the run's own validation at step 16
# (bf16 as trained), above chance (0.10) by a margin; with the running averages reset to
# their initial 0 and 1 (h5py) the same weights fall to chance: eval reads them.
res=$(eval_result "$ck" bf16)
read -r loss acc <<<"$res"
[[ $acc == "$(metric "$dir/full-resnet.jsonl" 16 accuracy)" && $loss == "$(metric "$dir/full-resnet.jsonl" 16 loss)" ]] ||
  fail "eval of $ck: loss $loss accuracy $acc; the run's validation: $(metric "$dir/full-resnet.jsonl" 16 loss) $(metric "$dir/full-resnet.jsonl" 16 accuracy)"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.15) }' || fail "resnet accuracy $acc is not above chance (0.10)"
cp "$ck" "$dir/reset.h5"
/usr/bin/python3 - "$dir/reset.h5" <<'PY' || fail "resetting the running averages"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for name, ds in f["buffers"].items():
        ds[...] = 0.0 if name.endswith("running_mean") else 1.0
PY
res=$(eval_result "$dir/reset.h5" bf16)
read -r rloss racc <<<"$res"
[[ $racc != "$acc" && $rloss != "$loss" ]] ||
  fail "eval gives loss $rloss accuracy $racc with the running averages reset, the same as with them"
pass "resnet running averages saved in /buffers and read by eval (accuracy $acc; reset: $racc)"

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
