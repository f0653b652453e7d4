#!/usr/bin/env bash
# The Llama ops end to end: models/llama-tiny.pbtxt made small (2 layers, 4 heads, width 32,
# ffn 64, context 16) trains on a generated corpus (`convert text`) at 2 ranks with kv_heads
# 1, 2 and 4, in fp32 and bf16, and its loss falls; `model show` reports the parameters and
# the forward FLOPs an independent count gives, for llama-tiny and llama3-1b (whose --plan
# works too); bad attention settings at 2 ranks are exit 1 with one message naming them.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir llama)
cd "$dir" || exit 1

$PY - <<'PYEOF'
import os, random
random.seed(4)
words = "def return self import class lambda yield for while with".split()
os.makedirs("corpus", exist_ok=True)
for d in range(40):
    with open(f"corpus/doc{d:02d}.py", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(90)) + "\n")
PYEOF
mpi 2 "$BIN" convert text --input 'corpus/*.py' --out data/c.h5 --shards 2 >/dev/null ||
  fail "convert text exited $?"
tiny=(--model llama-tiny --set layers=2 --set heads=4 --width 32 --set ffn=64 --set context=16)
common=("${tiny[@]}" --data 'data/c-*-of-*.h5' --threads 1 --seed 5 --prefetch 0 --log-every 10
  --optimizer adamw --lr 1e-2 --global-batch-size 16 --steps 40)

# losses FILE: the first and the last step record's loss
losses() {
  $PY -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["type"]=="step"]
print(r[0]["loss"], r[-1]["loss"])' "$1"
}
for kv in 1 2 4; do
  for prec in fp32 bf16; do
    mpi 2 "$BIN" train "${common[@]}" --set kv_heads=$kv --precision $prec \
      --metrics "m-$kv-$prec.jsonl" >"train-$kv-$prec.out" 2>&1 ||
      fail "kv_heads $kv $prec: train exited $?: $(cat "train-$kv-$prec.out")"
    read -r first final < <(losses "m-$kv-$prec.jsonl")
    $PY -c "import sys; sys.exit(0 if $final < 0.6 * $first else 1)" ||
      fail "kv_heads $kv $prec: loss $first -> $final did not fall by 40 %"
    echo "kv_heads $kv $prec: loss $first -> $final"
  done
done
pass "llama-tiny trains at 2 ranks with kv_heads 1, 2, 4 in fp32 and bf16 (loss falls by 40 %+ in 40 steps)"

# ---- model show: parameters and FLOPs against an independent count -----------------------
# count LAYERS HEADS KV WIDTH FFN T VOCAB: "params flops" of a Llama at those sizes (T tokens)
count() {
  $PY - "$@" <<'PYEOF'
import sys
L, H, KV, C, F, T, V = map(int, sys.argv[1:])
d = C // H
kvc = KV * d
params = V * C + L * (C + C * C + 2 * kvc * C + C * C + C + 3 * C * F) + C + V * C
lin = lambda i, o: 2 * T * i * o
layer = (4 * T * C                                # input_layernorm
         + lin(C, C) + 2 * lin(C, kvc)            # q, k, v
         + 2 * 2 * C * T * (T + 1) / 2            # causal scores and P V
         + 3 * T * (C + kvc)                      # rotary on q and k
         + lin(C, C) + T * C                      # o_proj, residual add
         + 4 * T * C                              # post_attention_layernorm
         + 2 * lin(C, F) + T * F + T * F          # gate, up, silu, mul
         + lin(F, C) + T * C)                     # down, residual add
flops = T * C + L * layer + 4 * T * C + lin(C, V)
print(params, int(flops))
PYEOF
}
# want_counts NAME LAYERS HEADS KV WIDTH FFN T VOCAB: `model show NAME`'s total line states the
# independent count's parameters exactly and its FLOPs to the 5 digits it prints (a linear's
# bias, the rotation or the causal half would each move them by more).
want_counts() {
  local name=$1 p f total
  shift
  read -r p f < <(count "$@")
  total=$(mpi 2 "$BIN" model show "$name" | grep '^total:') || fail "model show $name exited $?"
  contains " $p parameters" <<<"$total" || fail "$name: want $p parameters: $total"
  $PY - "$total" "$f" <<'PYEOF' || fail "$name: FLOPs differ from the independent count $f: $total"
import re, sys
m = re.search(r"([0-9.]+)([kMGT]?) FLOPs/sample forward", sys.argv[1])
got = float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]
want = float(sys.argv[2])
print(f"FLOPs {got:.6g} printed, {want:.6g} counted")
sys.exit(0 if abs(got - want) <= 1e-4 * want else 1)
PYEOF
  echo "$name: $p parameters, $f FLOPs per sample forward (independent count)"
}
want_counts llama-tiny 4 4 2 128 352 64 256
want_counts llama3-1b 16 32 8 2048 8192 2048 128256
pass "model show llama-tiny, llama3-1b: parameters and forward FLOPs as counted independently"

out=$(mpi 2 "$BIN" model show llama3-1b --plan --precision bf16 --batch-size 1 --seq-len 2048) ||
  fail "model show llama3-1b --plan exited $?: $out"
contains "activations" <<<"$out" || fail "model show --plan: no activations row: $out"
pass "model show llama3-1b --plan"

# ---- bad attention settings: exit 1, one message naming them ---------------------------
bad() {  # bad WHAT PATTERN CMD...: exit 1 and PATTERN once in stderr
  local what=$1 pattern=$2 err rc
  shift 2
  set +e
  err=$(mpi 2 "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [[ $rc -eq 1 ]] || fail "$what: exit $rc: $err"
  [[ $(grep -c -- "$pattern" <<<"$err") -eq 1 ]] || fail "$what: expected one '$pattern' in: $err"
}
bad "kv_heads not dividing heads" "heads 4 is not a multiple of kv_heads 3" \
  "$BIN" train "${common[@]}" --set kv_heads=3
bad "--seq-len beyond the context" "--seq-len 17 is longer than model 'llama-tiny''s context of 16 positions" \
  "$BIN" train "${common[@]}" --seq-len 17
pass "kv_heads 3 of 4 heads, --seq-len beyond the context: exit 1 at 2 ranks, one message each"
