#!/usr/bin/env bash
# --prometheus-file at 2 ranks: one file per rank ({rank} in the name), replaced while the run
# trains (read here several times during the run: its step grows), and read at the end by
# the real parser, prometheus_client's text parser (PyPI, in a venv this test makes): every
# family, the labels job/rank/host, and values that agree with the metrics file. A directory
# that does not exist (rank 1's only) is an input error naming the option and the directory.
source "$(dirname "$0")/lib.sh"
dir=$(workdir prometheus)
venv=$E2E_DIR/prometheus-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import prometheus_client' 2>/dev/null; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q prometheus_client || fail "pip install prometheus_client"
fi
mkdir "$dir/textfile"
E2E_JOB=$(job_tag) mpi 2 "$BIN" train --data "$DATA/train.h5" --hidden 256 --batch-size 32 \
  --threads 1 --steps 600 --log-every 1 --metrics "$dir/m.jsonl" --checkpoint-dir "$dir/ckpt" \
  --checkpoint-every 200 --prometheus-file "$dir/textfile/ringtrain-{rank}.prom" \
  --prometheus-every 0.2 >"$dir/out" 2>"$dir/err" &
job=$!
# While it trains: the step each time the file is read (it is replaced whole, never partial).
steps=()
while kill -0 "$job" 2>/dev/null; do
  f=$dir/textfile/ringtrain-1.prom
  if [[ -f $f ]]; then
    s=$(awk '/^ringtrain_step\{/ {print $2}' "$f")
    [[ -n $s ]] || fail "a reader saw a file without ringtrain_step: $(cat "$f")"
    [[ ${#steps[@]} -gt 0 && ${steps[-1]} == "$s" ]] || steps+=("$s")
  fi
  sleep 0.1
done
wait "$job" || fail "training failed: $(cat "$dir/err")"
echo "steps seen while training: ${steps[*]}"
[[ ${#steps[@]} -ge 3 ]] || fail "the file was not seen updating during the run (${steps[*]})"
ls "$dir/textfile"
[[ $(find "$dir/textfile" -name '*.tmp*' | wc -l) -eq 0 ]] || fail "a temporary file was left behind"
"$venv/bin/python" - "$dir" "$(hostname)" <<'PY' || fail "the Prometheus files"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
d, host = sys.argv[1], sys.argv[2]
last = [json.loads(l) for l in open(f"{d}/m.jsonl") if '"type":"step"' in l][-1]
for rank in (0, 1):
    fams = {f.name: f for f in text_string_to_metric_families(open(f"{d}/textfile/ringtrain-{rank}.prom").read())}
    want = ["ringtrain_step", "ringtrain_steps_per_second", "ringtrain_samples_per_second",
            "ringtrain_loss", "ringtrain_loss_scale", "ringtrain_data_wait_seconds",
            "ringtrain_exposed_comm_seconds", "ringtrain_straggler_score",
            "ringtrain_memory_bytes", "ringtrain_checkpoint_age_seconds"]
    missing = [w for w in want if w not in fams]
    assert not missing, f"rank {rank}: missing {missing}"
    for f in fams.values():
        assert f.type == "gauge", (f.name, f.type)
        for s in f.samples:
            assert s.labels["job"] == "local" and s.labels["rank"] == str(rank) and s.labels["host"] == host, s
    v = lambda name: fams[name].samples[0].value
    assert v("ringtrain_step") == 600, v("ringtrain_step")
    assert abs(v("ringtrain_loss") - last["loss"]) <= 1e-6 * abs(last["loss"]), (v("ringtrain_loss"), last)
    assert v("ringtrain_loss_scale") == last["loss_scale"]
    assert v("ringtrain_steps_per_second") > 0 and v("ringtrain_samples_per_second") > 0
    assert abs(v("ringtrain_samples_per_second") / v("ringtrain_steps_per_second") - 64) < 1e-6
    assert 0 <= v("ringtrain_checkpoint_age_seconds") < 60
    assert v("ringtrain_straggler_score") > 0
    mem = {s.labels["category"]: s.value for s in fams["ringtrain_memory_bytes"].samples}
    # mlp 784-256-10 in fp32: 203530 parameters, fp32 masters
    assert mem["masters"] == 203530 * 4, mem
print("prometheus files parsed: 2 ranks, every family, labels and values checked")
PY

# The directory of rank 1's file only is missing: the input error is on rank 1, one rank
# prints it, every rank exits 1.
mkdir -p "$dir/per-rank/0"
rc=0
mpi 2 "$BIN" train --data "$DATA/train.h5" --steps 2 --threads 1 \
  --prometheus-file "$dir/per-rank/{rank}/x.prom" >/dev/null 2>"$dir/bad.err" || rc=$?
[[ $rc -eq 1 ]] || fail "a missing directory: exit $rc, expected 1"
[[ $(grep -c '^ringtrain: error:' "$dir/bad.err") -eq 1 ]] || fail "not one message: $(cat "$dir/bad.err")"
contains "--prometheus-file '$dir/per-rank/{rank}/x.prom': the directory '$dir/per-rank/1' does not exist" \
  <"$dir/bad.err" || fail "the message: $(cat "$dir/bad.err")"
pass "Prometheus textfiles updated during the run and parsed by prometheus_client"
