#!/usr/bin/env bash
# What a person watching a run sees: the progress bar redrawn on time (not only every
# --log-every steps), the summary line that ends every run (steps, wall time, throughput,
# best validation, last checkpoint, how to continue), and under mpirun a stop by
# `kill -USR1 <mpirun>` explained on stderr next to Open MPI's "job has been aborted" report.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
dir=$(workdir progress)
args=(train --data "$DATA/train.h5" --val-data "$DATA/test.h5" --hidden 64 --threads 1
      --checkpoint-dir "$dir/ck")

# ---- the bar between --log-every lines --------------------------------------------------
# One rank held 1.5 s before step 100 (the test hook): the bar is drawn after step 1 and
# again after step 100 (more than the redraw interval later), though --log-every is 200.
rc=0
RINGTRAIN_TEST_STALL=0:100:1.5 timeout 120 "$BIN" "${args[@]}" --steps 200 --log-every 200 \
  --progress bar >"$dir/bar.out" 2>"$dir/bar.err" || rc=$?
[[ $rc -eq 0 ]] || fail "bar run exited $rc: $(cat "$dir/bar.err")"
tr '\r' '\n' <"$dir/bar.out" >"$dir/bar.frames"
for s in 1 100 200; do
  grep -q "^\[[#.]\{20\}\] step $s/200 epoch 0 loss [0-9.]* acc [0-9.]* " "$dir/bar.frames" ||
    fail "no bar frame of step $s/200: $(cat "$dir/bar.frames")"
done
frames=$(grep -c '^\[[#.]\{20\}\] step ' "$dir/bar.frames")
((frames < 50)) || fail "$frames frames for 200 steps: the bar is redrawn every step, not on time"
pass "--progress bar with --log-every 200: redrawn after steps 1 and 100 (the stall) and 200, $frames frames"

# ---- the summary line -----------------------------------------------------------------
num='[0-9][0-9.]*'
val=$(sed -n 's/^eval step 200: val loss \([0-9.]*\) accuracy \([0-9.]*\) .*/\1 (accuracy \2)/p' "$dir/bar.out")
[[ -n $val ]] || fail "no eval line: $(cat "$dir/bar.out")"
want="^run summary: 200 step(s) (1-200 of 200) in ${num}s, ${num} samples/s; best val loss $val at step 200; last checkpoint $dir/ck/ckpt-000000200.h5; to train further, run the same command with a larger --steps or --epochs (it resumes from the newest checkpoint in $dir/ck)\$"
[[ $(grep -c "$want" "$dir/bar.out") -eq 1 ]] || fail "expected the summary line $want: $(cat "$dir/bar.out")"
[[ $(tail -n 1 "$dir/bar.out") == "run summary: "* ]] || fail "the summary is not the last line"
ckpt_count=$(find "$dir/ck" -name 'ckpt-000000200.h5' | wc -l)
((ckpt_count == 1)) || fail "the checkpoint named in the summary does not exist"
pass "summary: steps, wall time, samples/s, the best validation as the eval line printed it, the checkpoint"

# The same command with more steps continues there; its summary counts only its own steps.
out=$(timeout 120 "$BIN" "${args[@]}" --steps 260 --log-every 20 2>&1) || fail "the longer run exited $?: $out"
contains "^run summary: 60 step(s) (201-260 of 260) in ${num}s, ${num} samples/s; best val loss .* at step 260; last checkpoint $dir/ck/ckpt-000000260.h5; " <<<"$out" ||
  fail "the resumed run's summary: $out"
pass "a resumed run's summary counts its own 60 steps"

# ---- stop under mpirun: kill -USR1 <mpirun> --------------------------------------------
rm -rf "$dir/ck"
rc=0
timeout 120 mpirun -n 2 "$BIN" "${args[@]}" --steps 300000 --batch-size 32 --log-every 100 \
  --metrics "$dir/stop.jsonl" >"$dir/stop.out" 2>"$dir/stop.err" &
job=$!
for _ in $(seq 1 150); do  # the handlers are installed once a step is done
  grep -q '"type":"step"' "$dir/stop.jsonl" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || fail "the job ended before training: $(cat "$dir/stop.err")"
  sleep 0.2
done
mpirun_pid=$(pgrep -P "$job" -x mpirun) || fail "no mpirun under this test's timeout ($job)"
kill -USR1 "$mpirun_pid"
wait "$job" || rc=$?
[[ $rc -eq 75 ]] || fail "mpirun exited $rc after USR1, expected 75: $(cat "$dir/stop.out" "$dir/stop.err")"
# mpirun forwards the signal to each rank; one that gets it after the step's agreement is
# not named ("on rank 0" rather than "on all 2 ranks"), but every rank stops at that step.
pattern="^stopped by SIGUSR1 on \(all 2 ranks\|rank [01]\) at step \([0-9]*\); checkpoint $dir/ck/ckpt-[0-9]\{9\}\.h5 saved\. Run the same command again to continue\.\$"
step=$(sed -n "s#$pattern#\2#p" "$dir/stop.out")
[[ -n $step ]] || fail "no stop line: $(cat "$dir/stop.out")"
ck="$dir/ck/ckpt-$(printf %09d "$step").h5"
[[ -f $ck ]] || fail "$ck does not exist"
# Open MPI's report, which the line explains, is there (the documented banner) ...
contains "job has been aborted" <"$dir/stop.err" || fail "no Open MPI banner: $(cat "$dir/stop.err")"
contains "Exit code: *75" <"$dir/stop.err" || fail "the banner names no exit code 75"
# ... and exactly one line on stderr, from rank 0, says that it is the requested stop.
note="^ringtrain: stop: requested by SIGUSR1, done at step $step with checkpoint $ck; mpirun's \"job has been aborted ... Exit code: 75\" report that follows is this stop, not a failure. Run the same command again to continue.\$"
[[ $(grep -c "$note" "$dir/stop.err") -eq 1 ]] ||
  fail "expected one stderr line $note: $(cat "$dir/stop.err")"
contains "^run summary: $step step(s) (1-$step of 300000) in ${num}s, ${num} samples/s; \(best val loss [^;]*; \)\{0,1\}last checkpoint $ck\$" <"$dir/stop.out" ||
  fail "the stopped run's summary: $(cat "$dir/stop.out")"
pass "USR1 to mpirun: exit 75, the stop line, one stderr line explaining mpirun's banner, the summary"
