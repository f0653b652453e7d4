#!/usr/bin/env bash
# Hostile metadata and structure on 2 ranks, the bad input on rank 1 only where the ranks
# can differ (MPMD: rank 0 gets the good file or value): normalisation statistics that are not
# finite or absurd (dataset and checkpoint), an exponent bit flipped in a checkpoint's
# input_std (the metadata checksum), precision "fp8" and float64 parameters, /images as a
# group, an init that overflows float32, --top-k above the classes, RINGTRAIN_DIRECT_READ=2,
# --print-config checking what train checks (with did-you-mean for --set and INI
# section keys), and SIGTERM to rank 1 while it is still in MPI_Init. Files are edited with
# h5py (an independent writer). Each refusal: exit 1 and exactly one error line naming the
# file or value.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir hostile-meta)
base=(train --hidden 16 --batch-size 16 --threads 1)
train=("${base[@]}" --steps 2)

# expect_refusal RC WANT CMD...: CMD (each command below has a `timeout 60`), exit RC,
# exactly one error line, which contains WANT.
expect_refusal() {
  local want_rc=$1 want=$2 rc=0
  shift 2
  "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -ne 124 ]] || { cat "$dir/err"; fail "'$*' hung"; }
  [[ $rc -eq $want_rc ]] || { cat "$dir/out" "$dir/err"; fail "'$*' exited $rc, expected $want_rc"; }
  local msg
  msg=$(grep '^ringtrain: error:' "$dir/err" || true)
  [[ $(grep -c . <<<"$msg") -eq 1 ]] || { cat "$dir/err"; fail "'$*': expected one error line"; }
  grep -qF -- "$want" <<<"$msg" || fail "'$*': '$msg' does not say '$want'"
  pass "$msg"
}
# on_rank1 GOOD-ARGS -- BAD-ARGS: rank 0 runs ringtrain with the first, rank 1 with the second.
on_rank1() {
  local -a rank0=()
  while [[ $1 != -- ]]; do rank0+=("$1"); shift; done
  shift
  timeout 60 mpirun -n 1 "$BIN" "${rank0[@]}" : -n 1 "$BIN" "$@"
}
two() { timeout 60 mpirun -n 2 "$BIN" "$@"; }  # two ARGS...: ringtrain on 2 ranks
# edit SRC DST PYTHON-ON-f: a copy of SRC, edited with h5py.
edit() {
  cp "$1" "$2"
  "$PY" -c "import h5py, numpy as np, struct
with h5py.File('$2', 'r+') as f:
    $3"
}

# ---- class 5: normalisation statistics, read from a dataset ---------------------------------
for c in "inf_mean:f.attrs['mean'] = float('inf'):attribute mean is inf" \
  "inf_std:f.attrs['std'] = float('inf'):attribute std is inf" \
  "tiny_std:f.attrs['std'] = 1e-300:attribute std is 1e-300" \
  "nan_mean:f.attrs['mean'] = float('nan'):attribute mean is nan"; do
  IFS=: read -r name stmt want <<<"$c"
  # The per-channel /mean, /std win over the attributes: without them the attributes are used.
  edit "$DATA/train.h5" "$dir/$name.h5" "del f['mean'], f['std']; $stmt"
  expect_refusal 1 "dataset '$dir/$name.h5': $want" \
    on_rank1 "${train[@]}" --data "$DATA/train.h5" -- "${train[@]}" --data "$dir/$name.h5"
done

# ---- ... from a checkpoint, and the metadata checksum ----------------------------------------
mpi 2 "$BIN" "${train[@]}" --data "$DATA/train.h5" --checkpoint-dir "$dir/ck" >/dev/null
good=$dir/ck/ckpt-000000002.h5
ev=(eval --data "$DATA/test.h5" --threads 1)
edit "$good" "$dir/std.h5" "f.attrs['input_std'] = 1e-300"
expect_refusal 1 "'$dir/std.h5' holds impossible metadata: input_std is 1e-300" \
  on_rank1 "${ev[@]}" --checkpoint "$good" -- "${ev[@]}" --checkpoint "$dir/std.h5"
