#!/usr/bin/env bash
# The C++ extension path end to end: `cmake --install` into a temporary prefix; the
# out-of-tree examples/custom_op built from a copy against that prefix only (its compile
# lines checked to hold no path into this tree); its unit test (finite differences); the
# installed binary training its model with --plugin on 2 ranks (the loss falls, the op's
# parameters change, the checkpoint records the plugin); eval with the plugin and without
# it (exit 1 naming the op and --plugin); and bad plugins on rank 1 only (MPMD): a missing
# file, not a shared object, a library that registers nothing, one registering an op name
# ringtrain has. Expects E2E_BUILD_DIR, E2E_SOURCE_DIR and E2E_CXX from CTest.
build_dir=${E2E_BUILD_DIR:?E2E_BUILD_DIR is not set}
source_dir=${E2E_SOURCE_DIR:?E2E_SOURCE_DIR is not set}
cxx=${E2E_CXX:?E2E_CXX is not set}
source "$(dirname "$0")/lib.sh"
dir=$(workdir plugin)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# Nothing from the caller may point the example's build at headers or packages elsewhere.
unset CMAKE_PREFIX_PATH CPATH CPLUS_INCLUDE_PATH C_INCLUDE_PATH LIBRARY_PATH CXXFLAGS \
  LDFLAGS CMAKE_GENERATOR CMAKE_BUILD_PARALLEL_LEVEL ringtrain_DIR

# ---- 1. the installed package -------------------------------------------------------
prefix=$dir/prefix
cmake --install "$build_dir" --prefix "$prefix" >"$dir/install.log"
for f in bin/ringtrain lib/librt_nn.a lib/librt_kernels.a lib/librt_base.a \
  include/ringtrain/nn/op_registry.hpp include/ringtrain/nn/layers.hpp \
  include/ringtrain/kernels/kernels.hpp include/ringtrain/core/tensor.hpp \
  include/ringtrain/ringtrain/model.pb.h include/ringtrain/ringtrain/config.hpp \
  share/ringtrain/models/cnn.pbtxt share/ringtrain/proto/model.proto \
  lib/cmake/ringtrain/ringtrainConfig.cmake lib/cmake/ringtrain/ringtrainConfigVersion.cmake \
  lib/cmake/ringtrain/ringtrainTargets.cmake; do
  [[ -f $prefix/$f ]] || fail "cmake --install did not install $f"
done
[[ -x $prefix/bin/ringrun ]] || fail "cmake --install did not install bin/ringrun (slurm/train.sbatch uses it)"
pass "installed into $prefix"
BIN=$prefix/bin/ringtrain # the installed binary from here on

# ---- 2. the example, from a copy, against the prefix only ---------------------------
cp -r "$source_dir/examples/custom_op" "$dir/src"
rm -rf "$dir/src/build"
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$dir/configure.log" 2>&1 ||
  { cat "$dir/configure.log"; fail "configuring examples/custom_op against $prefix"; }
grep -qxF "ringtrain_DIR:PATH=$prefix/lib/cmake/ringtrain" "$dir/build/CMakeCache.txt" ||
  fail "find_package(ringtrain) did not find the package in $prefix"
cmake --build "$dir/build" -j2 >"$dir/build.log" 2>&1 ||
  { cat "$dir/build.log"; fail "building examples/custom_op"; }
plugin=$dir/build/libcustom_op.so
[[ -f $plugin ]] || fail "the example built no libcustom_op.so"
# Every include directory of every compile line is in the prefix, the copy or the system.
python3 - "$dir/build/compile_commands.json" "$prefix" "$dir/src" "$dir/build" <<'PY'
import json, shlex, sys
cmds, allowed = json.load(open(sys.argv[1])), sys.argv[2:]
seen = 0
for c in cmds:
    args = shlex.split(c["command"])
    for i, a in enumerate(args):
        for flag in ("-I", "-isystem"):
            if a.startswith(flag):
                path = a[len(flag):] or args[i + 1]
                seen += 1
                if not (path.startswith("/usr/") or any(path.startswith(p) for p in allowed)):
                    sys.exit(f"FAIL: {c['file']} compiles with {flag}{path}, outside the prefix")
if seen == 0:
    sys.exit("FAIL: no include directory on the compile lines (is ringtrain::plugin empty?)")
print(f"ok: {len(cmds)} compile lines, {seen} include directories, all in the prefix or /usr")
PY
nm -D --undefined-only "$plugin" | contains 'ringtrain11register_op' ||
  fail "libcustom_op.so does not leave register_op to the binary (linked a copy of the registry?)"
pass "examples/custom_op built against the installed package"

# ---- 3. the op's unit test -------------------------------------------------------------
(cd "$dir/build" && ctest -V) >"$dir/unit.log" 2>&1 ||
  { cat "$dir/unit.log"; fail "the example's unit test"; }
