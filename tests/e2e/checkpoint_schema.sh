#!/usr/bin/env bash
# The checkpoint schema end to end, on 3-channel (RGB) data: `inspect` prints the
# per-channel normalisation as lists and exits 0, `inspect --schema` prints the table, and
# copies tampered with by h5py (a required attribute removed, one of another type, a
# non-finite value) are refused by inspect, eval and --resume at 2 ranks with one message
# naming the attribute. Checkpoints are deterministic: the same 2-rank run twice, and
# --zero 1 against --zero 0, write the same bytes but for HDF5's object modification times
# (1-second clock; tools/checkpoint_cmp.py); 1 rank against 2 (same global batch) gives the same attributes but
# world_size and the same tensors up to summation order.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
$PY -c 'import numpy, h5py' || fail "needs Debian's python3-numpy and python3-h5py (tools/install-deps.sh)"
dir=$(workdir checkpoint_schema)
src=$(cd "$(dirname "$0")/../.." && pwd)
cd "$dir" || exit 1

$PY - <<'EOF'
import numpy as np
rng = np.random.default_rng(5)
x = rng.integers(0, 256, size=(256, 3, 8, 8), dtype=np.uint8)
x[:, 0] //= 4  # channels with different means
np.save("x.npy", x)
np.save("y.npy", rng.integers(0, 4, size=256).astype(np.int64))
EOF
"$BIN" convert npy --images x.npy --labels y.npy --out rgb.h5 >/dev/null

train() {  # DIR RANKS ARGS...: 6 steps of global batch 16 on the RGB data
  local d=$1 n=$2
  shift 2
  mpi "$n" "$BIN" train --data rgb.h5 --steps 6 --global-batch-size 16 --threads 1 \
    --optimizer sgd --momentum 0.9 --checkpoint-dir "$d" "$@" >"$d.log" 2>&1 || { cat "$d.log"; fail "train $d exited $?"; }
  [[ -f $d/ckpt-000000006.h5 ]] || fail "train $d wrote no ckpt-000000006.h5"
}
train a 2
train b 2
train z 2 --zero 1
train one 1
ck=a/ckpt-000000006.h5

# ---- inspect: exit 0, the three means as a list, equal to the data's /mean --------------
out=$("$BIN" inspect "$ck") || fail "inspect of an RGB checkpoint exited $?: $out"
grep -q '^valid: yes' <<<"$out" || fail "inspect: not valid: $out"
means=$(grep '^  @input_channel_mean = ' <<<"$out") || fail "inspect shows no input_channel_mean"
grep -q '^  @input_channel_std = \[.*, .*, .*\]$' <<<"$out" || fail "inspect: input_channel_std"
$PY - "$means" <<'EOF' || fail "inspect's input_channel_mean is not the data's /mean: $means"
import sys, h5py, numpy as np
shown = [float(v) for v in sys.argv[1].split("=", 1)[1].strip().strip("[]").split(",")]
with h5py.File("rgb.h5", "r") as f:
    want = f["mean"][...]
assert len(shown) == 3 and np.allclose(shown, want, rtol=1e-8), (shown, want)
EOF
pass "inspect of an RGB checkpoint: exit 0, $means"
"$BIN" eval --checkpoint "$ck" --data rgb.h5 >eval.out 2>&1 || { cat eval.out; fail "eval exited $?"; }
pass "eval of the RGB checkpoint"
schema=$("$BIN" inspect --schema) || fail "inspect --schema exited $?"
# shellcheck disable=SC2016  # the backquotes are the markdown's
grep -qF '| `input_channel_mean` | float64 [C] |' <<<"$schema" || fail "inspect --schema: $schema"
# shellcheck disable=SC2016
grep -qF '| `/data` `position` | int64 | required (v1) |' <<<"$schema" || fail "inspect --schema"
pass "inspect --schema prints the table"

# ---- tampered copies: refused, naming the attribute --------------------------------------
tamper() {  # NAME PYTHON: a copy of $ck changed by PYTHON (f is the open h5py.File)
  cp "$ck" "$1.h5"
  $PY - "$1.h5" "$2" <<'EOF' || fail "h5py could not tamper with $1"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}