edit "$good" "$dir/mean.h5" "f.attrs['input_mean'] = 1e308"
expect_refusal 1 "input_mean is 1e+308" two "${ev[@]}" --checkpoint "$dir/mean.h5"
# One exponent bit of input_std flipped: a plausible value, caught by the checksum alone.
edit "$good" "$dir/flip.h5" "v = struct.unpack('<Q', struct.pack('<d', float(f.attrs['input_std'])))[0]
    f.attrs['input_std'] = struct.unpack('<d', struct.pack('<Q', v ^ (1 << 52)))[0]"
expect_refusal 1 "'$dir/flip.h5' is damaged: its metadata (root and group attributes) fails its checksum" \
  on_rank1 "${ev[@]}" --checkpoint "$good" -- "${ev[@]}" --checkpoint "$dir/flip.h5"
rc=0
"$BIN" inspect "$dir/flip.h5" >"$dir/inspect" || rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "valid: NO: .*fails its checksum" "$dir/inspect"; then
  fail "inspect of flip.h5 exited $rc: $(tail -n 1 "$dir/inspect")"
fi
# The checksum as docs/formats.md defines it, computed here independently, is the stored one.
"$PY" - "$good" <<'PY' || fail "meta_checksum does not match the documented canonical form"
import struct, sys, zlib
import h5py, numpy as np
recs = {}
with h5py.File(sys.argv[1], "r") as f:
    groups = [("", f)]
    f.visititems(lambda n, o: groups.append(("/" + n, o)) if isinstance(o, h5py.Group) else None)
    for path, g in groups:
        for name, v in g.attrs.items():
            key = path + "/" + name
            if key == "/meta_checksum":
                continue
            a = np.asarray(v)
            if isinstance(v, (bytes, str)):
                text = "s" + (v.decode() if isinstance(v, bytes) else v)
            elif a.dtype.kind in "iu":
                text = "i" + ",".join(str(int(x)) for x in a.ravel())
            elif a.dtype.kind == "f":
                text = "f" + ",".join("%016x" % struct.unpack("<Q", struct.pack("<d", float(x)))[0]
                                      for x in a.ravel())
            else:
                text = "x"
            recs[key] = key.encode() + b"\0" + text.encode() + b"\0"
    want = int(f.attrs["meta_checksum"])
got = zlib.crc32(b"".join(recs[k] for k in sorted(recs, key=lambda k: k.encode())))
assert got == want, (got, want)
PY
# A checkpoint from before the checksum (no meta_checksum) still evaluates.
edit "$good" "$dir/old.h5" "del f.attrs['meta_checksum']"
mpi 2 "$BIN" "${ev[@]}" --checkpoint "$dir/old.h5" | contains "accuracy" || fail "eval of old.h5"
pass "meta_checksum matches the documented form; a checkpoint without one still evaluates"

# ---- class 7: precision, parameter dtype, a group for a dataset, --top-k ---------------------
edit "$good" "$dir/fp8.h5" "f.attrs['precision'] = 'fp8'"
expect_refusal 1 "precision is 'fp8'; expected fp32, fp16 or bf16" \
  on_rank1 "${ev[@]}" --checkpoint "$good" -- "${ev[@]}" --checkpoint "$dir/fp8.h5"
mkdir -p "$dir/resume"
cp "$dir/fp8.h5" "$dir/resume/ckpt-000000002.h5"
expect_refusal 1 "precision is 'fp8'" two "${base[@]}" --data "$DATA/train.h5" \
  --steps 4 --resume "$dir/resume/ckpt-000000002.h5"
edit "$good" "$dir/f64.h5" "w = f['params/fc1.weight'][...]; del f['params/fc1.weight']
    f.create_dataset('params/fc1.weight', data=w.astype(np.float64))"
expect_refusal 1 "'params/fc1.weight' is stored as float64; expected fp32" \
  on_rank1 "${ev[@]}" --checkpoint "$good" -- "${ev[@]}" --checkpoint "$dir/f64.h5"
expect_refusal 1 "'params/fc1.weight' is stored as float64" two "${base[@]}" \
  --data "$DATA/train.h5" --steps 4 --resume "$dir/f64.h5"
edit "$DATA/test.h5" "$dir/group.h5" "del f['images']; f.create_group('images')"
expect_refusal 1 "'$dir/group.h5': /images is a group; expected a dataset" \
  on_rank1 "${train[@]}" --data "$DATA/train.h5" -- "${train[@]}" --data "$dir/group.h5"
