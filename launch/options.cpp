// Option tables of `ringtrain train|eval|convert idx` and their validation.
#include "launch/options.hpp"

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/timeline.hpp"

namespace po = boost::program_options;

namespace ringtrain::launch {
namespace {

// Parses args (and the --config file, if the table has it) into vm; wraps Boost's
// exceptions into input errors that say where to look.
bool parse(const char* command, const po::options_description& desc,
           const std::vector<std::string>& args, po::variables_map& vm, std::string* help) {
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (vm.count("help")) {
      std::ostringstream os;
      os << "usage: ringtrain " << command << " [options]\n" << desc;
      *help = os.str();
      return false;
    }
    if (vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream in(file);
      RT_REQUIRE(in, "--config '", file, "' cannot be opened");
      try {
        po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
      } catch (const po::error& e) {
        throw_input(cat("--config '", file, "': ", e.what(),
                        "; keys are the option names "
                        "without '--' (e.g. batch-size = 64)"));
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw_input(
        cat("ringtrain ", command, ": ", e.what(), " (see `ringtrain ", command, " --help`)"));
  }
  return true;
}

void require_positive(const po::variables_map& vm, const char* name) {
  if (!vm.count(name)) return;
  const auto v = vm[name].as<int64_t>();
  RT_REQUIRE(v > 0, "--", name, " ", v, " is not valid; expected a positive number");
}

}  // namespace

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

}  // namespace

bool parse_train(const std::vector<std::string>& args, TrainConfig& c, std::string* help) {
  std::string precision = "fp32", loss_scale = "dynamic";
  std::string optimizer = "adamw", wire;
  bool no_overlap = false;
  int64_t seed = int64_t(c.seed);
  po::options_description desc("train options");
  // clang-format off
  desc.add_options()
      ("help,h", "this help")
      ("config", po::value<std::string>(), "INI file of options (key = value); the command line wins")
      ("data", po::value(&c.data)->required(), "training dataset: a file, a directory of shards or a glob")
      ("val-data", po::value(&c.val_data), "validation dataset, evaluated after each epoch and at the end")
      ("prefetch", po::value(&c.prefetch)->default_value(2), "batches read ahead by the loader thread (0: none)")
      ("cache", po::bool_switch(&c.cache), "keep the samples this rank reads in memory for later epochs")
      ("model", po::value(&c.model)->default_value("mlp"), "mlp | cnn | resnet (models/*.pbtxt) or a model file (docs/models.md)")
      ("hidden", po::value<std::string>(), "mlp: hidden layer widths (the file's var hidden; default 512,256)")
      ("dropout", po::value<std::string>(), "cnn: dropout probability after the pooling (var dropout; default 0.25)")
      ("depth", po::value<std::string>(), "resnet: basic blocks per stage, 3 stages (var depth; default 1)")
      ("width", po::value<std::string>(), "resnet: channels of the first stage, then 2x, 4x (var width; default 16)")
      ("activation", po::value<std::string>(), "resnet: relu | gelu (var activation; default relu)")
      ("set", po::value<std::vector<std::string>>()->composing(), "VAR=VALUE: set a var of the model file (repeatable)")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)")
      ("layer-precision", po::value(&c.layer_precision), "per-layer compute dtype overrides, LAYER=DTYPE[,...] (e.g. conv1=fp32)")
      ("precision", po::value(&precision)->default_value("fp32"), "fp32 | fp16 | bf16 (mixed: fp32 masters)")
      ("batch-size", po::value<int64_t>(), "samples per rank per step (default 64)")
      ("global-batch-size", po::value<int64_t>(), "samples per step over all ranks")
      ("epochs", po::value<int64_t>(), "epochs to train (default 1)")
      ("steps", po::value<int64_t>(), "optimizer steps to train (instead of --epochs)")
      ("optimizer", po::value(&optimizer)->default_value("adamw"), "sgd | adamw")
      ("lr", po::value(&c.optimizer.lr)->default_value(1e-3f), "learning rate")
      ("momentum", po::value(&c.optimizer.momentum)->default_value(0.9f), "sgd momentum")
      ("nesterov", po::bool_switch(&c.optimizer.nesterov), "sgd: Nesterov momentum")
      ("weight-decay", po::value(&c.optimizer.weight_decay)->default_value(0.f), "decoupled (adamw) or L2 (sgd) weight decay")
      ("beta1", po::value(&c.optimizer.beta1)->default_value(0.9f), "adamw beta1")
      ("beta2", po::value(&c.optimizer.beta2)->default_value(0.999f), "adamw beta2")
      ("eps", po::value(&c.optimizer.eps)->default_value(1e-8f), "adamw epsilon")
      ("grad-clip", po::value(&c.grad_clip)->default_value(0.f), "clip the global gradient norm to this (0: off)")
      ("loss-scale", po::value(&loss_scale)->default_value("dynamic"), "dynamic | a constant scale")
      ("init-scale", po::value(&c.loss_scale.init_scale)->default_value(65536.f), "initial dynamic loss scale")
      ("scale-growth-interval", po::value(&c.loss_scale.growth_interval)->default_value(2000), "finite steps before the scale grows")
      ("scale-growth-factor", po::value(&c.loss_scale.growth_factor)->default_value(2.f), "growth factor")
      ("scale-backoff-factor", po::value(&c.loss_scale.backoff_factor)->default_value(0.5f), "backoff factor on overflow")
      ("min-scale", po::value(&c.loss_scale.min_scale)->default_value(1.f), "floor of the dynamic scale")
      ("checkpoint-dir", po::value(&c.checkpoint_dir), "directory for checkpoints (none: no checkpoints)")
      ("checkpoint-every", po::value(&c.checkpoint_every)->default_value(0), "also save every N steps (0: only at the end)")
      ("checkpoint-secs", po::value(&c.checkpoint_secs)->default_value(0), "also save every S seconds (0: off)")
      ("keep", po::value(&c.keep)->default_value(3), "checkpoints to keep")
      ("resume", po::value(&c.resume)->default_value("auto"), "auto | never | FILE")
      ("overwrite", po::bool_switch(&c.overwrite), "with --resume never: delete the checkpoints already in --checkpoint-dir")
      ("seed", po::value(&seed)->default_value(42), "seed of init and data order")
      ("device", po::value(&c.device)->default_value("cpu"), "cpu | cuda")
      ("gpu-memory", po::value(&c.gpu_memory)->default_value("grow"), "cuda: grow (on demand, cached) | reserve:FRACTION (of the GPU's memory, up front)")
      ("threads", po::value(&c.threads)->default_value(0), "threads per rank (0: the rank's CPU set if bound, else cores / ranks on the node)")
      ("comm", po::value(&c.comm)->default_value("mpi"), "gradient communication: mpi | hierarchical | nccl (cuda)")
      ("wire-dtype", po::value(&wire), "fp32 | fp16 | bf16 gradients on the wire (default: the compute dtype)")
      ("bucket-mb", po::value(&c.bucket_mb)->default_value(25), "gradient bucket size in MiB")
      ("no-overlap", po::bool_switch(&no_overlap), "allreduce the buckets after backward, not during it")
      ("stall-timeout", po::value(&c.stall_timeout)->default_value(300), "seconds in a gradient allreduce before the job ends with exit 2 (0: never)")
      ("log-every", po::value(&c.log_every)->default_value(50), "progress line and metrics every N steps")
      ("metrics", po::value(&c.metrics), "JSON-lines metrics file (rank 0)")
      ("tensorboard", po::value(&c.tensorboard), "write TensorBoard event files into this directory (rank 0)")
      ("histogram-every", po::value(&c.histogram_every)->default_value(100), "weight and gradient histograms every N steps (0: never)")
      ("check-numerics", po::bool_switch(&c.check_numerics), "find and name the first layer and rank with inf/nan each step")
      ("progress", po::value(&c.progress)->default_value("auto"), "auto | bar | lines: rank 0's progress as a bar redrawn in place, or lines")
      ("timeline", po::value(&c.timeline), "write a Chrome trace (Perfetto, chrome://tracing) of --timeline-steps, all ranks")
      ("timeline-steps", po::value(&c.timeline_steps)->default_value("1:10"), "A:B, the steps the timeline covers");
  // clang-format on
  po::variables_map vm;
  if (!parse("train", desc, args, vm, help)) return false;

