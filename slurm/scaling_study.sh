#!/usr/bin/env bash
# Submits a scaling study to Slurm: for every node count (and ranks per node) one weak-scaling
# job (fixed batch per rank) and one strong-scaling job (fixed global batch), each running
# benchmarks/scaling/run once under srun and writing one JSON result, then a report job that
# waits for them (afterany) and writes report.md and the plots with benchmarks/scaling/report.
# docs/scaling.md explains the figures; --dry-run prints the sbatch commands only.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: slurm/scaling_study.sh [options] [-- ringtrain train options]

  --nodes LIST            node counts, comma-separated (default 1,2,4,8)
  --tasks-per-node LIST   ranks per node, one per GPU (default 8); a list gives a point for
                          every combination with --nodes
  --gpus-per-task N       GPUs per rank (default 1; 0 leaves --gpus-per-task out: CPU nodes)
  --cpus-per-task N       CPUs per rank (default: not given)
  --modes LIST            weak, strong or both (default weak,strong)
  --model NAME            ringtrain --model (default mlp)
  --steps N               steps per point (default 300)
  --log-every N           steps per metrics window; the first is left out (default 25)
  --batch-size N          weak: samples per rank (default 256)
  --global-batch-size N   strong: samples per step in all (default: --batch-size times the
                          smallest rank count; must divide by every rank count)
  --time T                time limit per job (default 00:20:00)
  --data PATH             training data every node can read (default build/demo/data/fashion-train.h5)
  --bin PATH              ringtrain binary (default build/bin/ringtrain)
  --out DIR               results, logs, report; visible from every node
                          (default scaling-study-YYYYmmdd-HHMMSS)
  --series NAME           the series' name in the results (default MODEL-PRECISION-ringtrain)
  --sbatch-args "ARGS"    more sbatch options for every job, e.g. "--partition=gpu --account=x"
  --dry-run               print the sbatch commands, submit nothing
  --wait                  wait until the report job has ended, then print the report
  -h, --help              this help

Each point job runs `benchmarks/scaling/run --launcher srun` and writes DIR/points/MODE-NxT.jsonl;
the report job writes DIR/report.md, DIR/throughput.png and DIR/efficiency.png. Point jobs
ask for --exclusive nodes, so that nothing else on a node changes the figures.
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nodes_list=1,2,4,8
tpn_list=8
gpus_per_task=1
cpus_per_task=""
modes=weak,strong
model=mlp
steps=300
log_every=25
batch=256
global_batch=""
time_limit=00:20:00
data=$here/build/demo/data/fashion-train.h5
bin=$here/build/bin/ringtrain
out=""
series=""
sbatch_args=""
dry_run=0
wait_report=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes_list=$2; shift 2 ;;
    --tasks-per-node) tpn_list=$2; shift 2 ;;
    --gpus-per-task) gpus_per_task=$2; shift 2 ;;
    --cpus-per-task) cpus_per_task=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --log-every) log_every=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --global-batch-size) global_batch=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --series) series=$2; shift 2 ;;
    --sbatch-args) sbatch_args=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --wait) wait_report=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "scaling_study.sh: unknown option '$1' (--help lists them)" >&2; exit 1 ;;
  esac
done
train_args=("$@")
die() {
  echo "scaling_study.sh: $*" >&2
  exit 1
}
IFS=, read -r -a node_counts <<<"$nodes_list"
IFS=, read -r -a tasks_per_node <<<"$tpn_list"
IFS=, read -r -a mode_list <<<"$modes"
for v in "${node_counts[@]}" "${tasks_per_node[@]}" "$steps" "$batch" "$gpus_per_task"; do
  [[ "$v" =~ ^[0-9]+$ ]] || die "'$v' is not a whole number"
done
for m in "${mode_list[@]}"; do [[ $m == weak || $m == strong ]] || die "--modes: unknown mode '$m'"; done
[[ -n "$out" ]] || out=scaling-study-$(date +%Y%m%d-%H%M%S)
if [[ $dry_run -eq 0 ]]; then
  command -v sbatch >/dev/null || die "sbatch not found: run this where Slurm's commands are"
  [[ -x "$bin" ]] || die "--bin $bin is not an executable (build first, or give --bin)"
  [[ -e "$data" ]] || die "--data $data does not exist"
  mkdir -p "$out/points" "$out/logs"
