#!/usr/bin/env bash
# A checkpoint read back with h5dump (an independent reader) has the names, shapes, types,
# attributes and Fletcher32 checksums of docs/formats.md; a dataset file too.
source "$(dirname "$0")/lib.sh"
dir=$(workdir h5dump)
mpi 2 "$BIN" train --data "$DATA/train.h5" --precision bf16 --steps 10 --batch-size 16 \
  --optimizer sgd --checkpoint-dir "$dir" --threads 1 >/dev/null
ck=$dir/ckpt-000000010.h5
[[ -f $ck ]] || fail "no checkpoint named ckpt-<9 digits>.h5"
ls "$dir"/*.tmp 2>/dev/null && fail "a .tmp file was left behind"
header=$(h5dump -H -p "$ck")
expect() { grep -qE "$1" <<<"$header" || fail "h5dump shows no $2"; }
for a in format format_version step epoch samples_seen world_size precision model ringtrain_version; do
  expect "ATTRIBUTE \"$a\"" "root attribute $a"
done
expect 'DATASET "fc1.weight"' "/params/fc1.weight"
shape() {  # shape of a dataset as h5dump prints it
  awk -v ds="DATASET \"$1\"" '$0 ~ ds {f=1} f && /DATASPACE/ {print; exit}' <<<"$header"
}
shape fc1.weight | contains '( 512, 784 )' || fail "fc1.weight shape: $(shape fc1.weight)"
shape fc2.weight | contains '( 256, 512 )' || fail "fc2.weight shape"
shape fc3.weight | contains '( 10, 256 )' || fail "fc3.weight shape"
shape fc3.bias | contains '( 10 )' || fail "fc3.bias shape"
grep -A2 'DATASET "fc1.weight"' <<<"$header" | contains H5T_IEEE_F32LE || fail "params are not fp32"
expect 'CHECKSUM FLETCHER32' "Fletcher32 filter"
h5dump -a /precision "$ck" | contains '"bf16"' || fail "precision attribute"
h5dump -a /step "$ck" | contains '(0): 10' || fail "step attribute"
h5dump -a /format "$ck" | contains '"ringtrain-checkpoint"' || fail "format attribute"
m=$(h5dump -d /optimizer/fc1.weight/momentum -H "$ck")
grep -q '( 512, 784 )' <<<"$m" || fail "sgd momentum state"
for a in /loss_scaler/scale /loss_scaler/growth_tracker /data/epoch /data/position /rng/seed /optimizer/step; do
  h5dump -a "$a" "$ck" >/dev/null || fail "attribute $a"
done
pass "checkpoint layout as documented"
d=$(h5dump -H "$DATA/test.h5")
grep -q '( 10000, 1, 28, 28 )' <<<"$d" || fail "dataset /images shape"
h5dump -a /format "$DATA/test.h5" | contains '"ringtrain-dataset"' || fail "dataset format attribute"
pass "dataset layout as documented"

# A second independent reader: h5py (Debian's python3-h5py, which tools/install-deps.sh
# installs). Its absence is a failure, not a skip: the read-back is part of the contract.
/usr/bin/python3 -c 'import h5py, numpy' ||
  fail "/usr/bin/python3 cannot import h5py and numpy: install python3-h5py (tools/install-deps.sh)"
/usr/bin/python3 - "$ck" <<'PY' || fail "h5py read-back"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    assert f.attrs["format"] == b"ringtrain-checkpoint" or f.attrs["format"] == "ringtrain-checkpoint"
    assert int(f.attrs["step"]) == 10 and int(f.attrs["format_version"]) == 1
    shapes = {k: v.shape for k, v in f["params"].items()}
    assert shapes == {"fc1.weight": (512, 784), "fc1.bias": (512,), "fc2.weight": (256, 512),
                      "fc2.bias": (256,), "fc3.weight": (10, 256), "fc3.bias": (10,)}, shapes
    for k, ds in f["params"].items():
        assert ds.dtype == np.float32 and ds.fletcher32, k
        assert np.isfinite(ds[...]).all(), k
    assert f["optimizer"].attrs["name"] in (b"sgd", "sgd")
    assert f["optimizer/fc1.weight/momentum"].shape == (512, 784)
PY
pass "h5py reads the same names, shapes and fp32 values"
