#!/usr/bin/env bash
# Diagnosing a stuck or slow job (docs/usage.md, "Diagnosing a slow or stuck job"), at 4 ranks:
#  1. a hang: rank 2 is held inside its gradient reduction before it joins the first bucket's
#     allreduce (test hook RINGTRAIN_TEST_STALL=2:3:120:reduce); every rank's flight-recorder
#     dump exists within --stall-timeout + 5 s of the wait's start, and `ringtrain analyze`
#     names rank 2 and the sequence number the dumps themselves give (read here by python's
#     json); with one dump removed and one cut in the middle of a line, analyze still names
#     them and says what is missing;
#  2. a straggler: a 50 ms delay in rank 1's forward (RINGTRAIN_TEST_SLOW_FORWARD) is named,
#     with its host, by step 10, in one warning line, a `straggler` record and `straggler`
#     spans on rank 1's track of the timeline; analyze of the dumps of
#     --flight-recorder-dump-step names rank 1 as the slowest;
#  3. the same run without the delay, 1000 steps, names nobody;
# and SIGUSR2 (to mpirun, which forwards it) makes every rank dump while training goes on;
#  4. `train --preflight` prints the doctor's table and trains; `--preflight-strict` with rank 1
#     pinned to a core a busy loop holds (at nice 10) names rank 1 and ends with exit 2
#     before training; a bad doctor option at 2 ranks: one message, exit 1.
source "$(dirname "$0")/lib.sh"
dir=$(workdir diagnose)
host=$(hostname)
common=(--data "$DATA/train.h5" --hidden 32 --batch-size 16 --threads 1 --log-every 5)

# --- 1. a hang in the gradient allreduce
rc=0
RINGTRAIN_TEST_STALL=2:3:120:reduce mpi 4 -x RINGTRAIN_TEST_STALL "$BIN" train "${common[@]}" \
  --steps 10 --stall-timeout 3 --debug-dir "$dir/hang" >"$dir/hang.out" 2>"$dir/hang.err" || rc=$?
cat "$dir/hang.err"
[[ $rc -eq 2 ]] || fail "hung job: exit code $rc, expected 2"
contains "flight recorders in $dir/hang" <"$dir/hang.err" || fail "the stall message does not say where the dumps are"
for r in 0 1 2 3; do
  [[ -s $dir/hang/flight-rank-0000$r.jsonl ]] || fail "no flight-recorder dump of rank $r"
done
# The dumps as an independent reader sees them: the seq the waiting ranks are in, rank 2's
# last seq, and how long after the start of their wait the waiting ranks dumped.
read -r seq last2 late < <(/usr/bin/python3 - "$dir/hang" <<'PY'
import json, sys
dumps = {}
for r in range(4):
    lines = [json.loads(l) for l in open(f"{sys.argv[1]}/flight-rank-{r:05d}.jsonl")]
    dumps[r] = lines
waiting = set()
late = 0.0
for r in (0, 1, 3):
    head = dumps[r][0]
    open_ = [e for e in dumps[r] if e["type"] == "collective" and e["end"] is None]
    assert len(open_) == 1, f"rank {r}: {len(open_)} open collectives"
    e = open_[0]
    assert e["kind"] == "allreduce" and e["step"] == 3 and e["bucket"] == 0, e
    waiting.add(e["seq"])
    late = max(late, head["dumped_at"] - e["start"])
assert len(waiting) == 1, waiting
last2 = max(e["seq"] for e in dumps[2] if e["type"] == "collective")
assert all(e["end"] is not None for e in dumps[2] if e["type"] == "collective")
print(waiting.pop(), last2, f"{late:.1f}")
PY
) || fail "the dumps do not show ranks 0, 1, 3 waiting in one allreduce of step 3"
[[ $last2 -eq $((seq - 1)) ]] || fail "rank 2's last collective is seq $last2, expected $((seq - 1))"
/usr/bin/python3 -c "import sys; sys.exit(0 if $late <= 3 + 5 else 1)" ||
  fail "the waiting ranks dumped $late s after their wait began (more than --stall-timeout 3 + 5 s)"
"$BIN" analyze "$dir/hang" >"$dir/hang.analyze" || fail "analyze exited $?"
cat "$dir/hang.analyze"
contains "first divergent collective: seq $seq (allreduce" <"$dir/hang.analyze" || fail "analyze: not seq $seq"
contains "never entered: rank 2 on $host" <"$dir/hang.analyze" || fail "analyze does not name rank 2"
contains "entered, never left: ranks 0, 1, 3" <"$dir/hang.analyze" || fail "analyze: the waiting ranks"
contains "=> the job waits for rank 2 on $host" <"$dir/hang.analyze" || fail "analyze: no verdict"
contains "rank 0 on $host: step 3, in reduce" <"$dir/hang.analyze" || fail "analyze: rank 0's phase"

