// The settings of `ringtrain train`, filled from the command line and the --config INI file
// by launch/options.cpp (the option names are the CLI contract of docs/usage.md). The
// initialisers below are the defaults: the option table reads them, and --help prints them.
// The Trainer and what it runs on take their settings from here; the other subcommands'
// settings are in launch/config.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "nn/loss_scaler.hpp"
#include "nn/optimizer.hpp"
#include "nn/schedule.hpp"

namespace ringtrain::launch {

// The ZeRO stages and activation policies this build trains (--zero 0..kMaxTrainZero;
// --recompute blocks when kTrainsRecompute). The memory planner plans stages 0 to 3 and
// recomputation whatever these say, and suggests only what they allow.
inline constexpr int kMaxTrainZero = 3;
inline constexpr bool kTrainsRecompute = true;

struct TrainConfig {
  std::string data, val_data;
  int prefetch = 2;           // batches the loader thread reads ahead (0: read in the step)
  bool cache = false;         // keep the samples read in memory
  int64_t seq_len = 0;        // token data: tokens per window (0: the model's context)
  std::string model = "mlp";  // a built-in name or a model file
  // Overrides of the model file's vars, in order: (var, value, the option that gave it),
  // from --hidden/--depth/--width/--dropout/--activation and --set VAR=VALUE.
  struct VarOverride {
    std::string var, value, option;
  };
  std::vector<VarOverride> model_vars;
  std::vector<std::string> plugins;  // --plugin LIB.so: ops loaded before the model is built
  std::string layer_precision;       // "conv1=fp32,..."
  DType precision = DType::f32;
  // When neither --batch-size nor --global-batch-size, neither --epochs nor --steps is given
  // (the help texts print these).
  static constexpr int64_t kDefaultBatchSize = 64, kDefaultEpochs = 1;
  int64_t batch_size = 0, global_batch_size = 0;  // exactly one is set after parsing
  bool batch_size_given = false;                  // --batch-size was explicit
  int64_t epochs = 0, steps = 0;                  // exactly one is set after parsing
  OptimizerConfig optimizer;
  ScheduleConfig schedule;  // --lr-schedule and its warm-up and decay
  int64_t grad_accum = 1;   // micro-batches per optimizer step
  bool grad_accum_given = false;
  bool decay_all = false;  // weight decay on every parameter (no decay groups)
  float label_smoothing = 0.f;
  float grad_clip = 0.f;  // 0: off
  LossScalerConfig loss_scale;
  std::string augment;  // "crop:PAD,flip" (either part alone); "" for none
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0: only at the end
  double checkpoint_secs = 0;    // 0: off
  int keep = 3;
  bool async_checkpoint = false;  // saves written by a background thread (async_checkpoint.hpp)
  int64_t eval_every = 0;    // steps between evaluations besides epoch ends (0: epoch ends only)
  int64_t eval_windows = 0;  // token data: windows per evaluation (0: every window)
  // val_loss | val_accuracy | val_METRIC[:min|max]: keep DIR/best.h5 ("" for none)
  std::string keep_best;
  std::string best_metric;  // what --keep-best and --early-stop follow when --keep-best names none
  int64_t early_stop = 0;   // stop after this many evaluations without improvement (0: never)
  std::string resume = "auto";  // auto | never | FILE
  bool overwrite = false;       // --resume never may delete older checkpoints
  // --init-from CKPT|HF_DIR: a fresh run's weights (step 0, fresh optimizer state); "" none
  std::string init_from;
  std::vector<std::string> freeze;  // --freeze PREFIX: tensors never updated
  uint64_t seed = 42;
  std::string device = "cpu";
  std::string gpu_memory = "grow";  // cuda: grow | reserve:FRACTION
  int threads = 0;                  // 0: the rank's share of the node's cores
  std::string comm = "mpi";         // mpi | hierarchical | nccl
  DType wire_dtype = DType::f32;    // gradient dtype on the wire (default: the compute dtype)
  bool wire_dtype_given = false;
  double bucket_mb = 25;  // gradient bucket size
  bool overlap = true;    // allreduce buckets while backward runs
  int zero = 0;           // 1: ZeRO-1, optimizer state and fp32 gradients sharded; 2: ZeRO-2
  // Ranks per tensor-parallel group (consecutive ranks of one node; docs/scaling.md): the
  // world is T x D, data parallelism over the D groups.
  int tensor_parallel = 1;
  // none | blocks: each repeat body's activations freed after forward, recomputed in backward
  std::string recompute = "none";
  double stall_timeout = 300;  // seconds in a collective before the job ends (0: never)
  int64_t log_every = 50;
  std::string metrics;
  std::string tensorboard;        // event-file directory (rank 0)
  int64_t histogram_every = 100;  // weight/gradient histograms every N steps (0: never)
  bool check_numerics = false;    // find the first layer and rank with inf/nan
  std::string progress = "auto";  // auto | bar | lines
  std::string timeline;           // Chrome-trace file (written by rank 0)
  std::string timeline_steps = "1:10";
  // Diagnostics (docs/usage.md, "Diagnosing a slow or stuck job").
  int64_t flight_recorder = 4096;                    // entries per rank's ring (0: off)
  std::string debug_dir;                             // flight-recorder dumps ("": --checkpoint-dir)
  int64_t flight_recorder_dump_step = 0;             // also dump after this step (0: never)
  bool preflight = false, preflight_strict = false;  // `ringtrain doctor` before the run
  double straggler_threshold = 0.5;                  // slower than the median by this fraction
  int64_t straggler_window = 50;                     // steps per comparison (0: no detection)
  std::string prometheus_file;   // textfile-collector file ("{rank}": one per rank)
  double prometheus_every = 15;  // seconds between rewrites
  // The options as --print-config prints them (key = value lines), for the metrics' start
  // record and TensorBoard; filled by parse_train.
  std::string config_ini;
  // --print-config: check the data and the model as a run's start would, print
  // config_ini, and train nothing.
  bool print_config = false;
  // Bytes per rank the memory plan must fit ("" none, "auto": the OS's or the GPU's limit).
  std::string memory_budget;

  // The metric --keep-best and --early-stop follow: --keep-best's, else --best-metric's,
  // else val_loss.
  std::string best_metric_text() const {
    return !keep_best.empty() ? keep_best : !best_metric.empty() ? best_metric : "val_loss";
  }
};

// "val_NAME[:min|max]" (--keep-best, --best-metric): NAME is loss, accuracy or a metric of
// the model's loss block; lower is better for loss, mae and rmse unless :max says otherwise.
// name is "" when the text is not of that form.
struct BestMetric {
  std::string name;   // without the val_ prefix and the direction
  bool lower = true;  // lower values are better
  std::string label;  // val_NAME, as the lines and records name it
};
inline BestMetric parse_best_metric(const std::string& text) {
  BestMetric m;
  std::string s = text;
  int dir = 0;  // 0: the metric's own, -1: min, 1: max
  if (const size_t colon = s.find(':'); colon != std::string::npos) {
    const std::string d = s.substr(colon + 1);
    if (d != "min" && d != "max") return m;
    dir = d == "min" ? -1 : 1;
    s.resize(colon);
  }
  if (s.rfind("val_", 0) != 0 || s.size() == 4) return m;
  for (const char ch : s)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return m;
  m.name = s.substr(4);
  m.label = s;
  m.lower = dir != 0 ? dir < 0 : (m.name == "loss" || m.name == "mae" || m.name == "rmse");
  return m;
}

}  // namespace ringtrain::launch
