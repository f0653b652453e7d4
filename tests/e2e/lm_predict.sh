#!/usr/bin/env bash
# Predictions and evaluation budgets of a language model (a tiny GPT on a generated corpus):
# `predict` on token data at 2 ranks writes per-window losses equal to an independent
# PyTorch float64 forward pass from the checkpoint's masters, top-k ids equal to torch.topk
# of the logits it writes for a range of windows (with their log-softmax as scores), rows in
# dataset order (as 1 rank writes them), and the mean of its losses is eval's figure;
# `eval --eval-windows N` and training's evaluations under --eval-windows score exactly N
# windows, the ones floor(i * W / N); the training line's accuracy is correct tokens / tokens,
# counted here from predict's top-1 ids on the windows of each global batch (2 ranks x 2
# micro-batches); each bad option is exit 1 with one message.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir lm-predict)
here=$(cd "$(dirname "$0")" && pwd)
cd "$dir" || exit 1

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
# 2 ranks x 2 micro-batches of 6 windows: the accuracy sums over both.
run=("${tiny[@]}" --data 'data/c-*-of-*.h5' --threads 1 --seed 5 --prefetch 0 --optimizer sgd
  --lr 0.1 --momentum 0.9 --global-batch-size 24 --grad-accum 2 --checkpoint-dir ck --keep 100
  --checkpoint-every 1 --log-every 1 --val-data data/c-val.h5 --eval-every 4 --eval-windows 5)
mpi 2 "$BIN" train "${run[@]}" --steps 8 --metrics train.jsonl >train.out \
  || fail "train exited $?: $(cat train.out)"
ck=ck/ckpt-000000008.h5

# ---- predict at 2 ranks (and at 1 rank, another batch size, for the order) -------------
out=$(mpi 2 "$BIN" predict --checkpoint "$ck" --data data/c-val.h5 --out p2.h5 --top-k 5 \
  --logits-range 3:7 --batch-size 5 --threads 1) || fail "predict exited $?: $out"
contains "windows of 16 tokens of data/c-val.h5 .* top-5 next tokens, logits of windows 3 to 6" \
  <<<"$out" || fail "predict's line: $out"
mpi 1 "$BIN" predict --checkpoint "$ck" --data data/c-val.h5 --out p1.h5 --threads 1 >/dev/null \
  || fail "1-rank predict exited $?"
mpi 2 "$BIN" predict --checkpoint "$ck" --data data/c-val.h5 --out pt.h5 --top-k 5 --batch-size 5 \
  --threads 2 >/dev/null || fail "predict with 2 threads per rank exited $?"
out=$(mpi 2 "$BIN" eval --checkpoint "$ck" --data data/c-val.h5 --threads 1 --metrics eval.jsonl) \
  || fail "eval exited $?: $out"
