#!/usr/bin/env bash
# Bad files on 2 ranks, built here with h5py (an independent writer): checkpoints with
# non-finite or impossible values, a directory of only damaged checkpoints, a locked
# checkpoint directory, a dataset declaring 10^12 samples, a FIFO, a missing shard, IDX
# headers that overflow, a model too large for the machine, NaN float images, h5py's
# default string attributes, --metrics on /dev/full and --tensorboard on a tmpfs that fills
# up. Each error case checks the exit
# code and that exactly one "ringtrain: error:" line names the file or value.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
unset RINGTRAIN_DIRECT_READ RINGTRAIN_TEST_DIE_BEFORE_RENAME
PY=/usr/bin/python3
dir=$(workdir bad-files)

# run N RC EXPECTED-SUBSTRING ARGS...: N ranks under `timeout 60`, exit RC, exactly one
# error line, which contains the substring.
run() {
  local n=$1 want_rc=$2 want=$3
  shift 3
  local rc=0
  timeout 60 mpirun -n "$n" "$BIN" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -ne 124 ]] || { cat "$dir/err"; fail "'$*' hung (timeout 60 s)"; }
  local count
  count=$(grep -c '^ringtrain: error:' "$dir/err" || true)
  [[ $rc -eq $want_rc ]] || { cat "$dir/err"; fail "'$*' exited $rc, expected $want_rc"; }
  [[ $count -eq 1 ]] || { cat "$dir/err"; fail "'$*' printed $count error messages, expected 1"; }
  grep '^ringtrain: error:' "$dir/err" | grep -F -- "$want" >/dev/null \
    || { cat "$dir/err"; fail "'$*': message does not name '$want'"; }
  pass "$(grep '^ringtrain: error:' "$dir/err")"
}

train=(train --data "$DATA/train.h5" --hidden 16 --optimizer adamw --threads 1)

# A good adamw checkpoint to damage in several ways (h5py edits values, checksums stay valid).
mpi 2 "$BIN" "${train[@]}" --steps 2 --checkpoint-dir "$dir/good" >/dev/null
good=$dir/good/ckpt-000000002.h5
damage() {  # damage NAME PYTHON-STATEMENTS-ON-f: a copy of the good checkpoint, edited
  cp "$good" "$dir/$1.h5"
  "$PY" -c "import h5py, numpy as np
with h5py.File('$dir/$1.h5', 'r+') as f:
    $2"
}
damage nan_param "d = f['params/fc1.weight']; v = d[...]; v[0, 3] = np.nan; d[...] = v"
damage neg_step "f.attrs['step'] = np.int64(-5)"
damage neg_opt_step "f['optimizer'].attrs['step'] = np.int64(-1)"
damage neg_exp_avg_sq "d = f['optimizer/fc1.weight/exp_avg_sq']; v = d[...]; v[1, 0] = -1.0; d[...] = v"
damage zero_std "f.attrs['input_std'] = 0.0"
damage nan_std "f.attrs['input_std'] = float('nan')"
damage inf_scale "f['loss_scaler'].attrs['scale'] = float('inf')"

