#!/usr/bin/env bash
# A checkpoint save on a file system that fills up (docs/restart.md, "On a full disk"). 2
# ranks train into a tmpfs whose size is swept across the bytes of a save: below the first
# checkpoint, then from where the second save's first byte no longer fits to where all of
# it does, in steps small enough that every phase of writing the file (attributes, each
# dataset, the flush, the close) would meet ENOSPC at some size. At every size the job must
# end within the timeout with exit 0 and valid checkpoints, or with exit 2 and one message
# saying the file system is full, the checkpoint before intact and no .tmp left. Then the
# write errors that can still happen after the save reserved its space (a rank's direct
# chunk write, the HDF5 flush, rank 0's rename; injected with RINGTRAIN_TEST_FAIL) must end
# the job the same way. Prints one row per size.
source "$(dirname "$0")/lib.sh"
dir=$(workdir full_disk_save)
mnt=$dir/mnt
tmpfs_mountpoint "$mnt"

# --hidden 24: fc1's 75 KiB chunks are aligned to the block, as large ones are.
train=(train --data "$DATA/train.h5" --hidden 24 --batch-size 16 --threads 1 --steps 4
  --checkpoint-every 2 --keep 1)
full="saving checkpoint '$mnt/ck/ckpt-00000000[24].h5' failed; the file system holding '$mnt/ck' is full (ENOSPC"

# run_at SIZE_KIB [mpirun args...]: trains into a fresh tmpfs of that size; sets rc and took.
run_at() {
  local size=$1
  shift
  mount -t tmpfs -o "size=${size}k" tmpfs "$mnt"
  local start
  start=$(date +%s.%N)
  rc=0
  timeout 30 mpirun -n 2 "$@" "$BIN" "${train[@]}" --checkpoint-dir "$mnt/ck" \
    >"$dir/out" 2>"$dir/err" || rc=$?
  took=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
  [[ $rc -ne 124 ]] || fail "${size} KiB: the job hung (killed after 30 s); $(cat "$dir/err")"
  ! pgrep -f "^$BIN " >/dev/null || fail "${size} KiB: ranks still running after mpirun returned"
}

# check_outcome LABEL: exit 0 with valid checkpoints, or exit 2 with one full-disk message,
# the previous checkpoint valid and no .tmp; then unmounts. Sets outcome.
check_outcome() {
  local label=$1 f
  for f in "$mnt"/ck/ckpt-*.h5; do
    [[ -e $f ]] || continue
    "$BIN" inspect "$f" >/dev/null || fail "$label: $f is not a valid checkpoint"
  done
  if [[ $rc -eq 0 ]]; then
    [[ -e $mnt/ck/ckpt-000000004.h5 ]] || fail "$label: exit 0 without step 4's checkpoint"
    outcome="saved"
  elif [[ $rc -eq 2 ]]; then
    local count
    count=$(grep -c '^ringtrain: error:' "$dir/err" || true)
    [[ $count -eq 1 ]] || { cat "$dir/err"; fail "$label: $count error lines, expected 1"; }
    grep '^ringtrain: error:' "$dir/err" | contains "$full" ||
      { cat "$dir/err"; fail "$label: the error does not say the file system is full"; }
    # The save of step 4 failed only if step 2's fitted: then that one must still be there.
    if grep -q "ckpt-000000004.h5' failed" "$dir/err"; then
      [[ -e $mnt/ck/ckpt-000000002.h5 ]] || fail "$label: step 2's checkpoint is gone"
      outcome="step 4 refused, step 2 kept"
    else
      outcome="step 2 refused"
    fi
  else
    cat "$dir/err"
    fail "$label: exit code $rc, expected 0 or 2"
  fi
  if compgen -G "$mnt/ck/*.tmp" >/dev/null; then
    ls -la "$mnt/ck"
    fail "$label: a .tmp is left"
  fi
  umount "$mnt"
}

# One checkpoint's size, on a file system that holds everything.
run_at 4096
[[ $rc -eq 0 ]] || { cat "$dir/err"; fail "a save into 4 MiB failed (exit $rc)"; }
one=$(($(stat -c %s "$mnt/ck/ckpt-000000004.h5") / 1024 + 1))
umount "$mnt"

rows=("| tmpfs KiB | exit | seconds | outcome |" "|---|---|---|---|")
# Below one checkpoint; then from "step 2's fits, not one byte of step 4's" (4 KiB of the
# lock file) to past two checkpoints plus HDF5's room, in 24 KiB steps.
sizes=(32 $((one / 2)))
for ((s = one + 4; s <= 2 * one + 120; s += 24)); do sizes+=("$s"); done
for size in "${sizes[@]}"; do
  run_at "$size"
  check_outcome "${size} KiB"
  rows+=("| $size | $rc | $took | $outcome |")
done
printf '%s\n' "${rows[@]}"
# The sweep must have seen both ends: a refused save and a full one.
printf '%s\n' "${rows[@]}" | contains "| 0 |" || fail "no size of the sweep saved both checkpoints"
printf '%s\n' "${rows[@]}" | contains "step 4 refused, step 2 kept" ||
  fail "no size of the sweep refused the second save"
pass "checkpoint saves swept over ${#sizes[@]} tmpfs sizes: exit 0 or one full-disk message, no hang"

# Failures after the reservation, on the rank that meets them: every rank ends, exit 2.
for point in 1:savewrite:4 1:saveflush:4 0:savecommit:4; do
  run_at 4096 -x RINGTRAIN_TEST_FAIL=$point
  [[ $rc -eq 2 ]] || { cat "$dir/err"; fail "$point: exit code $rc, expected 2"; }
  check_outcome "$point"
  [[ $outcome == "step 4 refused, step 2 kept" ]] || fail "$point: $outcome"
  (( $(echo "$took < 15" | bc) )) || fail "$point: the job took $took s to end"
done
pass "a failed direct write, flush or rename on one rank: exit 2 on every rank, step 2 kept"
