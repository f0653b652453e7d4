#!/usr/bin/env bash
# The CLI contract: --version lists every library; every command's --help exits 0 with its
# usage, and every default it prints parses back (command line and --config) to the same
# value; a mistyped option gets a did-you-mean hint; non-finite and out-of-range values are
# refused; inspect shows a dataset and a checkpoint; options come from the INI file and the
# command line wins; eval reports loss and accuracy; the metrics file is JSON lines with the
# documented fields; convert creates --out's directory; --timeline never replaces a trace
# with an empty one and reports a failed write.
source "$(dirname "$0")/lib.sh"
dir=$(workdir cli)
unset OMP_NUM_THREADS

v=$("$BIN" --version)
for lib in ringtrain MPI HDF5 BLAS ONNX SentencePiece CUDA cuDNN NCCL; do
  grep -q "$lib" <<<"$v" || fail "--version does not mention $lib"
done
grep -q "Open MPI" <<<"$v" || fail "--version: MPI library"
grep -q "parallel" <<<"$v" || fail "--version: HDF5 is not parallel"
grep -q "OpenBLAS" <<<"$v" || fail "--version: BLAS"
pass "--version"

# Every --help: exit 0, the usage first; a command's help under mpirun comes once (rank 0).
for cmd in "" train eval convert "convert idx" "tokenizer train" inspect; do
  # shellcheck disable=SC2086  # $cmd is zero, one or two words
  out=$("$BIN" $cmd --help) || fail "ringtrain $cmd --help exited $?"
  [[ $(sed -n 1p <<<"$out") == "usage: ringtrain "* ]] || fail "ringtrain $cmd --help: $out"
  [[ -z "$cmd" ]] && continue  # `ringtrain --help` answers before MPI starts, on every rank
  # shellcheck disable=SC2086
  out=$(mpi 2 "$BIN" $cmd --help) || fail "mpirun -n 2 ringtrain $cmd --help exited $?"
  [[ $(grep -c '^usage: ringtrain' <<<"$out") -eq 1 ]] || fail "2 ranks, $cmd --help: $out"
done
"$BIN" train --help | contains "--global-batch-size" || fail "train --help"
"$BIN" --help | contains "convert idx" || fail "--help"
for group in data model precision optimisation checkpointing "device and communication" \
  observability testing/debugging; do
  "$BIN" train --help | contains "^$group:\$" || fail "train --help has no group '$group'"
done
pass "--help of every command exits 0; train's options come in groups"

# Every default --help prints reads back as the same value: given on the command line and
# through --config, --print-config shows the same configuration as with no option at all,
# and shows each value as --help wrote it (so --help prints 0.001, not 0.00100000005).
defaults_roundtrip() {  # NAME REQUIRED-ARGS...: the command's words up to the options
  local name=$1
  shift
  local -a cmd=()
  while [[ $1 != -- ]]; do cmd+=("$1"); shift; done
  shift
  local -a req=("$@") given=()
  local base pairs
  base=$("$BIN" "${cmd[@]}" "${req[@]}" --print-config) || fail "$name --print-config"
  pairs=$("$BIN" "${cmd[@]}" --help | sed -n 's/^ *--\([a-z0-9-]*\) arg (=\([^)]*\)).*/\1 \2/p')
  [[ -n "$pairs" ]] || fail "$name --help shows no defaults"
  : >"$dir/$name-defaults.ini"
  local key value n=0
  while read -r key value; do
    given+=("--$key" "$value")
    echo "$key = $value" >>"$dir/$name-defaults.ini"
    grep -qxF "$key = $value" <<<"$base" \
      || fail "$name: --help shows --$key (=$value), --print-config: $(grep "^$key =" <<<"$base")"
    n=$((n + 1))
  done <<<"$pairs"
  [[ "$("$BIN" "${cmd[@]}" "${req[@]}" "${given[@]}" --print-config)" == "$base" ]] \
    || fail "$name: the defaults given on the command line change the configuration"
  [[ "$("$BIN" "${cmd[@]}" "${req[@]}" --config "$dir/$name-defaults.ini" --print-config)" == "$base" ]] \
    || fail "$name: the defaults given through --config change the configuration"
  pass "$name: $n defaults printed by --help read back as the same values"
}
defaults_roundtrip train train -- --data "$DATA/train.h5"  # --print-config opens the data
defaults_roundtrip eval eval -- --data x --checkpoint y
defaults_roundtrip convert convert idx -- --images x --labels y --out z

