#!/usr/bin/env bash
# Token data end to end: `convert text` under 2 ranks (bytes as stored, read back with
# h5dump; documents split into train shards and the held-out file), the unigram/bigram
# baselines of `eval --baselines` against a Python computation from the raw bytes, and the
# bad inputs (empty corpus, a glob matching nothing, a token file given to an image model):
# exit 1 with one message naming the file and the number.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
dir=$(workdir text)
cd "$dir" || exit 1

# ---- a corpus of 12 documents, one not UTF-8 -------------------------------------------
mkdir -p corpus/sub
for i in 00 01 02 03 04 05 06 07 08 09; do
  printf 'def f%s(x):\n    return x * %s  # doc %s\n' "$i" "$i" "$i" >"corpus/sub/m$i.py"
done
printf 'caf\xe9 \xff\xfe raw bytes\n' >corpus/latin1.py
printf 'top = 1\n' >corpus/top.py
out=$(mpi 2 "$BIN" convert text --input 'corpus/**/*.py' --out data/t.h5 --shards 2 \
  --val-fraction 0.25) || fail "convert text exited $?: $out"
[[ $(grep -c "^wrote data/t-val.h5: " <<<"$out") -eq 1 ]] || fail "2 ranks print once: $out"
# Documents in name order: corpus/latin1.py, corpus/sub/m00..m09.py, corpus/top.py; with
# F = 0.25 of 12, the 4th, 8th and 12th (m02, m06, top) are held out.
dump() { h5dump -d /tokens -b LE -o "$2" "$1" >/dev/null; }
dump data/t-00000-of-00002.h5 s0.bin
dump data/t-00001-of-00002.h5 s1.bin
dump data/t-val.h5 val.bin
cat corpus/latin1.py corpus/sub/m0{0,1,3,4,5,7,8,9}.py >want-train.bin
cat corpus/sub/m02.py corpus/sub/m06.py corpus/top.py >want-val.bin
cat s0.bin s1.bin | cmp - want-train.bin || fail "training shards differ from the corpus bytes"
cmp val.bin want-val.bin || fail "validation file differs from documents 4, 8, 12"
h5dump -a /tokenizer data/t-val.h5 | contains '"bytes"' || fail "tokenizer attribute"
h5dump -d /doc_offsets data/t-val.h5 | contains "0, 40, 80, 88" || fail "val doc offsets: $(h5dump -d /doc_offsets data/t-val.h5)"
pass "convert text on 2 ranks: every byte (non-UTF-8 too) in 2 shards + held-out documents, read back with h5dump"

# ---- baselines against Python ---------------------------------------------------------
got=$("$BIN" eval --data data/t-val.h5 --baselines 'data/t-*-of-*.h5' --seq-len 8 --metrics m.jsonl) \
  || fail "eval --baselines exited $?: $got"
$PY - <<'EOF2' || fail "baselines differ from Python's: $got"
import json, math
s0, s1, val = (open(f, "rb").read() for f in ("s0.bin", "s1.bin", "val.bin"))
V = 256
uni = [0] * V; first = [0] * V; bi = {}
for s in (s0, s1):
    for t in s: uni[t] += 1
    for a, b in zip(s, s[1:]):
        first[a] += 1; bi[a, b] = bi.get((a, b), 0) + 1
N = len(s0) + len(s1)
last = (len(val) - 1) // 8 * 8  # targets of whole windows of 8
u = -sum(math.log((uni[val[p]] + 1) / (N + V)) for p in range(1, last + 1)) / last
b = -sum(math.log((bi.get((val[p-1], val[p]), 0) + 1) / (first[val[p-1]] + V)) for p in range(1, last + 1)) / last
rec = [json.loads(l) for l in open("m.jsonl")][-1]
assert rec["type"] == "baseline" and rec["targets"] == last, rec
assert abs(rec["unigram"] - u) < 1e-7 * u and abs(rec["bigram"] - b) < 1e-7 * b, (rec, u, b)  # 9 digits
EOF2
grep -q "bigram .* nats/token .* bits/byte" <<<"$got" || fail "eval prints nats/token and bits/byte: $got"
pass "eval --baselines: unigram and bigram cross-entropy equal Python's from the raw bytes"

# ---- bad input: exit 1, one message naming the file and the number ------------------------
mkdir -p empty && : >empty/a.txt && : >empty/b.txt
set +e
err=$(mpi 2 "$BIN" convert text --input 'empty/*.txt' --out e/x.h5 2>&1 >/dev/null); rc=$?
set -e
[[ $rc -eq 1 ]] || fail "empty corpus: exit $rc: $err"
[[ $(grep -c "empty/\*.txt'.*the corpus is empty (2 file(s), 0 bytes)" <<<"$err") -eq 1 ]] \
  || fail "empty corpus message (once): $err"
[[ ! -e e/x.h5 && ! -e e/x-val.h5 ]] || fail "empty corpus left files"
set +e
err=$(mpi 2 "$BIN" convert text --input 'nothing/*.txt' --out e/x.h5 2>&1 >/dev/null); rc=$?
set -e
{ [[ $rc -eq 1 ]] && contains "nothing/\*.txt' matches no file" <<<"$err"; } || fail "glob: $rc $err"
set +e
err=$(mpi 2 "$BIN" train --data data/t-00000-of-00002.h5 --steps 1 2>&1 >/dev/null); rc=$?
set -e
[[ $(grep -c "holds a token stream" <<<"$err") -eq 1 ]] || fail "one message at 2 ranks: $err"
set +e
set -e
{ [[ $rc -eq 1 ]] && contains "t-00000-of-00002.h5' holds a token stream, but model 'mlp' takes images" <<<"$err"; } \
  || fail "token data to an image model: $rc $err"
set +e
err=$("$BIN" eval --data data/t-val.h5 --baselines data/t-00000-of-00002.h5 --seq-len 200 2>&1); rc=$?
set -e
{ [[ $rc -eq 1 ]] && contains "holds no target for windows of 200 tokens" <<<"$err"; } \
  || fail "seq-len beyond the validation file: $rc $err"
pass "empty corpus, a glob of nothing, token data to an image model, windows longer than the file: exit 1 naming file and number"
