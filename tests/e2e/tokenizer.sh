#!/usr/bin/env bash
# SentencePiece tokenizers end to end, against PyPI's `sentencepiece` of the library's version
# (in a venv beside Debian's h5py): `tokenizer train` (BPE and unigram, 2 ranks) on a slice of the gpt demo's
# corpus (the first 40 *.py files of /usr/lib/python3.11 in C-locale order); `convert text
# --tokenizer` writes exactly the Python package's encoding of each document followed by the
# eos id, and records the model's bytes, SHA-256, vocabulary and end-of-text id; decoding
# the stored tokens gives each document back byte for byte. Then gpt-tiny trains on 2 ranks
# on a SentencePiece-encoded dataset, `eval` and `sample` run with its tokenizer, and the
# mismatches are refused at 2 ranks with one message: a file that is not a model, training
# and validation data of different tokenizers, a model vocabulary smaller than the
# tokenizer's, `eval` on data of another tokenizer, `sample --tokenizer` of another model.
source "$(dirname "$0")/lib.sh"
dir=$(workdir tokenizer)
cd "$dir" || exit 1
export OMP_NUM_THREADS=1

# The Python package of the library's own version: SentencePiece's releases differ in how
# the unigram model breaks ties between segmentations of equal score.
spm_version=$(pkg-config --modversion sentencepiece) || fail "pkg-config finds no sentencepiece"
venv=$E2E_DIR/spm-venv
if [[ ! -x $venv/bin/python ]] ||
  ! "$venv/bin/python" -c "import sentencepiece as s, h5py; assert s.__version__ == '$spm_version'" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv" || fail "python3 -m venv failed"
  "$venv/bin/pip" install -q "sentencepiece==$spm_version" ||
    fail "pip install sentencepiece==$spm_version failed"
fi
PY=$venv/bin/python

mapfile -d '' files < <(find /usr/lib/python3.11 -name '*.py' -type f -print0 | LC_ALL=C sort -z |
  head -z -n 40)
