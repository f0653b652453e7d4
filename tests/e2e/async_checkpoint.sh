#!/usr/bin/env bash
# --async-checkpoint (docs/usage.md, "Asynchronous checkpoints"): the state is staged at the
# save's step and written by a background thread, with every guarantee of a synchronous save.
#  1. The files equal a synchronous run's at the same steps, byte for byte except HDF5's
#     modification times (tools/checkpoint_cmp.py), and as h5diff
#     reads them, at 1, 2 and 4 ranks, fp32 and bf16, --zero 0 and 1.
#  2. A file system that fills during the background write (tmpfs): exit 2 with one message,
#     the previous checkpoint valid, no .tmp left; likewise a failed direct write on rank 1.
#  3. kill -9 of a rank while a background save is writing: --resume auto continues from the
#     newest complete checkpoint and ends bitwise on the uninterrupted run.
#  4. SIGUSR1 while a save is in flight: that save completes, the stop's save follows, exit 75.
#  5. --checkpoint-every 1 (each save due while the previous one writes): every save is
#     reported, the waits are in the metrics, and memory does not grow with the number of saves.
# RINGTRAIN_TEST_SAVE_DELAY_MS holds each save in flight long enough to act during it.
source "$(dirname "$0")/lib.sh"
dir=$(workdir async_checkpoint)
src=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
$PY -c 'import json' || fail "needs Debian's python3"

args=(--data "$DATA/train.h5" --hidden 24 --global-batch-size 16 --threads 1 --optimizer adamw
  --lr 3e-3 --log-every 100)

