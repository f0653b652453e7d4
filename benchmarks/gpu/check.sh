#!/usr/bin/env bash
# The GPU check of the CUDA backend on one GPU, bounded and self-explaining, for a machine
# that is lent for minutes: configures and builds the GPU targets for one architecture,
# runs each `gpu` test and gpu_bench as a step under its own `timeout`, all inside one
# deadline (7 minutes by default, 3 with --quick), and writes summary.json and summary.md
# (a table: every step passed, failed, timed out, skipped or not run, with its time and
# the reason) after every step, so a failure, a hang or a kill still leaves a summary.
# The benchmark runs before the longest test (gpu_train_cli), so its figures come back.
# --prebuilt runs programs built elsewhere (pack_prebuilt.sh) on a machine that lacks the
# build's libraries. --self-test runs the same machinery on fake steps (no GPU, no build)
# for ctest.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/gpu/check.sh [--quick] [--out DIR] [--build DIR] [--arch LIST] [--jobs N]
                               [--budget SECONDS] [--prebuilt FILE] [--self-test]

  --quick         a second attempt in the same lease: build (incremental when DIR exists),
                  the ops tests and the GEMM benchmark only; budget 180 s
  --out DIR       where summary.json, summary.md, bench.json, cudnn.log, check.log and
                  logs.tar.gz (every step's log) go; default $OUT if set, else DIR/gpu-check
  --build DIR     build directory (default build-gpu-check in the repository)
  --arch LIST     CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200; 80 for A100)
  --jobs N        build jobs (default: all cores)
  --budget S      the deadline in seconds for everything (default 420, --quick 180): each
                  step's timeout is its own limit or what is left, whichever is less; a
                  step with no time left is marked "not-run"
  --prebuilt FILE no configure or build: unpack FILE (made by pack_prebuilt.sh on a
                  machine with the build's libraries), find the CUDA libraries it needs on
                  this machine (CUDA toolkit, python3's NVIDIA pip packages), then run
                  gpu_ops, gpu_attention, gpu_training, gpu_allocator and gpu_bench
                  (240 s) from it;
                  gpu_nccl_np1 and gpu_train_cli need Open MPI's runtime and are marked
                  not-run
  --self-test     run the step/timeout/summary machinery on fake steps (no GPU needed)

Steps (full): env, configure, build, gpu_ops, gpu_attention, gpu_bench, gpu_allocator,
gpu_nccl_np1, gpu_training, gpu_train_cli (--quick: gpu_ops, gpu_attention, gpu_bench). Prebuilt: unpack, env, then the tests above that the bundle
holds. Environment: NCCL_DEBUG=WARN, cuDNN's error log
(CUDNN_LOGERR_DBG=1) into OUT/cudnn.log, NCCL bootstrap on loopback (one machine).

Exit status: 0 when every step passed (goals missed by the benchmark are reported, not
fatal); 1 when a step failed, timed out, was skipped (no usable GPU) or did not run.
USAGE
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build-gpu-check"
out="${OUT:-}"
arch=90
jobs="$(nproc)"
mode=full
budget=""
prebuilt=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) mode=quick; shift ;;
    --self-test) mode=self-test; shift ;;
    --prebuilt)
      [[ $# -ge 2 ]] || { echo "check.sh: $1 needs a value" >&2; exit 1; }
      mode=prebuilt
      prebuilt="$2"
      shift 2 ;;
    --out|--build|--arch|--jobs|--budget)
      [[ $# -ge 2 ]] || { echo "check.sh: $1 needs a value" >&2; exit 1; }
      case "$1" in
        --out) out="$2" ;;
        --build) build="$2" ;;
        --arch) arch="$2" ;;
        --jobs) jobs="$2" ;;
        --budget) budget="$2" ;;
      esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check.sh: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
if [[ -n $budget && ! $budget =~ ^[0-9]+$ ]]; then
  echo "check.sh: --budget '$budget' is not a whole number of seconds" >&2
  exit 1
fi
if [[ ! $jobs =~ ^[0-9]+$ || $jobs -lt 1 ]]; then
  echo "check.sh: --jobs '$jobs' is not a positive whole number" >&2
  exit 1
fi
case "$mode" in
  full|prebuilt) budget=${budget:-420} ;;
  quick) budget=${budget:-180} ;;
  self-test) budget=${budget:-20} ;;
esac
if [[ $mode == prebuilt ]]; then
  [[ -f $prebuilt ]] || { echo "check.sh: --prebuilt '$prebuilt' is not a file" >&2; exit 1; }
  prebuilt="$(cd "$(dirname "$prebuilt")" && pwd)/$(basename "$prebuilt")"
