// Option tables of `ringtrain train|eval|predict|convert idx|npy|images|cifar` and their
// validation: the help text (grouped, defaults written as a user would write them), hints for
// mistyped options, range checks that refuse non-finite and impossible values, and --print-config,
// which prints the parsed options as an INI file that --config reads back.
#include "launch/options.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.hpp"
#include "io/loader.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/timeline.hpp"

namespace po = boost::program_options;

namespace ringtrain::launch {
namespace {

// The shortest decimal text that reads back as exactly v (0.001, not 0.00100000005).
template <typename T>
std::string shortest(T v) {
  char buf[40];
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {  // 300, not %g's 3e+02
    std::snprintf(buf, sizeof buf, "%.0f", double(v));
    return buf;
  }
  for (int digits = 1; digits <= std::numeric_limits<T>::max_digits10; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    if (static_cast<T>(std::strtod(buf, nullptr)) == v) break;
  }
  return buf;
}

// An option bound to *target whose default is the value *target already holds (the config
// struct's initialiser is the one place a default lives), shown in --help as written.
template <typename T>
po::typed_value<T>* value_or_default(T* target) {
  if constexpr (std::is_floating_point_v<T>)
    return po::value(target)->default_value(*target, shortest(*target));
  else
    return po::value(target)->default_value(*target);
}

// Names users reach for that are spelled differently here (other frameworks' spellings).
const std::pair<const char*, const char*> kAliases[] = {
    {"learning-rate", "lr"},
    {"learning_rate", "lr"},
    {"batch", "batch-size"},
    {"bs", "batch-size"},
    {"batch_size", "batch-size"},
    {"max-steps", "steps"},
    {"num-epochs", "epochs"},
    {"ckpt-dir", "checkpoint-dir"},
    {"save-dir", "checkpoint-dir"},
    {"output-dir", "checkpoint-dir"},
    {"dtype", "precision"},
    {"amp", "precision"},
    {"clip-grad-norm", "grad-clip"},
    {"max-grad-norm", "grad-clip"},
    {"wd", "weight-decay"},
    {"num-threads", "threads"},
    {"val", "val-data"},
    {"validation-data", "val-data"},
    {"train-data", "data"},
    {"optim", "optimizer"},
    {"backend", "comm"},
    {"log-interval", "log-every"},
    {"resume-from", "resume"},
    {"scheduler", "lr-schedule"},
    {"lr-scheduler", "lr-schedule"},
    {"warmup", "warmup-steps"},
    {"gradient-accumulation-steps", "grad-accum"},
    {"accumulate-grad-batches", "grad-accum"},
    {"patience", "early-stop"},
    {"input", "images"},
    {"output", "out"},
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "; did you mean --lr?" for a name that is an alias of, or close to, an option of desc
// ("" when nothing is close). `dashes` is "--" on the command line, "" for INI keys.
std::string did_you_mean(std::string name, const po::options_description& desc,
                         const char* dashes) {
  name.erase(0, name.find_first_not_of('-'));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  std::string best;
  for (const auto& [alias, option] : kAliases)
    if (name == alias && desc.find_nothrow(option, false)) best = option;
  if (best.empty()) {
    std::string underscored = name;
    std::replace(underscored.begin(), underscored.end(), '_', '-');
    size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;  // at most this far away
    for (const auto& opt : desc.options()) {
      const std::string& known = opt->long_name();
      if (known.size() < 2) continue;
      const size_t d = edit_distance(underscored, known);
      if (d < best_d) best_d = d, best = known;
    }
  }
  return best.empty() ? "" : cat("; did you mean ", dashes, best, "?");
}

// Range checks. Each refuses nan and inf first ("must be finite"), then says the range.
void require_finite(double v, const char* name) {
  RT_REQUIRE(std::isfinite(v), "--", name, " ", v, " is not valid: must be finite");
}
void require_positive(double v, const char* name, double max = HUGE_VAL) {
  require_finite(v, name);
  RT_REQUIRE(v > 0, "--", name, " ", v, " is not valid: must be > 0");
  RT_REQUIRE(v <= max, "--", name, " ", v, " is not valid: must be <= ", max);
}
void require_non_negative(double v, const char* name) {
  require_finite(v, name);
  RT_REQUIRE(v >= 0, "--", name, " ", v, " is not valid: must be >= 0");
}
void require_unit(double v, const char* name) {  // [0, 1): probabilities, decay rates
  require_finite(v, name);
  RT_REQUIRE(v >= 0 && v < 1, "--", name, " ", v, " is not valid: must be in [0, 1)");
}

void require_positive_int(const po::variables_map& vm, const char* name) {
  if (!vm.count(name)) return;
  const auto v = vm[name].as<int64_t>();
  RT_REQUIRE(v > 0, "--", name, " ", v, " is not valid: must be > 0");
}

// The value of one parsed option as an INI value ("" for a type not listed).
std::string value_text(const boost::any& v) {
  if (auto* s = boost::any_cast<std::string>(&v)) return *s;
  if (auto* b = boost::any_cast<bool>(&v)) return *b ? "true" : "false";
  if (auto* i = boost::any_cast<int>(&v)) return std::to_string(*i);
  if (auto* l = boost::any_cast<int64_t>(&v)) return std::to_string(*l);
  if (auto* f = boost::any_cast<float>(&v)) return shortest(*f);
  if (auto* d = boost::any_cast<double>(&v)) return shortest(*d);
  return "";
}

// --print-config: every option that has a value, in table order, as `key = value` lines.
std::string config_text(const po::options_description& desc, const po::variables_map& vm) {
  std::string out;
  for (const auto& opt : desc.options()) {
    const std::string& key = opt->long_name();
    if (key == "help" || key == "config" || key == "print-config" || !vm.count(key)) continue;
    if (auto* list = boost::any_cast<std::vector<std::string>>(&vm[key].value())) {
      for (const auto& item : *list) out += cat(key, " = ", item, "\n");  // a repeated key
      continue;
    }
    out += cat(key, " = ", value_text(vm[key].value()), "\n");
  }
  return out;
}

// --help and --print-config, shared by every subcommand.
po::options_description general_options() {
  po::options_description g("general");
  g.add_options()("help,h", "this help")(
      "config", po::value<std::string>(),
      "INI file of options (key = value, keys without '--'); the command line wins");
  return g;
}

po::options_description debug_options() {
  po::options_description d("testing/debugging");
  d.add_options()("print-config",
                  "check the options, print them (defaults included) as an INI file for "
                  "--config, and exit without running");
  return d;
}

// Parses args (and the --config file, if given) into vm; wraps Boost's exceptions into
// input errors that say where to look. Returns false when --help was asked (*help is then
// the help text).
bool parse(const char* command, const po::options_description& desc,
           const std::vector<std::string>& args, po::variables_map& vm, std::string* help) {
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
  } catch (const po::unknown_option& e) {
    throw_input(cat("ringtrain ", command, ": unrecognised option '", e.get_option_name(), "'",
                    did_you_mean(e.get_option_name(), desc, "--"), " (see `ringtrain ", command,
                    " --help`)"));
  } catch (const po::error& e) {
    throw_input(
        cat("ringtrain ", command, ": ", e.what(), " (see `ringtrain ", command, " --help`)"));
  }
  if (vm.count("help")) {
    std::ostringstream os;
    os << "usage: ringtrain " << command << " [options]\n\n" << desc;
    *help = os.str();
    return false;
  }
  if (vm.count("config")) {
    const std::string file = vm["config"].as<std::string>();
    std::error_code ec;
    const auto st = std::filesystem::status(file, ec);
    RT_REQUIRE(std::filesystem::exists(st), "--config '", file, "' does not exist");
    // A directory, FIFO or device would be read as empty, or block: refuse before opening.
    RT_REQUIRE(std::filesystem::is_regular_file(st), "--config '", file,
               "' is not a regular file; expected an INI file of key = value lines");
    std::ifstream in(file);
    RT_REQUIRE(in, "--config '", file, "' cannot be opened");
    try {
      po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
    } catch (const po::unknown_option& e) {
      throw_input(cat("--config '", file, "': unrecognised key '", e.get_option_name(), "'",
                      did_you_mean(e.get_option_name(), desc, ""),
                      " (keys are the option names without '--', e.g. batch-size = 64)"));
    } catch (const po::error& e) {
      throw_input(cat("--config '", file, "': ", e.what(),
                      "; keys are the option names without '--' (e.g. batch-size = 64)"));
    }
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw_input(
        cat("ringtrain ", command, ": ", e.what(), " (see `ringtrain ", command, " --help`)"));
  }
  return true;
}

// The schedule's own checks (LrSchedule) with a stand-in for the run's length; those that
// need the run's steps are repeated when the trainer knows them.
void check_schedule(const ScheduleConfig& sc, double lr) {
  require_finite(sc.warmup_init_lr, "warmup-init-lr");
  require_finite(sc.min_lr, "min-lr");
  require_finite(sc.step_gamma, "step-gamma");
  RT_REQUIRE(sc.decay_steps >= 0, "--decay-steps ", sc.decay_steps, " is not valid: must be >= 0");
  RT_REQUIRE(sc.step_every >= 0, "--step-every ", sc.step_every, " is not valid: must be >= 0");
  LrSchedule(sc, lr, std::max<int64_t>(sc.decay_steps, sc.warmup_steps + 1));
}

std::vector<int64_t> parse_int_list(const std::string& s, const char* option) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_REQUIRE(used == item.size() && !item.empty() && v > 0, option, " '", s,
               "' is not valid; expected comma-separated positive integers, e.g. 512,256");
    out.push_back(v);
  }
  return out;
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
  auto& o = c.optimizer;
  auto& ls = c.loss_scale;
  // clang-format off
  po::options_description data("data");
  data.add_options()
      ("data", po::value(&c.data)->required(), "training dataset: a file, a directory of shards or a glob")
      ("val-data", po::value(&c.val_data), "validation dataset, evaluated after each epoch and at the end")
      ("prefetch", value_or_default(&c.prefetch), "batches read ahead by the loader thread (0: none)")
      ("cache", po::bool_switch(&c.cache), "keep the samples this rank reads in memory for later epochs")
      ("augment", po::value(&c.augment), "image augmentation: crop:PAD (random crop after zero padding), flip (horizontal), or crop:PAD,flip");
  po::options_description model("model");
  model.add_options()
      ("model", po::value(&c.model)->default_value("mlp"), "mlp | cnn | resnet (models/*.pbtxt) or a model file (docs/models.md)")
      ("hidden", po::value<std::string>(), "mlp: hidden layer widths (the file's var hidden; default 512,256)")
      ("dropout", po::value<std::string>(), "cnn: dropout probability after the pooling (var dropout; default 0.25)")
      ("depth", po::value<std::string>(), "resnet: basic blocks per stage, 3 stages (var depth; default 1)")
      ("width", po::value<std::string>(), "resnet: channels of the first stage, then 2x, 4x (var width; default 16)")
      ("activation", po::value<std::string>(), "resnet: relu | gelu (var activation; default relu)")
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
      ("batch-size", po::value<int64_t>(), "samples per rank per micro-batch (default 64)")
      ("global-batch-size", po::value<int64_t>(), "samples per optimizer step over all ranks (batch size x ranks x --grad-accum)")
      ("grad-accum", po::value<int64_t>(), "micro-batches per optimizer step, gradients summed before one allreduce (default 1; on resume, raised to keep the checkpoint's global batch)")
      ("epochs", po::value<int64_t>(), "epochs to train (default 1)")
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
      ("keep-best", po::value(&c.keep_best), "val_loss | val_accuracy: also keep the best checkpoint by this metric as DIR/best.h5 (needs --val-data)")
      ("resume", value_or_default(&c.resume), "auto | never | FILE")
      ("overwrite", po::bool_switch(&c.overwrite), "with --resume never: delete the checkpoints already in --checkpoint-dir");
  po::options_description dev("device and communication");
  dev.add_options()
      ("device", value_or_default(&c.device), "cpu | cuda")
      ("gpu-memory", value_or_default(&c.gpu_memory), "cuda: grow (on demand, cached) | reserve:FRACTION (of the GPU's memory, up front)")
      ("threads", value_or_default(&c.threads), "threads per rank (0: OMP_NUM_THREADS if set, else the rank's CPU set if bound, else cores / ranks on the node)")
      ("comm", value_or_default(&c.comm), "gradient communication: mpi | hierarchical | nccl (cuda)")
      ("wire-dtype", po::value(&wire), "fp32 | fp16 | bf16 gradients on the wire (default: the compute dtype)")
      ("bucket-mb", value_or_default(&c.bucket_mb), "gradient bucket size in MiB")
      ("no-overlap", po::bool_switch(&no_overlap), "allreduce the buckets after backward, not during it")
      ("zero", value_or_default(&c.zero), "0 | 1: ZeRO-1, the optimizer state and fp32 gradients sharded across ranks (reduce-scatter, shard update, all-gather)")
      ("stall-timeout", value_or_default(&c.stall_timeout), "seconds in a gradient allreduce before the job ends with exit 2 (0: never)");
  po::options_description eval("evaluation");
  eval.add_options()
      ("eval-every", value_or_default(&c.eval_every), "also evaluate --val-data every N steps (0: at epoch ends and the end only)")
      ("early-stop", value_or_default(&c.early_stop), "stop after N evaluations without improvement of --keep-best's metric (val_loss if not given; 0: never)");
  po::options_description obs("observability");
  obs.add_options()
      ("log-every", value_or_default(&c.log_every), "progress line and metrics every N steps")
      ("progress", value_or_default(&c.progress), "auto | bar | lines: rank 0's progress as a bar redrawn in place, or lines")
      ("metrics", po::value(&c.metrics), "JSON-lines metrics file (rank 0)")
      ("tensorboard", po::value(&c.tensorboard), "write TensorBoard event files into this directory (rank 0)")
      ("histogram-every", value_or_default(&c.histogram_every), "weight and gradient histograms every N steps (0: never)")
      ("timeline", po::value(&c.timeline), "write a Chrome trace (Perfetto, chrome://tracing) of --timeline-steps, all ranks")
      ("timeline-steps", value_or_default(&c.timeline_steps), "A:B, the steps the timeline covers");
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
  c.grad_accum = vm.count("grad-accum") ? vm["grad-accum"].as<int64_t>() : 1;
  c.grad_accum_given = vm.count("grad-accum") > 0;
  RT_REQUIRE(!(vm.count("batch-size") && vm.count("global-batch-size")),
             "give --batch-size (per rank) or --global-batch-size, not both");
  RT_REQUIRE(!(vm.count("epochs") && vm.count("steps")), "give --epochs or --steps, not both");
  c.batch_size = vm.count("batch-size") ? vm["batch-size"].as<int64_t>() : 0;
  c.batch_size_given = vm.count("batch-size") > 0;
  c.global_batch_size = vm.count("global-batch-size") ? vm["global-batch-size"].as<int64_t>() : 0;
  if (!c.batch_size && !c.global_batch_size) c.batch_size = 64;
  c.steps = vm.count("steps") ? vm["steps"].as<int64_t>() : 0;
  c.epochs = vm.count("epochs") ? vm["epochs"].as<int64_t>() : (c.steps ? 0 : 1);

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
  RT_REQUIRE(c.early_stop >= 0, "--early-stop ", c.early_stop, " is not valid: must be >= 0");
  RT_REQUIRE(c.keep_best.empty() || c.keep_best == "val_loss" || c.keep_best == "val_accuracy",
             "--keep-best '", c.keep_best, "' is not known; expected val_loss or val_accuracy");
  RT_REQUIRE(c.keep_best.empty() || !c.checkpoint_dir.empty(),
             "--keep-best needs --checkpoint-dir (best.h5 is kept there)");
  RT_REQUIRE((c.keep_best.empty() && c.early_stop == 0 && c.eval_every == 0) || !c.val_data.empty(),
             "--keep-best, --early-stop and --eval-every need --val-data to evaluate on");
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
  RT_REQUIRE(c.zero == 0 || c.zero == 1, "--zero ", c.zero, " is not valid; expected 0 or 1");
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
  if (const char* t = std::getenv("RINGTRAIN_TEST_STALL")) {
    long long step = 0;
    char point[16] = {0};
    const int got =
        std::sscanf(t, "%d:%lld:%lf:%15s", &c.test_stall_rank, &step, &c.test_stall_seconds, point);
    RT_REQUIRE((got == 3 || (got == 4 && std::string(point) == "gather")), "RINGTRAIN_TEST_STALL='",
               t, "' is not RANK:STEP:SECONDS[:gather]");
    c.test_stall_gather = got == 4;
    c.test_stall_step = step;
  }
  const bool ckpt_opts = c.checkpoint_every > 0 || c.checkpoint_secs > 0;
  RT_REQUIRE(!ckpt_opts || !c.checkpoint_dir.empty(),
             "--checkpoint-every/--checkpoint-secs need --checkpoint-dir");
  RT_REQUIRE(c.resume == "auto" || c.resume == "never" || !c.resume.empty(),
             "--resume must be auto, never or a checkpoint file");
  c.config_ini = config_text(desc, vm);
  if (vm.count("print-config")) {
    *help = c.config_ini;
    return false;
  }
  return true;
}

