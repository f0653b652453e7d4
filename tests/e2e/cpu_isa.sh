#!/usr/bin/env bash
# The CPU backend says what it runs on: the start-up line and `--version` name the CPU's ISA
# (worked out here independently, from /proc/cpuinfo's flags), the GEMM provider the feature
# rule gives (oneDNN with AVX2 or better, else OpenBLAS) and OpenBLAS's core (asked of
# libopenblas itself through python's ctypes). RINGTRAIN_GEMM=openblas forces OpenBLAS and,
# when its core is below the CPU's ISA, each rank warns once; a bad RINGTRAIN_GEMM on rank 1
# alone ends a 2-rank job with exit 1 and one message naming it, as does a bad
# RINGTRAIN_CPU_BF16; --version names a bad value instead of failing.
source "$(dirname "$0")/lib.sh"
dir=$(workdir cpu-isa)
# Hermetic: the choice is made from the CPU, not from settings left in the environment.
unset RINGTRAIN_GEMM RINGTRAIN_CPU_BF16 RINGTRAIN_CONV OPENBLAS_CORETYPE OPENBLAS_VERBOSE

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ $flags == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512vl; then
  level=avx512
  if has amx_tile && has amx_bf16; then isa=avx512_core_amx
  elif has avx512_fp16; then isa=avx512_core_fp16
  elif has avx512_bf16; then isa=avx512_core_bf16
  else isa=avx512_core; fi
elif has avx2 && has fma; then level=avx2 isa=avx2
elif has avx; then level=avx isa=avx
else level=sse isa=sse41; fi
case $level in avx2 | avx512) provider=oneDNN ;; *) provider=OpenBLAS ;; esac
core=$(python3 -c 'import ctypes
lib = ctypes.CDLL("libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())')
# OpenBLAS's core names by the ISA of their kernels (unknown names: the weakest).
case ${core,,} in
  skylakex | cooperlake | sapphirerapids) core_level=avx512 ;;
  haswell | zen | excavator) core_level=avx2 ;;
  sandybridge | bulldozer | piledriver | steamroller) core_level=avx ;;
  *) core_level=sse ;;
esac
rank_of() { case $1 in sse) echo 0 ;; avx) echo 1 ;; avx2) echo 2 ;; avx512) echo 3 ;; esac; }
weak=0
(($(rank_of "$core_level") < $(rank_of "$level"))) && weak=1
echo "this CPU: isa $isa ($level), OpenBLAS core $core ($core_level); expected GEMM $provider"

# --version: one CPU line with the ISA, the provider and the core.
"$BIN" --version >"$dir/version"
line=$(grep -a '^  CPU: ' "$dir/version") || { cat "$dir/version"; fail "--version has no CPU line"; }
contains "cpu isa $isa, GEMM $provider" <<<"$line" || fail "--version: '$line' does not say isa $isa, GEMM $provider"
contains "OpenBLAS core $core" <<<"$line" || fail "--version: '$line' does not name OpenBLAS core $core"
pass "--version: $line"

# The start-up line (rank 0's first line) of a 2-rank run, as built.
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 2 --hidden 32 --threads 1 >"$dir/out" 2>"$dir/err" \
  || { cat "$dir/out" "$dir/err"; fail "training failed"; }
start=$(sed -n 1p "$dir/out")
contains "cpu isa $isa, GEMM $provider" <<<"$start" || fail "start-up line does not say 'cpu isa $isa, GEMM $provider': $start"
contains "OpenBLAS core $core" <<<"$start" || fail "start-up line does not name OpenBLAS core $core: $start"
if [[ $provider == oneDNN ]]; then
  contains "GEMM oneDNN [0-9.]* isa " <<<"$start" || fail "start-up line does not give oneDNN's ISA: $start"
fi
n=$(grep -c 'warning: OpenBLAS runs' "$dir/err" || true)
[[ $n -eq 0 ]] || { cat "$dir/err"; fail "$n OpenBLAS warnings although OpenBLAS runs no GEMM"; }
pass "start-up line: $start"

# RINGTRAIN_GEMM=openblas: the line says so, and a weak core is warned about once per rank.
RINGTRAIN_GEMM=openblas mpi 2 -x RINGTRAIN_GEMM "$BIN" train --data "$DATA/train.h5" --steps 2 \
  --hidden 32 --threads 1 >"$dir/out" 2>"$dir/err" || { cat "$dir/out" "$dir/err"; fail "training failed"; }
start=$(sed -n 1p "$dir/out")
contains "GEMM OpenBLAS (RINGTRAIN_GEMM=openblas)" <<<"$start" || fail "forced OpenBLAS not on the start-up line: $start"
n=$(grep -c "warning: OpenBLAS runs its $core kernels on a CPU with $level" "$dir/err" || true)
[[ $n -eq $((2 * weak)) ]] || { cat "$dir/err"; fail "$n OpenBLAS warnings, expected $((2 * weak)) (core $core, CPU $level)"; }
pass "RINGTRAIN_GEMM=openblas: $n warning(s) for OpenBLAS core $core on $level"

# A bad value on rank 1 only: exit 1, one message naming the setting and the value.
rc=0
timeout 300 mpirun -n 1 "$BIN" train --data "$DATA/train.h5" --steps 2 --hidden 32 --threads 1 : \
  -n 1 env RINGTRAIN_GEMM=mkl "$BIN" train --data "$DATA/train.h5" --steps 2 --hidden 32 \
  --threads 1 >"$dir/out" 2>"$dir/err" || rc=$?
n=$(grep -c '^ringtrain: error:' "$dir/err" || true)
[[ $rc -eq 1 && $n -eq 1 ]] || { cat "$dir/err"; fail "RINGTRAIN_GEMM=mkl on rank 1: exit $rc, $n messages"; }
contains "RINGTRAIN_GEMM='mkl' is not valid" <"$dir/err" || { cat "$dir/err"; fail "the message does not name RINGTRAIN_GEMM='mkl'"; }
pass "RINGTRAIN_GEMM=mkl on rank 1: exit 1, one message"

# A bad RINGTRAIN_CPU_BF16 ends a run with exit 1 and one message; --version still answers
# and names the bad value on its CPU line.
rc=0
RINGTRAIN_CPU_BF16=fast mpi 2 -x RINGTRAIN_CPU_BF16 "$BIN" train --data "$DATA/train.h5" --steps 2 \
  --hidden 32 --threads 1 >"$dir/out" 2>"$dir/err" || rc=$?
n=$(grep -c '^ringtrain: error:' "$dir/err" || true)
[[ $rc -eq 1 && $n -eq 1 ]] || { cat "$dir/err"; fail "RINGTRAIN_CPU_BF16=fast: exit $rc, $n messages"; }
contains "RINGTRAIN_CPU_BF16='fast' is not valid" <"$dir/err" || { cat "$dir/err"; fail "the message does not name RINGTRAIN_CPU_BF16='fast'"; }
RINGTRAIN_GEMM=mkl "$BIN" --version >"$dir/version" || fail "--version with RINGTRAIN_GEMM=mkl exited $?"
grep -a '^  CPU: ' "$dir/version" | contains "RINGTRAIN_GEMM='mkl' is not valid" ||
  { cat "$dir/version"; fail "--version does not name the bad RINGTRAIN_GEMM"; }
pass "RINGTRAIN_CPU_BF16=fast: exit 1, one message; --version names a bad RINGTRAIN_GEMM"