fi
[[ -n "$out" ]] || out="$build/gpu-check"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# Step logs live beside the build (the device returns at most 8 files from $OUT); they
# travel back packed in logs.tar.gz.
logs="$out/.logs"
[[ $mode == self-test ]] || logs="$build/check-logs"
rm -rf "$logs"
mkdir -p "$logs"
rm -f "$out"/summary.json "$out"/summary.md "$out"/bench.json "$out"/cudnn.log "$out"/logs.tar.gz
# The console also goes to check.log; tee ignores the signals that stop the script, so the
# summary's last words still reach both.
exec > >(trap '' TERM INT HUP; exec tee "$out/check.log") 2>&1

start=$(date +%s)
deadline=$((start + budget))
reserve=10   # kept back for the summary and the log archive
min_step=5   # a step is not started with less than this left
if [[ $mode == self-test ]]; then reserve=3; min_step=3; fi
now() { date +%s; }
stamp() { echo "[$(($(now) - start))s] $*"; }

# CMake and the env step find nvcc on PATH; CUDA images keep it in /usr/local/cuda/bin.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
export NCCL_DEBUG=WARN
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"  # one machine: bootstrap on loopback
export CUDNN_LOGERR_DBG=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# ---- the steps' record and the summary ---------------------------------------------------
names=() statuses=() rcs=() secs=() limits=() notes=()

