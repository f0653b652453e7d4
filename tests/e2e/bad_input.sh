#!/usr/bin/env bash
# Bad input on 2 ranks: each case exits 1 with exactly one message (from one rank) that
# names the file/option/value, within the timeout (no hang of the other ranks); and a good
# checkpoint is never replaced by a failed run.
source "$(dirname "$0")/lib.sh"
dir=$(workdir bad-input)
echo "not hdf5" >"$dir/text.h5"
# A wrong-schema HDF5 file: only /images, no root attributes, no /labels.
h5copy -i "$DATA/test.h5" -o "$dir/nolabels.h5" -s /images -d /images
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 3 --hidden 32 --checkpoint-dir "$dir/ck" \
  --threads 1 >/dev/null
good=$dir/ck/ckpt-000000003.h5
sum_before=$(md5sum "$good")
printf 'steps = 3\nno-such-key = 1\n' >"$dir/bad.ini"

# check EXPECTED-SUBSTRING ARGS...: 2 ranks, exit 1, one error line containing the substring.
check() {
  local want=$1
  shift
  local rc=0
  mpi 2 "$BIN" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  local n
  n=$(grep -c '^ringtrain: error:' "$dir/err" || true)
  [[ $rc -eq 1 ]] || { cat "$dir/err"; fail "'$*' exited $rc, expected 1"; }
  [[ $n -eq 1 ]] || { cat "$dir/err"; fail "'$*' printed $n error messages, expected 1"; }
  grep '^ringtrain: error:' "$dir/err" | grep -F -- "$want" >/dev/null \
    || { cat "$dir/err"; fail "'$*': message does not name '$want'"; }
  pass "$(grep '^ringtrain: error:' "$dir/err")"
}

check "'$dir/missing.h5' does not exist" train --data "$dir/missing.h5"
check "is not an HDF5 file" train --data "$dir/text.h5"
check "attribute 'format' is missing" train --data "$dir/nolabels.h5"
check "is not a ringtrain dataset" train --data "$good"
check "--bogus" train --data "$DATA/train.h5" --bogus 1
check "--precision 'fp8'" train --data "$DATA/train.h5" --precision fp8
check "--batch-size" train --data "$DATA/train.h5" --batch-size many
check "--batch-size -4" train --data "$DATA/train.h5" --batch-size -4
check "--optimizer 'lamb'" train --data "$DATA/train.h5" --optimizer lamb
check "--global-batch-size 63 does not divide by 2 ranks" train --data "$DATA/train.h5" --global-batch-size 63
check "no-such-key" train --config "$dir/bad.ini" --data "$DATA/train.h5"
check "--config '$dir/none.ini'" train --config "$dir/none.ini" --data "$DATA/train.h5"
# Without a GPU (or a CUDA backend) --device cuda is an input error; with one it trains.
if ! nvidia-smi -L >/dev/null 2>&1; then
  check "--device 'cuda'" train --data "$DATA/train.h5" --device cuda
  check "--device 'cuda'" eval --checkpoint "$good" --data "$DATA/test.h5" --device cuda
fi
check "builds (models/mlp.pbtxt): node 'fc1'" train --data "$DATA/train.h5" --steps 6 --hidden 16 --checkpoint-dir "$dir/ck" --threads 1
check "was trained with --optimizer adamw" train --data "$DATA/train.h5" --steps 6 --hidden 32 --optimizer sgd --checkpoint-dir "$dir/ck" --threads 1
check "is not a ringtrain checkpoint" eval --checkpoint "$DATA/test.h5" --data "$DATA/test.h5"
check "is not an HDF5 file" eval --checkpoint "$dir/text.h5" --data "$DATA/test.h5"
check "unknown command 'fit'" fit
check "'$dir/none.gz' does not exist" convert idx --images "$dir/none.gz" --labels "$dir/none.gz" --out "$dir/x.h5"

# Damaged files: a truncated dataset; a truncated and a bit-flipped checkpoint named by
# --resume FILE (with --resume auto they are skipped instead: see restart.sh).
cp "$DATA/test.h5" "$dir/trunc-data.h5"
truncate -s 3000000 "$dir/trunc-data.h5"
check "truncated file" train --data "$dir/trunc-data.h5"
cp "$good" "$dir/trunc-ck.h5"
truncate -s 100000 "$dir/trunc-ck.h5"
check "is not a usable checkpoint" train --data "$DATA/train.h5" --hidden 32 --resume "$dir/trunc-ck.h5"
cp "$good" "$dir/flip-ck.h5"
python3 - "$dir/flip-ck.h5" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(len(f.read()) // 2); f.write(b"\x5a" * 256)
PY
check "fails its checksum" train --data "$DATA/train.h5" --hidden 32 --resume "$dir/flip-ck.h5"

check "already holds 1 checkpoint" train --data "$DATA/train.h5" --hidden 32 --resume never --checkpoint-dir "$dir/ck"
check "--overwrite only applies with --resume never" train --data "$DATA/train.h5" --overwrite
# --out's directory is created when missing (cli.sh); one that cannot be made is named.
check "directory '$dir/text.h5/sub' cannot be created" convert idx --images a --labels b \
  --out "$dir/text.h5/sub/x.h5"
rc=0
"$BIN" inspect "$dir/flip-ck.h5" >"$dir/out" 2>&1 || rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "valid: NO" "$dir/out"; then
  fail "inspect of a damaged checkpoint exited $rc"
fi
pass "inspect exits 1 on a damaged checkpoint"

[[ "$(md5sum "$good")" == "$sum_before" ]] || fail "the good checkpoint was modified"
[[ $(find "$dir/ck" -name 'ckpt-*' | wc -l) -eq 1 ]] || fail "failed runs left checkpoint files"
pass "the good checkpoint is untouched"
