#!/usr/bin/env bash
# ringtrain against its peers on the CPU: PyTorch DistributedDataParallel (gloo) and
# TensorFlow MultiWorkerMirroredStrategy (gRPC ring), both from PyPI in virtual environments
# this script creates (`torch`, `tensorflow-cpu`). The same models (the 784-512-256-10 MLP
# and the CNN), per-rank batch, data file, optimizer (SGD, momentum 0.9, lr 0.01), thread
# count (1 per rank) and precision: fp32, and bf16 as ringtrain's --precision bf16,
# torch.autocast(bfloat16) and Keras' mixed_bfloat16 policy. Prints every run's samples/s,
# its ratio to the best peer, the GFLOP/s one rank achieves and its fraction of the best
# SGEMM rate measured in the same run (a 2048^3 SGEMM on one core, gemm_bench's fastest
# provider, before and after the training runs, the higher of the two): the practical
# limit. Runs of one model and precision follow each other, so a change in the machine's
# load hits the frameworks alike; the order rotates between model/precision pairs.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/peers/run.sh [--steps N] [--models mlp,cnn] [--precisions fp32,bf16]
                               [--ranks N] [--frameworks ringtrain,pytorch,tensorflow]
                               [--build DIR] [--venvs DIR] [--data FILE] [--json FILE]
  --steps N         training steps per run, the first 20 untimed (default: mlp 400, cnn 100)
  --models LIST     comma-separated, of mlp and cnn (default mlp,cnn)
  --precisions LIST comma-separated, of fp32 and bf16 (default fp32,bf16)
  --ranks N         ranks per run under mpirun, 1 thread each (default 2)
  --frameworks LIST which to run (default ringtrain,pytorch,tensorflow)
  --build DIR       ringtrain's build directory, with bin/ringtrain and bin/gemm_bench
                    (default build)
  --venvs DIR       where the peers' virtual environments are, or are created
                    (DIR/torch, DIR/tensorflow; default build/peers). Creating them runs
                    pip install (PyTorch's wheel brings CUDA libraries: several GB)
  --data FILE       the Fashion-MNIST HDF5 file (default build/demo/data/fashion-train.h5,
                    from 'make demo')
  --json FILE       write one JSON object per run (JSON lines)
PYTHON names the interpreter the virtual environments are created from (default python3).
USAGE
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$here/build
venvs=""
data=""
steps=""
models=mlp,cnn
precisions=fp32,bf16
ranks=2
frameworks=ringtrain,pytorch,tensorflow
json=""
batch=128
window=20 # steps per timing window, all frameworks; the first window is start-up
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --frameworks) frameworks=$2; shift 2 ;;
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --venvs) venvs=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
venvs=${venvs:-$build/peers}
data=${data:-$build/demo/data/fashion-train.h5}
bin=$build/bin
py=${PYTHON:-python3}
[[ -f "$data" ]] || { echo "no $data: run 'make demo' first, or give --data" >&2; exit 1; }
[[ -x "$bin/ringtrain" && -x "$bin/gemm_bench" ]] ||
  { echo "no $bin/ringtrain or $bin/gemm_bench: build first, or give --build" >&2; exit 1; }
if [[ -n "$steps" ]] && ! [[ "$steps" =~ ^[0-9]+$ && "$steps" -ge $((3 * window)) ]]; then
  echo "--steps $steps: need a whole number of at least $((3 * window))" >&2; exit 1
fi
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || { echo "--ranks '$ranks': need a positive number" >&2; exit 1; }
IFS=, read -r -a model_arr <<<"$models"
IFS=, read -r -a prec_arr <<<"$precisions"
IFS=, read -r -a fw_arr <<<"$frameworks"
for m in "${model_arr[@]}"; do
  [[ $m == mlp || $m == cnn ]] || { echo "--models: unknown model '$m' (mlp, cnn)" >&2; exit 1; }
done
for p in "${prec_arr[@]}"; do
  [[ $p == fp32 || $p == bf16 ]] || { echo "--precisions: unknown '$p' (fp32, bf16)" >&2; exit 1; }
done
for f in "${fw_arr[@]}"; do
  [[ $f == ringtrain || $f == pytorch || $f == tensorflow ]] ||
    { echo "--frameworks: unknown '$f' (ringtrain, pytorch, tensorflow)" >&2; exit 1; }
done