(( ${#files[@]} == 40 )) || fail "expected 40 corpus files, found ${#files[@]}"
printf '%s\n' "${files[@]}" >files.txt

# check EXPECTED-SUBSTRING ARGS...: 2 ranks, exit 1, one error line containing the substring.
check() {
  local want=$1
  shift
  local rc=0
  mpi 2 "$BIN" "$@" >out 2>err || rc=$?
  local n
  n=$(grep -c '^ringtrain: error:' err || true)
  [[ $rc -eq 1 ]] || { cat err; fail "'$*' exited $rc, expected 1"; }
  [[ $n -eq 1 ]] || { cat err; fail "'$*' printed $n error messages, expected 1"; }
  grep '^ringtrain: error:' err | grep -F -- "$want" >/dev/null ||
    { cat err; fail "'$*': message does not name '$want'"; }
  pass "$(grep '^ringtrain: error:' err)"
}

# ---- train two tokenizers; convert; compare with the Python package ----------------------
for type in bpe unigram; do
  mpi 2 "$BIN" tokenizer train --input "${files[@]}" --vocab-size 1000 --model-type "$type" \
    --out "$type.model" --threads 2 >"train-$type.out" || fail "tokenizer train $type exited $?"
  grep -q "wrote $type.model: SentencePiece $type, vocabulary 1000" "train-$type.out" ||
    fail "tokenizer train $type: $(cat "train-$type.out")"
  "$BIN" convert text --input "${files[@]}" --tokenizer "$type.model" --val-fraction 0 \
    --out "all-$type.h5" --threads 2 >"conv-$type.out" || fail "convert text $type exited $?"
  grep "MB/s" "conv-$type.out" || fail "convert text printed no speed: $(cat "conv-$type.out")"
  "$PY" - "$type.model" "all-$type.h5" files.txt <<'PY' || fail "$type: ringtrain's encoding differs from sentencepiece's"
import hashlib, sys
import h5py, numpy as np, sentencepiece as spm
model, data, listing = sys.argv[1:]
sp = spm.SentencePieceProcessor(model_file=model)
docs = [open(p, "rb").read() for p in open(listing).read().splitlines()]
docs = [d for d in docs if d]
want, starts = [], []
for d in docs:
    starts.append(len(want))
    want += sp.encode(d.decode("utf-8")) + [sp.eos_id()]
with h5py.File(data, "r") as f:
    got = f["tokens"][...].astype(np.int64)
    offsets = f["doc_offsets"][...]
    a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    blob = f["tokenizer_model"][...].tobytes()
    mb = open(model, "rb").read()
    assert a["tokenizer"] == "sentencepiece", a["tokenizer"]
    assert a["tokenizer_sha256"] == hashlib.sha256(mb).hexdigest(), a["tokenizer_sha256"]
    assert blob == mb, "/tokenizer_model is not the model file"
    assert a["vocab_size"] == sp.vocab_size() == 1000, (a["vocab_size"], sp.vocab_size())
    assert a["eot_id"] == sp.eos_id() == 2, a["eot_id"]
assert len(got) == len(want), (len(got), len(want))
bad = np.flatnonzero(got != np.array(want))
assert bad.size == 0, f"{bad.size} tokens differ, first at {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"
assert list(offsets) == starts + [len(want)], "doc_offsets"
for i, d in enumerate(docs):  # decode(encode(x)) == x, from ringtrain's tokens
    ids = got[offsets[i]:offsets[i + 1] - 1].tolist()
    assert sp.decode(ids).encode("utf-8") == d, f"document {i} does not round-trip"
print(f"{len(want)} tokens of {len(docs)} documents ({sum(map(len, docs))} bytes) equal "
      "sentencepiece's; every document round-trips")
PY
  pass "$type: encodings equal the Python sentencepiece package's; decode(encode(x)) == x"
done

# ---- train, eval and sample on a SentencePiece dataset ------------------------------------
"$BIN" convert text --input "${files[@]}" --tokenizer bpe.model --val-fraction 0.1 \
  --out d/c.h5 --shards 2 --threads 2 >/dev/null || fail "convert text (split) exited $?"
"$BIN" convert text --input "${files[@]}" --tokenizer unigram.model --val-fraction 0.1 \
  --out u/c.h5 >/dev/null || fail "convert text (unigram, split) exited $?"
"$BIN" convert text --input "${files[@]}" --val-fraction 0.1 --out b/c.h5 >/dev/null ||
  fail "convert text (bytes) exited $?"
tiny=(--model gpt-tiny --set layers=2 --set heads=2 --set width=32 --set context=32
  --set padded_vocab=1024 --seq-len 32)
mpi 2 "$BIN" train "${tiny[@]}" --data 'd/c-*-of-*.h5' --val-data d/c-val.h5 --steps 40 \
  --batch-size 8 --optimizer adamw --lr 3e-3 --threads 1 --seed 3 --checkpoint-dir ck \
  --eval-every 40 --metrics m.jsonl --log-every 20 >train.out || fail "train exited $?"
"$PY" - m.jsonl <<'PY' || fail "the training loss did not fall: $(cat m.jsonl)"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["type"] == "step"]
first, last = steps[0]["loss"], steps[-1]["loss"]
print(f"loss {first:.3f} -> {last:.3f}")
assert last < first - 0.5, (first, last)
PY
ckpt=ck/ckpt-000000040.h5
h5dump -a /tokenizer "$ckpt" | contains '"sentencepiece"' || fail "the checkpoint records no tokenizer"
mpi 2 "$BIN" eval --checkpoint "$ckpt" --data d/c-val.h5 --threads 1 >eval.out ||
  fail "eval exited $?"
for t in "" "--tokenizer bpe.model"; do
  # shellcheck disable=SC2086  # $t: no option or two words
  mpi 2 "$BIN" sample --checkpoint "$ckpt" --prompt 'def main():' --tokens 20 --num-samples 3 \
    --threads 1 $t >sample.out || fail "sample $t exited $?"
  n=$(awk '/^--- sample [0-9]+ of 3/ { getline; if (index($0, "def main():") == 1) n++ } END { print n + 0 }' sample.out)
  [[ $n -eq 3 ]] ||
    fail "sample $t: expected 3 samples starting with the prompt: $(cat sample.out)"
done
pass "trained (loss falling), evaluated and sampled (decoded) with the SentencePiece dataset"

# ---- refusals, at 2 ranks --------------------------------------------------------------
echo "not a model" >bad.model
check "--tokenizer '$dir/bad.model' is not a SentencePiece model" convert text \
  --input "${files[@]}" --tokenizer "$dir/bad.model" --out x/x.h5
check "--vocab-size 10 is not valid" tokenizer train --input "${files[@]}" --vocab-size 10 \
  --out x.model
check "--model-type 'char' is not valid" tokenizer train --input "${files[@]}" --vocab-size 500 \
  --model-type char --out x.model
check "--val-data 'u/c-val.h5' was encoded with tokenizer sentencepiece" train "${tiny[@]}" \
  --data 'd/c-*-of-*.h5' --val-data u/c-val.h5 --steps 1 --threads 1
check "--val-data 'b/c-val.h5' was encoded with tokenizer bytes" train "${tiny[@]}" \
  --data 'd/c-*-of-*.h5' --val-data b/c-val.h5 --steps 1 --threads 1
check "has vocab_size 1000, larger than model 'gpt-tiny''s embedding of 512" train \
  --model gpt-tiny --set layers=1 --set width=32 --set heads=2 --set padded_vocab=512 \
  --data 'd/c-*-of-*.h5' --steps 1 --threads 1
check "--data 'u/c.h5' was encoded with tokenizer sentencepiece" train "${tiny[@]}" \
  --data u/c.h5 --steps 50 --batch-size 8 --optimizer adamw --lr 3e-3 --threads 1 --seed 3 \
  --checkpoint-dir ck
check "--data 'u/c-val.h5' was encoded with tokenizer sentencepiece" eval --checkpoint "$ckpt" \
  --data u/c-val.h5 --threads 1
check "--data 'b/c-val.h5' was encoded with tokenizer bytes" eval --checkpoint "$ckpt" \
  --data b/c-val.h5 --threads 1
check "--tokenizer 'unigram.model' has SHA-256 $(sha256sum unigram.model | cut -c1-64)" sample \
  --checkpoint "$ckpt" --prompt 'x' --tokens 2 --tokenizer unigram.model --threads 1
check "--tokenizer '$dir/bad.model' is not a SentencePiece model" sample --checkpoint "$ckpt" \
  --prompt 'x' --tokens 2 --tokenizer "$dir/bad.model" --threads 1
