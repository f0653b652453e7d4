// The option table of `ringtrain train` (the options every other helper branch adds to) and
// its validation: grouped help, defaults as written, the range checks of every value and the
// checks across options; the shared machinery is in option_parsing.hpp. The tables of the
// other subcommands are in options_eval.cpp (eval, predict) and options_convert.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/env.hpp"
#include "core/error.hpp"
#include "io/loader.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/option_parsing.hpp"
#include "launch/options.hpp"
#include "nn/model_file.hpp"
#include "ringtrain/model.pb.h"
#include "train/memory_plan.hpp"
#include "train/timeline.hpp"

namespace ringtrain::launch {

using namespace opts;  // NOLINT: the tables are written in the helpers' vocabulary

namespace {

// The model-var options given on the command line (or in the INI file), in a fixed order:
// the named ones, then --set VAR=VALUE.
std::vector<TrainConfig::VarOverride> model_var_overrides(const po::variables_map& vm) {
  std::vector<TrainConfig::VarOverride> out;
  for (const char* name : {"hidden", "dropout", "depth", "width", "activation"})
    if (vm.count(name)) out.push_back({name, vm[name].as<std::string>(), cat("--", name)});
  if (vm.count("set"))
    for (const auto& item : vm["set"].as<std::vector<std::string>>()) {
      const size_t eq = item.find('=');
      RT_REQUIRE(eq != std::string::npos && eq > 0, "--set '", item,
                 "' is not VAR=VALUE (e.g. --set width=32)");
      out.push_back({item.substr(0, eq), item.substr(eq + 1), cat("--set ", item.substr(0, eq))});
    }
  return out;
}

// The help of an option that sets a var of a shipped model: what it is, and the default the
// compiled-in model file gives it (read from the file, so that help and file agree).
std::string var_help(const std::string& model, const std::string& var, const std::string& what) {
  std::string value = "?";
  const ModelFile file = ModelFile::load(model);
  for (const pb::Var& v : file.def().var()) {
    if (v.name() != var) continue;
    switch (v.value_case()) {
      case pb::Var::kIntValue:
        value = std::to_string(v.int_value());
        break;
      case pb::Var::kFloatValue:
        value = cat(v.float_value());
        break;
      case pb::Var::kStringValue:
        value = v.string_value();
        break;
      case pb::Var::kIntList:
        value.clear();
        for (auto x : v.int_list().value()) {
          if (!value.empty()) value += ',';
          value += std::to_string(x);
        }
        break;
      default:
        break;
    }
  }
  return cat(model, ": ", what, " (var ", var, "; default ", value, ")");
}

}  // namespace

bool parse_train(const std::vector<std::string>& args, TrainConfig& c, std::string* help) {
  std::string precision = "fp32", loss_scale = "dynamic";
  std::string optimizer = "adamw", wire;
  bool no_overlap = false;
  int64_t seed = int64_t(c.seed);
  auto& o = c.optimizer;
  auto& ls = c.loss_scale;
  // The shipped models as the binary holds them (models/*.pbtxt compiled in).
  std::string model_help;
  for (const auto& name : ModelFile::builtin_models())
    model_help += (model_help.empty() ? "" : " | ") + name;
  model_help += " (models/*.pbtxt) or a model file (docs/models.md)";
  // clang-format off
  po::options_description data("data");
  data.add_options()
      ("data", po::value(&c.data)->required(), "training dataset: a file, a directory of shards or a glob")
      ("val-data", po::value(&c.val_data), "validation dataset, evaluated after each epoch and at the end")
      ("prefetch", value_or_default(&c.prefetch), "batches read ahead by the loader thread (0: none)")
      ("cache", po::bool_switch(&c.cache), "keep the samples this rank reads in memory for later epochs")
      ("augment", po::value(&c.augment), "image augmentation: crop:PAD (random crop after zero padding), flip (horizontal), or crop:PAD,flip")
      ("seq-len", value_or_default(&c.seq_len), "token data: tokens per window (0: the model's context)");
  po::options_description model("model");
  model.add_options()
      ("model", po::value(&c.model)->default_value(c.model), model_help.c_str())
      ("hidden", po::value<std::string>(), var_help("mlp", "hidden", "hidden layer widths").c_str())
      ("dropout", po::value<std::string>(), var_help("cnn", "dropout", "dropout probability after the pooling").c_str())
      ("depth", po::value<std::string>(), var_help("resnet", "depth", "basic blocks per stage, 3 stages").c_str())
      ("width", po::value<std::string>(), var_help("resnet", "width", "channels of the first stage, then 2x, 4x").c_str())
      ("activation", po::value<std::string>(), var_help("resnet", "activation", "relu | gelu").c_str())
      ("set", po::value<std::vector<std::string>>()->composing(), "VAR=VALUE: set a var of the model file (repeatable)")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 (mixed: fp32 masters)")
      ("layer-precision", po::value(&c.layer_precision), "per-layer compute dtype overrides, LAYER=DTYPE[,...] (e.g. conv1=fp32)")
      ("loss-scale", po::value(&loss_scale)->default_value(loss_scale), "dynamic | a constant scale > 0")
      ("init-scale", value_or_default(&ls.init_scale), "initial dynamic loss scale (> 0)")
      ("scale-growth-interval", value_or_default(&ls.growth_interval), "finite steps before the scale grows")
      ("scale-growth-factor", value_or_default(&ls.growth_factor), "growth factor (> 1)")
      ("scale-backoff-factor", value_or_default(&ls.backoff_factor), "backoff factor on overflow, in (0, 1)")
      ("min-scale", value_or_default(&ls.min_scale), "floor of the dynamic scale (> 0, at most --init-scale)");
  po::options_description optim("optimisation");
  optim.add_options()
      ("batch-size", po::value<int64_t>(), cat("samples per rank per micro-batch (default ", TrainConfig::kDefaultBatchSize, ")").c_str())
      ("global-batch-size", po::value<int64_t>(), "samples per optimizer step over all ranks (batch size x ranks x --grad-accum)")
      ("grad-accum", po::value<int64_t>(), cat("micro-batches per optimizer step, gradients summed before one allreduce (default ", TrainConfig{}.grad_accum, "; on resume, raised to keep the checkpoint's global batch)").c_str())
      ("epochs", po::value<int64_t>(), cat("epochs to train (default ", TrainConfig::kDefaultEpochs, ")").c_str())
      ("steps", po::value<int64_t>(), "optimizer steps to train (instead of --epochs)")
      ("optimizer", po::value(&optimizer)->default_value(optimizer), "sgd | adamw")
      ("lr", value_or_default(&o.lr), "learning rate, in (0, 1000]")
      ("momentum", value_or_default(&o.momentum), "sgd momentum, in [0, 1)")
      ("nesterov", po::bool_switch(&o.nesterov), "sgd: Nesterov momentum")
      ("weight-decay", value_or_default(&o.weight_decay), "decoupled (adamw) or L2 (sgd) weight decay (>= 0)")
      ("decay-all", po::bool_switch(&c.decay_all), "weight decay on every parameter (default: not on biases and normalisation parameters)")
      ("label-smoothing", value_or_default(&c.label_smoothing), "label smoothing of the training loss, in [0, 1) (PyTorch's definition)")
      ("beta1", value_or_default(&o.beta1), "adamw beta1, in [0, 1)")
      ("beta2", value_or_default(&o.beta2), "adamw beta2, in [0, 1)")
      ("eps", value_or_default(&o.eps), "adamw epsilon (> 0)")
      ("grad-clip", value_or_default(&c.grad_clip), "clip the global gradient norm to this (0: off)")
      ("seed", po::value(&seed)->default_value(seed), "seed of init and data order");
  auto& sc = c.schedule;
  po::options_description sched("learning-rate schedule");
  sched.add_options()
      ("lr-schedule", value_or_default(&sc.name), "constant | cosine | linear | step | inverse-sqrt, after the warm-up")
      ("warmup-steps", value_or_default(&sc.warmup_steps), "steps of linear warm-up from --warmup-init-lr to --lr")
      ("warmup-init-lr", value_or_default(&sc.warmup_init_lr), "learning rate of the first warm-up step, in [0, --lr]")
      ("min-lr", value_or_default(&sc.min_lr), "cosine, linear: the learning rate at --decay-steps, in [0, --lr]")
      ("decay-steps", value_or_default(&sc.decay_steps), "cosine, linear: the step where the decay reaches --min-lr (0: the run's last step)")
      ("step-every", value_or_default(&sc.step_every), "step: multiply the learning rate by --step-gamma every N steps after the warm-up")
      ("step-gamma", value_or_default(&sc.step_gamma), "step: the factor, in (0, 1]");
  po::options_description ckpt("checkpointing");
  ckpt.add_options()
      ("checkpoint-dir", po::value(&c.checkpoint_dir), "directory for checkpoints (none: no checkpoints)")
      ("checkpoint-every", value_or_default(&c.checkpoint_every), "also save every N steps (0: only at the end)")
      ("checkpoint-secs", value_or_default(&c.checkpoint_secs), "also save every S seconds (0: off)")
      ("keep", value_or_default(&c.keep), "checkpoints to keep")
      ("async-checkpoint", po::bool_switch(&c.async_checkpoint), "copy the state at the save's step and write the checkpoint in the background while training continues (the same file; at most one save in flight)")
      ("keep-best", po::value(&c.keep_best), "val_loss | val_accuracy | val_METRIC[:min|max] (a metric of the model's loss block): also keep the best checkpoint by this metric as DIR/best.h5 (needs --val-data)")
      ("best-metric", po::value(&c.best_metric), "val_loss | val_accuracy | val_METRIC[:min|max]: the metric --early-stop (and --keep-best, when it names none) follows; default direction: min for loss, mae and rmse, else max")
      ("resume", value_or_default(&c.resume), "auto | never | FILE")
      ("overwrite", po::bool_switch(&c.overwrite), "with --resume never: delete the checkpoints already in --checkpoint-dir")
      ("init-from", po::value(&c.init_from), "start from these weights only (a ringtrain checkpoint, or a Hugging Face GPT-2 or Llama directory): step 0, fresh optimizer state, this run's schedule; the model must have the same tensors (the last node may differ in its classes: it is then freshly initialised). A checkpoint to resume in --checkpoint-dir wins")
      ("freeze", po::value(&c.freeze)->composing(), "PREFIX: never update the tensors whose name starts with PREFIX (no step, no weight decay); repeatable");
  po::options_description dev("device and communication");
  dev.add_options()
      ("device", value_or_default(&c.device), "cpu | cuda")
      ("gpu-memory", value_or_default(&c.gpu_memory), "cuda: grow (on demand, cached) | reserve:FRACTION (of the GPU's memory, up front)")
      ("threads", value_or_default(&c.threads), "threads per rank (0: OMP_NUM_THREADS if set, else the rank's CPU set if bound, else cores / ranks on the node)")
      ("comm", value_or_default(&c.comm), "gradient communication: mpi | hierarchical | nccl (cuda)")
      ("wire-dtype", po::value(&wire), "fp32 | fp16 | bf16 gradients on the wire (default: the compute dtype)")
      ("bucket-mb", value_or_default(&c.bucket_mb), "gradient bucket size in MiB")
      ("no-overlap", po::bool_switch(&no_overlap), "allreduce the buckets after backward, not during it")
      ("zero", value_or_default(&c.zero), "0 | 1 | 2 | 3: 1 = ZeRO-1, the fp32 masters, optimizer state and fp32 gradients sharded across ranks (reduce-scatter, shard update, all-gather); 2 = ZeRO-2, also no whole gradient: each bucket exists only until it is reduce-scattered, every micro-batch reduced; 3 = ZeRO-3, also no whole working weights: each block's parameters are all-gathered before its forward and its backward and freed after")
      ("tensor-parallel", value_or_default(&c.tensor_parallel), "T: split each transformer block's linear layers and attention heads across T consecutive ranks of one node (Megatron-style; T divides the ranks per node); the ranks form T x D, gradients reduced over D")
      ("recompute", value_or_default(&c.recompute), "none | blocks: free the activations of each repeat body of the model (a transformer block) after its forward and compute them again before its backward (less memory, one more forward; the same results)")
      ("memory-budget", po::value(&c.memory_budget), "BYTES[K|M|G|T] | auto: refuse to start when the memory plan of a rank exceeds this (auto: the cgroup's or address-space limit, or physical memory, shared by the node's ranks; on a GPU its memory)")
      ("stall-timeout", value_or_default(&c.stall_timeout), "seconds in a gradient allreduce before the job ends with exit 2 (0: never)");
  po::options_description eval("evaluation");
  eval.add_options()
      ("eval-every", value_or_default(&c.eval_every), "also evaluate --val-data every N steps (0: at epoch ends and the end only)")
      ("eval-windows", po::value<int64_t>(), "token data: evaluate N windows of --val-data, evenly spread over it (default: every window)")
      ("early-stop", value_or_default(&c.early_stop), "stop after N evaluations without improvement of --keep-best's metric (val_loss if not given; 0: never)");
  po::options_description obs("observability");
  obs.add_options()
      ("log-every", value_or_default(&c.log_every), "progress line and metrics every N steps")
      ("progress", value_or_default(&c.progress), "auto | bar | lines: rank 0's progress as a bar redrawn in place, or lines")
      ("metrics", po::value(&c.metrics), "JSON-lines metrics file (rank 0)")
      ("tensorboard", po::value(&c.tensorboard), "write TensorBoard event files into this directory (rank 0)")
      ("histogram-every", value_or_default(&c.histogram_every), "weight and gradient histograms every N steps (0: never)")
      ("timeline", po::value(&c.timeline), "write a Chrome trace (Perfetto, chrome://tracing) of --timeline-steps, all ranks")
      ("timeline-steps", value_or_default(&c.timeline_steps), "A:B, the steps the timeline covers")
      ("flight-recorder", value_or_default(&c.flight_recorder), "entries of each rank's ring of recent collectives and phases, dumped on a stall, an abort or SIGUSR2 (0: off)")
      ("debug-dir", po::value(&c.debug_dir), "directory of the flight-recorder dumps, one file per rank (default: --checkpoint-dir; neither: no dumps)")
      ("flight-recorder-dump-step", value_or_default(&c.flight_recorder_dump_step), "also dump every rank's flight recorder after step N (0: never)")
      ("straggler-threshold", value_or_default(&c.straggler_threshold), "name a rank whose compute before the gradient reduction exceeds the ranks' median by this fraction (> 0)")
      ("straggler-window", value_or_default(&c.straggler_window), "steps per straggler comparison: the ranks trade their times every N steps (0: no detection)")
      ("prometheus-file", po::value(&c.prometheus_file), "Prometheus text-exposition file (node_exporter's textfile collector), replaced every --prometheus-every seconds; {rank} in the name: one file per rank, else rank 0's")
      ("prometheus-every", value_or_default(&c.prometheus_every), "seconds between rewrites of --prometheus-file (> 0)")
      ("preflight", po::bool_switch(&c.preflight), "first run `ringtrain doctor` (its defaults, this run's --threads): outliers are warnings")
      ("preflight-strict", po::bool_switch(&c.preflight_strict), "as --preflight, but an outlier ends the job with exit 2 before training");
  po::options_description debug = debug_options();
  debug.add_options()
      ("check-numerics", po::bool_switch(&c.check_numerics), "find and name the first layer and rank with inf/nan each step");
  // clang-format on
  po::options_description desc("train options");
  desc.add(general_options()).add(data).add(model).add(prec).add(optim).add(sched).add(ckpt);
  desc.add(eval).add(dev).add(obs).add(debug);
  po::variables_map vm;
  if (!parse("train", desc, args, vm, help)) return false;

  c.precision = parse_float_dtype(precision, "--precision");
  c.model_vars = model_var_overrides(vm);
  c.seed = uint64_t(seed);
  RT_REQUIRE(seed >= 0, "--seed ", seed, " is not valid: must be >= 0");
  RT_REQUIRE(optimizer == "sgd" || optimizer == "adamw", "--optimizer '", optimizer,
             "' is not known; expected sgd or adamw");
  o.name = optimizer;
  for (const char* n : {"batch-size", "global-batch-size", "epochs", "steps", "grad-accum"})
    require_positive_int(vm, n);
  c.grad_accum = vm.count("grad-accum") ? vm["grad-accum"].as<int64_t>() : TrainConfig{}.grad_accum;
  c.grad_accum_given = vm.count("grad-accum") > 0;
  RT_REQUIRE(!(vm.count("batch-size") && vm.count("global-batch-size")),
             "give --batch-size (per rank) or --global-batch-size, not both");
  RT_REQUIRE(!(vm.count("epochs") && vm.count("steps")), "give --epochs or --steps, not both");
  c.batch_size = vm.count("batch-size") ? vm["batch-size"].as<int64_t>() : 0;
  c.batch_size_given = vm.count("batch-size") > 0;
  c.global_batch_size = vm.count("global-batch-size") ? vm["global-batch-size"].as<int64_t>() : 0;
  if (!c.batch_size && !c.global_batch_size) c.batch_size = TrainConfig::kDefaultBatchSize;
  c.steps = vm.count("steps") ? vm["steps"].as<int64_t>() : 0;
  c.epochs =
      vm.count("epochs") ? vm["epochs"].as<int64_t>() : (c.steps ? 0 : TrainConfig::kDefaultEpochs);

  // Optimiser and loss-scale values: a nan or inf here trains to all-nan checkpoints, so
  // each is checked to be finite and in the range where the update means something. The lr
  // bound is generous (no schedule here uses more than a few units) but keeps 1e38 out.
  require_positive(o.lr, "lr", 1000);
  require_unit(o.momentum, "momentum");
  require_non_negative(o.weight_decay, "weight-decay");
  require_unit(o.beta1, "beta1");
  require_unit(o.beta2, "beta2");
  require_positive(o.eps, "eps");
  require_non_negative(c.grad_clip, "grad-clip");
  require_unit(c.label_smoothing, "label-smoothing");
  check_schedule(c.schedule, o.lr);
  RT_REQUIRE(c.eval_every >= 0, "--eval-every ", c.eval_every, " is not valid: must be >= 0");
  require_positive_int(vm, "eval-windows");
  c.eval_windows = vm.count("eval-windows") ? vm["eval-windows"].as<int64_t>() : 0;
  RT_REQUIRE(c.eval_windows == 0 || !c.val_data.empty(),
             "--eval-windows needs --val-data (a token dataset) to evaluate on");
  RT_REQUIRE(c.early_stop >= 0, "--early-stop ", c.early_stop, " is not valid: must be >= 0");
  for (const auto& [option, value] :
       {std::pair<const char*, const std::string*>{"--keep-best", &c.keep_best},
        {"--best-metric", &c.best_metric}})
    RT_REQUIRE(value->empty() || parse_best_metric(*value).name.size() > 0, option, " '", *value,
               "' is not known; expected val_loss, val_accuracy or val_METRIC[:min|max] for a "
               "metric of the model's loss block, e.g. val_rmse or val_r2:max");
  RT_REQUIRE(c.keep_best.empty() || c.best_metric.empty() || c.keep_best == c.best_metric,
             "--keep-best ", c.keep_best, " and --best-metric ", c.best_metric,
             " name different metrics; give the metric once");
  RT_REQUIRE(c.best_metric.empty() || !c.val_data.empty(),
             "--best-metric needs --val-data to evaluate on");
  RT_REQUIRE(c.keep_best.empty() || !c.checkpoint_dir.empty(),
             "--keep-best needs --checkpoint-dir (best.h5 is kept there)");
  RT_REQUIRE((c.keep_best.empty() && c.early_stop == 0 && c.eval_every == 0) || !c.val_data.empty(),
             "--keep-best, --early-stop and --eval-every need --val-data to evaluate on");
  RT_REQUIRE(c.seq_len >= 0, "--seq-len ", c.seq_len, " is not valid: must be >= 0");
  io::parse_augment(c.augment);  // input error now, not in the loader thread
  require_positive(ls.init_scale, "init-scale");
  require_positive(ls.min_scale, "min-scale");
  require_finite(ls.growth_factor, "scale-growth-factor");
  RT_REQUIRE(ls.growth_factor > 1, "--scale-growth-factor ", ls.growth_factor,
             " is not valid: must be > 1");
  require_finite(ls.backoff_factor, "scale-backoff-factor");
  RT_REQUIRE(ls.backoff_factor > 0 && ls.backoff_factor < 1, "--scale-backoff-factor ",
             ls.backoff_factor, " is not valid: must be in (0, 1)");
  RT_REQUIRE(ls.growth_interval > 0, "--scale-growth-interval ", ls.growth_interval,
             " is not valid: must be > 0");
  if (loss_scale == "dynamic") {
    ls.dynamic = true;
  } else {
    size_t used = 0;
    float v = 0;
    try {
      v = std::stof(loss_scale, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_REQUIRE(used == loss_scale.size(), "--loss-scale '", loss_scale,
               "' is not valid; expected dynamic or a positive number");
    require_positive(v, "loss-scale");
    ls.dynamic = false;
    ls.init_scale = v;
    ls.min_scale = std::min(ls.min_scale, v);
  }
  RT_REQUIRE(ls.min_scale <= ls.init_scale, "--min-scale ", ls.min_scale,
             " is not valid: must be at most the initial scale ", ls.init_scale);
  RT_REQUIRE(c.checkpoint_every >= 0, "--checkpoint-every ", c.checkpoint_every,
             " is not valid: must be >= 0");
  require_non_negative(c.checkpoint_secs, "checkpoint-secs");
  RT_REQUIRE(c.keep >= 1, "--keep ", c.keep, " is not valid: must be >= 1");
  RT_REQUIRE(c.log_every > 0, "--log-every ", c.log_every, " is not valid: must be > 0");
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads, " is not valid: must be >= 0");
  RT_REQUIRE(c.prefetch >= 0 && c.prefetch <= 64, "--prefetch ", c.prefetch,
             " is not valid; expected 0 to 64 batches");
  RT_REQUIRE(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
             "' is not known; expected cpu or cuda");
  kernels::cuda::MemoryPolicy::parse(c.gpu_memory);  // input error now, not at start-up
  RT_REQUIRE(c.comm == "mpi" || c.comm == "hierarchical" || c.comm == "nccl", "--comm '", c.comm,
             "' is not known; expected mpi, hierarchical or nccl");
  RT_REQUIRE(c.comm != "nccl" || c.device == "cuda",
             "--comm nccl needs --device cuda (NCCL reduces GPU buffers)");
  RT_REQUIRE(c.device != "cuda" || kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
  if (!wire.empty()) {
    c.wire_dtype = parse_float_dtype(wire, "--wire-dtype");
    c.wire_dtype_given = true;
  }
  c.overlap = !no_overlap;
  RT_REQUIRE(c.zero >= 0 && c.zero <= 3, "--zero ", c.zero, " is not valid; expected 0, 1, 2 or 3");
  RT_REQUIRE(c.zero != 2 || c.device != "cuda",
             "--zero 2 keeps gradient buckets in host memory; this build has no device path for "
             "it (use --zero 1 with --device cuda)");
  RT_REQUIRE(c.zero != 3 || c.device != "cuda",
             "--zero 3 gathers parameters and keeps gradient buckets in host memory; this build "
             "has no device path for it (use --zero 1 with --device cuda)");
  RT_REQUIRE(c.tensor_parallel >= 1, "--tensor-parallel ", c.tensor_parallel,
             " is not valid; expected a group size of 1 or more");
  RT_REQUIRE(c.tensor_parallel == 1 || c.zero == 0, "--tensor-parallel ", c.tensor_parallel,
             " with --zero ", c.zero,
             ": ZeRO over the data-parallel dimension of a tensor-parallel run is not built yet; "
             "use --zero 0");
  RT_REQUIRE(
      c.tensor_parallel == 1 || c.device != "cuda", "--tensor-parallel ", c.tensor_parallel,
      " with --device cuda: this build splits layers with MPI collectives on the host only "
      "(no NCCL tensor-parallel communicators yet); use --device cpu or --tensor-parallel 1");
  RT_REQUIRE(c.recompute == "none" || c.recompute == "blocks", "--recompute '", c.recompute,
             "' is not valid; expected none or blocks");
  if (!c.memory_budget.empty()) parse_memory_budget(c.memory_budget);  // input error now
  RT_REQUIRE(c.resume == "auto" || c.resume == "never" || c.init_from.empty(), "--init-from '",
             c.init_from, "' and --resume '", c.resume,
             "' both give the weights; --resume FILE continues a run, --init-from starts a new "
             "one from weights: give one");
  RT_REQUIRE(!c.overwrite || c.resume == "never",
             "--overwrite only applies with --resume never (it deletes the checkpoints already in "
             "--checkpoint-dir)");
  require_finite(c.bucket_mb, "bucket-mb");
  RT_REQUIRE(c.bucket_mb * double(1 << 20) >= 4 && c.bucket_mb <= 4096, "--bucket-mb ", c.bucket_mb,
             " is not valid; expected a size in MiB from 4 bytes (4e-6) to 4096");
  require_non_negative(c.stall_timeout, "stall-timeout");
  RT_REQUIRE(c.progress == "auto" || c.progress == "bar" || c.progress == "lines", "--progress '",
             c.progress, "' is not valid; expected auto, bar or lines");
  parse_step_window(c.timeline_steps);  // input error now, not after training
  RT_REQUIRE(c.histogram_every >= 0, "--histogram-every ", c.histogram_every,
             " is not valid: must be >= 0");
  RT_REQUIRE(c.flight_recorder >= 0 && c.flight_recorder <= (int64_t(1) << 24),
             "--flight-recorder ", c.flight_recorder,
             " is not valid; expected 0 (off) to 16777216 entries");
  RT_REQUIRE(c.flight_recorder_dump_step >= 0, "--flight-recorder-dump-step ",
             c.flight_recorder_dump_step, " is not valid: must be >= 0");
  RT_REQUIRE(c.flight_recorder_dump_step == 0 || c.flight_recorder > 0,
             "--flight-recorder-dump-step needs the flight recorder (--flight-recorder > 0)");
  RT_REQUIRE(c.flight_recorder_dump_step == 0 || !c.debug_dir.empty() || !c.checkpoint_dir.empty(),
             "--flight-recorder-dump-step needs --debug-dir or --checkpoint-dir to write into");
  require_positive(c.straggler_threshold, "straggler-threshold", 1e6);
  RT_REQUIRE(c.straggler_window >= 0, "--straggler-window ", c.straggler_window,
             " is not valid: must be >= 0");
  require_positive(c.prometheus_every, "prometheus-every", 1e6);
  const bool ckpt_opts = c.checkpoint_every > 0 || c.checkpoint_secs > 0;
  RT_REQUIRE(!ckpt_opts || !c.checkpoint_dir.empty(),
             "--checkpoint-every/--checkpoint-secs need --checkpoint-dir");
  RT_REQUIRE(!c.async_checkpoint || !c.checkpoint_dir.empty(),
             "--async-checkpoint needs --checkpoint-dir");
  RT_REQUIRE(c.resume == "auto" || c.resume == "never" || !c.resume.empty(),
             "--resume must be auto, never or a checkpoint file");
  c.config_ini = config_text(desc, vm);
  c.print_config = vm.count("print-config") > 0;  // cmd_train checks data and model first
  return true;
}

}  // namespace ringtrain::launch
