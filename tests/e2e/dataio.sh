#!/usr/bin/env bash
# Data in and predictions out, checked against independent readers (NumPy, PIL, h5py,
# PyTorch): `convert npy|images|cifar` at 1 and 2 ranks (pixels, labels, class names and
# per-channel mean/std as NumPy computes them; shards; resize + centre crop as PIL does
# it), every bad input of the converters and of predict on 2 ranks (exit 1, one message
# naming the file and record, nothing left under --out), `predict` (.h5 written by 2 ranks,
# .npy, probabilities, unlabelled data) against `eval`'s confusion matrix, and the PyTorch
# recipe of docs/interop.md against predict's logits (max |d| <= 1e-5).
source "$(dirname "$0")/lib.sh"
unset RINGTRAIN_DIRECT_READ RINGTRAIN_TEST_FAIL RINGTRAIN_TEST_STALL RINGTRAIN_CONV
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir dataio)
src=$(cd "$(dirname "$0")/../.." && pwd)
cd "$dir" || exit 1
$PY -c 'import numpy, h5py, PIL' || fail "needs Debian's python3-numpy, python3-h5py, python3-pil (tools/install-deps.sh)"

# ---- --help and --print-config of the new commands ------------------------------------
for cmd in "convert npy" "convert images" "convert cifar" predict; do
  # shellcheck disable=SC2086  # $cmd is one or two words
  out=$(mpi 2 "$BIN" $cmd --help) || fail "ringtrain $cmd --help exited $?"
  [[ $(grep -c "^usage: ringtrain $cmd" <<<"$out") -eq 1 ]] || fail "2 ranks, $cmd --help: $out"
done
cfg=$("$BIN" convert cifar --input a.bin b.bin --out o.h5 --print-config)
printf '%s\n' "$cfg" >cifar.ini
[[ "$("$BIN" convert cifar --config cifar.ini --print-config)" == "$cfg" ]] \
  || fail "convert cifar --print-config does not read back: $cfg"
pass "--help of convert npy|images|cifar and predict once at 2 ranks; convert cifar's --input list reads back from --config"