has() { grep -qF -- "$1" <<<"$2"; }  # TEXT IN: a fixed string, not a pattern
refused() {  # NAME MESSAGE: inspect, eval and --resume (2 ranks) refuse NAME.h5 naming MESSAGE
  local rc=0
  "$BIN" inspect "$1.h5" >"$1.inspect" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$1.inspect"; fail "inspect $1 exited $rc, expected 1"; }
  has "$2" "$(grep -F 'valid: NO' "$1.inspect")" || { cat "$1.inspect"; fail "inspect $1: no '$2'"; }
  rc=0
  mpi 2 "$BIN" eval --checkpoint "$1.h5" --data rgb.h5 >"$1.eval" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$1.eval"; fail "eval $1 exited $rc, expected 1"; }
  [[ $(grep -c 'error:' "$1.eval") -eq 1 ]] || { cat "$1.eval"; fail "eval $1: not one message"; }
  has "$2" "$(grep 'error:' "$1.eval")" || { cat "$1.eval"; fail "eval $1: no '$2'"; }
  rc=0
  mpi 2 "$BIN" train --data rgb.h5 --steps 8 --global-batch-size 16 --threads 1 \
    --optimizer sgd --momentum 0.9 --checkpoint-dir "r-$1" --resume "$1.h5" >"$1.resume" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$1.resume"; fail "--resume $1 exited $rc, expected 1"; }
  has "$2" "$(grep 'error:' "$1.resume")" || { cat "$1.resume"; fail "--resume $1: no '$2'"; }
  pass "$1 refused by inspect, eval and --resume: $(grep 'error:' "$1.eval")"
}
tamper no_position 'del f["data"].attrs["position"]'
refused no_position "lacks the int64 attribute '/data position'"
tamper step_string 'f.attrs["step"] = "six"'
refused step_string "attribute 'step' is a string; expected int64"
grep -qF '@step = "six"  (expected one int64)' step_string.inspect || fail "inspect marks no type"
tamper nan_std 'f.attrs["input_channel_std"] = np.array([0.2, np.nan, 0.2])'
refused nan_std "input_channel_std[1] is nan; expected a finite value > 0"

# ---- determinism -------------------------------------------------------------------------
# Byte comparison that allows only HDF5's 1-second modification times to differ.
same_bytes() { $PY "$src/tools/checkpoint_cmp.py" "$1" "$2"; }
same_bytes a/ckpt-000000006.h5 b/ckpt-000000006.h5 || fail "two 2-rank runs wrote different checkpoints"
same_bytes a/ckpt-000000006.h5 z/ckpt-000000006.h5 || fail "--zero 1 wrote another checkpoint than --zero 0"
pass "the same 2-rank run twice, and --zero 1, write the same bytes (modification times aside)"
$PY - a/ckpt-000000006.h5 one/ckpt-000000006.h5 <<'EOF' || fail "1 and 2 ranks differ beyond summation order"
import sys, h5py, numpy as np
def attrs(f):
    out = {}
    f.visititems(lambda n, o: out.update({f"{n}@{k}": v for k, v in o.attrs.items()}))
    out.update({f"@{k}": v for k, v in f.attrs.items()})
    return out
with h5py.File(sys.argv[1], "r") as two, h5py.File(sys.argv[2], "r") as one:
    a, b = attrs(two), attrs(one)
    assert a.pop("@world_size") == 2 and b.pop("@world_size") == 1
    a.pop("@meta_checksum"), b.pop("@meta_checksum")  # covers world_size too
    assert a.keys() == b.keys(), a.keys() ^ b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), (k, a[k], b[k])
    names = []
    two.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    assert len(names) == 12, names  # 3 layers' weight and bias, and their momentum
    for n in names:
        x, y = two[n][...], one[n][...]
        assert x.shape == y.shape and x.dtype == y.dtype, n
        assert np.allclose(x, y, rtol=1e-5, atol=1e-7), (n, np.abs(x - y).max())
EOF
pass "1 rank and 2 ranks: same attributes but world_size (and meta_checksum), same tensors up to summation order"
