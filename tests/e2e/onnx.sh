#!/usr/bin/env bash
# `ringtrain export --format onnx` checked by the real consumers, PyPI's `onnx` and
# `onnxruntime` (in a venv made by docs/interop.md's recipe, cached under the build dir;
# with h5py, whose Debian build does not import beside PyPI's numpy 2): an MLP, the CNN
# (dropout removed), a ResNet (GELU as erf, BatchNorm), examples/lenet_bn.pbtxt (a residual
# add) and a model file of the other ops (concat, reshape, last-axis linear, layer norm,
# every activation kind), each trained for a few steps at 2 ranks and exported at 2 ranks, pass
# onnx.checker.check_model(full_check=True), and ONNX Runtime's logits on 1,000 test images
# (through docs/interop.md's serving snippet, run as written) match `ringtrain predict`'s to
# max |d| <= 1e-4 with 100 % top-1 agreement. A GPT (gpt-tiny, written by onnx_fixture
# since token training is not in `train` yet) matches ringtrain's forward logits, its LM
# head tied to the token embedding (one initialiser) and causal (a prefix gives the same
# logits). So does a Llama (llama-tiny with 2 kv heads, also from onnx_fixture: rotary
# embeddings, grouped-query attention, RMS norms, SwiGLU, its head untied). Bad input at 2 ranks: one message, exit 1, nothing left under --out; a failure
# on rank 1 while exporting: exit 2, one message naming rank 1.
source "$(dirname "$0")/lib.sh"
FIXTURE=${ONNX_FIXTURE:?ONNX_FIXTURE is not set (the onnx_fixture binary)}
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(workdir onnx)
cd "$dir" || exit 1
export OMP_NUM_THREADS=1
venv=$E2E_DIR/onnx-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import onnx, onnxruntime, h5py' 2>/dev/null; then
  # docs/interop.md's venv recipe, as written but for the venv's path and Debian's python3.
  recipe=$(sed -n '/<!-- interop: ort_venv.sh -->/,/^```$/p' "$src/docs/interop.md" | sed '1,2d;$d')
  [[ $recipe == *"venv ort-venv"*"pip install"*h5py* ]] ||
    fail "docs/interop.md: no venv recipe installing h5py: '$recipe'"
  rm -rf "$venv"
  sed "s#ort-venv#$venv#g; s#^python3 #/usr/bin/python3 #; s#/pip install #/pip install -q #" \
    <<<"$recipe" | bash -euo pipefail || fail "docs/interop.md's venv recipe failed"
fi
PY=$venv/bin/python

# The first 1,000 test images as their own dataset.
"$PY" - "$DATA/test.h5" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    np.save("x.npy", f["images"][:1000])
    np.save("y.npy", f["labels"][:1000])
EOF
"$BIN" convert npy --images x.npy --labels y.npy --out test1k.h5 >/dev/null

# The ops the shipped models do not use, and every activation kind, in one image model (whose
# last node has the name of the ONNX graph's output).
cat >graph.pbtxt <<'EOF'
format_version: 1
name: "graph"
node { name: "a" conv { out_channels: 4 kernel: 3 padding: 1 activation: RELU } }
node { name: "b" input: "input" conv { out_channels: 2 kernel: 1 } }
node { name: "cat" input: "a" input: "b" concat {} }
node { name: "pool" max_pool { kernel: 3 stride: 2 } }
node { name: "rows" reshape { shape: [6, -1] } }
node { name: "proj" linear { out_features: 16 last_axis: true } }
node { name: "ln" layer_norm {} }
node { name: "gelu" activation { kind: GELU } }
node { name: "gelu_tanh" activation { kind: GELU_TANH } }
node { name: "silu" activation { kind: SILU } }
node { name: "flat" flatten {} }
node { name: "logits" linear { out_features: 10 } }
EOF