# refused EXIT-CODE EXPECTED-MESSAGE ARGS...: 2 ranks, that exit code, one error line with
# the message.
refused() {
  local want_rc=$1 want=$2 rc=0
  shift 2
  timeout 60 mpirun -n 2 "$BIN" "$@" >"$dir/ref.out" 2>"$dir/ref.err" || rc=$?
  [[ $rc -eq $want_rc ]] || { cat "$dir/ref.err"; fail "'$*' exited $rc, expected $want_rc"; }
  [[ $(grep -c '^ringtrain: error:' "$dir/ref.err") -eq 1 ]] \
    || { cat "$dir/ref.err"; fail "'$*': not exactly one error message"; }
  grep '^ringtrain: error:' "$dir/ref.err" | grep -qF -- "$want" \
    || { cat "$dir/ref.err"; fail "'$*': the message does not say '$want'"; }
  pass "$(grep '^ringtrain: error:' "$dir/ref.err")"
}
t=(train --data "$DATA/train.h5" --steps 2 --hidden 16 --threads 1)
refused 1 "unrecognised option '--learning-rate'; did you mean --lr?" "${t[@]}" --learning-rate 0.1
refused 1 "unrecognised option '--stpes'; did you mean --steps?" "${t[@]}" --stpes 3
refused 1 "unrecognised option '--chekpoint-dir'; did you mean --checkpoint-dir?" \
  "${t[@]}" --chekpoint-dir ck
printf 'learning-rate = 0.1\n' >"$dir/alias.ini"
refused 1 "unrecognised key 'learning-rate'; did you mean lr?" "${t[@]}" --config "$dir/alias.ini"
refused 1 "unrecognised option '--batch-sise'; did you mean --batch-size?" eval \
  --checkpoint x --data y --batch-sise 4
refused 1 "--lr inf is not valid: must be finite" "${t[@]}" --lr inf
refused 1 "--lr 1e+38 is not valid: must be <= 1000" "${t[@]}" --lr 1e38
refused 1 "--lr 0 is not valid: must be > 0" "${t[@]}" --lr 0
refused 1 "--eps 0 is not valid: must be > 0" "${t[@]}" --eps 0
refused 1 "--eps nan is not valid: must be finite" "${t[@]}" --eps nan
refused 1 "--eps -1 is not valid: must be > 0" "${t[@]}" --eps=-1
refused 1 "--weight-decay inf is not valid: must be finite" "${t[@]}" --weight-decay inf
refused 1 "--grad-clip nan is not valid: must be finite" "${t[@]}" --grad-clip nan
refused 1 "--momentum 1 is not valid: must be in [0, 1)" "${t[@]}" --momentum 1
refused 1 "--beta2 nan is not valid: must be finite" "${t[@]}" --beta2 nan
refused 1 "--dropout 1 is not valid; expected 0 to 0.99" train --model cnn \
  --data "$DATA/train.h5" --steps 2 --threads 1 --dropout 1
refused 1 "--dropout 'nan' is not valid; expected a number" train --model cnn \
  --data "$DATA/train.h5" --steps 2 --threads 1 --dropout nan
refused 1 "--init-scale inf is not valid: must be finite" "${t[@]}" --init-scale inf
refused 1 "--loss-scale nan is not valid: must be finite" "${t[@]}" --loss-scale nan
refused 1 "--scale-growth-factor inf is not valid: must be finite" "${t[@]}" --scale-growth-factor inf
refused 1 "--checkpoint-secs nan is not valid: must be finite" "${t[@]}" --checkpoint-secs nan
refused 1 "--stall-timeout inf is not valid: must be finite" "${t[@]}" --stall-timeout inf
refused 1 "--bucket-mb nan is not valid: must be finite" "${t[@]}" --bucket-mb nan
refused 1 "--config '$dir' is not a regular file" "${t[@]}" --config "$dir"
mkfifo "$dir/fifo.ini"
refused 1 "--config '$dir/fifo.ini' is not a regular file" "${t[@]}" --config "$dir/fifo.ini"
refused 1 "'$dir/fifo.ini' is not a regular file" inspect "$dir/fifo.ini"