grep -q 'ok: finite differences agree' "$dir/unit.log" || { cat "$dir/unit.log"; fail "no finite-difference check ran"; }
pass "swish_beta finite differences:$(grep -o " [0-9]* parameter elements.*" "$dir/unit.log")"

# ---- 4. training with the plugin on 2 ranks ------------------------------------------
train_args=(--data "$DATA/train.h5" --model "$dir/src/model.pbtxt" --batch-size 32
  --optimizer adamw --lr 0.003 --seed 3 --threads 1 --log-every 1)
(cd "$dir" && mpi 2 "$BIN" train --plugin "$plugin" "${train_args[@]}" --steps 60 \
  --checkpoint-dir "$dir/ckpt" --checkpoint-every 60 --metrics "$dir/metrics.jsonl") \
  >"$dir/train.out" 2>"$dir/train.err" || { cat "$dir/train.err"; fail "training with --plugin"; }
# The mean loss of the last 10 steps: it starts at ln(10) = 2.30 and must fall below 1.0.
python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert len(steps) == 60, f"FAIL: {len(steps)} step records, expected 60"
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-10:]) / 10
print(f"ok: loss {first:.4f} at step 1, mean {last:.4f} over steps 51-60")
sys.exit(0 if first > 2.0 and last < 1.0 else "FAIL: the loss did not fall below 1.0")
PY
ckpt=$dir/ckpt/ckpt-000000060.h5
[[ -f $ckpt ]] || fail "no checkpoint $ckpt"
# The betas start at 1 (Init::ones); after training, read back by h5dump, they differ.
betas() { h5dump -y -w 0 -d "/params/$1" "$ckpt" | sed -n '/DATA {/,/}/p' | tr -c -- '-0-9.e+\n' ' '; }
for p in act1.beta act2.beta act3.beta; do
  python3 -c '
import sys
v = [float(x) for x in sys.argv[2].split()]
n = {"act1.beta": 8, "act2.beta": 16, "act3.beta": 1}[sys.argv[1]]
assert len(v) == n, f"FAIL: {sys.argv[1]} has {len(v)} values, expected {n}"
moved = max(abs(x - 1) for x in v)
assert moved > 1e-3, f"FAIL: {sys.argv[1]} did not change from 1: {v}"
print(f"ok: {sys.argv[1]} moved from 1 by up to {moved:.4f}")' "$p" "$(betas "$p" | sed 's/^ *(0) *//')"
done
h5dump -a /plugins "$ckpt" | contains "swish_beta=$plugin" ||
  fail "the checkpoint does not record the plugin (attribute /plugins)"
pass "the checkpoint records swish_beta=$plugin"

# --zero 3 cannot gather a plugin op's parameters: refused on every rank, one message, exit 1.
rc=0
(cd "$dir" && mpi 2 "$BIN" train --plugin "$plugin" "${train_args[@]}" --steps 2 --zero 3) \
  >"$dir/zero3.out" 2>"$dir/zero3.err" || rc=$?
[[ $rc -eq 1 ]] || { cat "$dir/zero3.err"; fail "--zero 3 with a plugin op's parameters exited $rc, expected 1"; }
msg=$(grep '^ringtrain: error:' "$dir/zero3.err" || true)
[[ $(grep -c . <<<"$msg") -eq 1 ]] || { cat "$dir/zero3.err"; fail "--zero 3 with the plugin: expected one error line"; }
grep -qF -- "--zero 3: node 'act1' runs op 'swish_beta' of plugin '$plugin', which has parameters" <<<"$msg" ||
  fail "--zero 3 with the plugin: '$msg'"
pass "--zero 3 with a plugin op's parameters on 2 ranks: $msg"

# ---- 5. eval with the plugin, and without it -----------------------------------------
mpi 2 "$BIN" eval --plugin "$plugin" --checkpoint "$ckpt" --data "$DATA/test.h5" \
  --threads 1 >"$dir/eval.out" 2>"$dir/eval.err" || { cat "$dir/eval.err"; fail "eval with --plugin"; }
grep -q "^eval .* accuracy 0\.[0-9]*" "$dir/eval.out" || { cat "$dir/eval.out"; fail "eval printed no accuracy"; }
pass "$(grep '^eval ' "$dir/eval.out")"
rc=0
mpi 2 "$BIN" eval --checkpoint "$ckpt" --data "$DATA/test.h5" --threads 1 \
  >"$dir/noplug.out" 2>"$dir/noplug.err" || rc=$?
