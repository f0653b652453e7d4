#!/usr/bin/env bash
# benchmarks/gpu/check.sh's machinery, checked without a GPU: `check.sh --self-test` runs
# fake steps (one passes, one fails, one hangs past its own timeout, one skips with exit
# 77 as gpu_bench does without a device, one would outlive the whole budget, one comes too late), and this script checks from
# outside that the run ended within its budget, exited 1, and left a valid summary.json
# and a summary.md marking each step as it went. Then the same run stopped by SIGTERM must
# still leave a summary of the steps so far, and --help / a bad option behave. Given a CUDA
# build, the --prebuilt route too: pack_prebuilt.sh bundles its gpu_tests and gpu_bench,
# check.sh --prebuilt unpacks it and resolves every library the programs load (the env
# step runs ldd on them), and each test step runs the bundled program (skipped with 77
# without a GPU, passed with one; never failed or not run).
# usage: check_selftest.sh CHECK_SH WORKDIR [CUDA_BUILD_DIR]
set -euo pipefail

check=${1:?usage: check_selftest.sh CHECK_SH WORKDIR}
dir=${2:?usage: check_selftest.sh CHECK_SH WORKDIR}
cuda_build=${3:-}
rm -rf "$dir"
mkdir -p "$dir"
unset OUT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

rc=0
"$check" --self-test --out "$dir/run" >"$dir/run.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] || { cat "$dir/run.out"; fail "check.sh --self-test exited $rc, expected 1"; }
python3 - "$dir/run" <<'PY' || fail "summary of the self-test run"
import json, sys
d = sys.argv[1]
s = json.load(open(f"{d}/summary.json"))
want = {"ok": "passed", "fails": "failed", "hangs": "timeout", "gpu_bench": "skipped",
        "outlives_budget": "timeout", "late": "not-run"}
got = {st["name"]: st["status"] for st in s["steps"]}
assert got == want, f"step statuses {got}, expected {want}"
assert [st["name"] for st in s["steps"]] == list(want), "steps out of order"
assert s["result"] == "failed", s["result"]
steps = {st["name"]: st for st in s["steps"]}
assert steps["ok"]["note"] == "1/1 tests passed; goals: 1 met, 1 missed", steps["ok"]["note"]
assert steps["fails"]["rc"] == 3 and "error: something broke" in steps["fails"]["note"], steps["fails"]
assert steps["hangs"]["timeout_s"] == 2 and steps["hangs"]["rc"] in (124, 137), steps["hangs"]
assert steps["gpu_bench"]["rc"] == 77 and "no CUDA device" in steps["gpu_bench"]["note"], steps["gpu_bench"]
# The budget, not the step's own 600 s, bounded it; the whole run stayed inside the budget
# (plus the kill grace of `timeout -k 5`).
assert steps["outlives_budget"]["timeout_s"] < s["budget_s"], steps["outlives_budget"]
assert s["seconds"] <= s["budget_s"] + 5, (s["seconds"], s["budget_s"])
assert steps["late"]["rc"] is None and steps["late"]["log"] is None, steps["late"]
md = open(f"{d}/summary.md").read().splitlines()
rows = {l.split("|")[1].strip(): l.split("|")[2].strip() for l in md if l.startswith("| ") and not l.startswith("| step")}
assert rows == {"ok": "passed", "fails": "**FAILED**", "hangs": "**TIMEOUT**", "gpu_bench": "**SKIPPED**",
                "outlives_budget": "**TIMEOUT**", "late": "**NOT-RUN**"}, rows
print("self-test summary: every outcome marked", s["seconds"], "s")
PY
# The listing first: `tar | grep -q` fails under pipefail when grep's early exit makes tar
# die of SIGPIPE on a longer listing.
listing=$(tar tzf "$dir/run/logs.tar.gz") || fail "logs.tar.gz cannot be listed"
grep -qx 'logs/fails.log' <<<"$listing" || fail "logs.tar.gz has no logs/fails.log: $listing"
[[ -f $dir/run/cudnn.log ]] || fail "no cudnn.log in the output folder"

# Stopped by SIGTERM in the middle: the summary holds the steps that finished.
rc=0
timeout -s TERM 4 "$check" --self-test --out "$dir/term" >"$dir/term.out" 2>&1 || rc=$?
[[ $rc -eq 124 ]] || fail "the TERM run ended with $rc, expected timeout's 124"
grep -q "stopped by a signal" "$dir/term/check.log" || fail "check.log does not say it was stopped"
python3 - "$dir/term" <<'PY' || fail "summary of the stopped run"
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
got = {st["name"]: st["status"] for st in s["steps"]}
assert got.get("ok") == "passed" and got.get("fails") == "failed", got
assert "late" not in got, got
print("stopped run: summary of", len(got), "steps")
PY