  c.precision = parse_float_dtype(precision, "--precision");
  c.model_vars = model_var_overrides(vm);
  c.seed = uint64_t(seed);
  RT_REQUIRE(seed >= 0, "--seed ", seed, " is negative; expected 0 or a positive integer");
  RT_REQUIRE(optimizer == "sgd" || optimizer == "adamw", "--optimizer '", optimizer,
             "' is not known; expected sgd or adamw");
  c.optimizer.name = optimizer;
  for (const char* n : {"batch-size", "global-batch-size", "epochs", "steps"})
    require_positive(vm, n);
  RT_REQUIRE(!(vm.count("batch-size") && vm.count("global-batch-size")),
             "give --batch-size (per rank) or --global-batch-size, not both");
  RT_REQUIRE(!(vm.count("epochs") && vm.count("steps")), "give --epochs or --steps, not both");
  c.batch_size = vm.count("batch-size") ? vm["batch-size"].as<int64_t>() : 0;
  c.batch_size_given = vm.count("batch-size") > 0;
  c.global_batch_size = vm.count("global-batch-size") ? vm["global-batch-size"].as<int64_t>() : 0;
  if (!c.batch_size && !c.global_batch_size) c.batch_size = 64;
  c.steps = vm.count("steps") ? vm["steps"].as<int64_t>() : 0;
  c.epochs = vm.count("epochs") ? vm["epochs"].as<int64_t>() : (c.steps ? 0 : 1);