bool parse_eval(const std::vector<std::string>& args, EvalConfig& c, std::string* help) {
  std::string precision = "fp32";
  // clang-format off
  po::options_description data("data");
  data.add_options()
      ("checkpoint", po::value(&c.checkpoint), "checkpoint file (ckpt-*.h5); may be left out with --baselines")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)")
      ("data", po::value(&c.data)->required(), "dataset to evaluate on")
      ("batch-size", value_or_default(&c.batch_size), "samples per rank per forward pass")
      ("baselines", po::value(&c.baselines), "token data: also print the unigram and bigram cross-entropy on --data, counted on this training split")
      ("seq-len", value_or_default(&c.seq_len), "token data: windows of this many tokens (0: every token of the stream is a target)");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 compute (the training precision is not implied)");
  po::options_description dev("device");
  dev.add_options()
      ("threads", value_or_default(&c.threads), "threads per rank (0: OMP_NUM_THREADS if set, else the rank's CPU set if bound, else cores / ranks on the node)")
      ("device", value_or_default(&c.device), "cpu | cuda")
      ("gpu-memory", value_or_default(&c.gpu_memory), "cuda: grow | reserve:FRACTION");
  po::options_description obs("observability");
  obs.add_options()
      ("metrics", po::value(&c.metrics), "append an eval record to this JSON-lines file");
  // clang-format on
  po::options_description desc("eval options");
  desc.add(general_options()).add(data).add(prec).add(dev).add(obs).add(debug_options());
  po::variables_map vm;
  if (!parse("eval", desc, args, vm, help)) return false;
  RT_REQUIRE(!c.checkpoint.empty() || !c.baselines.empty(),
             "eval: --checkpoint FILE is required (or --baselines TRAIN, for the n-gram "
             "baselines of token data alone)");
  RT_REQUIRE(c.seq_len >= 0, "--seq-len ", c.seq_len, " is not valid: must be >= 0");
  c.precision = parse_float_dtype(precision, "--precision");
  require_positive_int(vm, "batch-size");
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads, " is not valid: must be >= 0");
  RT_REQUIRE(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
             "' is not known; expected cpu or cuda");
  kernels::cuda::MemoryPolicy::parse(c.gpu_memory);
  RT_REQUIRE(c.device != "cuda" || kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

namespace {

// --out and --shards, shared by every convert format.
po::options_description convert_output_options(ConvertConfig& c) {
  po::options_description out("output");
  // clang-format off
  out.add_options()
      ("out", po::value(&c.out)->required(), "output dataset file (.h5); its directory is created if missing")
      ("shards", value_or_default(&c.shards), "split into N files OUT-00000-of-0000N.h5");
  // clang-format on
  return out;
}

// Parses one convert format's table; false on --help / --print-config (as parse()).
bool parse_convert_format(const char* command, po::options_description& in,
                          const std::vector<std::string>& args, ConvertConfig& c,
                          std::string* help) {
  po::options_description desc(cat(command, " options"));
  desc.add(general_options()).add(in).add(convert_output_options(c)).add(debug_options());
  po::variables_map vm;
  if (!parse(command, desc, args, vm, help)) return false;
  RT_REQUIRE(c.shards >= 1, "--shards ", c.shards, " is not valid: must be >= 1");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

}  // namespace

bool parse_convert_npy(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("images", po::value(&c.images)->required(), "images: X.npy, X.npz:KEY or X.npz (one array); uint8 or float32")
      ("labels", po::value(&c.labels), "labels [N] of any integer dtype: Y.npy or Y.npz:KEY (none: unlabelled, for predict)")
      ("layout", value_or_default(&c.layout), "nchw | nhwc: the order of 4-d images");
  // clang-format on
  if (!parse_convert_format("convert npy", in, args, c, help)) return false;
  RT_REQUIRE(c.layout == "nchw" || c.layout == "nhwc", "--layout '", c.layout,
             "' is not known; expected nchw or nhwc");
  return true;
}

bool parse_convert_images(const std::vector<std::string>& args, ConvertConfig& c,
                          std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("root", po::value(&c.root)->required(), "ROOT/<class>/<image>.png|.jpg|.jpeg, one folder per class")
      ("size", po::value(&c.size), "H,W: resize each image to cover H x W and crop the centre (none: all images must have one size)")
      ("grayscale", po::bool_switch(&c.grayscale), "1 channel (luma) instead of RGB");
  // clang-format on
  if (!parse_convert_format("convert images", in, args, c, help)) return false;
  if (!c.size.empty()) {
    const std::vector<int64_t> hw = parse_int_list(c.size, "--size");
    RT_REQUIRE(hw.size() == 2 && hw[0] <= 65536 && hw[1] <= 65536, "--size '", c.size,
               "' is not valid; expected H,W (two positive integers up to 65536), e.g. 64,64");
    c.height = hw[0];
    c.width = hw[1];
  }
  return true;
}

bool parse_convert_cifar(const std::vector<std::string>& args, ConvertConfig& c,
                         std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("input", po::value(&c.inputs)->required()->multitoken(), "CIFAR binary batch files (data_batch_*.bin, test_batch.bin; train.bin, test.bin), concatenated in the order given")
      ("cifar100", po::bool_switch(&c.cifar100), "CIFAR-100 records (coarse and fine label; the fine label is used)");
  // clang-format on
  return parse_convert_format("convert cifar", in, args, c, help);
}

bool parse_convert_text(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("input", po::value(&c.inputs)->required()->multitoken(), "text files, directories (all files below) or globs (** matches any directories), one document per file, in the order given")
      ("val-fraction", value_or_default(&c.val_fraction), "held out as OUT-val.h5: every (1/F)-th document (or the last F of a corpus of fewer than 1/F documents); 0: none");
  // clang-format on
  if (!parse_convert_format("convert text", in, args, c, help)) return false;
  RT_REQUIRE(c.val_fraction >= 0 && c.val_fraction < 1, "--val-fraction ", c.val_fraction,
             " is not valid; expected a fraction in [0, 1), e.g. 0.1");
  return true;
}

bool parse_predict(const std::vector<std::string>& args, PredictConfig& c, std::string* help) {
  std::string precision = "fp32";
  // clang-format off
  po::options_description data("data");
  data.add_options()
      ("checkpoint", po::value(&c.checkpoint)->required(), "checkpoint file (ckpt-*.h5)")
      ("data", po::value(&c.data)->required(), "dataset to predict (labels not needed): a file, directory or glob")
      ("batch-size", value_or_default(&c.batch_size), "samples per rank per forward pass");
  po::options_description out("output");
  out.add_options()
      ("out", po::value(&c.out)->required(), "P.h5 (scores, top-k, labels, class names; written by all ranks) or P.npy (the scores only)")
      ("top-k", value_or_default(&c.top_k), "classes kept per sample in /top_k (at most the model's classes)")
      ("probabilities", po::bool_switch(&c.probabilities), "softmax probabilities instead of logits");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 compute");
  po::options_description dev("device");
  dev.add_options()
      ("threads", value_or_default(&c.threads), "threads per rank (0: as for train)")
      ("device", value_or_default(&c.device), "cpu | cuda")
      ("gpu-memory", value_or_default(&c.gpu_memory), "cuda: grow | reserve:FRACTION");
  // clang-format on
  po::options_description desc("predict options");
  desc.add(general_options()).add(data).add(out).add(prec).add(dev).add(debug_options());
  po::variables_map vm;
  if (!parse("predict", desc, args, vm, help)) return false;
  c.precision = parse_float_dtype(precision, "--precision");
  require_positive_int(vm, "batch-size");
  require_positive_int(vm, "top-k");
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads, " is not valid: must be >= 0");
  RT_REQUIRE(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
             "' is not known; expected cpu or cuda");
  kernels::cuda::MemoryPolicy::parse(c.gpu_memory);
  RT_REQUIRE(c.device != "cuda" || kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

bool parse_sample(const std::vector<std::string>& args, SampleConfig& c, std::string* help) {
  std::string precision = "fp32";
  // clang-format off
  po::options_description what("sampling");
  what.add_options()
      ("checkpoint", po::value(&c.checkpoint)->required(), "checkpoint of a language model (ckpt-*.h5)")
      ("prompt", po::value(&c.prompt)->required(), "text the samples continue (byte tokens; any bytes)")
      ("tokens", po::value(&c.tokens)->required(), "new tokens per sample")
      ("temperature", value_or_default(&c.temperature), "softmax temperature, > 0 (below 1: more conservative)")
      ("top-k", value_or_default(&c.top_k), "draw from the K most likely tokens only (0: all)")
      ("seed", value_or_default(&c.seed), "the same seed gives the same text")
      ("num-samples", value_or_default(&c.num_samples), "samples to draw, shared out over the ranks")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 compute");
  po::options_description dev("device");
  dev.add_options()
      ("threads", value_or_default(&c.threads), "threads per rank (0: as for train)")
      ("device", value_or_default(&c.device), "cpu | cuda")
      ("gpu-memory", value_or_default(&c.gpu_memory), "cuda: grow | reserve:FRACTION");
  // clang-format on
  po::options_description desc("sample options");
  desc.add(general_options()).add(what).add(prec).add(dev).add(debug_options());
  po::variables_map vm;
  if (!parse("sample", desc, args, vm, help)) return false;
  c.precision = parse_float_dtype(precision, "--precision");
  require_positive_int(vm, "tokens");
  require_positive_int(vm, "num-samples");
  require_positive(c.temperature, "temperature");
  RT_REQUIRE(c.top_k >= 0, "--top-k ", c.top_k, " is not valid: must be >= 0 (0: all tokens)");
  RT_REQUIRE(c.seed >= 0, "--seed ", c.seed, " is not valid: must be >= 0");
  RT_REQUIRE(!c.prompt.empty(), "--prompt is empty; give the text to continue (one byte at least)");
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads, " is not valid: must be >= 0");
  RT_REQUIRE(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
             "' is not known; expected cpu or cuda");
  kernels::cuda::MemoryPolicy::parse(c.gpu_memory);
  RT_REQUIRE(c.device != "cuda" || kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

bool parse_convert(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  // clang-format off
  po::options_description in("input");
  in.add_options()
      ("images", po::value(&c.images)->required(), "IDX images file (.gz or plain)")
      ("labels", po::value(&c.labels)->required(), "IDX labels file (.gz or plain)");
  po::options_description out("output");
  out.add_options()
      ("out", po::value(&c.out)->required(), "output dataset file (.h5); its directory is created if missing")
      ("shards", value_or_default(&c.shards), "split into N files OUT-00000-of-0000N.h5");
  // clang-format on
  po::options_description desc("convert idx options");
  desc.add(general_options()).add(in).add(out).add(debug_options());
  po::variables_map vm;
  if (!parse("convert idx", desc, args, vm, help)) return false;
  RT_REQUIRE(c.shards >= 1, "--shards ", c.shards, " is not valid: must be >= 1");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

}  // namespace ringtrain::launch
