#!/usr/bin/env bash
# Restart on the same number of ranks (2 -> 2) is bitwise identical to an uninterrupted run;
# on another number (2 -> 1, 2 -> 4, 4 -> 3) it continues the same global batch sequence
# and ends where the uninterrupted run ends up to floating-point summation order (parameters
# and optimizer state within a relative 1e-5, the loss within 1e-6; docs/restart.md); a global batch the
# new world size does not divide is an error naming both; damaged newer checkpoints (bit
# flip, truncation) are skipped with a warning and renamed aside; kill -9 of one rank ends
# the job (no hang) and --resume auto continues from the last good checkpoint.
source "$(dirname "$0")/lib.sh"
dir=$(workdir restart)
common=(--data "$DATA/train.h5" --hidden 64 --threads 1 --log-every 10 --seed 11 --prefetch 0)

final_loss() {  # mean loss of the last step record of a metrics file
  /usr/bin/python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1])]
print(repr([x for x in r if x["type"]=="step"][-1]["loss"]))' "$1"
}

# near A.h5 B.h5 TOL: the relative L2 distance of every tensor in /params and /optimizer of
# two checkpoints (h5py, an independent reader) is at most TOL; prints the largest.
near() {
  /usr/bin/python3 - "$@" <<'PY'
import sys, h5py, numpy as np
a, b, tol = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), float(sys.argv[3])
names = []
for g in ("params", "optimizer"):
    b[g].visititems(lambda n, o: names.append(g + "/" + n) if isinstance(o, h5py.Dataset) else None)
assert len(names) >= 6, names
worst, where = 0.0, ""
for n in names:
    x, y = a[n][...].astype(np.float64), b[n][...].astype(np.float64)
    assert x.shape == y.shape, (n, x.shape, y.shape)
    ref = np.linalg.norm(y)
    rel = np.linalg.norm(x - y) / ref if ref > 0 else np.abs(x - y).max()
    if rel > worst:
        worst, where = rel, n
print(f"{worst:.3g} ({where})")
sys.exit(0 if worst <= tol else 1)
PY
}

mpi 2 "$BIN" train "${common[@]}" --global-batch-size 96 --steps 80 --checkpoint-dir "$dir/ref" \
  --metrics "$dir/ref.jsonl" >/dev/null
ref=$(final_loss "$dir/ref.jsonl")
ref_ck=$dir/ref/ckpt-000000080.h5
for pair in "2 2" "2 1" "2 4" "4 3"; do
  read -r a b <<<"$pair"
  d=$dir/w$a-$b
  mpi "$a" "$BIN" train "${common[@]}" --global-batch-size 96 --steps 40 --checkpoint-dir "$d" >/dev/null
  out=$(mpi "$b" "$BIN" train "${common[@]}" --steps 80 --checkpoint-dir "$d" --metrics "$d.jsonl")
  contains "resumed from .*ckpt-000000040.h5 at step 40 (saved by $a ranks in fp32, global batch 96)" \
    <<<"$out" || fail "$a -> $b: $out"
  h5dump -a /world_size "$d/ckpt-000000080.h5" | contains "(0): $b\$" || fail "$a -> $b: world_size"
  loss=$(final_loss "$d.jsonl")
  if ((a == b)); then
    # Same number of ranks: bitwise, the loss printed to the last digit included.
    for group in /params /optimizer /loss_scaler /data; do
      h5diff "$ref_ck" "$d/ckpt-000000080.h5" "$group" "$group" || fail "$a -> $b: $group differs"
    done
    [[ $loss == "$ref" ]] || fail "$a -> $b: final loss $loss, uninterrupted $ref"
    pass "$a -> $b ranks: bitwise identical to the uninterrupted run (loss $loss)"
    continue
  fi
  # Another number of ranks: the same computation summed in another order. fp32 rounding
  # (6e-8 per addition) grown over 40 steps stays far below 1e-5; another seed, global batch
  # or learning rate is off by orders of magnitude more.
  dist=$(near "$d/ckpt-000000080.h5" "$ref_ck" 1e-5) || fail "$a -> $b: parameters or optimizer state differ from the uninterrupted run's by $dist (relative L2), more than 1e-5"
  /usr/bin/python3 -c 'import sys; l, r = map(float, sys.argv[1:]); sys.exit(abs(l - r) > 1e-6 * abs(r))' \
    "$loss" "$ref" || fail "$a -> $b: final loss $loss differs from the uninterrupted run's $ref by more than 1e-6 (relative)"
  pass "$a -> $b ranks continued global batch 96; loss $loss (uninterrupted: $ref); state within $dist"
done

# 128 does not divide by 3: an error that names both numbers, unless changed on purpose.
mpi 2 "$BIN" train "${common[@]}" --global-batch-size 128 --steps 10 --checkpoint-dir "$dir/g128" >/dev/null
rc=0
mpi 3 "$BIN" train "${common[@]}" --steps 20 --checkpoint-dir "$dir/g128" >"$dir/out" 2>"$dir/err" || rc=$?
[[ $rc -eq 1 ]] || fail "global batch 128 on 3 ranks exited $rc"
grep -q "continues global batch 128, which does not divide by 3 ranks" "$dir/err" || fail "$(cat "$dir/err")"
out=$(mpi 3 "$BIN" train "${common[@]}" --steps 20 --global-batch-size 126 --checkpoint-dir "$dir/g128")
grep -q "global batch 126" <<<"$out" || fail "--global-batch-size 126 on 3 ranks: $out"
pass "a global batch that does not divide is an error; --global-batch-size changes it"