"$check" --help | grep -q -- '--quick' || fail "--help does not describe --quick"
rc=0
"$check" --bogus >"$dir/bad.out" 2>&1 || rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "unknown option '--bogus'" "$dir/bad.out"; then
  fail "a bad option: exit $rc, $(cat "$dir/bad.out")"
fi
rc=0
"$check" --self-test --budget soon >"$dir/bad.out" 2>&1 || rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "budget 'soon'" "$dir/bad.out"; then
  fail "a bad --budget: exit $rc, $(cat "$dir/bad.out")"
fi

if [[ -n $cuda_build ]]; then
  pack="$(dirname "$check")/pack_prebuilt.sh"
  XZ_OPT=-0 "$pack" --build "$cuda_build" --out "$dir/bundle/rt.tar.xz" >"$dir/pack.out" 2>&1 ||
    { cat "$dir/pack.out"; fail "pack_prebuilt.sh failed"; }
  listing=$(tar tJf "$dir/bundle/rt.tar.xz") || fail "the bundle cannot be listed"
  for f in bin/gpu_tests bin/gpu_bench tests.tsv manifest.txt lib/libdnnl.so.2 lib/libprotobuf.so.32; do
    grep -qx "$f" <<<"$listing" || fail "the bundle has no $f"
  done
  if grep -qE '^lib/lib(cudart|cublas|cudnn|nccl|nvrtc|c|stdc\+\+)\.so' <<<"$listing"; then
    fail "the bundle holds a CUDA or C runtime library: $(grep -E '^lib/lib(cu|nccl|nvrtc|c\.|stdc)' <<<"$listing")"
  fi
  # The closure: with the bundle's lib/ first, every library the programs load comes from the
  # bundle, except the CUDA libraries and the C/C++ runtime, which the GPU machine has.
  mkdir -p "$dir/unpacked"
  tar -C "$dir/unpacked" -xJf "$dir/bundle/rt.tar.xz"
  for prog in gpu_tests gpu_bench; do
    outside="$(LD_LIBRARY_PATH="$dir/unpacked/lib" ldd "$dir/unpacked/bin/$prog" |
      awk '$2 == "=>" {print $1}' | grep -vxFf <(ls "$dir/unpacked/lib") |
      grep -vE '^lib(cuda|cudart|cublas|cublasLt|cudnn|nccl|nvrtc|c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so' || true)"
    [[ -z $outside ]] || fail "$prog loads libraries the bundle lacks: $outside"
  done
  rc=0
  "$check" --prebuilt "$dir/bundle/rt.tar.xz" --out "$dir/pre" --build "$dir/pre-build" \
    --budget 200 >"$dir/pre.out" 2>&1 || rc=$?
  [[ $rc -eq 1 ]] || { cat "$dir/pre.out"; fail "check.sh --prebuilt exited $rc, expected 1"; }
  python3 - "$dir/pre" <<'PY' || { cat "$dir/pre.out"; fail "summary of the --prebuilt run"; }
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
got = {st["name"]: st for st in s["steps"]}
order = ["unpack", "env", "gpu_ops", "gpu_attention", "gpu_training", "gpu_allocator", "gpu_bench",
         "gpu_nccl_np1", "gpu_train_cli"]
assert [st["name"] for st in s["steps"]] == order, [st["name"] for st in s["steps"]]
assert got["unpack"]["status"] == "passed", got["unpack"]
assert got["env"]["status"] == "passed", got["env"]
for name in order[2:7]:
    st = got[name]
    assert (st["status"], st["rc"]) in (("skipped", 77), ("passed", 0)), st
    assert st["status"] == "passed" or "no CUDA device" in st["note"], st
for name in order[7:]:
    assert got[name]["status"] == "not-run" and "Open MPI" in got[name]["note"], got[name]
print("prebuilt run:", {n: got[n]["status"] for n in order})
PY
  # The unpacked bundle is removed at the end (the env log names where it was).
  unpacked="$(sed -n 's/^LD_LIBRARY_PATH=\([^:]*\)\/lib.*/\1/p' "$dir/pre-build/check-logs/env.log")"
  [[ $unpacked == /tmp/ringtrain-prebuilt.* ]] || fail "the env log names no unpack folder: '$unpacked'"
  [[ ! -e $unpacked ]] || fail "check.sh left the unpacked bundle in $unpacked"
fi
echo "check.sh self-test checks passed"
