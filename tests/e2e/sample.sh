#!/usr/bin/env bash
# `ringtrain sample` end to end: a small GPT trained on a repetitive text continues it; the
# greedy continuation (--top-k 1) equals PyTorch's from the checkpoint's parameters
# (tests/e2e/greedy_ref.py, float64); the same seed gives the same samples on 1 and 2 ranks
# and another seed other text; bf16 samples; bad input (an image model, bad options, and a
# bad checkpoint on rank 1 only) is exit 1 with one message on every rank.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
dir=$(workdir sample)
cd "$dir" || exit 1

# ---- a GPT that has learned a text ------------------------------------------------------
mkdir corpus
for i in $(seq 1 60); do
  printf 'the quick brown fox jumps over the lazy dog %d times.\n' $((i % 7)) >>corpus/a.txt
done
out=$("$BIN" convert text --input corpus/a.txt --out data/t.h5 --val-fraction 0) \
  || fail "convert text exited $?: $out"
gpt=(--model gpt-tiny --set layers=2 --set heads=2 --width 64 --seq-len 32)
out=$(mpi 2 "$BIN" train --data data/t.h5 "${gpt[@]}" --batch-size 16 --steps 300 \
  --optimizer adamw --lr 3e-3 --threads 1 --seed 3 --checkpoint-dir ck --log-every 100) \
  || fail "training the GPT exited $?: $out"
cks=(ck/ckpt-*.h5)
ck=${cks[-1]}

# ---- greedy = PyTorch's greedy, and it has learned the text ------------------------------
printf 'the quick' >prompt.txt
"$BIN" sample --checkpoint "$ck" --prompt "$(cat prompt.txt)" --tokens 50 --top-k 1 >greedy.txt \
  || fail "sample exited $?"
head -c -1 greedy.txt >greedy.bin  # without the newline sample ends with
$PY "$HERE/greedy_ref.py" "$ck" 2 32 prompt.txt 50 greedy.bin || fail "greedy text differs from PyTorch's: $(cat greedy.txt)"
grep -q '^the quick brown fox jumps over the lazy dog [0-6] times\.$' <(head -1 greedy.txt) \
  || fail "the trained model does not continue its text: $(cat greedy.txt)"
pass "sample --top-k 1 continues 'the quick' as PyTorch does from the checkpoint's parameters: $(head -1 greedy.txt)"

# ---- seeds: rank-independent, and they matter ----------------------------------------------
s=(sample --checkpoint "$ck" --prompt "the " --tokens 60 --temperature 1.5 --top-k 20 --num-samples 3 --threads 1)
"$BIN" "${s[@]}" --seed 7 >one.txt || fail "sample on 1 rank exited $?"
mpi 2 "$BIN" "${s[@]}" --seed 7 >two.txt || fail "sample on 2 ranks exited $?"
cmp one.txt two.txt || fail "--seed 7 gives other text on 2 ranks"
"$BIN" "${s[@]}" --seed 8 >eight.txt || fail "sample --seed 8 exited $?"
$PY - <<'EOF2' || fail "samples of --seed 7 and 8 are not as expected"
import re
def samples(f, seed):
    parts = re.split(rb"(?:^|\n)--- sample [123] of 3 \(seed %d\) ---\n" % seed, open(f, "rb").read())
    assert parts[0] == b"" and len(parts) == 4, (f, parts)
    # each sample: the prompt + 60 bytes, then the newline sample ends with
    assert all(len(p) == 65 and p.startswith(b"the ") and p.endswith(b"\n") for p in parts[1:]), parts
    return [p[:-1] for p in parts[1:]]
seven, eight = samples("one.txt", 7), samples("eight.txt", 8)
assert len(set(seven)) == 3, ("one seed's 3 samples are not all different", seven)
assert not set(seven) & set(eight), ("--seed 8 repeats a sample of --seed 7", seven, eight)
EOF2
pass "--seed 7 gives the same 3 samples on 1 and 2 ranks; --seed 8 other text"

out=$("$BIN" sample --checkpoint "$ck" --prompt "the quick" --tokens 20 --top-k 1 --precision bf16) \
  || fail "sample --precision bf16 exited $?"
[[ ${#out} -eq 29 ]] || fail "bf16 sample has ${#out} bytes, not 9 + 20: $out"
pass "sample --precision bf16: $out"

# ---- bad input: exit 1, one message ------------------------------------------------------
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 2 --hidden 16 --threads 1 \
  --checkpoint-dir img >/dev/null || fail "training the MLP exited $?"
imgs=(img/ckpt-*.h5)
img=${imgs[-1]}
bad() {  # bad EXPECTED-MESSAGE-PART ARGS...: exit 1 on 2 ranks, the message printed once
  local want=$1 rc=0 err
  shift
  err=$(mpi 2 "$BIN" sample "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -eq 1 ]] || fail "sample $* exited $rc, not 1: $err"
  [[ $(grep -c "ringtrain: error:" <<<"$err") -eq 1 ]] || fail "sample $*: not one message: $err"
  grep -qF -- "$want" <<<"$err" || fail "sample $*: the message lacks '$want': $err"
}
bad "holds a model of [1, 28, 28] inputs, not a language model" --checkpoint "$img" --prompt x --tokens 3
bad "--temperature 0 is not valid: must be > 0" --checkpoint "$ck" --prompt x --tokens 3 --temperature 0
bad "--temperature nan is not valid: must be finite" --checkpoint "$ck" --prompt x --tokens 3 --temperature nan
bad "--top-k 257 is not valid; expected 1 to 256" --checkpoint "$ck" --prompt x --tokens 3 --top-k 257
bad "--prompt is empty" --checkpoint "$ck" --prompt "" --tokens 3
bad "--tokens 0 is not valid" --checkpoint "$ck" --prompt x --tokens 0
bad "nope.h5" --checkpoint nope.h5 --prompt x --tokens 3
# rank 1 alone gets the image checkpoint: still one message, every rank exits 1 at once
rc=0
err=$(timeout 60 mpirun -n 1 "$BIN" sample --checkpoint "$ck" --prompt x --tokens 3 : \
  -n 1 "$BIN" sample --checkpoint "$img" --prompt x --tokens 3 2>&1 >/dev/null) || rc=$?
[[ $rc -eq 1 ]] || fail "a bad checkpoint on rank 1 only: exit $rc, not 1: $err"
[[ $(grep -c "ringtrain: error:" <<<"$err") -eq 1 ]] || fail "a bad checkpoint on rank 1 only: $err"
grep -qF "not a language model" <<<"$err" || fail "a bad checkpoint on rank 1 only: $err"
pass "bad input (image model, temperature, top-k, empty prompt, tokens, missing file, rank 1 only): exit 1, one message"
