#!/usr/bin/env bash
# Hugging Face Llama weights in and out, against the real libraries (transformers 4.44 and
# safetensors in lib.sh's hf_venv): random LlamaForCausalLMs saved with save_pretrained (2
# kv heads and an untied head; 1 kv head, multi-query, with the head tied) -> `convert hf`
# on 1 and 2 ranks (the same tensors) -> ringtrain's fp32 logits equal transformers' within
# 1e-5 -> `export --format hf` gives back every tensor bitwise and the config's values, and
# from_pretrained of the export gives the same logits. `train --init-from HF_DIR` of
# llama-tiny with every tensor frozen keeps the HF weights bitwise. Bad input at 2 ranks with
# rank 1 failing: rope_scaling set, attention_bias true, hidden_act not silu: exit 1, one
# message naming the key, in seconds.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
LOGITS=${HF_LOGITS:?HF_LOGITS is not set (the hf_logits binary)}
dir=$(workdir hf_llama)
cd "$dir" || exit 1
PY=$(hf_venv)

# ---- random Llamas (uniform(-0.3, 0.3): logits and attention far from uniform) ----------
"$PY" - <<'EOF' || fail "making the Hugging Face models"
import torch
from transformers import LlamaConfig, LlamaForCausalLM
def make(path, seed, **kw):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32,
                      **kw)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(-0.3, 0.3)
    m.save_pretrained(path)
make("llama", 0, num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5)
make("llama-kv1", 1, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0)
EOF

mpi 1 "$BIN" convert hf --in llama --out ck.h5 >convert.out || fail "convert hf exited $?"
contains "converted llama -> ck.h5: llama (21 tensors, 106816 parameters" <convert.out ||
  fail "convert hf: $(cat convert.out)"
mpi 2 "$BIN" convert hf --in llama --out ck2.h5 >/dev/null || fail "convert hf (2 ranks)"
h5diff ck.h5 ck2.h5 /params /params || fail "2 ranks differ from 1 rank"
pass "convert hf of a LlamaForCausalLM: $(cat convert.out)"
mpi 2 "$BIN" convert hf --in llama-kv1 --out kv1.h5 >convert1.out || fail "convert hf (kv 1)"
contains "llama (20 tensors, 86336 parameters" <convert1.out || fail "convert hf (kv 1): $(cat convert1.out)"

# ---- logits: ringtrain (the converted checkpoint) vs transformers ----------------------
cat >logits.py <<'EOF'
import subprocess, sys
import numpy as np, torch
from transformers import LlamaForCausalLM
hf_dir, ck, logits_bin = sys.argv[1:4]
m = LlamaForCausalLM.from_pretrained(hf_dir).eval()
v, t = m.config.vocab_size, m.config.max_position_embeddings
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
"$PY" logits.py llama ck.h5 "$LOGITS" >logits.out || fail "logits: $(cat logits.out)"
pass "kv_heads 2, untied head: $(cat logits.out)"
"$PY" logits.py llama-kv1 kv1.h5 "$LOGITS" >logits1.out || fail "logits (kv 1): $(cat logits1.out)"
pass "kv_heads 1, tied head, rope_theta 500000: $(cat logits1.out)"

# ---- export --format hf: bitwise round trip, the config, from_pretrained ---------------
cat >roundtrip.py <<'EOF'
import json, sys
import numpy as np, torch
from safetensors.numpy import load_file
from transformers import LlamaForCausalLM
src, out = sys.argv[1:3]
a, b = load_file(f"{src}/model.safetensors"), load_file(f"{out}/model.safetensors")
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
for k in a:
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
ca, cb = json.load(open(f"{src}/config.json")), json.load(open(f"{out}/config.json"))
assert cb["architectures"] == ["LlamaForCausalLM"] and cb["torch_dtype"] == "float32", cb
for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
          "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
          "rope_scaling", "hidden_act"):
    assert ca[k] == cb[k], (k, ca[k], cb[k])