# ---- inputs ---------------------------------------------------------------------------
$PY - <<'EOF'
import os, numpy as np
from PIL import Image
rng = np.random.default_rng(7)
os.makedirs("in", exist_ok=True)
x = rng.integers(0, 256, size=(120, 3, 10, 10), dtype=np.uint8)
y = rng.integers(0, 4, size=120)
np.save("in/x.npy", x)
np.save("in/y.npy", y.astype(np.int64))
np.savez("in/d.npz", images=x.transpose(0, 2, 3, 1), labels=y.astype(np.int16))
np.savez_compressed("in/dc.npz", only=x[:, 0])                       # [N, H, W]: one channel
np.save("in/xf.npy", rng.normal(size=(50, 12)).astype(np.float32))     # [N, D] float32
np.save("in/yf.npy", np.arange(50) % 3)
np.save("in/obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
np.save("in/x_i32.npy", x.astype(np.int32))
np.save("in/y_short.npy", y[:119])
# ImageFolder: 3 classes, PNG and JPEG, 12x16 (HxW) RGB
for k, cls in enumerate(["ant", "bee", "cow"]):
    os.makedirs(f"in/imgs/{cls}", exist_ok=True)
    for i in range(8):
        a = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
        Image.fromarray(a).save(f"in/imgs/{cls}/{i:02d}." + ("png" if i % 2 else "jpg"), quality=90)
# CIFAR-10: two batch files (30 + 20 records) and the class names
for name, n in [("data_batch_1.bin", 30), ("data_batch_2.bin", 20)]:
    rec = np.concatenate([rng.integers(0, 10, size=(n, 1)), rng.integers(0, 256, size=(n, 3072))], 1)
    rec.astype(np.uint8).tofile("in/" + name)
open("in/batches.meta.txt", "w").write("\n".join(
    "airplane automobile bird cat deer dog frog horse ship truck".split()) + "\n\n")
rec = np.concatenate([rng.integers(0, 20, size=(10, 1)), rng.integers(0, 100, size=(10, 1)),
                      rng.integers(0, 256, size=(10, 3072))], 1).astype(np.uint8)
rec.tofile("in/train.bin")  # CIFAR-100
open("in/bad.bin", "wb").write(rec.tobytes()[:3073 * 3 + 5])
rec = np.fromfile("in/data_batch_1.bin", np.uint8).reshape(-1, 3073).copy()
rec[25, 0] = 12  # in rank 1's half
rec.tofile("in/badlabel.bin")
EOF

# ---- convert npy ----------------------------------------------------------------------
"$BIN" convert npy --images in/x.npy --labels in/y.npy --out out/x.h5 >/dev/null
mpi 2 "$BIN" convert npy --images in/d.npz:images --labels in/d.npz:labels --layout nhwc \
  --out out/d.h5 >/dev/null
mpi 2 "$BIN" convert npy --images in/x.npy --labels in/y.npy --out out/sh/x.h5 --shards 3 >/dev/null
"$BIN" convert npy --images in/dc.npz --out out/dc.h5 >/dev/null
"$BIN" convert npy --images in/xf.npy --labels in/yf.npy --out out/xf.h5 >/dev/null
$PY - <<'EOF' || fail "convert npy: the files do not hold what NumPy holds"
import h5py, numpy as np
x, y = np.load("in/x.npy"), np.load("in/y.npy")
for name in ["out/x.h5", "out/d.h5"]:
    with h5py.File(name) as f:
        assert (f["images"][()] == x).all() and (f["labels"][()] == y).all(), name
        assert f.attrs["num_classes"] == y.max() + 1, name
        v = x.astype(np.float64) / 255
        m, s = v.mean(axis=(0, 2, 3)), v.std(axis=(0, 2, 3))
        assert np.abs(f["mean"][()] - m).max() < 1e-12 and np.abs(f["std"][()] - s).max() < 1e-12, name
        assert abs(f.attrs["mean"] - v.mean()) < 1e-12 and abs(f.attrs["std"] - v.std()) < 1e-12, name
parts = [h5py.File(f"out/sh/x-0000{k}-of-00003.h5") for k in range(3)]
assert [p["images"].shape[0] for p in parts] == [40, 40, 40]
assert (np.concatenate([p["images"][()] for p in parts]) == x).all()
assert (np.concatenate([p["labels"][()] for p in parts]) == y).all()
assert all(p.attrs["mean"] == parts[0].attrs["mean"] for p in parts)
with h5py.File("out/dc.h5") as f:
    assert f["images"].shape == (120, 1, 10, 10) and "labels" not in f and "num_classes" not in f.attrs
with h5py.File("out/xf.h5") as f:
    xf = np.load("in/xf.npy")
    assert f["images"].dtype == np.float32 and (f["images"][()] == xf).all()
    assert abs(f["mean"][0] - xf.astype(np.float64).mean()) < 1e-9
EOF
[[ -z $(find out -name '*.tmp') ]] || fail "a .tmp file was left: $(find out -name '*.tmp')"
pass "convert npy: .npy, .npz:key (nhwc), .npz of one array, float32, 3 shards at 2 ranks"

# ---- convert images -------------------------------------------------------------------
"$BIN" convert images --root in/imgs --out out/i1.h5 >/dev/null
mpi 2 "$BIN" convert images --root in/imgs --out out/i2.h5 >/dev/null
h5diff out/i1.h5 out/i2.h5 || fail "convert images: 1 and 2 ranks differ"
mpi 2 "$BIN" convert images --root in/imgs --size 6,6 --out out/r.h5 >/dev/null
mpi 2 "$BIN" convert images --root in/imgs --size 12,12 --grayscale --out out/g.h5 >/dev/null
$PY - <<'EOF' || fail "convert images: the pixels are not what PIL decodes"
import glob, h5py, numpy as np
from PIL import Image
files = sorted(glob.glob("in/imgs/*/*"))
with h5py.File("out/i1.h5") as f:
    assert [s.decode() for s in f["class_names"][()]] == ["ant", "bee", "cow"]
    assert (f["labels"][()] == np.repeat([0, 1, 2], 8)).all()
    got = f["images"][()]
    for i, name in enumerate(files):
        want = np.asarray(Image.open(name).convert("RGB")).transpose(2, 0, 1)
        assert (got[i] == want).all(), (name, np.abs(got[i].astype(int) - want).max())
# --size 6,6: scale 0.5 to 6x8, crop columns 1..7; PIL's bilinear (same triangle filter)
with h5py.File("out/r.h5") as f:
    got = f["images"][()]
    for i, name in enumerate(files):
        want = np.asarray(Image.open(name).convert("RGB").resize((8, 6), Image.BILINEAR))
        want = want[:, 1:7].transpose(2, 0, 1).astype(int)
        d = np.abs(got[i].astype(int) - want).max()
        assert d <= 1, (name, d)
with h5py.File("out/g.h5") as f:
    assert f["images"].shape == (24, 1, 12, 12) and f["mean"].shape == (1,)
EOF
pass "convert images: PNG and JPEG as PIL decodes them, same at 1 and 2 ranks; --size as PIL's bilinear resize (±1) + centre crop; --grayscale"

# ---- convert cifar --------------------------------------------------------------------
mpi 2 "$BIN" convert cifar --input in/data_batch_1.bin in/data_batch_2.bin --out out/c.h5 >/dev/null
"$BIN" convert cifar --input in/train.bin --cifar100 --out out/c100.h5 >/dev/null
$PY - <<'EOF' || fail "convert cifar: records not as written"
import h5py, numpy as np
rec = np.concatenate([np.fromfile(f"in/data_batch_{k}.bin", np.uint8).reshape(-1, 3073) for k in (1, 2)])
with h5py.File("out/c.h5") as f:
    assert (f["labels"][()] == rec[:, 0]).all() and (f["images"][()] == rec[:, 1:].reshape(-1, 3, 32, 32)).all()
    assert f["class_names"][1] == b"automobile" and f.attrs["num_classes"] == 10
rec = np.fromfile("in/train.bin", np.uint8).reshape(-1, 3074)
with h5py.File("out/c100.h5") as f:
    assert (f["labels"][()] == rec[:, 1]).all() and f.attrs["num_classes"] == 100
EOF
pass "convert cifar: CIFAR-10 over two files with class names, CIFAR-100 fine labels"

# ---- bad input: 2 ranks, exit 1, one message, nothing under --out -------------------------
# bad EXPECTED ARGS...: the output directory bad/ must stay empty.
bad() {
  local want=$1
  shift
  rm -rf bad && mkdir bad
  local rc=0
  mpi 2 "$BIN" "$@" >bad.out 2>bad.err || rc=$?
  local n
  n=$(grep -c '^ringtrain: error:' bad.err || true)
  [[ $rc -eq 1 && $n -eq 1 ]] || { cat bad.err; fail "'$*': exit $rc with $n messages, expected 1 and 1"; }
  grep '^ringtrain: error:' bad.err | grep -F -- "$want" >/dev/null \
    || { cat bad.err; fail "'$*': the message does not say '$want'"; }
  [[ -z $(ls -A bad) ]] || fail "'$*' left $(ls -A bad) under --out"
  pass "$(grep '^ringtrain: error:' bad.err)"
}
mkimgs() {  # a fresh copy of the image folder in $1
  rm -rf "$1" && cp -r in/imgs "$1"
}
# The broken file is in the last class: rank 1 of 2 decodes it.
mkimgs b1 && head -c 300 in/imgs/cow/03.png >b1/cow/05.png
bad "image 'b1/cow/05.png' is a corrupt PNG" convert images --root b1 --out bad/x.h5
mkimgs b2 && head -c $(($(stat -c %s in/imgs/cow/02.jpg) * 9 / 10)) in/imgs/cow/02.jpg >b2/cow/06.jpg
bad "image 'b2/cow/06.jpg' is a corrupt JPEG: Premature end of JPEG file" convert images --root b2 --out bad/x.h5
mkimgs b3 && $PY -c "from PIL import Image; Image.new('RGB', (9, 7)).save('b3/cow/07.png')"
bad "image 'b3/cow/07.png' (record 23) is 7x9 (HxW) but 'b3/ant/00.jpg', the first image, is 12x16" \
  convert images --root b3 --out bad/x.h5
mkimgs b4 && mkdir b4/dog
bad "class folder 'b4/dog' holds no .png, .jpg or .jpeg image" convert images --root b4 --out bad/x.h5
bad "'in/obj.npy' holds a NumPy object array (dtype '|O', stored pickled); it is refused, never unpickled" \
  convert npy --images in/obj.npy --out bad/x.h5
bad "--images 'in/x_i32.npy' holds int32; expected uint8 or float32" convert npy --images in/x_i32.npy --out bad/x.h5
bad "--labels 'in/y_short.npy' holds 119 labels but --images 'in/x.npy' holds 120 images" \
  convert npy --images in/x.npy --labels in/y_short.npy --out bad/x.h5
bad "'in/d.npz' holds no array 'pixels'; it holds: images, labels" convert npy --images in/d.npz:pixels --out bad/x.h5
bad "--input 'in/bad.bin' holds 9224 bytes, which is not a multiple of the 3073-byte CIFAR-10 record" \
  convert cifar --input in/data_batch_1.bin in/bad.bin --out bad/x.h5
bad "--input 'in/badlabel.bin': record 25 has label 12; expected 0 to 9" \
  convert cifar --input in/badlabel.bin --out bad/x.h5

# ---- train, predict, eval -------------------------------------------------------------
train() {  # train NAME DATA [options]: 2 ranks, 20 steps, checkpoint in ck/NAME
  local name=$1 data=$2
  shift 2
  mpi 2 "$BIN" train --data "$data" --steps 20 --batch-size 8 --threads 1 --seed 5 \
    --checkpoint-dir "ck/$name" "$@" >/dev/null
}
train mlp out/x.h5 --hidden 32
train cnn out/c.h5 --model cnn
train resnet out/g.h5 --model resnet --width 4 --activation gelu
mlp=ck/mlp/ckpt-000000020.h5 cnn=ck/cnn/ckpt-000000020.h5

mpi 2 "$BIN" predict --checkpoint "$cnn" --data out/c.h5 --out pred/c.h5 --top-k 3 >/dev/null
mpi 2 "$BIN" predict --checkpoint "$cnn" --data out/c.h5 --out pred/c.npy >/dev/null
"$BIN" predict --checkpoint "$cnn" --data out/c.h5 --out pred/c1.npy --batch-size 7 >/dev/null
mpi 2 "$BIN" predict --checkpoint "$cnn" --data out/c.h5 --out pred/cp.h5 --probabilities >/dev/null
rm -f eval.jsonl
mpi 2 "$BIN" eval --checkpoint "$cnn" --data out/c.h5 --metrics eval.jsonl >eval.txt
$PY - <<'EOF' || { cat eval.txt; fail "predict/eval disagree"; }
import h5py, json, numpy as np
with h5py.File("pred/c.h5") as f, h5py.File("out/c.h5") as d:
    assert f.attrs["format"] == b"ringtrain-predictions" and f.attrs["scores"] == b"logits"
    logits, top, labels = f["logits"][()], f["top_k"][()], f["labels"][()]
    top_scores = f["top_k_scores"][()]
    assert logits.shape == (50, 10) and top.shape == (50, 3)
    assert (labels == d["labels"][()]).all() and (f["class_names"][()] == d["class_names"][()]).all()
order = np.argsort(-logits, axis=1, kind="stable")[:, :3]
assert (top == order).all() and np.array_equal(top_scores, np.take_along_axis(logits, order, 1))
npy = np.load("pred/c.npy")
assert npy.dtype == np.float32 and np.array_equal(npy, logits), "pred/c.npy differs from pred/c.h5"
one = np.load("pred/c1.npy")  # 1 rank, batches of 7
assert np.abs(one - logits).max() <= 1e-6, np.abs(one - logits).max()
with h5py.File("pred/cp.h5") as f:
    p = f["probabilities"][()]
e = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
assert np.abs(p - e / e.sum(1, keepdims=True)).max() < 1e-6
rec = [json.loads(l) for l in open("eval.jsonl")][-1]
pred = logits.argmax(1)
conf = np.zeros((10, 10), int)
np.add.at(conf, (labels, pred), 1)
assert rec["confusion"] == conf.tolist(), (rec["confusion"], conf.tolist())
assert abs(rec["accuracy"] - (pred == labels).mean()) < 1e-12
for k, c in enumerate(rec["per_class"]):
    tp, n_pred, n_true = conf[k, k], conf[:, k].sum(), conf[k].sum()
    assert c["samples"] == n_true and c["predicted"] == n_pred
    assert abs(c["accuracy"] - (50 - n_true - n_pred + 2 * tp) / 50) < 1e-9
    assert (c["precision"] is None) == (n_pred == 0) and (n_pred == 0 or abs(c["precision"] - tp / n_pred) < 1e-9)
    assert (c["recall"] is None) == (n_true == 0) and (n_true == 0 or abs(c["recall"] - tp / n_true) < 1e-9)
assert rec["per_class"][1]["name"] == "automobile"
EOF
grep -q "^automobile " eval.txt || { cat eval.txt; fail "eval's table does not name the classes"; }
grep -q "^confusion matrix (rows: label, columns: predicted class)" eval.txt || fail "eval printed no confusion matrix"
pass "predict: .h5 by 2 ranks = .npy = 1 rank (1e-6), top-k, probabilities; eval's confusion matrix and per-class figures match predict's"

mpi 2 "$BIN" predict --checkpoint "$mlp" --data out/x.h5 --out pred/x.npy >/dev/null
mpi 2 "$BIN" convert npy --images in/x.npy --out out/unlabelled.h5 >/dev/null
mpi 2 "$BIN" predict --checkpoint "$mlp" --data out/unlabelled.h5 --out pred/u.h5 >/dev/null
$PY -c "
import h5py, numpy as np
f = h5py.File('pred/u.h5')
assert 'labels' not in f and np.array_equal(f['logits'][()], np.load('pred/x.npy'))
" || fail "predict on unlabelled data differs from the labelled run"
pass "predict on unlabelled data: same logits, no /labels"
bad "dataset 'out/unlabelled.h5' has no /labels; training and eval need labelled data" \
  eval --checkpoint "$mlp" --data out/unlabelled.h5
bad "--data 'out/c.h5' has samples of shape [3, 32, 32] but checkpoint '$mlp' holds a model for [3, 10, 10]" \
  predict --checkpoint "$mlp" --data out/c.h5 --out bad/p.h5
bad "--out 'bad/p.csv' must end in .h5" predict --checkpoint "$mlp" --data out/x.h5 --out bad/p.csv

# ---- the NumPy example and the PyTorch recipe of docs/interop.md -----------------------
# shellcheck disable=SC2016  # the backquotes are markdown's, not the shell's
sed -n '/^## NumPy and h5py/,/^A predictions file/p' "$src/docs/interop.md" | sed -n '/^```python/,/^```$/p' |
  sed '1d;$d' | sed "s#ckpt/ckpt-000000050.h5#$mlp#; s#data/test.h5#out/x.h5#" >numpy_example.py
got=$($PY numpy_example.py)
want=$($PY -c "import numpy as np; print(np.load('pred/x.npy')[:8].argmax(1))")
[[ -n $got && $got == "$want" ]] || fail "interop.md's NumPy example predicts $got, predict $want"
pass "interop.md's NumPy MLP example predicts what predict does: $got"

$PY -c 'import torch' || fail "the PyTorch recipe needs Debian's python3-torch (tools/install-deps.sh)"
# shellcheck disable=SC2016
sed -n '/<!-- interop: torch_recipe.py -->/,/^```$/p' "$src/docs/interop.md" | sed '1,2d;$d' >torch_recipe.py
[[ $(wc -l <torch_recipe.py) -gt 50 ]] || fail "the recipe block was not found in docs/interop.md"
for model in mlp:out/x.h5 cnn:out/c.h5 resnet:out/g.h5; do
  name=${model%%:*} data=${model#*:}
  ck=ck/$name/ckpt-000000020.h5
  mpi 2 "$BIN" predict --checkpoint "$ck" --data "$data" --out "pred/$name-rt.npy" >/dev/null
  $PY torch_recipe.py "$ck" "$data" "pred/$name-torch.npy" >/dev/null
  $PY - "$name" <<'EOF' || fail "$name: PyTorch's logits differ from predict's"
import sys, numpy as np
name = sys.argv[1]
rt, pt = np.load(f"pred/{name}-rt.npy"), np.load(f"pred/{name}-torch.npy")
d = np.abs(rt - pt).max()
print(f"{name}: {rt.shape[0]} samples, max |torch - ringtrain| = {d:.2e}, "
      f"arg-max agreement {(rt.argmax(1) == pt.argmax(1)).mean():.0%}")
assert rt.shape == pt.shape and d <= 1e-5 and (rt.argmax(1) == pt.argmax(1)).all()
EOF
done
pass "PyTorch recipe (docs/interop.md): mlp, cnn, resnet (gelu, BatchNorm) logits within 1e-5 of predict"