# The peers' virtual environments, created once (pip install from PyPI).
ensure_venv() {
  local dir=$venvs/$1 module=$2
  shift 2
  if ! "$dir/bin/python" -c "import $module, h5py" 2>/dev/null; then
    echo "# creating $dir: pip install $* (may take minutes)" >&2
    "$py" -m venv "$dir"
    "$dir/bin/pip" install --quiet --progress-bar off "$@" >&2
  fi
}
for f in "${fw_arr[@]}"; do
  case $f in
    pytorch) ensure_venv torch torch torch numpy h5py ;;
    tensorflow) ensure_venv tensorflow tensorflow tensorflow-cpu h5py ;;
  esac
done

if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1
# One thread per rank for every library a framework loads (ringtrain sets its own).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 MASTER_ADDR=127.0.0.1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Training FLOPs of one sample. Forward: 2 FLOPs per multiply-add (MAC) of every Linear
# and Conv2d; backward: twice the forward (input gradient + weight gradient) except the
# first layer's input gradient, which no framework computes (its input is the data).
# So 6 * MACs - 2 * MACs(first layer). Biases, ReLU, pooling, dropout, the loss and the
# optimizer are left out (under 1% of these counts for both models).
#   mlp: 784*512 + 512*256 + 256*10 = 535,040 MACs, first 401,408
#   cnn: conv1 26*26*32*(1*9) = 194,688; conv2 24*24*64*(32*9) = 10,616,832;
#        fc1 9216*128 = 1,179,648; fc2 128*10 = 1,280; 11,992,448 MACs, first 194,688
flops_per_sample() {
  case "$1" in
    mlp) echo $((6 * (784 * 512 + 512 * 256 + 256 * 10) - 2 * 784 * 512)) ;;
    cnn) echo $((6 * (26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9 + 9216 * 128 + 128 * 10) - 2 * 26 * 26 * 32 * 9)) ;;
  esac
}
free_ports() { # N free local ports, comma-separated
  "$py" -c 'import socket,sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(",".join(str(s.getsockname()[1]) for s in ss))' "$1"
}
# The best SGEMM rate on one core: the fastest provider's 2048^3 row of gemm_bench.
gemm_rate() {
  "$bin/gemm_bench" --threads 1 --json | "$py" -c 'import json,sys
rows = [r for r in json.load(sys.stdin) if r["shape"] == "square2048"]
best = max(rows, key=lambda r: r["gflops"])
print(best["gflops"], best["provider"])'
}

# run_one FRAMEWORK MODEL PRECISION STEPS: samples/s of all ranks together, or fails.
run_one() {
  local fw=$1 model=$2 prec=$3 s=$4 log=$tmp/$1.log out=$tmp/$1-$2-$3.json
  case $fw in
    ringtrain)
      mpirun -n "$ranks" "$bin/ringtrain" train --data "$data" --model "$model" \
        --batch-size "$batch" --steps "$s" --threads 1 --precision "$prec" --optimizer sgd \
        --lr 0.01 --momentum 0.9 --log-every "$window" --metrics "$out" >"$log" 2>&1 ||
        { cat "$log" >&2; echo "ringtrain failed ($model, $prec)" >&2; exit 2; }
      sed -n 1p "$log" >"$tmp/ringtrain-startup"
      # The median samples_per_sec of the step records after the first (start-up).
      "$py" -c 'import json,sys,statistics
r = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median([x["samples_per_sec"] for x in r if x["type"] == "step"][1:]))' "$out"
      ;;
    pytorch)
      mpirun -n "$ranks" -x MASTER_ADDR -x MASTER_PORT="$(free_ports 1)" -x OMP_NUM_THREADS \
        -x OPENBLAS_NUM_THREADS "$venvs/torch/bin/python" "$here/benchmarks/peers/torch_ddp.py" \
        --data "$data" --model "$model" --batch-size "$batch" --steps "$s" --warmup "$window" \
        --window "$window" --threads 1 --precision "$prec" --json "$out" >"$log" 2>&1 ||
        { cat "$log" >&2; echo "torch_ddp.py failed ($model, $prec)" >&2; exit 2; }
      "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_sec"])' "$out"
      ;;
    tensorflow)
      mpirun -n "$ranks" -x TF_PORTS="$(free_ports "$ranks")" -x OMP_NUM_THREADS \
        "$venvs/tensorflow/bin/python" "$here/benchmarks/peers/tf_mwms.py" --data "$data" \
        --model "$model" --batch-size "$batch" --steps "$s" --warmup "$window" \
        --window "$window" --threads 1 --precision "$prec" --json "$out" >"$log" 2>&1 ||
        { cat "$log" >&2; echo "tf_mwms.py failed ($model, $prec)" >&2; exit 2; }
      "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_sec"])' "$out"
      ;;
  esac
}
version_of() {
  case $1 in
    ringtrain) "$bin/ringtrain" --version | sed -n 1p | cut -d' ' -f2 ;;
    pytorch) "$venvs/torch/bin/python" -c 'import torch; print(torch.__version__)' ;;
    tensorflow) "$venvs/tensorflow/bin/python" -c 'import tensorflow as t; print(t.__version__)' 2>/dev/null ;;
  esac
}