$PY - "$ck" data/c-val.h5 p2.h5 p1.h5 pt.h5 eval.jsonl <<'EOF' || fail "predict differs from PyTorch"
import json, math, sys
import h5py, numpy as np, torch
import torch.nn.functional as F
ck, val, p, p1, pt = (h5py.File(f, "r") for f in sys.argv[1:6])
ev = [json.loads(l) for l in open(sys.argv[6])][-1]
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
    a = ((q @ k.transpose(-1, -2)) / math.sqrt(C // H)).masked_fill(mask, float("-inf")).softmax(-1)
    h = h + lin((a @ v).transpose(1, 2).reshape(w, T, C), b + "attn_proj")
    h = h + lin(F.gelu(lin(ln(h, b + "ln2"), b + "fc"), approximate="tanh"), b + "fc_proj")
logits = (ln(h, "ln_f") @ P["embed.wte"].T)[..., :V]
ref = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none").view(w, T).mean(1)
A = p.attrs
text = lambda v: v.decode() if isinstance(v, bytes) else v  # fixed-length HDF5 strings
assert text(A["format"]) == "ringtrain-predictions" and text(A["kind"]) == "tokens", dict(A)
assert (A["windows"], A["seq_len"], A["vocab_size"], A["top_k"]) == (w, T, V, 5), dict(A)
assert (A["logits_start"], A["logits_end"]) == (3, 7), dict(A)
loss = torch.tensor(p["loss"][...])
assert loss.shape == (w,) and p["correct"].shape == (w,) and p["targets"].shape == (w, T)
# Window i is tokens [i*T, i*T + T] of the file: its targets are the stream shifted by one.
assert np.array_equal(p["targets"][...], y.numpy()), "targets out of dataset order"
# fp32 forward against float64: about 1e-7 relative; a wrong window, position or mask is
# off by far more than 1e-5.
err = ((loss - ref).abs() / ref).max().item()
assert err <= 1e-5, f"per-window loss off PyTorch's by {err:.3g} (relative)"
# The written logits of windows 3..6 against float64, and the top-k of every position of
# those windows against torch.topk of the same (written) logits, scores = log-softmax.
L = torch.tensor(p["logits"][...])
assert L.shape == (4, T, V), L.shape
lerr = (L.double() - logits[3:7]).abs().max().item()
assert lerr <= 1e-4, f"logits off PyTorch's by {lerr:.3g}"
tv, ti = torch.topk(L, 5, dim=-1)
top = torch.tensor(p["top_k"][3:7].astype("int64"))
assert torch.equal(top, ti), "top-k ids differ from torch.topk of the logits"
lsm = torch.log_softmax(L.double(), -1).gather(-1, ti)
serr = (torch.tensor(p["top_k_scores"][3:7]).double() - lsm).abs().max().item()
assert serr <= 1e-5, f"top-k scores off the log-softmax by {serr:.3g}"
# Every window: the top-1 id and correct count agree with an independent count.
top1 = p["top_k"][:, :, 0]
assert np.array_equal((top1 == p["targets"][...]).sum(1), p["correct"][...]), "/correct"
# 1 rank, batch 256 (one pass) against 2 ranks, batch 5: the same rows in the same order.
assert np.array_equal(p1["targets"][...], p["targets"][...]), "1-rank rows in another order"
d1 = np.abs(p1["loss"][...] - p["loss"][...]).max()
assert d1 <= 1e-6, f"1 vs 2 ranks: per-window loss differs by {d1:.3g}"
assert "top_k" not in p1 and "logits" not in p1, "top-k or logits written unasked"
# The top-k of 2 threads per rank (rows in parallel): the same ids, scores within 1e-6.
assert np.array_equal(pt["top_k"][...], p["top_k"][...]), "top-k ids depend on the threads"
d2 = np.abs(pt["top_k_scores"][...] - p["top_k_scores"][...]).max()
assert d2 <= 1e-6, f"top-k scores depend on the threads by {d2:.3g}"
# The mean of the windows' losses is eval's loss over the same windows (the same kernel).
assert ev["windows"] == w and ev["tokens"] == w * T, ev
m = float(loss.mean())
assert abs(m - ev["loss"]) <= 1e-9 * ev["loss"], (m, ev["loss"])
print(f"{w} windows: loss within {err:.2g} of PyTorch, logits within {lerr:.2g}, top-5 = torch.topk")
EOF
pass "predict on token data (2 ranks): per-window loss = PyTorch float64 (<= 1e-5), top-k = torch.topk, rows in dataset order, mean = eval's loss"

# ---- --eval-windows: exactly N windows, floor(i * W / N) --------------------------------
out=$(mpi 2 "$BIN" eval --checkpoint "$ck" --data data/c-val.h5 --threads 1 --eval-windows 7 \
  --metrics ew.jsonl) || fail "eval --eval-windows exited $?: $out"
contains "(7 of [0-9]* windows of 16 tokens: 112 target tokens" <<<"$out" || fail "eval line: $out"
$PY - p2.h5 ew.jsonl train.jsonl <<'EOF' || fail "--eval-windows"
import json, sys
import h5py
p = h5py.File(sys.argv[1], "r")
ev = [json.loads(l) for l in open(sys.argv[2])][-1]
loss, W = p["loss"][...], int(p.attrs["windows"])
assert ev["windows"] == 7 and ev["tokens"] == 7 * 16 and ev["windows_total"] == W, ev
want = sum(loss[i * W // 7] for i in range(7)) / 7
assert abs(ev["loss"] - want) <= 1e-9 * want, (ev["loss"], want)
# Training: evaluations at steps 4 and 8, 5 windows each.
evals = [json.loads(l) for l in open(sys.argv[3]) if json.loads(l)["type"] == "eval"]
assert [e["step"] for e in evals] == [4, 8] and all(e["tokens"] == 5 * 16 for e in evals), evals
print(evals[-1]["loss"])
EOF
train_eval=$($PY -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["type"]=="eval"][-1]["loss"])' train.jsonl)
mpi 2 "$BIN" eval --checkpoint "$ck" --data data/c-val.h5 --threads 1 --eval-windows 5 \
  --metrics ew5.jsonl >/dev/null || fail "eval --eval-windows 5 exited $?"
$PY -c 'import json,sys; a=float(sys.argv[1]); b=[json.loads(l) for l in open(sys.argv[2])][-1]["loss"]
sys.exit(abs(a-b) > 1e-9*b)' "$train_eval" ew5.jsonl \
  || fail "training's evaluation under --eval-windows 5 differs from eval --eval-windows 5"
pass "--eval-windows 7: exactly 7 windows floor(i*W/7), loss = their mean from predict; training's --eval-every 4 --eval-windows 5 = eval --eval-windows 5"

# ---- the training line's accuracy: correct tokens / tokens -----------------------------
# Step s trained checkpoint s-1's weights on the windows at positions [(s-1)*24, s*24) of
# epoch 0's permutation; predict's top-1 ids of those windows against their targets.
for s in 2 5 8; do
  mpi 2 "$BIN" predict --checkpoint "ck/ckpt-00000000$((s - 1)).h5" --data 'data/c-*-of-*.h5' \
    --top-k 1 --out "tr$s.h5" --threads 1 >/dev/null || fail "predict on the training data exited $?"
done
$PY - "$here" train.jsonl <<'EOF' || fail "the training accuracy is not correct tokens / tokens"
import json, sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])
import h5py, numpy as np
from epoch_permutation import permutation
steps = {r["step"]: r for r in map(json.loads, open(sys.argv[2])) if r["type"] == "step"}
for s in (2, 5, 8):
    p = h5py.File(f"tr{s}.h5", "r")
    W = int(p.attrs["windows"])
    batch = permutation(5, 0, W)[(s - 1) * 24 : s * 24]
    hits = int((p["top_k"][...][batch, :, 0] == p["targets"][...][batch]).sum())
    want, got = hits / (24 * 16), steps[s]["accuracy"]
    # The record prints 9 significant digits; one token is 1/384 = 2.6e-3.
    assert abs(got - want) <= 1e-8, f"step {s}: accuracy {got}, counted {hits}/384 = {want}"
    print(f"step {s}: {hits}/384 tokens = {got:.6f}")
EOF
pass "training accuracy = correct tokens / tokens of the global batch (counted from predict's top-1 ids; 2 ranks x 2 micro-batches)"

# ---- bad input: exit 1, one message ------------------------------------------------------
bad() {  # bad WHAT PATTERN CMD...: exit 1 and PATTERN once in stderr
  local what=$1 pattern=$2 err rc
  shift 2
  set +e
  err=$(mpi 2 "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [[ $rc -eq 1 ]] || fail "$what: exit $rc: $err"
  [[ $(grep -c '^ringtrain: error:' <<<"$err") -eq 1 ]] || fail "$what: not one message: $err"
  [[ $(grep -c -F -- "$pattern" <<<"$err") -eq 1 ]] || fail "$what: expected '$pattern' in: $err"
}
pr=(predict --checkpoint "$ck" --data data/c-val.h5 --out bad.h5 --threads 1)
bad "--top-k 0" "--top-k 0 is not valid: must be > 0" "$BIN" "${pr[@]}" --top-k 0
bad "--top-k > vocab" "--top-k 257 is not valid; expected 1 to 256 (the vocabulary of 'data/c-val.h5')" \
  "$BIN" "${pr[@]}" --top-k 257
bad "--logits-range syntax" "--logits-range '3-5' is not valid; expected START:END" \
  "$BIN" "${pr[@]}" --logits-range 3-5
bad "--logits-range reversed" "--logits-range '5:3' is not valid" "$BIN" "${pr[@]}" --logits-range 5:3
bad "--logits-range beyond the windows" "--logits-range 0:1000 is outside the" "$BIN" "${pr[@]}" \
  --logits-range 0:1000
bad "--logits-range too large" "--logits-range 0:100000 asks for 409600000 logits" "$BIN" "${pr[@]}" \
  --logits-range 0:100000
bad ".npy for token data" "are written as .h5" "$BIN" predict --checkpoint "$ck" --data data/c-val.h5 \
  --out bad.npy
bad "--probabilities for token data" "--probabilities is for classifiers" "$BIN" "${pr[@]}" --probabilities
bad "eval --eval-windows 0" "--eval-windows 0 is not valid: must be > 0" "$BIN" eval --checkpoint "$ck" \
  --data data/c-val.h5 --eval-windows 0
bad "eval --eval-windows -2" "--eval-windows -2 is not valid: must be > 0" "$BIN" eval \
  --checkpoint "$ck" --data data/c-val.h5 --eval-windows -2
bad "train --eval-windows 0" "--eval-windows 0 is not valid: must be > 0" "$BIN" train "${tiny[@]}" \
  --data 'data/c-*-of-*.h5' --val-data data/c-val.h5 --eval-windows 0 --steps 1
mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 8 --steps 2 --threads 1 --checkpoint-dir img \
  >/dev/null || fail "mlp run exited $?"
bad "eval --eval-windows of an image model" \
  "--eval-windows 3 is for token data; the model of checkpoint 'img/ckpt-000000002.h5' takes images" \
  "$BIN" eval --checkpoint img/ckpt-000000002.h5 --data "$DATA/test.h5" --eval-windows 3
bad "train --eval-windows of an image model" "--eval-windows 3 is for token data; model 'mlp' takes images" \
  "$BIN" train --data "$DATA/train.h5" --val-data "$DATA/test.h5" --eval-windows 3 --steps 1
bad "predict --logits-range of an image model" "--logits-range is for token data" \
  "$BIN" predict --checkpoint img/ckpt-000000002.h5 --data "$DATA/test.h5" --out bad.h5 --logits-range 0:2
bad "train --eval-windows without --val-data" "--eval-windows needs --val-data" "$BIN" train \
  "${tiny[@]}" --data 'data/c-*-of-*.h5' --eval-windows 3 --steps 1
# A token outside the vocabulary at 7/8 of the stream, in a window only rank 1 reads: found
# in its forward passes and agreed on before any rank creates the output (one message, exit
# 1, no .tmp left behind).
pos=$($PY - <<'EOF'
import h5py, numpy as np
t = (h5py.File("data/c-val.h5", "r")["tokens"][...] % 200).astype(np.uint8)
pos = len(t) * 7 // 8
assert pos // 16 >= (len(t) - 1) // 16 // 2, "not in rank 1's windows"
t[pos] = 250
with h5py.File("data/bad-tok.h5", "w") as f:
    f.attrs["format"], f.attrs["format_version"] = "ringtrain-tokens", 1
    f.attrs["vocab_size"], f.attrs["tokenizer"], f.attrs["split"] = 200, "bytes", "val"
    f.create_dataset("tokens", data=t, chunks=(1024,))
    f.create_dataset("doc_offsets", data=np.array([0, len(t)], np.int64))
print(pos)
EOF
)
bad "a bad token read by rank 1" "token dataset 'data/bad-tok.h5': token 250 at position $pos is" \
  "$BIN" predict --checkpoint "$ck" --data data/bad-tok.h5 --out bad.h5 --threads 1
[[ ! -e bad.h5 && ! -e bad.npy && ! -e bad.h5.tmp ]] || fail "a refused predict left an output"
pass "--top-k 0 and > vocabulary, bad --logits-range (syntax, order, beyond the windows, over 2^28 values), a bad token read by rank 1 only, .npy and --probabilities for token data, --eval-windows 0/-2 (eval, train), without --val-data or for an image model, --logits-range for an image model: exit 1, one message"