# convert creates the directory of --out, as the README's first command needs.
src=$(dpkg -L dataset-fashion-mnist | grep 't10k-images-idx3-ubyte.gz$' | xargs dirname)
(cd "$dir" && "$BIN" convert idx --images "$src/t10k-images-idx3-ubyte.gz" \
  --labels "$src/t10k-labels-idx1-ubyte.gz" --out new/sub/test.h5) >"$dir/conv.out"
grep -qx "wrote new/sub/test.h5: 10000 samples of \[1, 28, 28\], 10 classes" "$dir/conv.out" \
  || fail "convert into a new directory: $(cat "$dir/conv.out")"
cmp <(h5dump -d /labels "$dir/new/sub/test.h5" | tail -n +3) \
  <(h5dump -d /labels "$DATA/test.h5" | tail -n +3) || fail "convert into a new directory: labels differ"
pass "convert created new/sub/ for --out"

# --timeline: a resumed run whose window lies before its first step keeps the first trace
# (and says so); a trace that cannot be written is a runtime error naming the file.
tl=(train --data "$DATA/train.h5" --hidden 16 --threads 1 --checkpoint-dir "$dir/tl-ck"
    --timeline "$dir/trace.json" --timeline-steps 2:3)
mpi 2 "$BIN" "${tl[@]}" --steps 4 >/dev/null
sum=$(md5sum <"$dir/trace.json")
python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["traceEvents"]; assert any(x.get("ph")=="X" for x in e)' \
  "$dir/trace.json" || fail "the first run's trace has no spans"
mpi 2 "$BIN" "${tl[@]}" --steps 6 >"$dir/tl.out" 2>"$dir/tl.err"
[[ $(md5sum <"$dir/trace.json") == "$sum" ]] || fail "the resumed run replaced the first run's trace"
grep -q "resumed from .*ckpt-000000004.h5" "$dir/tl.out" || fail "the second run did not resume"
grep -qF "no step of --timeline-steps 2:3 ran in this run" "$dir/tl.err" || fail "no warning: $(cat "$dir/tl.err")"
grep -q "written to" "$dir/tl.out" && fail "a trace not written was announced as written"
pass "--timeline: a resumed run after the window keeps the earlier trace and warns"
refused 2 "--timeline '/dev/full': writing the trace failed: No space left on device" \
  train --data "$DATA/train.h5" --steps 3 --hidden 16 --threads 1 --timeline /dev/full \
  --timeline-steps 1:2

# INI file: precision and steps from the file, --steps from the command line wins.
cat >"$dir/run.ini" <<'INI'
# a comment
precision = bf16
steps = 9
hidden = 64,32
batch-size = 16
log-every = 1
INI
mpi 2 "$BIN" train --config "$dir/run.ini" --data "$DATA/train.h5" --steps 4 --threads 1 \
  --checkpoint-dir "$dir/ck" --metrics "$dir/m.jsonl" --val-data "$DATA/test.h5" >"$dir/out"
[[ -f "$dir/ck/ckpt-000000004.h5" ]] || fail "command line --steps 4 did not win over the file's 9"
h5dump -a /precision "$dir/ck/ckpt-000000004.h5" | contains '"bf16"' || fail "precision from the file"
grep -q "global batch 32 (16/rank)" "$dir/out" || fail "batch-size from the file"
pass "config file, command line wins"

/usr/bin/python3 - "$dir/m.jsonl" <<'PY' || fail "metrics JSON lines"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in recs if r["type"] == "step"]
assert [r["step"] for r in steps] == [1, 2, 3, 4], steps
for r in steps:
    assert set(r) >= {"step", "epoch", "loss", "loss_scale", "lr", "samples_per_sec", "world_size"}, r
    assert r["world_size"] == 2 and r["loss"] > 0
ck = [r for r in recs if r["type"] == "checkpoint"]
assert ck and ck[-1]["step"] == 4 and ck[-1]["bytes"] > 0 and ck[-1]["path"].endswith("ckpt-000000004.h5"), ck
ev = [r for r in recs if r["type"] == "eval"]
assert ev and ev[-1]["split"] == "val" and 0 <= ev[-1]["accuracy"] <= 1, ev
PY
pass "metrics records"