# Damaged newer checkpoints are skipped (and renamed aside), the older good one is used.
d=$dir/damaged
mpi 2 "$BIN" train "${common[@]}" --steps 30 --checkpoint-every 10 --checkpoint-dir "$d" >/dev/null
/usr/bin/python3 - "$d/ckpt-000000030.h5" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:      # flip bits in the middle of the file
    f.seek(len(f.read()) // 2); f.write(b"\xff\x00\xff\x00" * 64)
PY
truncate -s 5000 "$d/ckpt-000000020.h5"
out=$(mpi 2 "$BIN" train "${common[@]}" --steps 40 --checkpoint-dir "$d" 2>&1)
grep -q "skipping checkpoint .*ckpt-000000030.h5" <<<"$out" || fail "bit flip not reported: $out"
grep -q "skipping checkpoint .*ckpt-000000020.h5" <<<"$out" || fail "truncation not reported"
grep -q "resumed from .*ckpt-000000010.h5 at step 10" <<<"$out" || fail "did not fall back: $out"
[[ -f $d/ckpt-000000030.h5.invalid && -f $d/ckpt-000000040.h5 ]] || fail "files: $(ls "$d")"
pass "bit-flipped and truncated checkpoints skipped, kept as .invalid, resumed at step 10"

# kill -9 of one rank while training with a checkpoint every step: the job ends (mpirun
# kills the rest), and the same command continues from a valid checkpoint.
d=$dir/kill
big=(--data "$DATA/train.h5" --hidden "1024,1024" --threads 1 --prefetch 0 --keep 2)
tag=$(job_tag)
E2E_JOB=$tag mpi 2 "$BIN" train "${big[@]}" --steps 100000 --checkpoint-every 1 --checkpoint-dir "$d" \
  >"$dir/kill.out" 2>&1 &
job=$!
for _ in $(seq 1 150); do
  [[ $(find "$d" -name 'ckpt-*.h5' 2>/dev/null | wc -l) -ge 2 ]] && break
  sleep 0.2
done
pid=$(job_pids "$tag" OMPI_COMM_WORLD_RANK=1)
[[ -n "$pid" ]] || fail "no rank 1 of this test's job to kill"
start=$(date +%s)
kill -9 "$pid"
rc=0
wait "$job" || rc=$?
(( $(date +%s) - start <= 60 )) || fail "the job took more than 60 s to end after kill -9"
# mpirun reports the killed rank (non-zero); 124 would be lib.sh's timeout, i.e. a hang.
(( rc != 0 && rc != 124 )) || fail "the job with a rank killed by kill -9 exited $rc: $(cat "$dir/kill.out")"
pass "kill -9 of one rank ended the job in $(( $(date +%s) - start )) s with exit code $rc"
# The same command continues from the newest checkpoint the kill left (a .tmp of a save that
# was under way is not one), two steps further, and ends normally.
newest=$(find "$d" -name 'ckpt-*.h5' | sort | tail -n 1)
[[ -n $newest ]] || fail "no checkpoint after kill -9: $(ls "$d")"
"$BIN" inspect "$newest" >/dev/null || fail "the newest checkpoint after kill -9, $newest, is not valid"
at=$(h5dump -a /step "$newest" | sed -n 's/.*(0): \([0-9]*\).*/\1/p')
rc=0
out=$(mpi 2 "$BIN" train "${big[@]}" --steps $((at + 2)) --global-batch-size 128 --checkpoint-dir "$d" \
  --resume auto 2>&1) || rc=$?
[[ $rc -eq 0 ]] || fail "the rerun after kill -9 exited $rc: $out"
contains "resumed from $newest at step $at " <<<"$out" || fail "no resume from $newest after kill -9: $out"
final=$d/ckpt-$(printf %09d $((at + 2))).h5
"$BIN" inspect "$final" | contains "valid: yes" || fail "the rerun's checkpoint $final is not valid"
find "$d" -name '*.tmp' | contains . && fail "a .tmp is left after the rerun's saves: $(ls "$d")"
pass "after kill -9 the newest checkpoint (step $at) is valid; the rerun continued from it to step $((at + 2)), exit 0"

# A job killed in the middle of a checkpoint write (test hook: rank 0 dies after writing
# ckpt-000000010.h5.tmp, before the rename): the previous checkpoint stays valid and is the
# one resumed; the partial .tmp is never taken for a checkpoint and the next save removes it.
d=$dir/mid-write
rc=0
RINGTRAIN_TEST_DIE_BEFORE_RENAME=10 mpi 2 -x RINGTRAIN_TEST_DIE_BEFORE_RENAME "$BIN" train \
  "${common[@]}" --steps 20 --checkpoint-every 5 --checkpoint-dir "$d" >/dev/null 2>&1 || rc=$?
(( rc != 0 )) || fail "the job did not die in the checkpoint write"
[[ -f $d/ckpt-000000010.h5.tmp && ! -f $d/ckpt-000000010.h5 ]] || fail "files after the kill: $(ls "$d")"
out=$(mpi 2 "$BIN" train "${common[@]}" --steps 20 --checkpoint-every 5 --checkpoint-dir "$d")
grep -q "resumed from .*ckpt-000000005.h5 at step 5" <<<"$out" || fail "did not resume at step 5: $out"
[[ ! -e $d/ckpt-000000010.h5.tmp && -f $d/ckpt-000000020.h5 ]] || fail "after the rerun: $(ls "$d")"
pass "killed mid-write: step 5 resumed, the partial file ignored and removed"