# inspect: "valid: NO: <why>", exit 1 (one process: inspect reads one file).
for c in "nan_param:/params/fc1.weight holds nan at index 3" "neg_step:step is -5" \
  "neg_opt_step:/optimizer step is -1" "neg_exp_avg_sq:exp_avg_sq holds -1 at index 784" \
  "zero_std:input_std is 0" "nan_std:input_std is nan" "inf_scale:/loss_scaler scale is inf"; do
  name=${c%%:*} want=${c#*:}
  rc=0
  timeout 60 "$BIN" inspect "$dir/$name.h5" >"$dir/out" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$dir/out"; fail "inspect $name exited $rc, expected 1"; }
  grep -F "valid: NO: " "$dir/out" | grep -F -- "$want" >/dev/null \
    || { cat "$dir/out"; fail "inspect $name: no 'valid: NO' naming '$want'"; }
  pass "inspect $name: $(grep -F 'valid: NO' "$dir/out")"
done
timeout 60 "$BIN" inspect "$good" | contains "valid: yes" || fail "inspect of the good checkpoint"

# eval: exit 1 naming the file and the tensor or value.
run 2 1 "'$dir/nan_param.h5' is damaged: /params/fc1.weight holds nan at index 3" \
  eval --checkpoint "$dir/nan_param.h5" --data "$DATA/test.h5" --threads 1
run 2 1 "'$dir/neg_step.h5' holds impossible metadata: step is -5" \
  eval --checkpoint "$dir/neg_step.h5" --data "$DATA/test.h5" --threads 1
run 2 1 "input_std is nan" eval --checkpoint "$dir/nan_std.h5" --data "$DATA/test.h5" --threads 1

# Resume: a damaged newest checkpoint is skipped for the older good one ...
mkdir -p "$dir/mixed"
cp "$good" "$dir/mixed/ckpt-000000002.h5"
cp "$dir/neg_exp_avg_sq.h5" "$dir/mixed/ckpt-000000004.h5"
timeout 60 mpirun -n 2 "$BIN" "${train[@]}" --steps 4 --checkpoint-dir "$dir/mixed" \
  >"$dir/out" 2>"$dir/err" || { cat "$dir/err"; fail "resume past a damaged checkpoint"; }
contains "resumed from $dir/mixed/ckpt-000000002.h5" <"$dir/out" \
  || { cat "$dir/out"; fail "did not resume from the older good checkpoint"; }
[[ -f $dir/mixed/ckpt-000000004.h5.invalid ]] || fail "damaged checkpoint not renamed .invalid"
pass "resume skipped the damaged ckpt-000000004.h5 for ckpt-000000002.h5"
# ... but a directory of only damaged checkpoints is an error, not a silent fresh start,
# also on the next attempt (the files are .invalid by then) ...
mkdir -p "$dir/alldamaged"
cp "$dir/nan_param.h5" "$dir/alldamaged/ckpt-000000002.h5"
cp "$dir/neg_step.h5" "$dir/alldamaged/ckpt-000000004.h5"
for attempt in 1 2; do
  run 2 1 "--checkpoint-dir '$dir/alldamaged' holds no valid checkpoint" \
    "${train[@]}" --steps 4 --checkpoint-dir "$dir/alldamaged"
  contains "$dir/alldamaged/ckpt-000000002.h5.invalid, $dir/alldamaged/ckpt-000000004.h5.invalid" \
    <"$dir/err" || { cat "$dir/err"; fail "attempt $attempt: damaged files not named"; }
  contains "--resume never --overwrite" <"$dir/err" || fail "the way to start over is not named"
done
[[ ! -e $dir/alldamaged/ckpt-000000002.h5 && -f $dir/alldamaged/ckpt-000000002.h5.invalid ]] \
  || fail "damaged checkpoints not renamed .invalid"
# ... and --resume never --overwrite starts over, deleting the .invalid files too.
timeout 60 mpirun -n 2 "$BIN" "${train[@]}" --steps 2 --checkpoint-dir "$dir/alldamaged" \
  --resume never --overwrite >/dev/null 2>"$dir/err" || { cat "$dir/err"; fail "--overwrite"; }
left=$(find "$dir/alldamaged" -name '*.invalid' | wc -l)
[[ $left -eq 0 && -f $dir/alldamaged/ckpt-000000002.h5 ]] \
  || { ls "$dir/alldamaged"; fail "--resume never --overwrite left $left .invalid files"; }
pass "--resume never --overwrite started over and removed the .invalid files"

# The checkpoint directory is locked by the job that writes it: a holder (python's flock,
# as another job's rank 0 would hold it) makes a second job exit 1 naming host and pid.
mkdir -p "$dir/locked"
"$PY" -c "import fcntl, sys, time
f = open('$dir/locked/.lock', 'w'); fcntl.flock(f, fcntl.LOCK_EX)
f.write('otherhost 4242\n'); f.flush(); print('locked', flush=True); time.sleep(120)" \
  >"$dir/holder.out" &
holder=$!
for _ in $(seq 100); do [[ -s $dir/holder.out ]] && break; sleep 0.1; done
[[ -s $dir/holder.out ]] || fail "the lock holder did not start"
run 2 1 "'$dir/locked' is in use by another ringtrain job (host otherhost, pid 4242" \
  "${train[@]}" --steps 2 --checkpoint-dir "$dir/locked"
kill "$holder"
wait "$holder" 2>/dev/null || true # killed on purpose: its status is SIGTERM's
timeout 60 mpirun -n 2 "$BIN" "${train[@]}" --steps 2 --checkpoint-dir "$dir/locked" \
  >/dev/null 2>"$dir/err" || { cat "$dir/err"; fail "the dir stayed locked after the holder ended"; }
pass "the lock is free once its holder is gone"

# Declared sizes against the file: 10^12 samples in a few KB.
"$PY" -c "import h5py, numpy as np
with h5py.File('$dir/huge.h5', 'w') as f:
    f.attrs['format'] = 'ringtrain-dataset'; f.attrs['format_version'] = 1
    f.attrs['num_classes'] = 10
    f.create_dataset('images', shape=(10**12, 784), dtype='u1', chunks=(64, 784))
    f.create_dataset('labels', shape=(10**12,), dtype='i8', chunks=(4096,))"
run 2 1 "'$dir/huge.h5': /images declares 1000000000000 samples" train --data "$dir/huge.h5" --threads 1
# IDX headers whose product overflows 64 bits or exceeds the file; no --out file is left.
"$PY" -c "import struct
open('$dir/overflow.idx', 'wb').write(bytes([0, 0, 8, 3]) + struct.pack('>3I', *[2**32 - 1] * 3) + bytes(16))
open('$dir/short.idx', 'wb').write(bytes([0, 0, 8, 3]) + struct.pack('>3I', 60000, 28, 28) + bytes(100))
open('$dir/labels.idx', 'wb').write(bytes([0, 0, 8, 1]) + struct.pack('>I', 60000) + bytes(60000))"
run 2 1 "'$dir/overflow.idx' declares shape [4294967295, 4294967295, 4294967295], whose size overflows 64 bits" \
  convert idx --images "$dir/overflow.idx" --labels "$dir/labels.idx" --out "$dir/conv.h5"
run 2 1 "holds only 100 bytes" \
  convert idx --images "$dir/short.idx" --labels "$dir/labels.idx" --out "$dir/conv.h5" --shards 2
left=$(find "$dir" -name 'conv*' | wc -l)
[[ $left -eq 0 ]] || fail "a failed convert left $left --out file(s)"
pass "no --out file after the failed conversions"
# A model that cannot fit in memory: exit 1 naming the option and the bytes.
run 2 1 "--hidden 100000,100000 on samples of shape [1, 28, 28] needs at least" \
  train --data "$DATA/train.h5" --hidden 100000,100000 --threads 1

# Non-regular files are refused before opening (a FIFO would block forever).
mkfifo "$dir/fifo.h5"
run 2 1 "'$dir/fifo.h5' is not a regular file" train --data "$dir/fifo.h5" --threads 1
rc=0
timeout 60 "$BIN" inspect "$dir/fifo.h5" >/dev/null 2>"$dir/err" || rc=$?
if [[ $rc -ne 1 ]] || ! contains "is not a regular file" <"$dir/err"; then
  cat "$dir/err"
  fail "inspect of a FIFO exited $rc"
fi
pass "inspect refuses the FIFO"

# A missing shard of a series is named, not silently left out.
src=$(dpkg -L dataset-fashion-mnist | grep 'train-images-idx3-ubyte.gz$' | xargs dirname)
mkdir -p "$dir/shards"
"$BIN" convert idx --images "$src/t10k-images-idx3-ubyte.gz" \
  --labels "$src/t10k-labels-idx1-ubyte.gz" --out "$dir/shards/t.h5" --shards 3 >/dev/null
rm "$dir/shards/t-00001-of-00003.h5"
run 2 1 "'$dir/shards/t-00001-of-00003.h5'" train --data "$dir/shards" --threads 1
run 2 1 "1 of them is missing" train --data "$dir/shards/t-*.h5" --threads 1

# h5py's defaults (variable-length UTF-8 string attributes) are a valid dataset.
"$PY" -c "import h5py, numpy as np
rng = np.random.default_rng(0)
with h5py.File('$dir/h5py.h5', 'w') as f:
    f.attrs['format'] = 'ringtrain-dataset'
    f.attrs['format_version'] = 1
    f.attrs['num_classes'] = 4
    f['images'] = rng.random((256, 20), dtype=np.float32)
    f['labels'] = (np.arange(256) % 4).astype(np.int64)"
timeout 60 mpirun -n 2 "$BIN" train --data "$dir/h5py.h5" --steps 2 --hidden 8 \
  --threads 1 >/dev/null 2>"$dir/err" || { cat "$dir/err"; fail "an h5py-written dataset was refused"; }
pass "h5py's variable-length string attributes are read"

# Failures inside the training loop on one rank need the job-wide failure path.
# A NaN in the one float sample that rank 1 of 2 reads first: position 128 of epoch 0's
# permutation of 256 samples (global batch 256, so rank 1 takes positions 128..255),
# recomputed from its definition by tests/e2e/epoch_permutation.py.
bad=$("$PY" - "$dir/nan.h5" "$(dirname "$0")" <<'PYEOF'
import sys, h5py, numpy as np
sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, sys.argv[-1])
from epoch_permutation import permutation
bad = permutation(42, 0, 256)[128]
x = np.random.default_rng(0).random((256, 20), dtype=np.float32)
x[bad, 3] = np.nan
with h5py.File(sys.argv[1], 'w') as f:
    f.attrs['format'] = 'ringtrain-dataset'
    f.attrs['format_version'] = 1
    f.attrs['num_classes'] = 4
    f['images'] = x
    f['labels'] = (np.arange(256) % 4).astype(np.int64)
print(bad)
PYEOF
)
run 2 1 "'$dir/nan.h5': sample $bad (row $bad of this file) holds nan at element 3; float images must be finite [rank 1 " \
  train --data "$dir/nan.h5" --seed 42 --global-batch-size 256 --steps 1 --hidden 8 --threads 1