  if (loss_scale == "dynamic") {
    c.loss_scale.dynamic = true;
  } else {
    size_t used = 0;
    float v = 0;
    try {
      v = std::stof(loss_scale, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_REQUIRE(used == loss_scale.size() && std::isfinite(v) && v > 0, "--loss-scale '", loss_scale,
               "' is not valid; expected dynamic or a positive number");
    c.loss_scale.dynamic = false;
    c.loss_scale.init_scale = v;
    c.loss_scale.min_scale = std::min(c.loss_scale.min_scale, v);
  }
  RT_REQUIRE(c.grad_clip >= 0.f, "--grad-clip ", c.grad_clip, " is negative");
  RT_REQUIRE(c.checkpoint_every >= 0, "--checkpoint-every ", c.checkpoint_every, " is negative");
  RT_REQUIRE(c.checkpoint_secs >= 0, "--checkpoint-secs ", c.checkpoint_secs, " is negative");
  RT_REQUIRE(c.log_every > 0, "--log-every ", c.log_every,
             " is not valid; expected a positive number");
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads, " is negative");
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
  RT_REQUIRE(!c.overwrite || c.resume == "never",
             "--overwrite only applies with --resume never (it deletes the checkpoints already in "
             "--checkpoint-dir)");
  RT_REQUIRE(c.bucket_mb * double(1 << 20) >= 4 && c.bucket_mb <= 4096, "--bucket-mb ", c.bucket_mb,
             " is not valid; expected a size in MiB from 4 bytes (4e-6) to 4096");
  RT_REQUIRE(c.stall_timeout >= 0, "--stall-timeout ", c.stall_timeout, " is negative");
  RT_REQUIRE(c.progress == "auto" || c.progress == "bar" || c.progress == "lines", "--progress '",
             c.progress, "' is not valid; expected auto, bar or lines");
  parse_step_window(c.timeline_steps);  // input error now, not after training
  RT_REQUIRE(c.histogram_every >= 0, "--histogram-every ", c.histogram_every, " is negative");
  if (const char* t = std::getenv("RINGTRAIN_TEST_STALL")) {
    long long step = 0;
    RT_REQUIRE(std::sscanf(t, "%d:%lld:%lf", &c.test_stall_rank, &step, &c.test_stall_seconds) == 3,
               "RINGTRAIN_TEST_STALL='", t, "' is not RANK:STEP:SECONDS");
    c.test_stall_step = step;
  }
  const bool ckpt_opts = c.checkpoint_every > 0 || c.checkpoint_secs > 0;
  RT_REQUIRE(!ckpt_opts || !c.checkpoint_dir.empty(),
             "--checkpoint-every/--checkpoint-secs need --checkpoint-dir");
  RT_REQUIRE(c.resume == "auto" || c.resume == "never" || !c.resume.empty(),
             "--resume must be auto, never or a checkpoint file");
  return true;
}

bool parse_eval(const std::vector<std::string>& args, EvalConfig& c, std::string* help) {
  std::string precision = "fp32";
  po::options_description desc("eval options");
  // clang-format off
  desc.add_options()
      ("help,h", "this help")
      ("config", po::value<std::string>(), "INI file of options")
      ("checkpoint", po::value(&c.checkpoint)->required(), "checkpoint file (ckpt-*.h5)")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)")
      ("data", po::value(&c.data)->required(), "dataset to evaluate on")
      ("batch-size", po::value<int64_t>(&c.batch_size)->default_value(256), "samples per rank per forward pass")
      ("precision", po::value(&precision)->default_value("fp32"), "fp32 | fp16 | bf16 compute")
      ("threads", po::value(&c.threads)->default_value(0), "threads per rank (0: cores / ranks on the node)")
      ("device", po::value(&c.device)->default_value("cpu"), "cpu | cuda")
      ("gpu-memory", po::value(&c.gpu_memory)->default_value("grow"), "cuda: grow | reserve:FRACTION")
      ("metrics", po::value(&c.metrics), "append an eval record to this JSON-lines file");
  // clang-format on
  po::variables_map vm;
  if (!parse("eval", desc, args, vm, help)) return false;
  c.precision = parse_float_dtype(precision, "--precision");
  require_positive(vm, "batch-size");
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads, " is negative");
  RT_REQUIRE(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
             "' is not known; expected cpu or cuda");
  kernels::cuda::MemoryPolicy::parse(c.gpu_memory);
  RT_REQUIRE(c.device != "cuda" || kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
  return true;
}

bool parse_convert(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  po::options_description desc("convert idx options");
  // clang-format off
  desc.add_options()
      ("help,h", "this help")
      ("config", po::value<std::string>(), "INI file of options")
      ("images", po::value(&c.images)->required(), "IDX images file (.gz or plain)")
      ("labels", po::value(&c.labels)->required(), "IDX labels file (.gz or plain)")
      ("out", po::value(&c.out)->required(), "output dataset file (.h5)")
      ("shards", po::value(&c.shards)->default_value(1), "split into N files OUT-00000-of-0000N.h5");
  // clang-format on
  po::variables_map vm;
  return parse("convert idx", desc, args, vm, help);
}

}  // namespace ringtrain::launch
