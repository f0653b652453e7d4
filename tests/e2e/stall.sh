#!/usr/bin/env bash
# Stall detection: rank 2 of 3 is held back before step 3 (test hook RINGTRAIN_TEST_STALL);
# the other ranks wait in the gradient allreduce longer than --stall-timeout 2, print which
# rank has not arrived and where it is, and the job ends with exit code 2 (no hang).
source "$(dirname "$0")/lib.sh"
dir=$(workdir stall)
start=$(date +%s)
rc=0
RINGTRAIN_TEST_STALL=2:3:120 mpi 3 -x RINGTRAIN_TEST_STALL "$BIN" train --data "$DATA/train.h5" \
  --hidden 32 --batch-size 16 --steps 10 --threads 1 --stall-timeout 2 >"$dir/out" 2>"$dir/err" || rc=$?
took=$(( $(date +%s) - start ))
cat "$dir/err"
[[ $rc -eq 2 ]] || fail "exit code $rc, expected 2"
(( took < 60 )) || fail "the job took $took s to end"
grep -q "stall: rank [01] on .* in the gradient allreduce of step 3 bucket 0; not arrived: rank 2 on [^ ]* is at step 2" \
  "$dir/err" || fail "the message does not name rank 2 at step 2"
pass "stall detected in $took s, rank 2 named, exit 2"