# name, then the model options of `train`
models=(
  "mlp --model mlp --hidden 64,32"
  "cnn --model cnn"
  "resnet --model resnet --depth 1 --width 4 --activation gelu"
  "lenet_bn --model $src/examples/lenet_bn.pbtxt --set width=8"
  "graph --model graph.pbtxt"
)
for m in "${models[@]}"; do
  read -r -a words <<<"$m"
  name=${words[0]}
  mpi 2 "$BIN" train --data "$DATA/train.h5" "${words[@]:1}" --steps 20 --batch-size 32 \
    --threads 1 --seed 3 --checkpoint-dir "ck/$name" >"$name.train" ||
    fail "$name: train exited $?: $(tail -3 "$name.train")"
  ck=ck/$name/ckpt-000000020.h5
  mpi 2 "$BIN" predict --checkpoint "$ck" --data test1k.h5 --out "$name-pred.h5" >/dev/null ||
    fail "$name: predict exited $?"
  mpi 2 "$BIN" export --checkpoint "$ck" --format onnx --opset 17 --out "$name.onnx" \
    >"$name.export" || fail "$name: export exited $?"
  [[ $(grep -c "^exported $ck -> $name.onnx (ONNX opset 17" "$name.export") -eq 1 ]] ||
    fail "$name: export did not say once what it wrote: $(cat "$name.export")"
done

# docs/interop.md's serving snippet, as written, on every model.
sed -n '/<!-- interop: onnx_serve.py -->/,/^```$/p' "$src/docs/interop.md" | sed '1,2d;$d' >onnx_serve.py
[[ $(wc -l <onnx_serve.py) -gt 10 ]] || fail "the onnx_serve.py block was not found in docs/interop.md"
for m in "${models[@]}"; do
  name=${m%% *}
  "$PY" onnx_serve.py "$name.onnx" test1k.h5 "$name-ort.npy" >"$name.serve" ||
    fail "$name: onnx_serve.py exited $?: $(cat "$name.serve")"
done

"$FIXTURE" gpt gpt >/dev/null || fail "onnx_fixture gpt exited $?"
mpi 2 "$BIN" export --checkpoint gpt/ckpt-000000001.h5 --out gpt.onnx >/dev/null ||
  fail "gpt: export exited $?"
"$FIXTURE" llama llama >/dev/null || fail "onnx_fixture llama exited $?"
mpi 2 "$BIN" export --checkpoint llama/ckpt-000000001.h5 --out llama.onnx >/dev/null ||
  fail "llama: export exited $?"

"$PY" - "${models[@]%% *}" <<'EOF' || fail "ONNX Runtime disagrees with ringtrain (table above)"
import sys, h5py, numpy as np, onnx, onnxruntime as ort
bad = []
print(f"{'model':10} {'samples':>7} {'max |d|':>9} {'top-1 agree':>11}  ONNX ops")
def row(name, n, d, agree, ops):
    print(f"{name:10} {n:7d} {d:9.2e} {agree:10.2%}  {' '.join(sorted(ops))}")
    if not (d <= 1e-4 and agree == 1.0):
        bad.append(name)
for name in sys.argv[1:]:
    m = onnx.load(f"{name}.onnx")
    onnx.checker.check_model(m, full_check=True)
    ops = {n.op_type for n in m.graph.node}
    assert "Dropout" not in ops, name
    assert all(a.name != "training_mode" or a.i == 0 for n in m.graph.node for a in n.attribute)
    want = h5py.File(f"{name}-pred.h5", "r")["logits"][:]
    got = np.load(f"{name}-ort.npy")
    assert got.shape == want.shape == (1000, 10), (name, got.shape, want.shape)
    row(name, len(want), float(np.abs(got - want).max()), (got.argmax(1) == want.argmax(1)).mean(), ops)
# the GPT: ids [batch, sequence] -> logits [batch, sequence, vocabulary]
m = onnx.load("gpt.onnx")
onnx.checker.check_model(m, full_check=True)
inits = {t.name for t in m.graph.initializer}
assert "embed.wte" in inits and "head.weight" not in inits, "the LM head is not tied"
uses = [n.op_type for n in m.graph.node if "embed.wte" in n.input]
assert sorted(uses) == ["Gather", "Transpose"], uses
s = ort.InferenceSession("gpt.onnx", providers=["CPUExecutionProvider"])
tok = np.load("gpt/tokens.npy").astype(np.int32)
want = np.load("gpt/logits.npy")
got = s.run(["logits"], {"input": tok})[0]
assert got.shape == want.shape == (4, 24, 256), (got.shape, want.shape)
row("gpt-tiny", tok.size, float(np.abs(got - want).max()),
    (got.argmax(-1) == want.argmax(-1)).mean(), {n.op_type for n in m.graph.node})