read -r gemm_start gemm_provider < <(gemm_rate)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$tmp/rows"
turn=0
for model in "${model_arr[@]}"; do
  s=$steps
  [[ -z "$s" ]] && { [[ $model == mlp ]] && s=400 || s=100; }
  for prec in "${prec_arr[@]}"; do
    # Rotate the order so that no framework always runs first (or last) in a pair.
    order=("${fw_arr[@]:turn}" "${fw_arr[@]:0:turn}")
    turn=$(((turn + 1) % ${#fw_arr[@]}))
    for fw in "${order[@]}"; do
      sps=$(run_one "$fw" "$model" "$prec" "$s")
      echo "$model $prec $fw $s $(flops_per_sample "$model") $sps" >>"$tmp/rows"
      printf '# %s %s %s: %.0f samples/s\n' "$model" "$prec" "$fw" "$sps" >&2
    done
  done
done
read -r gemm_end _ < <(gemm_rate)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
versions=""
for fw in "${fw_arr[@]}"; do versions+="$fw=$(version_of "$fw") "; done
startup=$(cat "$tmp/ringtrain-startup" 2>/dev/null || true)

"$py" - "$tmp/rows" "$gemm_start" "$gemm_end" "$gemm_provider" "$load_start" "$load_end" \
  "$batch" "$ranks" "$versions" "$startup" "${OPENBLAS_CORETYPE-}" "$json" <<'PY'
import json, sys
(rows_file, g0, g1, gprov, load0, load1, batch, ranks, versions, startup, coretype,
 out) = sys.argv[1:]
gemm, ranks = max(float(g0), float(g1)), int(ranks)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# {ranks} rank(s) x 1 thread, batch {batch} per rank, SGD momentum 0.9; {versions.strip()}")
print(f"# CPU: {cpu}; ringtrain: {startup.split('; ', 1)[-1] if startup else '-'}")
if coretype:
    print(f"# OPENBLAS_CORETYPE={coretype} was set in the environment")
print(f"# reference: best SGEMM 2048^3 on 1 core ({gprov}), {gemm:.1f} GFLOP/s (before the runs "
      f"{float(g0):.1f}, after {float(g1):.1f}); load average {load0} at start, {load1} at end")
print(f"{'model':5} {'prec':4} {'framework':10} {'samples/s':>10} {'vs_best_peer':>12} "
      f"{'GF/rank':>8} {'frac_sgemm':>10}")
rows = [l.split() for l in open(rows_file)]
recs = []
for model, prec, fw, steps, flops, sps in rows:
    sps, flops = float(sps), int(flops)
    peers = [float(r[5]) for r in rows if r[0] == model and r[1] == prec and r[2] != fw
             and r[2] != "ringtrain"]
    best_peer = max(peers) if peers else None
    gf = sps * flops / ranks * 1e-9
    r = dict(model=model, precision=prec, framework=fw, ranks=ranks, batch_per_rank=int(batch),
             steps=int(steps), flops_per_sample=flops, samples_per_sec=sps,
             ratio_to_best_peer=None if best_peer is None else sps / best_peer,
             gflops_per_rank=gf, sgemm_gflops=gemm, sgemm_provider=gprov,
             fraction_of_sgemm=gf / gemm)
    recs.append(r)
    ratio = "-" if best_peer is None else f"{sps / best_peer:.2f}"
    print(f"{model:5} {prec:4} {fw:10} {sps:10.0f} {ratio:>12} {gf:8.1f} {gf / gemm:10.3f}")
print("# vs_best_peer: samples/s over the fastest other peer's (PyTorch, TensorFlow) on the same "
      "model and precision. Goals (issue 18): ringtrain >= 1.5 on the mlp, >= 1.3 on the cnn")
if out:
    with open(out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
PY
