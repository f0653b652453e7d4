#!/usr/bin/env bash
# Failure anywhere ends the whole job (docs/architecture.md, "When a rank fails"): an error
# at every point of the loop, injected on one non-zero rank of 2 and of 4 (test hook
# RINGTRAIN_TEST_FAIL=RANK:POINT:STEP), and real bad files, must end every rank within
# seconds with the documented exit code and exactly one "ringtrain: error:" line that names
# the cause; a failed save leaves the previous checkpoint valid and chosen by --resume auto.
# Prints the table of failure point x ranks with exit code and time to exit.
source "$(dirname "$0")/lib.sh"
dir=$(workdir failures)
unset OMP_NUM_THREADS RINGTRAIN_TEST_FAIL RINGTRAIN_TEST_STALL

errors_in() { grep -c '^ringtrain: error:' "$1" || true; }

# Another job running the same binary must not count as a rank left over by this test's
# jobs: a stand-in whose command line starts with the binary's path runs throughout.
bash -c 'exec -a "$0" sleep 600' "$BIN" &
decoy=$!
trap 'kill "$decoy" 2>/dev/null || true' EXIT
# The leftover check sees this test's own processes: a tagged one is found, the decoy not.
tag=$(job_tag)
E2E_JOB=$tag sleep 60 &
probe=$!
found=$(job_pids "$tag")
[[ $found == "$probe" ]] || fail "job_pids found '$found' for a process of pid $probe"
kill "$probe"
wait "$probe" 2>/dev/null || [[ $? -eq 143 ]] || fail "the tagged probe did not end by SIGTERM"

# run_case LABEL EXPECTED_RC PATTERN N [mpirun/ringtrain args...]: runs, then checks the exit
# code, one error line matching PATTERN, time to exit, and that no process of the job (found
# by its tag, see lib.sh) is left running.
table=()
run_case() {
  local label=$1 want=$2 pattern=$3 n=$4
  shift 4
  local start end rc=0 tag
  tag=$(job_tag)
  start=$(date +%s.%N)
  E2E_JOB=$tag timeout 60 mpirun -n "$n" "$@" >"$dir/$label.out" 2>"$dir/$label.err" || rc=$?
  end=$(date +%s.%N)
  local took
  took=$(printf '%.1f' "$(echo "$end - $start" | bc)")
  table+=("| $label | $n | $rc | $took s |")
  [[ $rc -ne 124 ]] || fail "$label: the job hung (killed by timeout after 60 s)"
  [[ $rc -eq $want ]] || { cat "$dir/$label.err"; fail "$label: exit code $rc, expected $want"; }
  local count
  count=$(errors_in "$dir/$label.err")
  [[ $count -eq 1 ]] || { cat "$dir/$label.err"; fail "$label: $count error lines, expected 1"; }
  grep '^ringtrain: error:' "$dir/$label.err" | contains "$pattern" ||
    { cat "$dir/$label.err"; fail "$label: the error line does not match '$pattern'"; }
  (( $(echo "$took < 30" | bc) )) || fail "$label: the job took $took s to end"
  local left
  left=$(job_pids "$tag")
  [[ -z $left ]] || fail "$label: processes ${left//$'\n'/ } of the job still running after mpirun returned"
}

train_args=(--data "$DATA/train.h5" --hidden 32 --batch-size 16 --threads 1 --log-every 1)

# Every point of the loop, on the last rank of 2 and of 4.
for n in 2 4; do
  bad=$((n - 1))
  for point in read forward backward reduce optimizer eval save metrics; do
    rank=$bad
    [[ $point == metrics ]] && rank=0 # only rank 0 writes metrics
    ck=$dir/ck-$point-$n
    extra=(--steps 6 --checkpoint-dir "$ck" --checkpoint-every 2)
    [[ $point == eval ]] && extra+=(--val-data "$DATA/test.h5")
    [[ $point == metrics ]] && extra+=(--metrics "$dir/metrics-$n.jsonl")
    step=4
    [[ $point == read || $point == eval ]] && step=-1
    run_case "$point-np$n" 2 "injected test failure at '$point' on rank $rank" "$n" \
      -x RINGTRAIN_TEST_FAIL="$rank:$point:$step" "$BIN" train "${train_args[@]}" "${extra[@]}"
    # The checkpoint of step 2 was written before any failure and must stay valid.
    if [[ $point != read ]]; then
      "$BIN" inspect "$ck/ckpt-000000002.h5" >/dev/null ||
        fail "$point-np$n: the checkpoint of step 2 is not valid after the failure"
    fi
  done
done
pass "every injected failure ended the job with exit 2 and one message"

