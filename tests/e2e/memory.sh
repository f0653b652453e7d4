#!/usr/bin/env bash
# Memory, measured and planned: `model show --plan` prints a plan of any rank count without
# allocating it (GPT-2 1.5B at W = 512 on this machine); a run prints its plan at start-up
# and its measured peaks per category at the end, and writes the `memory` metrics record
# (read back by python's json: every rank's peak of each category within 10 % of its plan);
# a --memory-budget too small is refused at start-up on 2 ranks (exit 1, one message naming
# the figures and what would fit), also when it is rank 1's check that fails; a budget that
# no setting meets says so; and a bad budget value is exit 1.
source "$(dirname "$0")/lib.sh"
dir=$(workdir memory)
PY=/usr/bin/python3

# The plan of GPT-2 1.5B (48 blocks of width 1600, 25 heads) at 512 ranks, --zero 3, bf16:
# masters + optimizer state 12P/W, and no rank holds its 6 GB of masters.
out=$("$BIN" model show gpt2-124m --set layers=48 --set width=1600 --set heads=25 --plan \
  --ranks 512 --zero 3 --precision bf16 --batch-size 1 --seq-len 1024)
echo "$out"
contains "memory plan per rank: 512 rank(s), --zero 3, --recompute none, bf16, adamw" <<<"$out" ||
  fail "no plan header: $out"
state=$(awk '/^masters |^optimizer /{s += $2} END {print s}' <<<"$out")
params=$(sed -n "s/^model 'gpt2-124m': \([0-9]*\) parameters.*/\1/p" <<<"$out")
[[ -n $params && $params -gt 1500000000 ]] || fail "GPT-2 1.5B has $params parameters: $out"
$PY -c "import sys; s, p = $state, $params; r = s * 512 / p; sys.exit(0 if abs(r - 12) < 0.01 else 1)" ||
  fail "masters + optimizer x 512 ranks is not 12 bytes per parameter: $state B, $params parameters"
pass "model show --plan: GPT-2 1.5B at 512 ranks, --zero 3: masters + optimizer state = 12P/W"
rc=0
err=$("$BIN" model show cnn --input 1,28,28 --plan --recompute blocks 2>&1) || rc=$?
[[ $rc -eq 1 ]] && contains "--recompute blocks: model 'cnn' has no repeat body" <<<"$err" ||
  fail "--recompute blocks on the CNN: exit $rc: $err"
pass "model show --plan --recompute blocks on a model without repeats: exit 1"

# A run: the plan first, the measured peaks last, the record between them.
args=(--data "$DATA/train.h5" --hidden 256,128 --global-batch-size 64 --threads 1 --steps 5
  --optimizer adamw --log-every 5)
mpi 2 "$BIN" train "${args[@]}" --zero 1 --precision bf16 --metrics "$dir/m.jsonl" \
  --memory-budget 1G >"$dir/run.out" 2>&1 || fail "the run failed: $(cat "$dir/run.out")"
contains "^memory plan/rank (rank 0 of 2, --zero 1, 32 sample(s)/micro-batch): masters .*; total .* of --memory-budget 1.00 GiB" <"$dir/run.out" ||
  fail "no plan line: $(cat "$dir/run.out")"
contains "^memory peak/rank (measured, the largest of 2 rank(s); \[rank 0's plan\]): masters " <"$dir/run.out" ||
  fail "no peak line: $(cat "$dir/run.out")"
$PY - "$dir/m.jsonl" <<'PYEOF' || fail "the memory record: $(grep memory "$dir/m.jsonl")"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
mem = [r for r in recs if r["type"] == "memory"]
assert len(mem) == 1, mem
m = mem[0]
assert m["world_size"] == 2 and m["zero"] == 1 and m["step"] == 5 and m["budget"] == 1 << 30, m
cats = ["masters", "optimizer", "working", "gathered", "gradients", "activations", "workspace"]
assert [r["rank"] for r in m["ranks"]] == [0, 1], m
for r in m["ranks"]:
    for c in cats + ["total"]:
        peak, plan = r["peak"][c], r["planned"][c]
        assert abs(peak - plan) <= 0.10 * plan, (r["rank"], c, peak, plan)
    assert r["peak"]["masters"] < r["startup_peak"]["masters"], "set-up held the full masters"
    print(r["rank"], {c: (r["peak"][c], r["planned"][c]) for c in cats})
assert recs[-1]["type"] == "stop", recs[-1]
PYEOF
pass "plan line, peak line and the memory record: every category within 10 % of the plan on both ranks"

# Refused at start-up on 2 ranks: one message, the figures, what would fit.
check() { # EXPECTED-SUBSTRING COMMAND...: the command exits 1 with one such message
  local want=$1
  shift
  local rc=0 n
  "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  n=$(grep -c '^ringtrain: error:' "$dir/err" || true)
  [[ $rc -eq 1 && $n -eq 1 ]] || { cat "$dir/err"; fail "'$*' exited $rc with $n messages"; }
  grep '^ringtrain: error:' "$dir/err" | grep -F -- "$want" >/dev/null ||
    { cat "$dir/err"; fail "'$*': the message does not say '$want'"; }
  pass "$(grep '^ringtrain: error:' "$dir/err" | cut -c1-400)"
}
check "It would fit with --zero 1 (" mpi 2 "$BIN" train "${args[@]}" --memory-budget 3500K
check "It would fit with --zero 1 on 5 ranks" mpi 2 "$BIN" train "${args[@]}" --memory-budget 2700K
check "It fits at no --zero stage" mpi 2 "$BIN" train "${args[@]}" --memory-budget 100K
check "--memory-budget 'lots' is not valid" mpi 2 "$BIN" train "${args[@]}" --memory-budget lots
# Only rank 1's check fails (its --config gives it the smaller budget).
printf 'memory-budget = 2700K\n' >"$dir/small.ini"
printf 'memory-budget = 1G\n' >"$dir/big.ini"
check "rank 1 would hold" timeout 300 mpirun -n 1 "$BIN" train "${args[@]}" --config "$dir/big.ini" : \
  -n 1 "$BIN" train "${args[@]}" --config "$dir/small.ini"
