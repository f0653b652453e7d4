#!/usr/bin/env bash
# Faults across emulated nodes, 2 nodes x 1 rank under mpirun: (1) node 1's link cut
# (`tools/netns-cluster.sh link NODE down`: its veth's bridge end down) during training ends
# the job within a bounded time, with a non-zero exit and a message naming the side that no
# longer answers (ringtrain's stall watch after --stall-timeout 5, or Open MPI losing its
# daemon), and once the link is back the same command resumes from the last checkpoint;
# (2) SIGKILL of the rank on node 1 likewise ends the job. The fixture's nodes give up TCP
# retransmissions after about 12 s (--tcp-retries 5) and mn_mpirun sets keepalives on
# Open MPI's daemon connections: with Linux's and Open MPI's defaults, mpirun would wait
# about 15 minutes for the daemon it can no longer reach (docs/launching.md).
source "$(dirname "$0")/lib.sh"
need_cluster
dir=$(tdir multinode-faults)
trap '"$NETNS" link "${P}1" up >/dev/null 2>&1 || true' EXIT
train=(--data "$DATA/train.h5" --hidden 64 --batch-size 32 --threads 1 --log-every 10 --seed 11
       --stall-timeout 5 --checkpoint-every 300 --checkpoint-dir "$dir/ckpt")

# start_training LOG: 2 nodes x 1 rank in the background (pid in $job), until a checkpoint
# exists and training is 10 steps past it, so that the fault meets a step (which the stall
# watch covers) rather than the save.
start_training() {
  MN_TIMEOUT=600 mn_mpirun 1 "$BIN" train "${train[@]}" --steps 1000000 >"$1" 2>&1 &
  job=$!
  for _ in $(seq 1 480); do
    if (($(last_ckpt_step "$dir/ckpt") > 0)) && grep -q '^step 3[1-9]0/' "$1"; then return 0; fi
    kill -0 "$job" 2>/dev/null || { cat "$1"; fail "training ended before its first checkpoint"; }
    sleep 0.25
  done
  cat "$1"
  fail "no checkpoint and 10 more steps within 120 s"
}

# wait_end SECONDS: until the background job ends; sets rc and took (seconds), fails after
# SECONDS.
wait_end() {
  local t0=$SECONDS
  for _ in $(seq 1 $(($1 * 4))); do
    kill -0 "$job" 2>/dev/null || break
    sleep 0.25
  done
  took=$((SECONDS - t0))
  if kill -0 "$job" 2>/dev/null; then
    kill -TERM "$job" 2>/dev/null || true
    fail "the job did not end within $1 s"
  fi
  rc=0
  wait "$job" || rc=$?
}

# What a fault leaves on node 1: a daemon (or rank) that never heard of the end.
kill_left() {
  local pid n=0
  for pid in $(ip netns pids "${P}1"); do
    if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" =~ ^(ringtrain|orted)$ ]]; then
      kill -KILL "$pid" 2>/dev/null || true
      n=$((n + 1))
    fi
  done
  echo "$n"
}

# (1) link cut
start_training "$dir/cut.out"
"$NETNS" link "${P}1" down
wait_end 90
cat "$dir/cut.out"
((rc != 0)) || fail "the job ended with exit 0 after the link cut"
grep -qE "stall: rank 0 on ${P}0 has waited [0-9]+ s .*not arrived: rank 1 on ${P}1 did not answer|Remote daemon: .* on node ${P}1" \
  "$dir/cut.out" || fail "no message names rank 1 on ${P}1 or ${P}1's daemon as unreachable"
pass "link of ${P}1 cut: the job ended in $took s with exit $rc, naming ${P}1"
"$NETNS" link "${P}1" up
left=$(kill_left)
saved=$(last_ckpt_step "$dir/ckpt")
# Right after the link comes back, Open MPI's daemon launch into the node can still time out
# (the bridge port relearns the address); only that launch failure is retried, twice.
for attempt in 1 2 3; do
  rc_resume=0
  MN_TIMEOUT=300 mn_mpirun 1 "$BIN" train "${train[@]}" --steps $((saved + 20)) \
    >"$dir/resume.out" 2>&1 || rc_resume=$?
  ((rc_resume != 0)) && grep -q "ORTE was unable to reliably start one or more daemons" \
    "$dir/resume.out" && ((attempt < 3)) && { sleep 5; continue; }
  break
done
((rc_resume == 0)) || { cat "$dir/resume.out"; fail "the run after the link came back failed"; }
contains "resumed from .*ckpt-0*$saved.h5 at step $saved" <"$dir/resume.out" ||
  { cat "$dir/resume.out"; fail "did not resume from the last checkpoint (step $saved)"; }
pass "link back: resumed from step $saved, trained to $((saved + 20)) ($left process(es) left on ${P}1 by the cut, killed)"

# (2) SIGKILL of the rank on node 1
rm -rf "$dir/ckpt"
start_training "$dir/kill.out"
victim=""
for pid in $(ip netns pids "${P}1"); do
  [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == ringtrain ]] && victim=$pid
done
[[ -n "$victim" ]] || fail "no ringtrain process in ${P}1"
kill -KILL "$victim"
wait_end 60
cat "$dir/kill.out"
((rc != 0)) || fail "the job ended with exit 0 after rank 1 was killed"
grep -qE "rank 1 with PID $victim on node ${P}1 exited on signal 9|not arrived: rank 1 on ${P}1" "$dir/kill.out" ||
  fail "no message names rank 1 on ${P}1"
left=$(kill_left)
pass "rank 1 on ${P}1 killed: the job ended in $took s with exit $rc ($left process(es) left on ${P}1)"
