// Command-line and INI parsing for the subcommands (Boost.Program_options). Every option can
// also be a key of the --config file; the command line wins. Errors are input errors that
// name the option and what was expected (a mistyped name gets the nearest one as a hint;
// a number must be finite and in its range).
#pragma once

#include <string>
#include <vector>

#include "launch/config.hpp"

namespace ringtrain::launch {

// Each returns false when --help or --print-config was asked: *help then holds the text to
// print (the grouped help, or the parsed options as an INI file) and the command is done.
bool parse_train(const std::vector<std::string>& args, TrainConfig& cfg, std::string* help);
bool parse_eval(const std::vector<std::string>& args, EvalConfig& cfg, std::string* help);
bool parse_convert(const std::vector<std::string>& args, ConvertConfig& cfg, std::string* help);
bool parse_convert_npy(const std::vector<std::string>& args, ConvertConfig& cfg, std::string* help);
bool parse_convert_images(const std::vector<std::string>& args, ConvertConfig& cfg,
                          std::string* help);
bool parse_convert_cifar(const std::vector<std::string>& args, ConvertConfig& cfg,
                         std::string* help);
bool parse_convert_text(const std::vector<std::string>& args, ConvertConfig& cfg,
                        std::string* help);
bool parse_convert_hf(const std::vector<std::string>& args, ConvertConfig& cfg, std::string* help);
bool parse_tokenizer_train(const std::vector<std::string>& args, TokenizerTrainConfig& cfg,
                           std::string* help);
bool parse_predict(const std::vector<std::string>& args, PredictConfig& cfg, std::string* help);
bool parse_sample(const std::vector<std::string>& args, SampleConfig& cfg, std::string* help);
bool parse_export(const std::vector<std::string>& args, ExportConfig& cfg, std::string* help);

}  // namespace ringtrain::launch