# A failed save: the half-written file is never chosen; --resume auto takes step 2's.
ck=$dir/ck-save-2
[[ -e $ck/ckpt-000000002.h5 && ! -e $ck/ckpt-000000004.h5 ]] ||
  fail "after a failed save: expected step 2's checkpoint and none of step 4 in $ck"
out=$(timeout 60 mpirun -n 2 "$BIN" train "${train_args[@]}" --steps 2 --checkpoint-dir "$ck" \
  --resume auto 2>&1) || fail "resume after a failed save: $out"
contains "resumed from $ck/ckpt-000000002.h5 at step 2" <<<"$out" ||
  fail "resume after a failed save did not take step 2's checkpoint: $out"
pass "after a failed save, --resume auto continues from the previous checkpoint"

# Real bad files. Labels out of range in the training data (every rank reads some; one
# message all the same) and in the validation data.
/usr/bin/python3 - "$DATA/train.h5" "$dir/badlabel.h5" "$DATA/test.h5" "$dir/badval.h5" <<'EOF'
import shutil, sys
import h5py
src, dst, vsrc, vdst = sys.argv[1:]
for a, b, value in ((src, dst, 10), (vsrc, vdst, -1)):
    shutil.copy(a, b)
    with h5py.File(b, "r+") as f:
        labels = f["labels"][...]
        labels[::7] = value
        f["labels"][...] = labels
EOF
run_case badlabel-np2 1 "badlabel.h5" 2 "$BIN" train --data "$dir/badlabel.h5" --hidden 32 \
  --batch-size 16 --threads 1 --steps 4
run_case badval-np2 1 "badval.h5" 2 "$BIN" train "${train_args[@]}" --steps 2 \
  --val-data "$dir/badval.h5"
run_case badeval-np2 1 "badval.h5" 2 "$BIN" eval --checkpoint "$dir/ck-save-2/ckpt-000000002.h5" \
  --data "$dir/badval.h5"
pass "labels out of range in --data, --val-data and eval --data: exit 1, one message"

# A truncated shard of a sharded dataset.
mkdir -p "$dir/shards"
src=$(dpkg -L dataset-fashion-mnist | grep 'train-images-idx3-ubyte.gz$' | xargs dirname)
"$BIN" convert idx --images "$src/t10k-images-idx3-ubyte.gz" \
  --labels "$src/t10k-labels-idx1-ubyte.gz" --out "$dir/shards/part.h5" --shards 2 >/dev/null
second=$(find "$dir/shards" -name '*-00001-of-00002.h5')
truncate -s $(($(stat -c %s "$second") / 2)) "$second"
run_case truncated-np2 1 "$(basename "$second")" 2 "$BIN" train --data "$dir/shards" \
  --hidden 32 --batch-size 16 --threads 1 --steps 4
pass "a truncated shard: exit 1 naming the file"

# Disk full during a save: a small tmpfs holds one checkpoint but not a second.
mnt=$dir/tmpfs
mkdir -p "$mnt"
if mount -t tmpfs -o size=1m tmpfs "$mnt" 2>"$dir/mount.err"; then
  trap 'umount "$mnt" 2>/dev/null || true; kill "$decoy" 2>/dev/null || true' EXIT
  for n in 1 2; do
    rm -rf "${mnt:?}"/*
    run_case diskfull-np$n 2 "saving checkpoint '.*' failed; the file system holding '.*' is full" "$n" \
      "$BIN" train --data "$DATA/train.h5" --hidden 64 --batch-size 16 --threads 1 --steps 6 \
      --checkpoint-dir "$mnt/ck" --checkpoint-every 2
    "$BIN" inspect "$mnt/ck/ckpt-000000002.h5" >/dev/null ||
      fail "diskfull-np$n: the checkpoint of step 2 is not valid after the disk filled"
    out=$(timeout 60 mpirun -n "$n" "$BIN" train --data "$DATA/train.h5" --hidden 64 \
      --batch-size 16 --threads 1 --steps 2 --checkpoint-dir "$mnt/ck" 2>&1) ||
      fail "diskfull-np$n: resume failed: $out"
    contains "resumed from $mnt/ck/ckpt-000000002.h5" <<<"$out" ||
      fail "diskfull-np$n: --resume auto did not choose step 2's checkpoint: $out"
  done
  umount "$mnt"
  trap 'kill "$decoy" 2>/dev/null || true' EXIT
  pass "disk full during a save: exit 2, one message, the previous checkpoint chosen on resume"
else
  echo "SKIPPED: disk-full cases: mount -t tmpfs is not permitted here: $(cat "$dir/mount.err")"
fi

echo "| case | ranks | exit code | time to exit |"
echo "|---|---|---|---|"
printf '%s\n' "${table[@]}"