rc=0
out=$(mpi 2 "$BIN" train "${args[@]}" --steps 2 --async-checkpoint 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "--async-checkpoint without --checkpoint-dir exited $rc: $out"
[[ $(grep -c "^ringtrain: error: --async-checkpoint needs --checkpoint-dir" <<<"$out") -eq 1 ]] ||
  fail "--async-checkpoint without --checkpoint-dir: $out"
pass "--async-checkpoint without --checkpoint-dir: exit 1, one message"

# --- 1. async = sync, bitwise
# same_files NAME RANKS ARGS...: a sync and an async run of 6 steps saving at 2, 4 and 6.
same_files() {
  local name=$1 ranks=$2 mode step
  shift 2
  for mode in sync async; do
    local extra=()
    [[ $mode == async ]] && extra=(--async-checkpoint)
    mpi "$ranks" "$BIN" train "${args[@]}" "$@" --steps 6 --checkpoint-every 2 --keep 3 \
      --checkpoint-dir "$dir/$name-$mode" --metrics "$dir/$name-$mode.jsonl" "${extra[@]}" \
      >"$dir/$name-$mode.out" 2>&1 || fail "$name $mode exited $?: $(cat "$dir/$name-$mode.out")"
  done
  contains "async checkpoint staging [1-9][0-9]* B" <"$dir/$name-async.out" ||
    fail "$name: the start-up line does not give the staging memory: $(cat "$dir/$name-async.out")"
  for step in 000000002 000000004 000000006; do
    local a=$dir/$name-sync/ckpt-$step.h5 b=$dir/$name-async/ckpt-$step.h5
    [[ -f $b ]] || fail "$name: the async run has no $b"
    h5diff "$a" "$b" || fail "$name: step $step differs (h5diff)"
    $PY "$src/tools/checkpoint_cmp.py" "$a" "$b" >/dev/null ||
      fail "$name: step $step is not byte for byte the synchronous save's (modification times aside)"
  done
  # Each async save reported once, with what training waited and the write's own seconds.
  $PY - "$dir/$name-async.jsonl" <<'EOF' || fail "$name: checkpoint records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"checkpoint"' in l]
recs = [r for r in recs if r["type"] == "checkpoint"]
assert [r["step"] for r in recs] == [2, 4, 6], recs
for r in recs:
    assert r["async"] is True and r["bytes"] > 0 and r["seconds"] > 0, r
    assert 0 <= r["blocking_s"] and 0 <= r["waited_s"] <= r["blocking_s"], r
EOF
  pass "$name on $ranks rank(s): async saves equal the synchronous ones byte for byte"
}
same_files fp32-z0-1 1
same_files fp32-z0-2 2
same_files bf16-z0-2 2 --precision bf16
same_files fp32-z1-2 2 --zero 1
same_files bf16-z1-2 2 --precision bf16 --zero 1
same_files fp32-z1-4 4 --zero 1

# --- 2. a full file system during the background write
mnt=$dir/mnt
tmpfs_mountpoint "$mnt"
full_args=("${args[@]}" --steps 4 --checkpoint-every 2 --keep 1 --async-checkpoint)
one=$(($(stat -c %s "$dir/fp32-z0-2-sync/ckpt-000000004.h5") / 1024 + 1))
# full_run LABEL SIZE_KIB [mpirun args]: step 2's save fits, step 4's (beside it until the
# rename) does not, or fails by injection.
full_run() {
  local label=$1 size=$2 rc=0 count
  shift 2
  mount -t tmpfs -o "size=${size}k" tmpfs "$mnt"
  timeout 60 mpirun -n 2 "$@" "$BIN" train "${full_args[@]}" --checkpoint-dir "$mnt/ck" \
    >"$dir/full.out" 2>"$dir/full.err" || rc=$?
  [[ $rc -eq 2 ]] || { cat "$dir/full.err"; fail "$label: exit $rc, expected 2"; }
  count=$(grep -c '^ringtrain: error:' "$dir/full.err" || true)
  [[ $count -eq 1 ]] || { cat "$dir/full.err"; fail "$label: $count error lines, expected 1"; }
  grep '^ringtrain: error:' "$dir/full.err" |
    contains "saving checkpoint '$mnt/ck/ckpt-000000004.h5' failed; the file system holding '$mnt/ck' is full (ENOSPC" ||
    { cat "$dir/full.err"; fail "$label: the error does not say that step 4's save met a full disk"; }
  "$BIN" inspect "$mnt/ck/ckpt-000000002.h5" | contains "valid: yes" ||
    fail "$label: step 2's checkpoint is not valid: $(ls -la "$mnt/ck")"
  ! compgen -G "$mnt/ck/*.tmp" >/dev/null || fail "$label: a .tmp is left: $(ls "$mnt/ck")"
  ! pgrep -f "^$BIN train .*$mnt/ck" >/dev/null || fail "$label: ranks still running"
  umount "$mnt"
  pass "$label: exit 2 with one full-disk message, step 2 kept"
}
full_run "tmpfs of $((one * 3 / 2)) KiB" $((one * 3 / 2))
full_run "direct write failing on rank 1" 4096 -x RINGTRAIN_TEST_FAIL=1:savewrite:4

# --- 3. kill -9 of a rank during a background write, then --resume auto
long=("${args[@]}" --steps 40 --checkpoint-every 10 --async-checkpoint)
mpi 2 "$BIN" train "${long[@]}" --checkpoint-dir "$dir/uninterrupted" >"$dir/u.out" 2>&1 ||
  fail "the uninterrupted run exited $?: $(cat "$dir/u.out")"
# wait_for FILE: up to 60 s.
wait_for() {
  for _ in $(seq 1 300); do
    [[ -e $1 ]] && return 0
    sleep 0.2
  done
  fail "$1 never appeared: $(ls "$(dirname "$1")")"
}
ck=$dir/killed
tag=$(job_tag)
E2E_JOB=$tag RINGTRAIN_TEST_SAVE_DELAY_MS=3000 mpi 2 -x RINGTRAIN_TEST_SAVE_DELAY_MS "$BIN" train \
  "${long[@]}" --checkpoint-dir "$ck" >"$dir/k.out" 2>&1 &
job=$!
wait_for "$ck/ckpt-000000010.h5"
wait_for "$ck/ckpt-000000020.h5.tmp"  # step 20's save is writing (held by the delay)
victim=$(job_pids "$tag" "OMPI_COMM_WORLD_RANK=1")
[[ -n $victim ]] || fail "no process of rank 1 found"
kill -9 "$victim"
rc=0
wait "$job" || rc=$?
[[ $rc -ne 0 ]] || fail "the job with a killed rank exited 0"
[[ ! -e $ck/ckpt-000000020.h5 ]] || fail "step 20's checkpoint was completed after the kill"
rc=0
out=$(mpi 2 "$BIN" train "${long[@]}" --checkpoint-dir "$ck" 2>&1) || rc=$?
[[ $rc -eq 0 ]] || fail "--resume auto after the kill exited $rc: $out"
contains "resumed from $ck/ckpt-000000010.h5 at step 10 " <<<"$out" ||
  fail "did not resume from step 10's checkpoint: $out"
! compgen -G "$ck/*.tmp" >/dev/null || fail "a .tmp is left after the resumed run: $(ls "$ck")"
h5diff "$dir/uninterrupted/ckpt-000000040.h5" "$ck/ckpt-000000040.h5" /params /params ||
  fail "the resumed run's parameters differ from the uninterrupted run's"
h5diff "$dir/uninterrupted/ckpt-000000040.h5" "$ck/ckpt-000000040.h5" /optimizer /optimizer ||
  fail "the resumed run's optimizer state differs from the uninterrupted run's"
pass "kill -9 of rank 1 during step 20's background write: resumed from step 10, bitwise at the end"

# --- 4. SIGUSR1 while a save is in flight
ck=$dir/usr1
tag=$(job_tag)
E2E_JOB=$tag RINGTRAIN_TEST_SAVE_DELAY_MS=2000 mpi 2 -x RINGTRAIN_TEST_SAVE_DELAY_MS "$BIN" train \
  "${args[@]}" --steps 100000 --checkpoint-every 10 --async-checkpoint --checkpoint-dir "$ck" \
  --metrics "$dir/usr1.jsonl" >"$dir/usr1.out" 2>&1 &
job=$!
wait_for "$ck/ckpt-000000010.h5.tmp"
pid=$(job_pids "$tag" "OMPI_COMM_WORLD_RANK=0")
[[ -n $pid ]] || fail "no process of rank 0 found"
kill -USR1 "$pid"
rc=0
wait "$job" || rc=$?
[[ $rc -eq 75 ]] || fail "SIGUSR1 during a save: exit $rc, expected 75: $(cat "$dir/usr1.out")"
pattern="^stopped by SIGUSR1 on rank 0 at step \([0-9]*\); checkpoint $ck/ckpt-[0-9]\{9\}\.h5 saved"
step=$(sed -n "s|$pattern.*|\1|p" "$dir/usr1.out")
[[ -n $step ]] || fail "no stop line: $(cat "$dir/usr1.out")"
for f in "$ck/ckpt-000000010.h5" "$ck/ckpt-$(printf %09d "$step").h5"; do
  "$BIN" inspect "$f" | contains "valid: yes" || fail "$f is not a valid checkpoint"
done
! compgen -G "$ck/*.tmp" >/dev/null || fail "a .tmp is left after the stop: $(ls "$ck")"
$PY - "$dir/usr1.jsonl" "$step" <<'EOF' || fail "SIGUSR1: the metrics"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
stop = int(sys.argv[2])
ck = [r for r in recs if r["type"] == "checkpoint"]
assert [r["step"] for r in ck][-2:] == [10, stop] or [r["step"] for r in ck][-1] == stop, ck
last = ck[-1]
assert last["step"] == stop and last["waited_s"] > 0.5, last  # it waited for step 10's
assert recs[-1]["type"] == "stop" and recs[-1]["exit_code"] == 75, recs[-1]
EOF
pass "SIGUSR1 while step 10's save was writing: it completed, step $step saved after it, exit 75"

# --- 5. --checkpoint-every 1: saves back to back, bounded memory
# A state of 3 x 0.8 Mi fp32 values (9.6 MB): a copy per save kept would show in the RSS.
big=(--data "$DATA/train.h5" --hidden 1024 --global-batch-size 16 --threads 1 --optimizer adamw
  --log-every 100 --checkpoint-every 1 --keep 2 --async-checkpoint)
for steps in 5 45; do
  /usr/bin/time -f %M -o "$dir/rss-$steps" "$BIN" train "${big[@]}" --steps "$steps" \
    --checkpoint-dir "$dir/every1-$steps" --metrics "$dir/every1-$steps.jsonl" \
    >"$dir/every1-$steps.out" 2>&1 || fail "--checkpoint-every 1 ($steps steps) exited $?: $(cat "$dir/every1-$steps.out")"
done
$PY - "$dir" <<'EOF' || fail "--checkpoint-every 1"
import json, sys
d = sys.argv[1]
recs = [json.loads(l) for l in open(f"{d}/every1-45.jsonl")]
ck = [r for r in recs if r["type"] == "checkpoint"]
assert [r["step"] for r in ck] == list(range(1, 46)), [r["step"] for r in ck]
staging = [r for r in recs if r["type"] == "start"][0]["async_checkpoint_staging_bytes"]
rss = {s: int(open(f"{d}/rss-{s}").read().split()[-1]) * 1024 for s in (5, 45)}
waits = sum(r["waited_s"] for r in ck)
print(f"staging {staging} B; max RSS {rss[5]} B after 5 saves, {rss[45]} B after 45; "
      f"saves waited {waits:.3f} s in all, {sum(r['waited_s'] > 0 for r in ck)} of 45 waited")
# 40 more saves may not hold even one more copy of the state.
assert rss[45] - rss[5] < staging, (rss, staging)
EOF
pass "--checkpoint-every 1: 45 saves reported, memory bounded"