# The same dumps as a killed job may leave them: rank 3's missing, rank 1's cut mid-line.
mkdir "$dir/partial"
cp "$dir/hang"/flight-rank-0000[012].jsonl "$dir/partial/"
size=$(stat -c %s "$dir/partial/flight-rank-00001.jsonl")
truncate -s $((size * 2 / 3)) "$dir/partial/flight-rank-00001.jsonl"
"$BIN" analyze "$dir/partial" >"$dir/partial.analyze" || fail "analyze of partial dumps exited $?"
cat "$dir/partial.analyze"
contains "missing: rank 3 on $host left no dump" <"$dir/partial.analyze" || fail "analyze: rank 3 missing"
contains "partial: flight-rank-00001.jsonl" <"$dir/partial.analyze" || fail "analyze: rank 1 partial"
contains "never entered: rank 2 on $host" <"$dir/partial.analyze" || fail "analyze (partial): rank 2"
rc=0
"$BIN" analyze "$dir/nothing-here" >/dev/null 2>"$dir/none.err" || rc=$?
[[ $rc -eq 1 ]] || fail "analyze of no directory: exit $rc, expected 1"
contains "is not a directory" <"$dir/none.err" || fail "analyze of no directory: $(cat "$dir/none.err")"
mkdir "$dir/empty"
rc=0
"$BIN" analyze "$dir/empty" >/dev/null 2>"$dir/empty.err" || rc=$?
[[ $rc -eq 1 ]] || fail "analyze of a directory without dumps: exit $rc, expected 1"
contains "no flight-recorder dump (flight-rank-\*.jsonl) in '$dir/empty'" <"$dir/empty.err" ||
  fail "analyze of a directory without dumps: $(cat "$dir/empty.err")"

# --- SIGUSR2 to mpirun, which forwards it: every rank dumps and training goes on (then
# SIGTERM stops the run at a step boundary with a checkpoint, exit 75).
tag=$(job_tag)
E2E_JOB=$tag mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 256 --batch-size 16 \
  --threads 1 --steps 100000 --log-every 10 --metrics "$dir/usr2.jsonl" --checkpoint-dir "$dir/usr2-ckpt" \
  --debug-dir "$dir/usr2" >"$dir/usr2.out" 2>"$dir/usr2.err" &
job=$!
for _ in $(seq 100); do grep -qs '"type":"step"' "$dir/usr2.jsonl" && break; sleep 0.2; done
grep -qs '"type":"step"' "$dir/usr2.jsonl" || fail "the SIGUSR2 job did not start training"
# mpirun of this job (by its tag, lib.sh), which forwards SIGUSR2 to every rank.
mpirun_pid=""
for p in $(job_pids "$tag"); do
  [[ $(cat "/proc/$p/comm" 2>/dev/null) == @(mpirun|orterun) ]] && mpirun_pid=$p
done
[[ -n $mpirun_pid ]] || fail "no mpirun of the SIGUSR2 job found"
kill -USR2 "$mpirun_pid"
for _ in $(seq 50); do
  [[ -s $dir/usr2/flight-rank-00000.jsonl && -s $dir/usr2/flight-rank-00001.jsonl ]] && break
  sleep 0.2
done
steps_at_dump=$(grep -c '"type":"step"' "$dir/usr2.jsonl")
for _ in $(seq 100); do
  (( $(grep -c '"type":"step"' "$dir/usr2.jsonl") > steps_at_dump + 1 )) && break
  sleep 0.2
done
rank0=$(job_pids "$tag" OMPI_COMM_WORLD_RANK=0)
[[ -n $rank0 ]] || fail "no rank 0 of the SIGUSR2 job found"
kill -TERM "$rank0"
rc=0
wait "$job" || rc=$?
cat "$dir/usr2.err"
[[ $rc -eq 75 ]] || fail "the SIGUSR2 job: exit $rc, expected 75 after SIGTERM"
for r in 0 1; do
  f=$dir/usr2/flight-rank-0000$r.jsonl
  [[ -s $f ]] || fail "no SIGUSR2 dump of rank $r"
  head -1 "$f" | contains '"reason":"SIGUSR2"' || fail "rank $r's dump: $(head -1 "$f")"
  contains "ringtrain: rank $r wrote its flight recorder to $f (SIGUSR2)" <"$dir/usr2.err" ||
    fail "rank $r did not say it dumped"
done
(( $(grep -c '"type":"step"' "$dir/usr2.jsonl") > steps_at_dump + 1 )) ||
  fail "training did not go on after the SIGUSR2 dump"

# --- the options' values: exit 1 with one message naming the option and the value
check_option() {
  local want=$1 rc=0
  shift
  mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 2 "$@" >/dev/null 2>"$dir/opt.err" || rc=$?
  [[ $rc -eq 1 ]] || fail "'$*': exit $rc, expected 1"
  [[ $(grep -c '^ringtrain: error:' "$dir/opt.err") -eq 1 ]] || fail "'$*': $(cat "$dir/opt.err")"
  contains "$want" <"$dir/opt.err" || fail "'$*': $(cat "$dir/opt.err")"
}
check_option "--flight-recorder -1 is not valid; expected 0 (off) to 16777216 entries" --flight-recorder -1
check_option "--straggler-threshold 0 is not valid: must be > 0" --straggler-threshold 0
check_option "--straggler-window -5 is not valid: must be >= 0" --straggler-window=-5
check_option "--flight-recorder-dump-step needs --debug-dir or --checkpoint-dir" --flight-recorder-dump-step 1
check_option "--prometheus-every 0 is not valid: must be > 0" --prometheus-every 0

