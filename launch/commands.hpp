// The subcommands of the `ringtrain` CLI. Each returns the process exit code; input
// errors are agreed across ranks (JobExit), so every command can run under mpirun.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace ringtrain::launch {

int cmd_train(const std::vector<std::string>& args, comm::Communicator& comm);
int cmd_eval(const std::vector<std::string>& args, comm::Communicator& comm);
int cmd_predict(const std::vector<std::string>& args, comm::Communicator& comm);
int cmd_sample(const std::vector<std::string>& args, comm::Communicator& comm);
int cmd_convert(const std::vector<std::string>& args, comm::Communicator& comm);
int cmd_tokenizer(const std::vector<std::string>& args,
                  comm::Communicator& comm);  // tokenizer_cmd.cpp
int cmd_inspect(const std::vector<std::string>& args, comm::Communicator& comm);
int cmd_model(const std::vector<std::string>& args, comm::Communicator& comm);   // model_show.cpp
int cmd_export(const std::vector<std::string>& args, comm::Communicator& comm);  // onnx_export.cpp

struct ConvertConfig;
// hf_commands.cpp: `convert hf` (collective: every rank reads and writes its part), and
// `export --format hf` of a GPT-2 checkpoint into OUT_DIR (one process; returns a summary).
int convert_hf(const ConvertConfig& cfg, comm::Communicator& comm);
std::string export_hf(const std::string& checkpoint, const std::string& out_dir);

}  // namespace ringtrain::launch
