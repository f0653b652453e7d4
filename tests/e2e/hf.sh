#!/usr/bin/env bash
# Hugging Face weights in and out, against the real libraries (transformers 4.44 and
# safetensors from PyPI in a venv, lib.sh's hf_venv): a random GPT2LMHeadModel saved with
# save_pretrained (one file, sharded with model.safetensors.index.json, and its GPT2Model
# without the "transformer." prefix) -> `convert hf`
# on 1 and 2 ranks (the same tensors) -> ringtrain's fp32 logits equal transformers' within
# 1e-5 -> `export --format hf` gives back every tensor bitwise, and from_pretrained of the
# export gives the same logits. Fine-tuning: `train --init-from HF_DIR` on 2 ranks trains and
# the held-out loss falls below the HF model's; with every tensor frozen the weights stay the
# HF model's bitwise; --freeze block0. keeps block0.* bitwise while the others move;
# --init-from a checkpoint of a classifier with other classes replaces the head (named). Bad
# input at 2 ranks with rank 1 failing: a missing shard, an unknown model_type, a tensor of
# the wrong shape, a truncated safetensors header, --init-from a checkpoint of another model:
# exit 1, one message naming it, in seconds.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
LOGITS=${HF_LOGITS:?HF_LOGITS is not set (the hf_logits binary)}
dir=$(workdir hf)
cd "$dir" || exit 1
PY=$(hf_venv)

# ---- a random GPT-2 (uniform(-0.3, 0.3): logits and attention far from uniform) ---------
"$PY" - <<'EOF' || fail "making the Hugging Face model"
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                 resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
m = GPT2LMHeadModel(cfg).eval()
with torch.no_grad():
    for p in m.parameters():
        p.uniform_(-0.3, 0.3)
m.save_pretrained("hf")
m.save_pretrained("hf-sharded", max_shard_size="100KB")
m.transformer.save_pretrained("hf-base")  # GPT2Model: the names without "transformer."
EOF
ls hf-sharded/model-00002-of-*.safetensors >/dev/null || fail "save_pretrained wrote no shards"

mpi 1 "$BIN" convert hf --in hf --out ck.h5 >convert.out || fail "convert hf exited $?"
contains "converted hf -> ck.h5: gpt2 (28 tensors, 118528 parameters" <convert.out ||
  fail "convert hf: $(cat convert.out)"
mpi 2 "$BIN" convert hf --in hf-sharded --out ck2.h5 >/dev/null || fail "convert hf (2 ranks)"
h5diff ck.h5 ck2.h5 /params /params || fail "2 ranks from shards differ from 1 rank"
mpi 2 "$BIN" convert hf --in hf-base --out ck-base.h5 >/dev/null || fail "convert hf of GPT2Model"
h5diff ck.h5 ck-base.h5 /params /params || fail "GPT2Model's names read other values"
pass "convert hf: 1 rank from one file = 2 ranks from $(find hf-sharded -name "*.safetensors" | wc -l) shards"

# ---- logits: ringtrain (the converted checkpoint) vs transformers ----------------------
cat >logits.py <<'EOF'
import subprocess, sys
import numpy as np, torch
from transformers import GPT2LMHeadModel
# ringtrain's logits over its padded vocabulary: the first V are the model's.
hf_dir, ck, logits_bin = sys.argv[1:4]
m = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
v, t = m.config.vocab_size, m.config.n_positions
ids = torch.randint(0, v, (3, t), generator=torch.Generator().manual_seed(1))
np.save("tokens.npy", ids.numpy().astype(np.int64))
subprocess.run([logits_bin, ck, "tokens.npy", "rt.npy"], check=True)
rt = np.load("rt.npy")
with torch.no_grad():
    ref = m(ids).logits.numpy()
assert rt.shape[:2] == ref.shape[:2] and rt.shape[2] >= v, (rt.shape, ref.shape)
d = float(np.abs(rt[..., :v] - ref).max())
print(f"max|ringtrain - transformers| = {d:.3g} over logits of max |{np.abs(ref).max():.3g}|")
sys.exit(0 if d <= 1e-5 else 1)
EOF
"$PY" logits.py hf ck.h5 "$LOGITS" >logits.out || fail "logits: $(cat logits.out)"
pass "$(cat logits.out)"

# ---- export --format hf: bitwise round trip and from_pretrained ------------------------
mpi 2 "$BIN" export --checkpoint ck.h5 --format hf --out exported >export.out ||
  fail "export --format hf exited $?"
contains "exported ck.h5 -> exported/{config.json,model.safetensors}" <export.out ||
  fail "export: $(cat export.out)"
"$PY" - <<'EOF' || fail "round trip"
import numpy as np, torch
from safetensors.numpy import load_file
from transformers import GPT2LMHeadModel
a, b = load_file("hf/model.safetensors"), load_file("exported/model.safetensors")
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
for k in a:
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
ids = torch.from_numpy(np.load("tokens.npy"))
with torch.no_grad():
    x = GPT2LMHeadModel.from_pretrained("hf").eval()(ids).logits
    y = GPT2LMHeadModel.from_pretrained("exported").eval()(ids).logits