expect_refusal 1 "--top-k 11 is not valid; expected 1 to 10 (the model's classes)" \
  two predict --checkpoint "$good" --data "$DATA/test.h5" --out "$dir/p.h5" \
  --top-k 11 --threads 1
mpi 2 "$BIN" predict --checkpoint "$good" --data "$DATA/test.h5" --out "$dir/p.h5" --top-k 10 \
  --threads 1 | contains "top-10" || fail "predict --top-k 10 of 10 classes"
expect_refusal 1 "RINGTRAIN_DIRECT_READ" timeout 60 mpirun -n 1 "$BIN" "${train[@]}" --data "$DATA/train.h5" \
  : -n 1 env RINGTRAIN_DIRECT_READ=2 "$BIN" "${train[@]}" --data "$DATA/train.h5"
grep -F "[rank 1 " "$dir/err" | contains "RINGTRAIN_DIRECT_READ" || fail "the message does not name rank 1"

# ---- class 5: an init that makes non-finite weights ------------------------------------------
cat >"$dir/huge.pbtxt" <<'EOF'
format_version: 1
name: "huge"
node { name: "flat" flatten {} }
node { name: "fc" linear { out_features: 10 } init { param: "weight" kind: NORMAL std: 1e300 } }
EOF
expect_refusal 1 "huge.pbtxt:4:" two train --data "$DATA/train.h5" --steps 2 --threads 1 \
  --model "$dir/huge.pbtxt"
grep -qF "NORMAL needs a positive std of at most 1e+37, got 1e+300" "$dir/err" || fail "init message"

# ---- papercuts: --print-config checks what train checks ---------------------------------------
pc=(train --data "$DATA/train.h5" --threads 1)
expect_refusal 1 "dataset '$dir/none.h5' does not exist" \
  two train --data "$dir/none.h5" --print-config
expect_refusal 1 "--hidden: model 'cnn'" two "${pc[@]}" --model cnn --hidden 3 \
  --print-config
expect_refusal 1 "has no parameter 'widht' (did you mean width?)" \
  two "${pc[@]}" --model resnet --set widht=3 --print-config
printf '[train]\nstpes = 3\n' >"$dir/section.ini"
expect_refusal 1 "unrecognised key 'train.stpes'; did you mean steps? ([sections] are not read" \
  two "${pc[@]}" --config "$dir/section.ini" --print-config
# Other papercuts: --size names its own form; --help lists every shipped model.
expect_refusal 1 "--size '32x32' is not valid; expected H,W (two positive integers up to 65536), e.g. 64,64" \
  timeout 60 "$BIN" convert images --root "$dir" --size 32x32 --out "$dir/x.h5"
help=$("$BIN" train --help)
for m in cnn gpt-tiny gpt2-124m mlp resnet; do
  grep -q -- "$m" <<<"$help" || fail "train --help does not list the shipped model $m"
done
out=$(mpi 2 "$BIN" "${pc[@]}" --model resnet --set width=8 --print-config)
grep -qx "set = width=8" <<<"$out" || fail "--print-config of a good command: $out"
pass "--print-config of a good command prints the configuration"

# ---- class 8: SIGTERM to rank 1 while it is in MPI_Init ---------------------------------------
# Rank 0 starts 3 s late, so rank 1 waits in MPI_Init for it when the signal comes at 1.5 s;
# the run then stops at its first step boundary with a checkpoint, like a signal a moment later.
cat >"$dir/late.sh" <<'EOF'
#!/bin/sh
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then sleep 3; else (sleep 1.5; kill -TERM $$) & fi
exec "$@"
EOF
chmod +x "$dir/late.sh"
rc=0
timeout 60 mpirun -n 2 "$dir/late.sh" "$BIN" "${base[@]}" --data "$DATA/train.h5" --steps 50 \
  --checkpoint-dir "$dir/init-ck" >"$dir/init.out" 2>"$dir/init.err" || rc=$?
[[ $rc -eq 75 ]] || { cat "$dir/init.out" "$dir/init.err"; fail "SIGTERM in MPI_Init: exit $rc, expected 75"; }
grep -q "^stopped by SIGTERM on rank 1 at step [0-9]*; checkpoint $dir/init-ck/ckpt-" "$dir/init.out" \
  || { cat "$dir/init.out"; fail "no stop line naming SIGTERM on rank 1"; }
pass "SIGTERM to rank 1 in MPI_Init: $(grep '^stopped by' "$dir/init.out")"