prefix = s.run(["logits"], {"input": tok[:, :10]})[0]
d = float(np.abs(prefix - want[:, :10]).max())
print(f"gpt-tiny, the first 10 tokens alone: max |d| {d:.2e} (causal)")
if d > 1e-4:
    bad.append("gpt-tiny prefix")
# llama-tiny: rotary embeddings, grouped-query attention (2 kv heads), RMS norms, SwiGLU
m = onnx.load("llama.onnx")
onnx.checker.check_model(m, full_check=True)
inits = {t.name for t in m.graph.initializer}
assert "embed_tokens.wte" in inits and "lm_head.weight" in inits, "the Llama head is untied"
s = ort.InferenceSession("llama.onnx", providers=["CPUExecutionProvider"])
tok = np.load("llama/tokens.npy").astype(np.int32)
want = np.load("llama/logits.npy")
got = s.run(["logits"], {"input": tok})[0]
assert got.shape == want.shape == (4, 24, 256), (got.shape, want.shape)
row("llama-tiny", tok.size, float(np.abs(got - want).max()),
    (got.argmax(-1) == want.argmax(-1)).mean(), {n.op_type for n in m.graph.node})
prefix = s.run(["logits"], {"input": tok[:, :10]})[0]
d = float(np.abs(prefix - want[:, :10]).max())
print(f"llama-tiny, the first 10 tokens alone: max |d| {d:.2e} (causal, rotary positions from 0)")
if d > 1e-4:
    bad.append("llama-tiny prefix")
print("opset", m.opset_import[0].version, "ir_version", m.ir_version)
sys.exit(1 if bad else 0)
EOF
pass "ONNX export: checker (full) and ONNX Runtime agree with predict (and the GPT's and the Llama's forward)"

# ---- bad input at 2 ranks: one message, exit 1, nothing under --out -----------------------
# refused SUBSTRING [env=VALUE] -- EXPORT-ARGS...: exit 1 (or 2 with RINGTRAIN_TEST_FAIL),
# the message once, no out.onnx nor out.onnx.tmp.
refused() {
  local want=$1 code=1 rc=0 env=()
  shift
  if [[ $1 == RINGTRAIN_TEST_FAIL=* ]]; then
    env=(-x "$1")
    export "${1?}"
    code=2
    shift
  fi
  rm -f bad.onnx bad.onnx.tmp
  mpi 2 "${env[@]}" "$BIN" export "$@" >bad.out 2>bad.err || rc=$?
  unset RINGTRAIN_TEST_FAIL
  [[ $rc -eq $code ]] || fail "export $*: exit $rc, expected $code: $(cat bad.err)"
  [[ $(grep -c "ringtrain: error:" bad.err) -eq 1 ]] || fail "export $*: not one message: $(cat bad.err)"
  grep -qF -- "$want" bad.err || fail "export $*: the message lacks '$want': $(cat bad.err)"
  [[ ! -e bad.onnx && ! -e bad.onnx.tmp ]] || fail "export $*: left a file under --out"
}
ck=ck/mlp/ckpt-000000020.h5
refused "--opset 18 is not supported" --checkpoint "$ck" --opset 18 --out bad.onnx
refused "--format 'tflite' is not known; expected onnx" --checkpoint "$ck" --format tflite --out bad.onnx
refused "nope.h5" --checkpoint nope.h5 --out bad.onnx
"$FIXTURE" plugin plugin >/dev/null || fail "onnx_fixture plugin exited $?"
refused "node 'same' (op custom, type 'test_identity', from a plugin) cannot be exported to ONNX" \
  --checkpoint plugin/ckpt-000000001.h5 --out bad.onnx
touch afile
refused "--out 'afile/bad.onnx': directory 'afile' cannot be created" --checkpoint "$ck" --out afile/bad.onnx
refused "[rank 1 on" RINGTRAIN_TEST_FAIL=1:export --checkpoint "$ck" --out bad.onnx
pass "export at 2 ranks refuses --opset 18, --format tflite, a missing checkpoint, a plugin op and an impossible --out (exit 1), and a failure on rank 1 ends it (exit 2), one message each, nothing left"