assert torch.equal(x, y), float((x - y).abs().max())
print(f"{len(a)} tensors bitwise; from_pretrained of the export: identical logits")
EOF
pass "export --format hf round trip"

# ---- a gpt-tiny trained here (vocabulary 256 padded to 320) out to transformers ---------
"$PY" - <<'EOF'
import os, random
random.seed(3)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(40):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(90)) + "\n")
EOF
mpi 1 "$BIN" convert text --input 'corpus/*.py' --out data/c.h5 --val-fraction 0.25 >/dev/null ||
  fail "convert text"
mpi 2 "$BIN" train --model gpt-tiny --set layers=1 --set heads=2 --set width=32 --set context=16 \
  --set padded_vocab=320 --data data/c.h5 --steps 3 --batch-size 4 --threads 1 \
  --checkpoint-dir tiny >/dev/null || fail "train gpt-tiny"
mpi 2 "$BIN" export --checkpoint tiny/ckpt-000000003.h5 --format hf --out tiny-hf >/dev/null ||
  fail "export --format hf of gpt-tiny"
"$PY" logits.py tiny-hf tiny/ckpt-000000003.h5 "$LOGITS" >tiny.out || fail "gpt-tiny: $(cat tiny.out)"
pass "gpt-tiny (vocabulary padded to 320) exported, transformers' logits: $(cat tiny.out)"

# ---- fine-tuning from the HF directory -------------------------------------------------
gpt=(--model gpt2-124m --set layers=2 --set heads=4 --set width=64 --set context=32
  --set padded_vocab=256 --data data/c.h5 --batch-size 8 --threads 1 --lr 1e-3 --prefetch 0)
# the loss of the HF model itself
mpi 2 "$BIN" eval --checkpoint ck.h5 --data data/c-val.h5 --threads 1 >eval0.out ||
  fail "eval ck.h5"
loss0=$(sed -n 's/.*model *\([0-9.]*\) nats.*/\1/p' eval0.out)
mpi 2 "$BIN" train "${gpt[@]}" --init-from hf --steps 40 --checkpoint-dir ft >ft.out ||
  { cat ft.out; fail "train --init-from hf exited $?"; }
contains "initialised from hf (Hugging Face GPT-2): weights only (step 0, fresh optimizer state)" \
  <ft.out || fail "no initialisation line: $(cat ft.out)"
mpi 2 "$BIN" eval --checkpoint ft/ckpt-000000040.h5 --data data/c-val.h5 --threads 1 >eval1.out ||
  fail "eval of the fine-tuned checkpoint"
loss1=$(sed -n 's/.*model *\([0-9.]*\) nats.*/\1/p' eval1.out)
awk -v a="$loss0" -v b="$loss1" 'BEGIN { exit !(b < a - 0.5) }' ||
  fail "held-out loss did not fall: $loss0 (HF model) -> $loss1 (40 steps)"
pass "train --init-from hf: held-out loss $loss0 -> $loss1 nats/token after 40 steps"

# Every tensor frozen: after 5 steps (AdamW, weight decay 0.1) the weights are the HF model's.
mpi 2 "$BIN" train "${gpt[@]}" --init-from hf-sharded --steps 5 --weight-decay 0.1 \
  --freeze embed. --freeze block --freeze ln_f --checkpoint-dir frozen >/dev/null ||
  fail "train with every tensor frozen"
h5diff ck.h5 frozen/ckpt-000000005.h5 /params /params ||
  fail "--init-from + --freeze of every tensor: the weights are not the HF model's bitwise"
# Into a run whose embedding has more rows (padded_vocab 320): the HF rows, then zeros.
mpi 2 "$BIN" train "${gpt[@]/padded_vocab=256/padded_vocab=320}" --init-from hf --steps 1 \
  --freeze embed. --freeze block --freeze ln_f --checkpoint-dir padded >/dev/null ||
  fail "train --init-from hf with padded_vocab 320"
"$PY" - <<'EOF' || fail "--init-from hf into padded_vocab 320"
import h5py, numpy as np
with h5py.File("ck.h5") as a, h5py.File("padded/ckpt-000000001.h5") as b:
    w = b["params/embed.wte"][()]
    assert w.shape == (320, 64) and np.array_equal(w[:256], a["params/embed.wte"][()])
    assert not w[256:].any(), "padded rows not zero"
EOF
pass "--init-from hf into padded_vocab 320: the 256 rows bitwise, 64 zero rows"

# block0. frozen: bitwise equal; every other tensor moved (replicated fp32, and ZeRO-1 in bf16:
# sharded masters, each rank reading its part).
for how in "--zero 0" "--zero 1 --precision bf16"; do
  # shellcheck disable=SC2086  # $how: the options, split
  mpi 2 "$BIN" train "${gpt[@]}" --init-from hf --steps 5 --weight-decay 0.1 --freeze block0. \
    $how --checkpoint-dir part --resume never --overwrite >/dev/null ||
    fail "train --freeze block0. $how"
  "$PY" - <<'EOF' || fail "--freeze block0. $how"
