#!/usr/bin/env bash
# A GPT trained end to end on token data (models/gpt-tiny.pbtxt made small: 2 layers, 2
# heads, width 32, context 16) from a generated corpus converted with `convert text`:
# 1, 2 and 4 ranks with one global batch end at the same parameters up to fp32 summation
# order; a run stopped at step 12 and resumed is bitwise identical to an uninterrupted one
# (bf16); a restart from 2 to 3 ranks continues (fp32, within 1e-5); --zero 1 trains as
# --zero 0 does; `eval` of the checkpoint equals an independent PyTorch forward pass over
# every held-out window; each bad input (an image dataset to the GPT, a vocabulary larger
# than the embedding, --seq-len beyond the context or the shortest shard, token data to eval
# of an image model's checkpoint) is exit 1 with one message naming the file and numbers.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir gpt)
cd "$dir" || exit 1

# ---- a corpus: 40 documents of words from a small vocabulary ---------------------------
$PY - <<'EOF'
import os, random
random.seed(3)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(40):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(90)) + "\n")
EOF
mpi 2 "$BIN" convert text --input 'corpus/*.py' --out data/c.h5 --shards 2 --val-fraction 0.25 \
  >/dev/null || fail "convert text exited $?"
tiny=(--model gpt-tiny --set layers=2 --set heads=2 --set width=32 --set context=16)
common=("${tiny[@]}" --data 'data/c-*-of-*.h5' --threads 1 --seed 5 --prefetch 0 --log-every 6)
sgd=(--optimizer sgd --lr 0.1 --momentum 0.9 --global-batch-size 24)

last() {  # FIELD of the last record of TYPE in a metrics file
  $PY -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["type"]==sys.argv[2]]
print(repr(r[-1][sys.argv[3]]))' "$@"
}
# near A.h5 B.h5 TOL: relative L2 distance of every /params tensor of two checkpoints (h5py)
# at most TOL; prints the largest.
near() {
  $PY - "$@" <<'PY'
import sys, h5py, numpy as np
a, b, tol = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), float(sys.argv[3])
names = []
b["params"].visititems(lambda n, o: names.append("params/" + n) if isinstance(o, h5py.Dataset) else None)
assert len(names) == 4 + 12 * 2, names
worst, where = 0.0, ""
for n in names:
    x, y = a[n][...].astype(np.float64), b[n][...].astype(np.float64)
    rel = np.linalg.norm(x - y) / np.linalg.norm(y)
    if rel > worst:
        worst, where = rel, n
print(f"{worst:.3g} ({where})" if worst > 0 else "0 (identical)")
sys.exit(0 if worst <= tol else 1)
PY
}

# ---- 1, 2 and 4 ranks, one global batch of 24 windows of 16 tokens ---------------------
for n in 1 2 4; do
  out=$(mpi "$n" "$BIN" train "${common[@]}" "${sgd[@]}" --steps 24 --checkpoint-dir "w$n" \
    --val-data data/c-val.h5 --metrics "w$n.jsonl") || fail "$n ranks exited $?: $out"
  [[ $n -ne 2 ]] || contains "windows of 16 tokens, 384 tokens/step" <<<"$out" \
    || fail "the start-up line gives tokens per step: $out"
done
first=$($PY -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][1]["loss"])' w1.jsonl)
final=$(last w1.jsonl step loss)
$PY -c 'import sys; f, l = map(float, sys.argv[1:]); sys.exit(not (f > 2.0 and l < f - 0.5))' \
  "$first" "$final" || fail "1 rank did not learn: loss $first -> $final nats/token"
# The same windows summed in another order: fp32 rounding (6e-8 per addition) grown over 24
# SGD steps stays far below 1e-5; another batch order or seed is off by more than 1e-2.
for n in 2 4; do
  dist=$(near "w$n/ckpt-000000024.h5" w1/ckpt-000000024.h5 1e-5) \
    || fail "$n ranks x $((24 / n)) vs 1 rank x 24: parameters differ by $dist (relative L2) > 1e-5"
  pass "$n ranks x $((24 / n)) windows = 1 rank x 24 after 24 steps: relative L2 $dist (<= 1e-5)"
done

# Validation during training (fp32) is the eval command's figure for the same checkpoint.
out=$(mpi 2 "$BIN" eval --checkpoint w1/ckpt-000000024.h5 --data data/c-val.h5 --threads 1 \
  --metrics w1-eval.jsonl) || fail "eval of w1 exited $?: $out"
$PY -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-9 * b)' \
  "$(last w1.jsonl eval loss)" "$(last w1-eval.jsonl eval loss)" \
  || fail "validation during training $(last w1.jsonl eval loss) vs eval $(last w1-eval.jsonl eval loss)"
