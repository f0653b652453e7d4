// The machinery every option table of launch/options*.cpp shares: parsing a table from the
// command line and the --config INI file (Boost's errors turned into input errors, with a
// hint for a mistyped or other framework's name), defaults shown as written, range checks
// that refuse non-finite and impossible values, and --print-config.
#pragma once

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "nn/schedule.hpp"

namespace ringtrain::launch::opts {

namespace po = boost::program_options;

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

// "; did you mean --lr?" for a name that is an alias of, or close to, an option of desc
// ("" when nothing is close). `dashes` is "--" on the command line, "" for INI keys.
std::string did_you_mean(std::string name, const po::options_description& desc, const char* dashes);

// Range checks, input errors naming --NAME. Each refuses nan and inf first ("must be
// finite"), then says the range.
void require_finite(double v, const char* name);
void require_positive(double v, const char* name, double max = HUGE_VAL);
void require_non_negative(double v, const char* name);
void require_unit(double v, const char* name);  // [0, 1): probabilities, decay rates
void require_positive_int(const po::variables_map& vm, const char* name);  // if given

// --print-config: every option that has a value, in table order, as `key = value` lines.
std::string config_text(const po::options_description& desc, const po::variables_map& vm);
// --help and --config; --print-config. Every subcommand's table has both groups.
po::options_description general_options();
po::options_description debug_options();

// Parses args (and the --config file, if given) into vm; wraps Boost's exceptions into
// input errors that say where to look. Returns false when --help was asked (*help is then
// the help text).
bool parse(const char* command, const po::options_description& desc,
           const std::vector<std::string>& args, po::variables_map& vm, std::string* help);

// The schedule's own checks (LrSchedule) with a stand-in for the run's length; those that
// need the run's steps are repeated when the trainer knows them.
void check_schedule(const ScheduleConfig& sc, double lr);

// "512,256" -> {512, 256}; an input error naming `option` unless all are positive integers.
// `expected` says what the option takes, for the message of a value that is no such list.
std::vector<int64_t> parse_int_list(
    const std::string& s, const char* option,
    const char* expected = "comma-separated positive integers, e.g. 512,256");

}  // namespace ringtrain::launch::opts
