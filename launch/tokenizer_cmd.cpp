// `ringtrain tokenizer train`: a SentencePiece model (BPE or unigram) trained on the user's
// text by rank 0; the other ranks check the options with it and wait (see commands.hpp).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "core/files.hpp"
#include "io/convert_text.hpp"
#include "io/output_file.hpp"
#include "io/tokenizer.hpp"
#include "launch/commands.hpp"
#include "launch/options.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {

int cmd_tokenizer(const std::vector<std::string>& args, comm::Communicator& comm) {
  const char* usage =
      "usage: ringtrain tokenizer train --input FILE|DIR|GLOB... --vocab-size N "
      "[--model-type bpe|unigram] --out tok.model\n"
      "`ringtrain tokenizer train --help` lists its options.\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.rank() == 0) std::cout << usage;
    return 0;
  }
  TokenizerTrainConfig cfg;
  std::string help;
  bool run = true;
  run_and_agree(comm, [&] {
    RT_REQUIRE(!args.empty() && args[0] == "train",
               "ringtrain tokenizer: expected a subcommand: `ringtrain tokenizer train --input "
               "GLOB --vocab-size N --out tok.model`",
               args.empty() ? "" : cat(" (got '", args[0], "')"));
    run = parse_tokenizer_train({args.begin() + 1, args.end()}, cfg, &help);
  });
  if (!run) {
    if (comm.rank() == 0) std::cout << help;
    return 0;
  }
  run_and_agree(comm, [&] {
    // Every rank checks the inputs (so a bad --input is named whichever rank sees it first);
    // rank 0 trains.
    io::TokenizerTrainSpec spec;
    spec.files = io::expand_text_inputs(cfg.inputs);
    uint64_t bytes = 0;
    for (const auto& f : spec.files) bytes += require_regular_file(f, "--input", "a text file");
    RT_REQUIRE(bytes > 0, "--input: ", spec.files.size(),
               " file(s) of 0 bytes; expected text to train a tokenizer on");
    RT_REQUIRE(bytes <= uint64_t(cfg.max_input_mb) << 20, "--input: ", spec.files.size(),
               " file(s) of ", bytes, " bytes in all; more than --max-input-mb ", cfg.max_input_mb,
               " MiB");
    if (comm.rank() != 0) return;
    const std::filesystem::path parent = std::filesystem::path(cfg.out).parent_path();
    std::error_code mk;  // like `mkdir -p`, as convert does
    if (!parent.empty()) std::filesystem::create_directories(parent, mk);
    RT_REQUIRE(parent.empty() || std::filesystem::is_directory(parent), "--out '", cfg.out,
               "': directory '", parent.string(), "' cannot be created",
               mk ? cat(" (", mk.message(), ")") : "");
    spec.vocab_size = cfg.vocab_size;
    spec.model_type = cfg.model_type;
    spec.threads =
        cfg.threads > 0 ? cfg.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string model = io::train_sentencepiece(spec);
    const std::string tmp = cfg.out + ".tmp";
    try {
      io::write_whole_file(tmp, {{model.data(), model.size()}});
      io::commit_output(tmp, cfg.out);
    } catch (...) {
      io::rethrow_write_failure(cfg.out, [&] { io::remove_quietly(tmp); });
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "wrote %s: SentencePiece %s, vocabulary %lld, sha256 %s; %lld bytes of text from "
        "%zu files, %.2f s\n",
        cfg.out.c_str(), cfg.model_type.c_str(), static_cast<long long>(cfg.vocab_size),
        io::sha256_hex(model).c_str(), static_cast<long long>(bytes), spec.files.size(), secs);
  });
  return 0;
}

}  // namespace ringtrain::launch