[[ $rc -eq 1 ]] || { cat "$dir/noplug.err"; fail "eval without --plugin exited $rc, expected 1"; }
msg=$(grep '^ringtrain: error:' "$dir/noplug.err" || true)
[[ $(grep -c . <<<"$msg") -eq 1 ]] || { cat "$dir/noplug.err"; fail "eval without --plugin: expected one error line"; }
{ grep -qF "op 'swish_beta'" <<<"$msg" && grep -qF -- "--plugin $plugin" <<<"$msg"; } ||
  fail "eval without --plugin: '$msg' does not name the op and say --plugin $plugin"
pass "eval without the plugin: $msg"

# ---- 6. resume: without the plugin (exit 1 naming the op), then with it ---------------
rc=0
(cd "$dir" && mpi 2 "$BIN" train "${train_args[@]}" --steps 70 --checkpoint-dir "$dir/ckpt") \
  >"$dir/resume0.out" 2>"$dir/resume0.err" || rc=$?
[[ $rc -eq 1 ]] || { cat "$dir/resume0.err"; fail "resume without --plugin exited $rc, expected 1"; }
msg=$(grep '^ringtrain: error:' "$dir/resume0.err" || true)
[[ $(grep -c . <<<"$msg") -eq 1 ]] || { cat "$dir/resume0.err"; fail "resume without --plugin: expected one error line"; }
{ grep -qF "unknown op 'swish_beta'" <<<"$msg" && grep -qF -- "--plugin" <<<"$msg"; } ||
  fail "resume without --plugin: '$msg' does not name the op and --plugin"
pass "resume without the plugin: $msg"
(cd "$dir" && mpi 2 "$BIN" train --plugin "$plugin" "${train_args[@]}" --steps 70 \
  --checkpoint-dir "$dir/ckpt" --checkpoint-every 70) >"$dir/resume.out" 2>"$dir/resume.err" ||
  { cat "$dir/resume.err"; fail "resume with --plugin"; }
grep -q 'resum.* step 60' "$dir/resume.out" || { cat "$dir/resume.out"; fail "the run did not resume from step 60"; }
h5dump -a /step "$dir/ckpt/ckpt-000000070.h5" | contains '(0): 70' || fail "no checkpoint of step 70"
pass "resumed with the plugin from step 60 to 70"

# ---- 7. bad plugins, on rank 1 only --------------------------------------------------
touch "$dir/empty.cpp"
# Longer than an ELF header, so that the loader reads it as one.
printf 'this text file is not a shared object, whatever its name says: %s\n' 1 2 3 >"$dir/text.so"
# Registers "conv", which ringtrain has built in.
cat >"$dir/dup.cpp" <<'CPP'
#include "nn/op_registry.hpp"
namespace {
RINGTRAIN_REGISTER_OP(dup, ringtrain::OpDef{.name = "conv",
                                            .infer = [](const ringtrain::OpNode& n) { return n.inputs[0]; },
                                            .build = [](const ringtrain::OpNode&) -> std::unique_ptr<ringtrain::Layer> { return nullptr; },
                                            .flops = nullptr});
}
CPP
"$cxx" -std=c++20 -fPIC -shared "$dir/empty.cpp" -o "$dir/empty.so"
"$cxx" -std=c++20 -fPIC -shared -I"$prefix/include/ringtrain" "$dir/dup.cpp" -o "$dir/dup.so"
# bad LIB REASON: rank 0 trains without a plugin, rank 1 with LIB; both exit 1 (well within
# the timeout) and one message names LIB (as resolved, when it exists) and REASON.
bad() {
  local lib=$1 reason=$2 named=${3:-$1} rc=0 start=$SECONDS args=(--data "$DATA/train.h5" --model mlp --steps 2
    --batch-size 16 --threads 1)
  (cd "$dir" && timeout 60 mpirun -n 1 "$BIN" train "${args[@]}" : -n 1 "$BIN" train "${args[@]}" \
    --plugin "$lib") >"$dir/bad.out" 2>"$dir/bad.err" || rc=$?
  [[ $rc -eq 1 ]] || { cat "$dir/bad.err"; fail "--plugin $lib on rank 1: exited $rc, expected 1"; }
  local msg
  msg=$(grep '^ringtrain: error:' "$dir/bad.err" || true)
  [[ $(grep -c . <<<"$msg") -eq 1 ]] || { cat "$dir/bad.err"; fail "--plugin $lib: expected one error line"; }
  grep -qF -- "--plugin '$named'" <<<"$msg" || fail "--plugin $lib: '$msg' does not name the file"
  grep -qF -- "$reason" <<<"$msg" || fail "--plugin $lib: '$msg' does not say '$reason'"
  pass "--plugin $lib on rank 1, exit 1 on both after $((SECONDS - start)) s: $msg"
}
bad "$dir/missing.so" "No such file or directory"
bad "$dir/text.so" "invalid ELF header"
bad "$dir/empty.so" "registers no op"
bad "$dir/dup.so" "registers op 'conv', which ringtrain has built in"