ids = torch.from_numpy(np.load("tokens.npy"))
with torch.no_grad():
    x = LlamaForCausalLM.from_pretrained(src).eval()(ids).logits
    y = LlamaForCausalLM.from_pretrained(out).eval()(ids).logits
assert torch.equal(x, y), float((x - y).abs().max())
print(f"{len(a)} tensors bitwise, config values equal; from_pretrained of the export: identical logits")
EOF
mpi 2 "$BIN" export --checkpoint ck.h5 --format hf --out exported >export.out ||
  fail "export --format hf exited $?"
contains "exported ck.h5 -> exported/{config.json,model.safetensors} (Llama: 2 layers, 4 heads, 2 kv heads, width 64, ffn 128, context 32, vocabulary 256, head untied; 21 tensors)" \
  <export.out || fail "export: $(cat export.out)"
"$PY" logits.py llama ck.h5 "$LOGITS" >/dev/null || fail "tokens for the round trip"
"$PY" roundtrip.py llama exported >rt.out || fail "round trip: $(cat rt.out)"
pass "export --format hf (kv_heads 2): $(cat rt.out)"
mpi 1 "$BIN" export --checkpoint kv1.h5 --format hf --out exported1 >/dev/null ||
  fail "export --format hf (kv 1)"
"$PY" logits.py llama-kv1 kv1.h5 "$LOGITS" >/dev/null || fail "tokens for the round trip (kv 1)"
"$PY" roundtrip.py llama-kv1 exported1 >rt1.out || fail "round trip (kv 1): $(cat rt1.out)"
pass "export --format hf (kv_heads 1, tied): $(cat rt1.out)"

# ---- --init-from the HF directory into llama-tiny, every tensor frozen -----------------
"$PY" - <<'EOF'
import os, random
random.seed(3)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(20):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(90)) + "\n")
EOF
mpi 1 "$BIN" convert text --input 'corpus/*.py' --out data/c.h5 --val-fraction 0.25 >/dev/null ||
  fail "convert text"
mpi 2 "$BIN" train --model llama-tiny --set layers=2 --set heads=4 --set kv_heads=2 \
  --set width=64 --set ffn=128 --set context=32 --set norm_eps=1e-5 --data data/c.h5 \
  --batch-size 4 --threads 1 --steps 2 --weight-decay 0.1 --init-from llama \
  --freeze embed_tokens. --freeze layers. --freeze norm. --freeze lm_head. \
  --checkpoint-dir frozen >ft.out || { cat ft.out; fail "train --init-from llama"; }
contains "initialised from llama (Hugging Face Llama): weights only" <ft.out ||
  fail "no initialisation line: $(cat ft.out)"
h5diff ck.h5 frozen/ckpt-000000002.h5 /params /params ||
  fail "--init-from + --freeze of every tensor: the weights are not the HF model's bitwise"
pass "train llama-tiny --init-from llama, every tensor frozen: the HF weights bitwise"

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
good=(-n 1 "$BIN" convert hf --in llama --out bad.h5 : -n 1 "$BIN")
"$PY" - <<'EOF'
import json, shutil
for name, key, value in [("scaled", "rope_scaling", {"rope_type": "linear", "factor": 2.0}),
                         ("biased", "attention_bias", True), ("gelu", "hidden_act", "gelu")]:
    shutil.copytree("llama", name)
    c = json.load(open(f"{name}/config.json"))
    c[key] = value
    json.dump(c, open(f"{name}/config.json", "w"), indent=2)
EOF
run "'scaled/config.json': rope_scaling {\"factor\":2.0,\"rope_type\":\"linear\"} is not supported" \
  "${good[@]}" convert hf --in scaled --out bad.h5
run "'biased/config.json': attention_bias true is not supported" \
  "${good[@]}" convert hf --in biased --out bad.h5
run "'gelu/config.json': hidden_act \"gelu\" is not supported" \
  "${good[@]}" convert hf --in gelu --out bad.h5
[[ ! -e bad.h5 && ! -e bad.h5.tmp ]] || fail "a failed convert left bad.h5"