# --metrics on a full device: rank 0's first write fails, exit 2 naming the file.
run 2 2 "writing --metrics '/dev/full' failed; the file system holding '/dev' is full (ENOSPC" \
  train --data "$DATA/train.h5" --steps 2 --hidden 8 --threads 1 --metrics /dev/full
# --tensorboard on a file system that fills up during training (a tmpfs mounted here with
# one free page): the write that does not fit ends the job with exit 2 naming the file.
full=$dir/full
mkdir -p "$full"
if mount -t tmpfs -o size=256k tmpfs "$full" 2>"$dir/mount.err"; then
  trap 'umount "$full" 2>/dev/null || true' EXIT
  mkdir -p "$full/tb"
  head -c 4096 /dev/zero >"$full/slack"
  # Fill every other page; dd stops at ENOSPC, which is the point.
  dd if=/dev/zero of="$full/fill" bs=4096 2>/dev/null || true
  rm "$full/slack"
  run 2 2 "--tensorboard file '$full/tb/events.out.tfevents." \
    train --data "$DATA/train.h5" --steps 200 --log-every 1 --hidden 8 --threads 1 \
    --tensorboard "$full/tb"
  contains "No space left on device" <"$dir/err" || { cat "$dir/err"; fail "ENOSPC not named"; }
  umount "$full"
  trap - EXIT
else
  echo "SKIP: cannot mount a tmpfs here ($(cat "$dir/mount.err")): --tensorboard on a full disk not tested"
fi
