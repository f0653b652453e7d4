// Command-line and INI parsing for the subcommands (Boost.Program_options). Every option can
// also be a key of the --config file; the command line wins. Errors are input errors that
// name the option and what was expected.
#pragma once

#include <string>
#include <vector>

#include "launch/config.hpp"

namespace ringtrain::launch {

// Each returns false when --help was asked (the help text is then in *help).
bool parse_train(const std::vector<std::string>& args, TrainConfig& cfg, std::string* help);
bool parse_eval(const std::vector<std::string>& args, EvalConfig& cfg, std::string* help);
bool parse_convert(const std::vector<std::string>& args, ConvertConfig& cfg, std::string* help);

}  // namespace ringtrain::launch