fi
out=$(cd "$(dirname "$out")" 2>/dev/null && pwd)/$(basename "$out")

# The smallest rank count sets the default global batch of the strong series.
min_ranks=""
for n in "${node_counts[@]}"; do
  for t in "${tasks_per_node[@]}"; do
    r=$((n * t))
    [[ -z "$min_ranks" || $r -lt $min_ranks ]] && min_ranks=$r
  done
done
[[ -n "$global_batch" ]] || global_batch=$((batch * min_ranks))

# Shell-quoted words, for --wrap and for printing.
quote() {
  local out="" w
  for w in "$@"; do out+="${out:+ }$(printf '%q' "$w")"; done
  echo "$out"
}
submit() {  # submit WRAP SBATCH-OPTIONS...: prints the job id (with --dry-run: the command)
  local wrap=$1
  shift
  if [[ $dry_run -eq 1 ]]; then
    echo "$(quote sbatch "$@") --wrap='$wrap'" >&3
    echo "JOB$((${#ids[@]} + 1))"
  else
    sbatch --parsable "$@" --wrap="$wrap" | cut -d';' -f1
  fi
}

exec 3>&1  # the dry run's commands go to stdout, past the $(...) that captures job ids
read -r -a extra_sbatch <<<"$sbatch_args"
ids=()
for mode in "${mode_list[@]}"; do
  for n in "${node_counts[@]}"; do
    for t in "${tasks_per_node[@]}"; do
      ranks=$((n * t))
      if [[ $mode == strong ]] && ((global_batch % ranks != 0)); then
        die "--global-batch-size $global_batch does not divide by $ranks ranks"
      fi
      name=$mode-${n}x$t
      run=("$here/benchmarks/scaling/run" --launcher srun --ranks "$ranks" --mode "$mode"
           --model "$model" --steps "$steps" --log-every "$log_every" --batch-size "$batch"
           --global-batch-size "$global_batch" --data "$data" --bin "$bin"
           --out "$out/points/$name.jsonl")
      [[ -n "$series" ]] && run+=(--series "$series")
      [[ ${#train_args[@]} -gt 0 ]] && run+=(-- "${train_args[@]}")
      args=(--job-name="scaling-$name" --nodes="$n" --ntasks-per-node="$t" --exclusive
            --time="$time_limit" --output="$out/logs/%x-%j.out")
      ((gpus_per_task > 0)) && args+=(--gpus-per-task="$gpus_per_task")
      [[ -n "$cpus_per_task" ]] && args+=(--cpus-per-task="$cpus_per_task")
      args+=("${extra_sbatch[@]}")
      ids+=("$(submit "$(quote "${run[@]}")" "${args[@]}")")
    done
  done
done

report=("$here/benchmarks/scaling/report" "$out/points" --out "$out"
        --title "Scaling study: $model, $(date '+%F')")
args=(--job-name=scaling-report --ntasks=1 --time=00:10:00 --output="$out/logs/%x-%j.out"
      --dependency="afterany:$(IFS=:; echo "${ids[*]}")" "${extra_sbatch[@]}")
if [[ $wait_report -eq 1 && $dry_run -eq 0 ]]; then
  echo "scaling_study: ${#ids[@]} point job(s) ${ids[*]}; waiting for the report job"
  rc=0
  sbatch --wait "${args[@]}" --wrap="$(quote "${report[@]}")" >/dev/null || rc=$?
  [[ $rc -eq 0 ]] || die "the report job failed (exit $rc); logs in $out/logs"
  cat "$out/report.md"
  exit 0
fi
rid=$(submit "$(quote "${report[@]}")" "${args[@]}")
if [[ $dry_run -eq 1 ]]; then
  echo "scaling_study: dry run, nothing submitted (${#ids[@]} point jobs and a report job above)"
else
  echo "scaling_study: point jobs ${ids[*]}, report job $rid; results in $out"
fi