# --- 2. a straggler, and 3. a clean run
straggle=(--straggler-window 5 --straggler-threshold 1.0)
RINGTRAIN_TEST_SLOW_FORWARD=1:50 mpi 4 -x RINGTRAIN_TEST_SLOW_FORWARD "$BIN" train "${common[@]}" \
  "${straggle[@]}" --steps 12 --metrics "$dir/slow.jsonl" --debug-dir "$dir/slow" \
  --flight-recorder-dump-step 12 --timeline "$dir/slow.trace.json" --timeline-steps 1:12 \
  >"$dir/slow.out" 2>"$dir/slow.err" || fail "slow job failed"
cat "$dir/slow.err"
grep -c "straggler:" "$dir/slow.err" | grep -qx 1 || fail "expected one straggler warning line"
grep -qE "ringtrain: straggler: rank 1 on $host computes .* before the gradient reduction, .*x the median .* of 4 ranks \(steps (2-5|6-10);" \
  "$dir/slow.err" || fail "the warning does not name rank 1 by step 10"
/usr/bin/python3 - "$dir/slow.jsonl" <<'PY' || fail "straggler records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"straggler"' in l]
assert recs and all(r["rank"] == 1 for r in recs), recs
assert recs[0]["step"] <= 10, recs[0]
assert recs[0]["compute_s"] > 0.05 and recs[0]["ratio"] > 2, recs[0]
PY
/usr/bin/python3 - "$dir/slow.trace.json" <<'PY' || fail "straggler spans in the timeline"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "straggler"]
assert ev and all(e["pid"] == 1 for e in ev), ev
assert all(e["dur"] > 50e3 for e in ev), ev  # microseconds: the 50 ms delay is inside
PY
"$BIN" analyze "$dir/slow" >"$dir/slow.analyze" || fail "analyze (slow) exited $?"
cat "$dir/slow.analyze"
contains "slowest rank: rank 1 on $host" <"$dir/slow.analyze" || fail "analyze does not name rank 1"
contains "every rank left every recorded collective" <"$dir/slow.analyze" || fail "analyze: a hang where none is"

mpi 4 "$BIN" train "${common[@]}" "${straggle[@]}" --steps 1000 --metrics "$dir/clean.jsonl" \
  >"$dir/clean.out" 2>"$dir/clean.err" || fail "clean job failed"
if grep -q "straggler:" "$dir/clean.err" || grep -qF "\"type\":\"straggler\"" "$dir/clean.jsonl"; then
  cat "$dir/clean.err"
  fail "a clean run named a straggler"
fi
pass "hang: rank 2 and seq $seq named, dumps $late s after the wait began; straggler rank 1 named; clean run quiet"

# --- 4. the pre-flight check
mpi 2 "$BIN" train "${common[@]}" --steps 3 --preflight >"$dir/pre.out" 2>&1 ||
  { cat "$dir/pre.out"; fail "train --preflight exited $?"; }
contains "ringtrain doctor: 2 ranks on 1 node" <"$dir/pre.out" || fail "no doctor table before training: $(cat "$dir/pre.out")"
grep -q "^step 3/3" "$dir/pre.out" || fail "train --preflight did not train: $(cat "$dir/pre.out")"
cat >"$dir/pin.sh" <<'EOF'
#!/usr/bin/env bash
if [[ $OMPI_COMM_WORLD_RANK == 1 ]]; then exec taskset -c 1 nice -n 10 "$@"; fi
exec taskset -c 0 "$@"
EOF
chmod +x "$dir/pin.sh"
taskset -c 1 bash -c 'while :; do :; done' &
busy=$!
rc=0
mpi 2 --bind-to none "$dir/pin.sh" "$BIN" train "${common[@]}" --steps 3 --preflight-strict \
  --checkpoint-dir "$dir/pre-strict" >"$dir/pre-strict.out" 2>&1 || rc=$?
kill "$busy"
cat "$dir/pre-strict.out"
((rc == 2)) || fail "--preflight-strict with rank 1 on a busy core exited $rc, expected 2"
contains "rank 1 on $host: GEMM" <"$dir/pre-strict.out" || fail "--preflight-strict did not name rank 1"
[[ $(grep -c "ringtrain: error" "$dir/pre-strict.out") == 1 ]] || fail "not one error message"
if grep -q "^step " "$dir/pre-strict.out"; then fail "--preflight-strict trained after an outlier"; fi
rc=0
out=$(mpi 2 "$BIN" doctor --outlier 1.5 2>&1) || rc=$?
((rc == 1)) || fail "doctor --outlier 1.5 exited $rc, expected 1: $out"
[[ $(grep -c "ringtrain: error: .*--outlier" <<<"$out") == 1 ]] || fail "not one message naming --outlier: $out"
pass "--preflight prints the doctor table and trains; --preflight-strict stops on rank 1's busy core (exit 2); bad --outlier: exit 1"
