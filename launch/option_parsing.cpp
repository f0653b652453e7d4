// The machinery every option table shares (see option_parsing.hpp): parsing the command line
// and the --config file with hints for mistyped names, range checks, --print-config.
#include "launch/option_parsing.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/edit_distance.hpp"
#include "core/error.hpp"

namespace ringtrain::launch::opts {
namespace {

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

}  // namespace

// "; did you mean --lr?" for a name that is an alias of, or close to, an option of desc
// ("" when nothing is close). `dashes` is "--" on the command line, "" for INI keys.
std::string did_you_mean(std::string name, const po::options_description& desc,
                         const char* dashes) {
  name.erase(0, name.find_first_not_of('-'));
  // An INI key under a [section] arrives as "section.key": the key is what can be meant.
  if (const size_t dot = name.rfind('.'); dot != std::string::npos) name.erase(0, dot + 1);
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
void require_positive(double v, const char* name, double max) {
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
      const std::string key = e.get_option_name();
      throw_input(cat("--config '", file, "': unrecognised key '", key, "'",
                      did_you_mean(key, desc, ""),
                      key.find('.') != std::string::npos
                          ? " ([sections] are not read: put the keys before any [section] line)"
                          : " (keys are the option names without '--', e.g. batch-size = 64)"));
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

std::vector<int64_t> parse_int_list(const std::string& s, const char* option,
                                    const char* expected) {
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
               "' is not valid; expected ", expected);
    out.push_back(v);
  }
  return out;
}

}  // namespace ringtrain::launch::opts
