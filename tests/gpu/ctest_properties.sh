#!/usr/bin/env bash
# The ctest properties of the `gpu` tests, checked without a GPU: only exit status 77 (the
# suites' "no CUDA device", decided before any test runs) may show as Skipped — no
# SKIP_REGULAR_EXPRESSION, which would turn a failing run that prints the phrase into a
# skip — and every test has its own TIMEOUT within benchmarks/gpu/check.sh's step limits
# (120 s, 300 s for gpu_train_cli), since `ctest --timeout` does not override a TIMEOUT.
# usage: ctest_properties.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: ctest_properties.sh BUILD_DIR}
ctest --test-dir "$build" --show-only=json-v1 -L gpu >"$build/gpu-tests.json"
python3 - "$build/gpu-tests.json" <<'PY'
import json, sys
tests = json.load(open(sys.argv[1]))["tests"]
names = sorted(t["name"] for t in tests)
assert names == sorted(["gpu_ops", "gpu_attention", "gpu_allocator", "gpu_training", "gpu_nccl_np1",
                        "gpu_train_cli"]), names
for t in tests:
    p = {q["name"]: q["value"] for q in t.get("properties", [])}
    name = t["name"]
    assert "SKIP_REGULAR_EXPRESSION" not in p, f"{name}: a skip regex overrides the exit code"
    assert p.get("SKIP_RETURN_CODE") == 77, f"{name}: SKIP_RETURN_CODE {p.get('SKIP_RETURN_CODE')}"
    limit = 300 if name == "gpu_train_cli" else 120
    assert 0 < p.get("TIMEOUT", 0) <= limit, f"{name}: TIMEOUT {p.get('TIMEOUT')} (at most {limit})"
print(f"{len(tests)} gpu tests: skip only on exit 77, TIMEOUTs within check.sh's limits")
PY