# eval of the step-4 checkpoint in bf16 (as trained) prints the loss and accuracy of the
# run's own validation at step 4 on the same file (the metrics record), on 2 ranks and on 1.
want=$(/usr/bin/python3 -c 'import json,sys
[ev] = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "eval" and r["step"] == 4]
print("loss %.4f accuracy %.4f" % (ev["loss"], ev["accuracy"]))' "$dir/m.jsonl")
for n in 2 1; do
  out=$(mpi "$n" "$BIN" eval --checkpoint "$dir/ck/ckpt-000000004.h5" --data "$DATA/test.h5" \
    --precision bf16 --threads 1)
  contains "^eval $dir/ck/ckpt-000000004.h5 on $DATA/test.h5 (10000 samples, computed in bf16): $want\$" <<<"$out" ||
    fail "eval on $n rank(s): '$out', expected '... (10000 samples, computed in bf16): $want' as the run's validation"
done
pass "eval: $want on 2 ranks and on 1, as the run's own validation of the same weights"

i=$("$BIN" inspect "$dir/ck/ckpt-000000004.h5")
for want in "ringtrain-checkpoint" "/params/fc1.weight  fp32 \[64, 784\]" "valid: yes"; do
  grep -q "$want" <<<"$i" || fail "inspect checkpoint shows no '$want': $i"
done
"$BIN" inspect "$DATA/test.h5" | contains "/images  uint8 \[10000, 1, 28, 28\]" || fail "inspect dataset"
pass "inspect"

# --checkpoint-secs: a tiny interval saves after (nearly) every step, agreed by all ranks.
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 6 --hidden 32 --threads 1 --keep 10 \
  --checkpoint-dir "$dir/secs" --checkpoint-secs 0.000001 >/dev/null
n=$(find "$dir/secs" -name 'ckpt-*.h5' | wc -l)
(( n >= 5 )) || fail "--checkpoint-secs: $n checkpoints after 6 steps"
pass "--checkpoint-secs saved $n checkpoints in 6 steps"

# A loss scale so large that fp16 gradients overflow: every step is skipped with a record,
# the scale backs off to its floor and the run warns once.
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 6 --hidden 32 --threads 1 --precision fp16 \
  --init-scale 1e30 --min-scale 1e29 --metrics "$dir/skip.jsonl" >"$dir/skip.out" 2>"$dir/skip.err"
[[ $(grep -c 'loss scale is at its floor' "$dir/skip.err") -eq 1 ]] || fail "floor warning: $(cat "$dir/skip.err")"
/usr/bin/python3 - "$dir/skip.jsonl" <<'PY' || fail "skip records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
skips = [r for r in recs if r["type"] == "skip"]
assert [r["step"] for r in skips] == [1, 2, 3, 4, 5, 6], skips
assert all(r["reason"] == "non-finite gradients" for r in skips)
scales = [r["loss_scale"] for r in skips]
want = [5e29, 2.5e29, 1.25e29, 1e29, 1e29, 1e29]  # x0.5 per overflow, floor 1e29
assert all(abs(s - w) <= 1e-6 * w for s, w in zip(scales, want)), scales
assert sum(r["type"] == "warning" for r in recs) == 1, recs
PY
pass "overflowing steps are skipped, recorded, and the floor is reported once"

# A RINGTRAIN_* variable the settings table does not have (a typo): one warning, from rank 0,
# naming it and the setting it is closest to; the run goes on. A declared one: no warning.
RINGTRAIN_GEM=onednn RINGTRAIN_DIRECT_READ=1 mpi 2 -x RINGTRAIN_GEM -x RINGTRAIN_DIRECT_READ \
  "$BIN" train --data "$DATA/train.h5" --steps 2 --hidden 16 --threads 1 \
  >"$dir/typo.out" 2>"$dir/typo.err" || fail "a run with an unknown RINGTRAIN_ variable failed"
[[ $(grep -c 'RINGTRAIN_' "$dir/typo.err") -eq 1 ]] || fail "unknown setting: $(cat "$dir/typo.err")"
grep -qx 'ringtrain: warning: RINGTRAIN_GEM is not a ringtrain setting (did you mean RINGTRAIN_GEMM?)' \
  "$dir/typo.err" || fail "unknown setting warning: $(cat "$dir/typo.err")"
pass "an unknown RINGTRAIN_ variable gets one warning naming it"