json_escape() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/ }
  s=${s//$'\r'/ }
  s=${s//$'\t'/ }
  printf '%s' "$s"
}

overall() {
  local s
  for s in "${statuses[@]}"; do [[ $s == passed ]] || { echo failed; return; }; done
  echo passed
}

write_summary() {
  local i n=${#names[@]} bench=null gpu=""
  [[ -s $out/bench.json ]] && bench="$(cat "$out/bench.json")"
  [[ -s $logs/env.log ]] && gpu="$(sed -n 's/^gpu: //p' "$logs/env.log" | sed -n 1p)"
  {
    printf '{"mode": "%s", "budget_s": %d, "seconds": %d, "result": "%s", "gpu": "%s",\n' \
      "$mode" "$budget" "$(($(now) - start))" "$(overall)" "$(json_escape "$gpu")"
    printf ' "steps": ['
    for ((i = 0; i < n; i++)); do
      [[ $i -gt 0 ]] && printf ','
      local log="\"logs/${names[i]}.log\""
      [[ ${statuses[i]} == not-run ]] && log=null
      printf '\n  {"name": "%s", "status": "%s", "rc": %s, "seconds": %s, "timeout_s": %s, "log": %s, "note": "%s"}' \
        "${names[i]}" "${statuses[i]}" "${rcs[i]}" "${secs[i]}" "${limits[i]}" "$log" \
        "$(json_escape "${notes[i]}")"
    done
    printf '],\n "bench": %s}\n' "$bench"
  } >"$out/summary.json.tmp"
  mv "$out/summary.json.tmp" "$out/summary.json"
  {
    echo "# GPU check ($mode): $(overall)"
    echo
    echo "${gpu:-GPU: unknown}; $(($(now) - start)) s of a $budget s budget."
    echo
    echo "| step | status | seconds | timeout | note |"
    echo "|---|---|---:|---:|---|"
    for ((i = 0; i < n; i++)); do
      local mark="${statuses[i]}"
      [[ $mark == passed ]] || mark="**${mark^^}**"
      printf '| %s | %s | %s | %s | %s |\n' "${names[i]}" "$mark" "${secs[i]}" "${limits[i]}" \
        "${notes[i]//|/\\|}"
    done
    if grep -q '^gpu_bench on ' "$logs/gpu_bench.log" 2>/dev/null; then
      echo
      echo "## gpu_bench"
      echo
      # Which attention ran in the GPT rows (cuDNN's fused attention or our kernel).
      grep '^attention path: ' "$logs/gpu_bench.log" | sed 's/$/  /' || true
      echo
      echo '```'
      sed -n '/^gpu_bench on /,$p' "$logs/gpu_bench.log" | sed '/^wrote /d' | sed -n 1,110p
      echo '```'
    fi
    for ((i = 0; i < n; i++)); do
      [[ ${statuses[i]} == passed || ${statuses[i]} == not-run ]] && continue
      [[ -s $logs/${names[i]}.log ]] || continue
      echo
      echo "## ${names[i]}: last lines of logs/${names[i]}.log"
      echo
      echo '```'
      tail -n 25 "$logs/${names[i]}.log"
      echo '```'
    done
  } >"$out/summary.md.tmp"
  mv "$out/summary.md.tmp" "$out/summary.md"
}

# Everything that goes back: the step logs and cuDNN's error logs, once.
finish() {
  local f
  : >"$out/cudnn.log"
  for f in "$logs"/cudnn-*.log; do
    [[ -s $f ]] || continue
    echo "==== ${f##*/cudnn-}" >>"$out/cudnn.log"
    cat "$f" >>"$out/cudnn.log"
  done
  write_summary || echo "check.sh: writing the summary failed" >&2
  tar -C "$logs" --transform 's,^\.,logs,' -czf "$out/logs.tar.gz" . 2>/dev/null || true
  [[ -z $pre ]] || rm -rf "$pre"
}
step_pid=""
pre=""  # --prebuilt: where the bundle is unpacked
on_signal() {
  [[ -z $step_pid ]] || kill -TERM "$step_pid" 2>/dev/null || true
  echo "check.sh: stopped by a signal; the summary holds the steps so far" >&2
  finish
  exit 1
}
trap on_signal TERM INT HUP

# One line of a log that says why a step did not pass.
why_of() {
  local log=$1 line
  line="$(grep -m1 -E 'SKIPPED: no CUDA device' "$log" 2>/dev/null || true)"
  [[ -n $line ]] || line="$(grep -m3 -E '^\[  FAILED  \]|Failure$|^FAIL|[Ee]rror[: ]|\*\*\*(Failed|Timeout|Exception)|MISSED' "$log" 2>/dev/null | tr '\n' ' ' || true)"
  [[ -n $line ]] || line="$(grep -v '^\s*$' "$log" 2>/dev/null | tail -n 1 || true)"
  printf '%s' "${line:0:300}"
}

record() {  # NAME STATUS RC SECONDS TIMEOUT NOTE
  names+=("$1") statuses+=("$2") rcs+=("$3") secs+=("$4") limits+=("$5") notes+=("$6")
  # A fault in the summary must not end the run (errexit is off inside an || operand).
  write_summary || echo "check.sh: writing the summary failed after step $1" >&2
}

# step NAME LIMIT_S CMD...: runs CMD under `timeout` (the lesser of LIMIT_S and what is left
# of the budget), its output in logs/NAME.log; exit 77 or a ctest "Skipped" is a skip.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - $(now) - reserve))
  if [[ $left -lt $min_step ]]; then
    stamp "$name: not run (${left}s of the budget left)"
    record "$name" not-run null 0 0 "no time left in the $budget s budget"
    return 0
  fi
  [[ $limit -le $left ]] || limit=$left
  stamp "$name (timeout ${limit}s)"
  # A shell function runs in a child bash (timeout runs programs; the functions and the
  # variables they read are exported below).
  if declare -F "$1" >/dev/null; then set -- bash -c '"$@"' _ "$@"; fi
  local t0 rc=0 status note=""
  t0=$(now)
  # In the background and waited for, so that a signal to this script is handled at once
  # (bash runs traps only between foreground commands) and stops the step too.
  CUDNN_LOGDEST_DBG="$logs/cudnn-$name.log" timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 &
  step_pid=$!
  wait "$step_pid" || rc=$?
  step_pid=""
  local took=$(($(now) - t0))
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status=timeout
    note="killed after ${limit}s"
    local why
    why="$(why_of "$logs/$name.log")"
    [[ -z $why ]] || note+=": $why"
  elif [[ $rc -eq 77 ]] || grep -q '\*\*\*Skipped' "$logs/$name.log"; then
    status=skipped
    note="$(why_of "$logs/$name.log")"
  elif [[ $rc -ne 0 ]]; then
    status=failed
    note="exit $rc: $(why_of "$logs/$name.log")"
  else
    status=passed
    note="$(grep -m1 -E 'tests passed|^all .* passed' "$logs/$name.log" || true)"
  fi
  # Whatever the outcome: the benchmark's goals, and warnings (e.g. a convolution that cuDNN
  # could only run in fp32).
  local met missed warned
  met=$(grep -cE ' met$' "$logs/$name.log" || true)
  missed=$(grep -cE ' MISSED$' "$logs/$name.log" || true)
  warned=$(grep -c 'ringtrain: warning:' "$logs/$name.log" || true)
  [[ $((met + missed)) -eq 0 ]] || note+="${note:+; }goals: $met met, $missed missed"
  [[ $warned -eq 0 ]] || note+="${note:+; }$warned warning(s): $(grep -m1 'ringtrain: warning:' "$logs/$name.log" | cut -c1-160)"
  stamp "$name: $status (${took}s)${note:+: ${note:0:160}}"
  record "$name" "$status" "$rc" "$took" "$limit" "$note"
}

# A step that could not start because an earlier one failed.
blocked() {
  stamp "$1: not run ($2)"
  record "$1" not-run null 0 0 "$2"
}
passed() {
  local i
  for ((i = 0; i < ${#names[@]}; i++)); do
    [[ ${names[i]} == "$1" ]] && { [[ ${statuses[i]} == passed ]]; return; }
  done
  return 1
}

# ---- the real steps ---------------------------------------------------------------------
env_report() {
  local missing=() tool lib
  if command -v nvidia-smi >/dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
      --format=csv,noheader | sed -n 1p)"
    nvidia-smi
  else
    missing+=(nvidia-smi)
  fi
  for tool in nvcc cmake mpirun h5diff python3 protoc; do
    if command -v "$tool" >/dev/null; then echo "$tool: $(command -v "$tool")"; else missing+=("$tool"); fi
  done
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  command -v cmake >/dev/null && cmake --version | sed -n 1p
  # What CMakeLists.txt requires besides CUDA (MPI, parallel HDF5, Boost.Program_options,
  # OpenBLAS, oneDNN, Protocol Buffers, GoogleTest) and cuDNN/NCCL: a CUDA image without them fails at
  # configure, and this line says which, before the build is tried.
  for lib in libcudnn.so libnccl.so libmpi.so libhdf5_openmpi libboost_program_options \
    libopenblas libdnnl libprotobuf; do
    if ldconfig -p | grep -q "$lib"; then echo "$lib: found"; else missing+=("$lib"); fi
  done
  local hdr
  for hdr in cudnn.h nccl.h gtest/gtest.h cblas.h; do
    if compgen -G "/usr/include/$hdr" >/dev/null || compgen -G "/usr/local/include/$hdr" \
      >/dev/null || compgen -G "/usr/include/*/$hdr" >/dev/null \
      || compgen -G "/usr/local/cuda/include/$hdr" >/dev/null; then
      echo "$hdr: found"
    else
      missing+=("$hdr")
    fi
  done
  echo "cores: $(nproc); budget ${budget}s"
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "error: missing ${missing[*]}"
    return 1
  fi
}

configure() {
  local gen=()
  [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch"
}

ctest_one() {  # the one ctest test named $1, with its own TIMEOUT
  ctest --test-dir "$build" -R "^$1\$" -V --no-tests=error
}

run_real() {
  local targets=(gpu_tests gpu_nccl_tests gpu_bench ringtrain) bench_args=()
  if [[ $mode == quick ]]; then
    targets=(gpu_tests gpu_bench)
    bench_args=(--quick --gemm-only)
  fi
  step env 20 env_report || true
  step configure 90 configure
  if passed configure; then
    step build 260 cmake --build "$build" -j"$jobs" --target "${targets[@]}"
  else
    blocked build "configure did not pass"
  fi
  local tests=(gpu_ops gpu_attention gpu_bench gpu_allocator gpu_nccl_np1 gpu_training gpu_train_cli)
  [[ $mode == quick ]] && tests=(gpu_ops gpu_attention gpu_bench)
  local t
  for t in "${tests[@]}"; do
    if ! passed build; then
      blocked "$t" "the build did not pass"
    elif [[ $t == gpu_bench ]]; then
      step gpu_bench 150 "$build/bin/gpu_bench" --json "$out/bench.json" "${bench_args[@]}"
    elif [[ $t == gpu_train_cli ]]; then
      step "$t" 310 ctest_one "$t"
    else
      step "$t" 130 ctest_one "$t"
    fi
  done
}

# ---- programs built elsewhere: --prebuilt ---------------------------------------------------
# Adds to LD_LIBRARY_PATH the folder of each CUDA library the bundle needs that the loader
# does not already find: the CUDA toolkit's, else python3's NVIDIA pip packages' (where
# CUDA/PyTorch images keep cuDNN and NCCL). cuDNN's runtime-compiled engines also load NVRTC.
find_cuda_libs() {
  local need lib dirs=() d hit
  need="$(sed -n 's/^cuda libraries needed from the machine: //p' "$pre/manifest.txt")"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d $d ]] && dirs+=("$d")
  done
  if command -v python3 >/dev/null; then
    while read -r d; do [[ -d $d/nvidia ]] && dirs+=("$d/nvidia"); done < <(python3 -c \
      'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
      2>/dev/null || true)
  fi
  for lib in $need libnvrtc.so.13; do
    ldconfig -p 2>/dev/null | grep -q " $lib " && continue
    hit=""
    for d in "${dirs[@]}"; do
      hit="$(find "$d" -name "$lib" -print -quit 2>/dev/null || true)"
      [[ -z $hit ]] || break
    done
    [[ -n $hit ]] || continue
    case ":${LD_LIBRARY_PATH:-}:" in
      *":$(dirname "$hit"):"*) ;;
      *) LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$hit")" ;;
    esac
  done
  export LD_LIBRARY_PATH="$pre/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

env_prebuilt() {
  if command -v nvidia-smi >/dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
      --format=csv,noheader | sed -n 1p)"
    nvidia-smi
  else
    echo "nvidia-smi: not found"
  fi
  echo "glibc: $(ldd --version | sed -n 1p)"
  cat "$pre/manifest.txt"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "cores: $(nproc); budget ${budget}s"
  local prog missing
  for prog in "$pre"/bin/*; do
    ldd "$prog" | grep -E 'libcu|libnccl' || true
    missing="$(ldd "$prog" | grep 'not found' || true)"
    if [[ -n $missing ]]; then
      echo "error: ${prog##*/} cannot load: $(echo "$missing" | awk '{print $1}' | tr '\n' ' ')"
      return 1
    fi
  done
}

