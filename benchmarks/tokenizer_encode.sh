#!/usr/bin/env bash
# `convert text --tokenizer` encoding speed against the Python `sentencepiece` package of the
# same library version, on the same corpus and model, in one run: trains a BPE and a unigram
# tokenizer (--vocab-size, default 4096) on the gpt demo's corpus (the *.py files of
# /usr/lib/python3.11), converts the corpus with each on 1..--threads threads, encodes it
# with the Python package (one thread, document by document, as convert does), and prints
# one row per model and thread count: bytes, tokens, seconds, tokens/s, MB/s, MB/s per
# thread, and the ratio to Python's MB/s. The Python package comes from a venv under --dir
# (pip install sentencepiece==<pkg-config's version>).
set -euo pipefail

usage() {
  echo "usage: benchmarks/tokenizer_encode.sh [--bin RINGTRAIN] [--corpus DIR] [--dir DIR] [--threads N] [--vocab-size V]"
  echo "  defaults: build/bin/ringtrain, /usr/lib/python3.11, build/tokenizer-bench, 2, 4096"
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$here/build/bin/ringtrain
corpus=/usr/lib/python3.11
dir=$here/build/tokenizer-bench
threads=2
vocab=4096
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --corpus) corpus=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --vocab-size) vocab=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
[[ -x $bin ]] || { echo "tokenizer_encode.sh: $bin is not built (or give --bin)" >&2; exit 1; }
mkdir -p "$dir"
version=$(pkg-config --modversion sentencepiece)
venv=$dir/venv
if ! "$venv/bin/python" -c "import sentencepiece as s; assert s.__version__ == '$version'" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q "sentencepiece==$version"
fi
mapfile -d '' files < <(find "$corpus" -name '*.py' -type f -print0 | LC_ALL=C sort -z)
printf '%s\n' "${files[@]}" >"$dir/files.txt"
export OMP_NUM_THREADS=1
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(getconf _NPROCESSORS_ONLN) cores; $(lscpu | sed -n 's/^Model name: *//p')"
printf '%-8s %-14s %12s %10s %8s %10s %8s %12s %8s\n' model encoder bytes tokens seconds tokens/s MB/s MB/s/thread ratio
for type in bpe unigram; do
  [[ -f $dir/$type.model ]] ||
    "$bin" tokenizer train --input "${files[@]}" --vocab-size "$vocab" --model-type "$type" \
      --out "$dir/$type.model" >/dev/null
  read -r py_bytes py_tokens py_s < <("$venv/bin/python" - "$dir/$type.model" "$dir/files.txt" <<'PY'
import sys, time
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
docs = [open(p, "rb").read() for p in open(sys.argv[2]).read().splitlines()]
docs = [d.decode("utf-8") for d in docs if d]
t = time.perf_counter()
tokens = sum(len(sp.encode(d)) + 1 for d in docs)
print(sum(len(d.encode("utf-8")) for d in docs), tokens, time.perf_counter() - t)
PY
)
  py_mbs=$(awk -v b="$py_bytes" -v s="$py_s" 'BEGIN { printf "%.3f", b / s / 1e6 }')
  printf '%-8s %-14s %12d %10d %8.3f %10.0f %8.3f %12.3f %8s\n' "$type" "python 1 thread" \
    "$py_bytes" "$py_tokens" "$py_s" "$(awk -v t="$py_tokens" -v s="$py_s" 'BEGIN { print t / s }')" \
    "$py_mbs" "$py_mbs" 1.00
  for ((t = 1; t <= threads; ++t)); do
    line=$("$bin" convert text --input "${files[@]}" --tokenizer "$dir/$type.model" \
      --val-fraction 0 --out "$dir/out-$type.h5" --threads "$t" | grep '^encoded')
    # "encoded B bytes into T tokens in S s on N thread(s): ..."
    read -r b k s < <(awk '{ print $2, $5, $8 }' <<<"$line")
    awk -v m="$type" -v n="$t" -v b="$b" -v k="$k" -v s="$s" -v p="$py_mbs" 'BEGIN {
      printf "%-8s %-14s %12d %10d %8.3f %10.0f %8.3f %12.3f %8.2f\n", m, "ringtrain " n "t", b, k, s,
        k / s, b / s / 1e6, b / s / 1e6 / n, (b / s / 1e6) / p }'
    [[ $k == "$py_tokens" ]] || { echo "token counts differ: $k vs Python's $py_tokens" >&2; exit 1; }
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