import h5py, numpy as np
with h5py.File("ck.h5") as a, h5py.File("part/ckpt-000000005.h5") as b:
    frozen = moved = 0
    for k in a["params"]:
        same = np.array_equal(a["params"][k][()], b["params"][k][()])
        if k.startswith("block0."):
            assert same, f"frozen {k} changed"
            frozen += 1
        else:
            assert not same, f"{k} did not change"
            moved += 1
print(f"{frozen} frozen tensors bitwise unchanged, {moved} others updated")
EOF
  pass "--freeze block0. ($how): frozen tensors bitwise unchanged"
done

# A classifier's head replaced when the classes differ: an MLP on 10 classes, then 5.
"$PY" - <<EOF
import h5py, numpy as np
with h5py.File("$DATA/train.h5") as s, h5py.File("five.h5", "w") as d:
    for k, v in s.attrs.items():
        d.attrs[k] = v
    d.attrs["num_classes"] = 5
    d["images"] = s["images"][:512]
    d["labels"] = s["labels"][:512] % 5
EOF
mlp=(--model mlp --hidden 16 --threads 1 --batch-size 32 --steps 2)
mpi 2 "$BIN" train "${mlp[@]}" --data "$DATA/train.h5" --checkpoint-dir mlp10 >/dev/null ||
  fail "mlp on 10 classes"
mpi 2 "$BIN" train "${mlp[@]}" --data five.h5 --init-from mlp10/ckpt-000000002.h5 >five.out ||
  fail "mlp on 5 classes from the 10-class checkpoint: $(cat five.out)"
grep -qF "head 'fc2' replaced (classes differ), freshly initialised: fc2.weight [10, 16] -> [5, 16] fc2.bias [10] -> [5]" \
  five.out || fail "head replacement not named: $(cat five.out)"
pass "--init-from a 10-class checkpoint into 5 classes: head fc2 replaced"

# ---- bad input at 2 ranks, rank 1 failing ----------------------------------------------
# run WANT MPIRUN-ARGS...: exit 1 within 60 s and one error line containing WANT.
run() {
  local want=$1
  shift
  local rc=0
  timeout 60 mpirun "$@" >out 2>err || rc=$?
  [[ $rc -ne 124 ]] || { cat err; fail "'$*' hung (timeout 60 s)"; }
  [[ $rc -eq 1 ]] || { cat err; fail "'$*' exited $rc, expected 1"; }
  local count
  count=$(grep -c '^ringtrain: error:' err || true)
  [[ $count -eq 1 ]] || { cat err; fail "'$*' printed $count error messages, expected 1"; }
  grep '^ringtrain: error:' err | grep -F -- "$want" >/dev/null ||
    { cat err; fail "'$*': the message does not name '$want'"; }
  pass "$(grep '^ringtrain: error:' err | cut -c1-220)"
}
# Rank 0 converts a good directory, rank 1 a bad one.
good=(-n 1 "$BIN" convert hf --in hf-sharded --out bad.h5 : -n 1 "$BIN")
cp -r hf-sharded missing && rm missing/model-00003-of-*.safetensors
run "'missing/model.safetensors.index.json' names shard 'model-00003-of-0000" \
  "${good[@]}" convert hf --in missing --out bad.h5
cp -r hf bert && sed -i 's/"model_type": "gpt2"/"model_type": "bert"/' bert/config.json
run "'bert/config.json': model_type 'bert' is not an architecture ringtrain converts" \
  "${good[@]}" convert hf --in bert --out bad.h5
"$PY" - <<'EOF'
import shutil
from safetensors.numpy import load_file, save_file
shutil.copytree("hf", "shape")
t = load_file("hf/model.safetensors")
t["transformer.h.1.mlp.c_fc.weight"] = t["transformer.h.1.mlp.c_fc.weight"][:, :128]
save_file(t, "shape/model.safetensors", metadata={"format": "pt"})
shutil.copytree("hf", "trunc")
b = open("hf/model.safetensors", "rb").read()
open("trunc/model.safetensors", "wb").write(b[:8] + b[8:40])  # the header cut short
EOF
run "tensor 'transformer.h.1.mlp.c_fc.weight' has shape [64, 128]; ringtrain's 'block1.fc.weight' [256, 64] needs [64, 256]" \
  "${good[@]}" convert hf --in shape --out bad.h5
run "'trunc/model.safetensors' is truncated: its header declares" \
  "${good[@]}" convert hf --in trunc --out bad.h5
[[ ! -e bad.h5 && ! -e bad.h5.tmp ]] || fail "a failed convert left bad.h5"
run "--init-from 'mlp10/ckpt-000000002.h5' holds model 'mlp', which has no tensor 'embed.wte'" \
  -n 1 "$BIN" train "${gpt[@]}" --steps 1 --init-from hf : \
  -n 1 "$BIN" train "${gpt[@]}" --steps 1 --init-from mlp10/ckpt-000000002.h5
run "--init-from 'ck.h5': tensor 'embed.wpe' is [32, 64] there but [16, 64] in this run's model" \
  -n 2 "$BIN" train "${gpt[@]/context=32/context=16}" --steps 1 --init-from ck.h5