# tar's -J needs the xz program, which a slim image may lack; python3's tarfile reads xz
# through its own lzma module.
unpack_bundle() {  # FILE DIR
  if command -v xz >/dev/null; then
    tar -C "$2" -xJf "$1"
  else
    echo "no xz program: unpacking with python3's tarfile"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
  fi
}

run_prebuilt() {
  pre="$(mktemp -d /tmp/ringtrain-prebuilt.XXXXXX)"
  step unpack 60 unpack_bundle "$prebuilt" "$pre"
  if ! passed unpack; then
    local t
    for t in env gpu_ops gpu_attention gpu_training gpu_allocator gpu_bench; do blocked "$t" "unpack did not pass"; done
    return 0
  fi
  find_cuda_libs
  step env 20 env_prebuilt
  mkdir -p "$pre/work"
  cd "$pre/work"  # the tests' working directory, as ctest's build/tests/gpu
  # No build and no gpu_train_cli here: the tests first (a wrong kernel is the news that
  # matters most), then the benchmark with the rest of the budget.
  local name limit args=() t
  for t in gpu_ops gpu_attention gpu_training gpu_allocator gpu_bench; do
    if ! passed env; then
      blocked "$t" "env did not pass: a library is missing"
    elif [[ $t == gpu_bench ]]; then
      step gpu_bench 240 "$pre/bin/gpu_bench" --json "$out/bench.json"
    elif IFS=$'\t' read -r -a args < <(grep "^$t"$'\t' "$pre/tests.tsv"); then
      name=${args[0]} limit=${args[1]}
      step "$name" "$((limit + 10))" "$pre/bin/gpu_tests" "${args[@]:2}" --source-dir="$root"
    else
      blocked "$t" "not in the bundle's tests.tsv"
    fi
  done
  for t in gpu_nccl_np1 gpu_train_cli; do
    blocked "$t" "needs Open MPI's runtime (mpiexec), which the prebuilt bundle does not hold"
  done
}

# ---- fake steps for --self-test: one of each outcome ----------------------------------------
run_self_test() {
  step ok 30 bash -c 'echo "1/1 tests passed"; echo "goal x  1.0 >=0.5 met"; echo "goal y  0.1 >=0.8 MISSED"'
  step fails 30 bash -c 'echo "error: something broke" >&2; exit 3'
  step hangs 2 sleep 60
  step gpu_bench 30 bash -c 'echo "SKIPPED: no CUDA device (self-test)"; exit 77'
  step outlives_budget 600 sleep 600  # bounded by the deadline, not its own limit
  step late 30 true
}

export root build arch budget
export pre
export -f env_report configure ctest_one env_prebuilt unpack_bundle
stamp "check.sh $mode: budget ${budget}s, out $out"
case "$mode" in
  self-test) run_self_test ;;
  prebuilt) run_prebuilt ;;
  *) run_real ;;
esac
finish
stamp "done: $(overall); $out/summary.json, $out/summary.md"
cat "$out/summary.md"
[[ $(overall) == passed ]]