[[ $(last w1.jsonl eval tokens) == "$(last w1-eval.jsonl eval tokens)" ]] || fail "validation tokens"
pass "validation during training = eval of its checkpoint: $(last w1.jsonl eval loss) nats/token"

# ---- bitwise resume (bf16, AdamW; the schedule fixed to 24 steps): 12 + 12 = 24 steps ------
adamw=(--optimizer adamw --lr 3e-3 --weight-decay 0.1 --grad-clip 1 --batch-size 8 --precision bf16
  --lr-schedule cosine --warmup-steps 4 --decay-steps 24)
mpi 2 "$BIN" train "${common[@]}" "${adamw[@]}" --steps 24 --checkpoint-dir ref --metrics ref.jsonl \
  >/dev/null || fail "uninterrupted bf16 run exited $?"
mpi 2 "$BIN" train "${common[@]}" "${adamw[@]}" --steps 12 --checkpoint-dir res >/dev/null \
  || fail "first half exited $?"
cp -r res res3  # the 2 -> 3 restart below continues the same checkpoint
out=$(mpi 2 "$BIN" train "${common[@]}" "${adamw[@]}" --steps 24 --checkpoint-dir res \
  --metrics res.jsonl) || fail "resume exited $?: $out"
contains "resumed from res/ckpt-000000012.h5 at step 12" <<<"$out" || fail "resume line: $out"
for group in /params /optimizer /loss_scaler /data; do
  h5diff ref/ckpt-000000024.h5 res/ckpt-000000024.h5 "$group" "$group" \
    || fail "resumed run: $group differs from the uninterrupted run"
done
[[ $(last res.jsonl step loss) == "$(last ref.jsonl step loss)" ]] || fail "resumed loss differs"
pass "bf16 AdamW stopped at step 12 and resumed: bitwise identical to 24 uninterrupted steps"

# ---- restart on 3 ranks (global batch 24 kept; fp32 SGD, summation order only) --------
mpi 2 "$BIN" train "${common[@]}" "${sgd[@]}" --steps 12 --checkpoint-dir r3 >/dev/null \
  || fail "2-rank half exited $?"
out=$(mpi 3 "$BIN" train "${common[@]}" "${sgd[@]}" --steps 24 --checkpoint-dir r3 \
  --metrics r3.jsonl) || fail "restart on 3 ranks exited $?: $out"
contains "resumed from r3/ckpt-000000012.h5 at step 12 (saved by 2 ranks in fp32, global batch 24)" \
  <<<"$out" || fail "3 ranks: $out"
h5dump -a /step r3/ckpt-000000024.h5 | contains "(0): 24\$" || fail "3 ranks: step count"
h5dump -a /world_size r3/ckpt-000000024.h5 | contains "(0): 3\$" || fail "3 ranks: world_size"
$PY -c 'import math,sys; sys.exit(not math.isfinite(float(sys.argv[1])))' "$(last r3.jsonl step loss)" \
  || fail "3 ranks: loss not finite"
dist=$(near r3/ckpt-000000024.h5 w1/ckpt-000000024.h5 1e-5) \
  || fail "2 -> 3 ranks: parameters differ from the uninterrupted run by $dist > 1e-5"
pass "restart 2 -> 3 ranks continued to step 24 (global batch 24): within $dist of the uninterrupted run"

# ---- --zero 1: the same update from sharded optimizer state ----------------------------
mpi 2 "$BIN" train "${common[@]}" "${sgd[@]}" --steps 24 --zero 1 --checkpoint-dir z1 >/dev/null \
  || fail "--zero 1 exited $?"
dist=$(near z1/ckpt-000000024.h5 w2/ckpt-000000024.h5 1e-5) \
  || fail "--zero 1 differs from --zero 0 by $dist"
pass "--zero 1 on 2 ranks: within $dist of --zero 0"

# ---- eval against PyTorch: every window of the held-out file --------------------------
ck=ref/ckpt-000000024.h5
out=$(mpi 2 "$BIN" eval --checkpoint "$ck" --data data/c-val.h5 --baselines 'data/c-*-of-*.h5' \
  --threads 1 --metrics eval.jsonl) || fail "eval exited $?: $out"
[[ $(grep -c "model .* nats/token .* bits/byte" <<<"$out") -eq 1 ]] || fail "eval prints once: $out"
contains "model / bigram = " <<<"$out" || fail "eval prints the ratio to the bigram: $out"
$PY - "$ck" data/c-val.h5 eval.jsonl <<'EOF' || fail "eval differs from PyTorch: $out"
# GPT-2 as the model file describes it, in float64 from the checkpoint's fp32 masters.
import json, math, sys
import h5py, torch
import torch.nn.functional as F
ck, val, rec = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), \
    [json.loads(l) for l in open(sys.argv[3])][-1]
P = {k: torch.tensor(v[...], dtype=torch.float64) for k, v in ck["params"].items()}
T, H, C, V = 16, 2, 32, int(val.attrs["vocab_size"])
s = torch.tensor(val["tokens"][...].astype("int64"))
w = (len(s) - 1) // T
x, y = s[: w * T].view(w, T), s[1 : w * T + 1].view(w, T)
h = P["embed.wte"][x] + P["embed.wpe"][:T]
ln = lambda h, n: F.layer_norm(h, (C,), P[n + ".weight"], P[n + ".bias"], 1e-5)
lin = lambda h, n: h @ P[n + ".weight"].T + P[n + ".bias"]
mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
for i in range(2):
    b = f"block{i}."
    q, k, v = lin(ln(h, b + "ln1"), b + "qkv").split(C, dim=-1)
    q, k, v = (t.view(w, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    a = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
    a = a.masked_fill(mask, float("-inf")).softmax(-1)
    h = h + lin((a @ v).transpose(1, 2).reshape(w, T, C), b + "attn_proj")
    h = h + lin(F.gelu(lin(ln(h, b + "ln2"), b + "fc"), approximate="tanh"), b + "fc_proj")
logits = ln(h, "ln_f") @ P["embed.wte"].T
loss = F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1)).item()
assert rec["type"] == "eval" and rec["windows"] == w and rec["tokens"] == w * T, (rec, w)
# fp32 forward against float64: about 1e-7 relative; a wrong window, mask or position is
# off by far more than 1e-5.
assert abs(rec["loss"] - loss) <= 1e-5 * loss, (rec["loss"], loss)
assert abs(rec["bits_per_byte"] - loss / math.log(2)) <= 1e-5 * loss, rec
print(f"eval {rec['loss']:.6f} nats/token, PyTorch {loss:.6f}")
EOF
pass "eval of a GPT checkpoint on all $($PY -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["windows"])' eval.jsonl) held-out windows equals PyTorch's float64 forward (<= 1e-5)"

# ---- bad input: exit 1, one message naming the file and the numbers ---------------------
bad() {  # bad WHAT PATTERN CMD...: exit 1 and PATTERN once in stderr
  local what=$1 pattern=$2 err rc
  shift 2
  set +e
  err=$(mpi 2 "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [[ $rc -eq 1 ]] || fail "$what: exit $rc: $err"
  [[ $(grep -c -- "$pattern" <<<"$err") -eq 1 ]] || fail "$what: expected one '$pattern' in: $err"
}
bad "image data to a GPT" "train.h5' holds images and labels, but model 'gpt-tiny' takes tokens" \
  "$BIN" train "${tiny[@]}" --data "$DATA/train.h5" --steps 1
bad "vocabulary beyond the embedding" \
  "token dataset 'data/c-\*-of-\*.h5' has vocab_size 256, larger than model 'gpt-tiny''s embedding of 128 tokens" \
  "$BIN" train "${tiny[@]}" --set padded_vocab=128 --data 'data/c-*-of-*.h5' --steps 1
bad "--seq-len beyond the context" "--seq-len 17 is longer than model 'gpt-tiny''s context of 16 positions" \
  "$BIN" train "${tiny[@]}" --data 'data/c-*-of-*.h5' --seq-len 17 --steps 1
shortest=$($PY -c 'import h5py,sys; print(min(h5py.File(f)["tokens"].shape[0] for f in sys.argv[1:]))' data/c-0000*-of-*.h5)
bad "--seq-len beyond the shortest shard" \
  "--seq-len $shortest is longer than token dataset 'data/c-0000.-of-00002.h5' allows: it holds $shortest tokens" \
  "$BIN" train "${tiny[@]}" --set context=16384 --data 'data/c-*-of-*.h5' --seq-len "$shortest" --steps 1
bad "image data to eval of a GPT checkpoint" \
  "train.h5' holds images and labels, but the model of checkpoint '$ck' takes tokens" \
  "$BIN" eval --checkpoint "$ck" --data "$DATA/train.h5"
mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 8 --steps 2 --threads 1 --checkpoint-dir img \
  >/dev/null || fail "mlp run exited $?"
bad "token data to eval of an image checkpoint" \
  "data/c-val.h5' holds a token stream, but the model of checkpoint 'img/ckpt-000000002.h5' takes images" \
  "$BIN" eval --checkpoint img/ckpt-000000002.h5 --data data/c-val.h5
pass "image data to a GPT (train, eval), token data to an image checkpoint, vocabulary > embedding, --seq-len > context and > shortest shard: exit 1 naming file and numbers"
