// `ringtrain`: the CLI entry point. One process is one rank; MPI starts here, the
// subcommand runs, and every way out maps to the exit codes of the contract:
// 0 finished, 1 bad input, 2 runtime failure, 75 stopped by a signal after a checkpoint.
#include <malloc.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <mpi.h>

#include <memory>

#include "io/hdf5.hpp"
#include "launch/analyze.hpp"
#include "launch/commands.hpp"
#include "launch/doctor.hpp"
#include "train/job.hpp"
#include "train/signals.hpp"
#include "train/version.hpp"

namespace {

const char* kUsage =
    "usage: ringtrain <command> [options]\n"
    "  train   [--config FILE.ini] [options]   train (one process = one rank)\n"
    "  eval    --checkpoint FILE --data PATH   loss, accuracy and per-class figures\n"
    "  predict --checkpoint FILE --data PATH --out P.h5|P.npy\n"
    "                                          scores and top-k classes of every sample\n"
    "  sample  --checkpoint FILE --prompt TEXT --tokens N\n"
    "                                          text from a language model\n"
    "  export  --checkpoint FILE --format onnx|hf --out M.onnx|DIR\n"
    "                                          the network as an ONNX model, or a GPT-2 or\n"
    "                                          Llama as a Hugging Face directory\n"
    "  convert idx|npy|images|cifar|text|hf ... --out PATH\n"
    "                                          data to a ringtrain dataset (text: byte or\n"
    "                                          SentencePiece tokens; hf: Hugging Face GPT-2\n"
    "                                          or Llama weights to a checkpoint)\n"
    "  tokenizer train --input GLOB --vocab-size N --out tok.model\n"
    "                                          a SentencePiece tokenizer for convert text\n"
    "  inspect FILE.h5 | --schema              what a dataset or checkpoint holds; the\n"
    "                                          checkpoint format\n"
    "  model show FILE|NAME                    a model's layer table: shapes, parameters, FLOPs\n"
    "  analyze DIR                             where a stuck or slow job's ranks were (their\n"
    "                                          flight-recorder dumps)\n"
    "  doctor                                  before a run: every rank's GEMM rate and memory\n"
    "                                          bandwidth, every link's latency and bandwidth;\n"
    "                                          outliers marked\n"
    "  --version                               ringtrain and every library built in\n"
    "`ringtrain <command> --help` lists a command's options.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace ringtrain;
  using namespace ringtrain::launch;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 1 : 0;
  }
  if (args[0] == "--version") {  // MPI_Get_library_version is callable before MPI_Init
    std::cout << version_text();
    return 0;
  }
  // A stop signal while MPI starts (MPI_Init can take seconds on a large job) stops a
  // training run like one a moment later, at the first step boundary with a checkpoint,
  // instead of killing the rank: the handlers (which only set a flag) come first.
  if (args[0] == "train") {
    install_stop_handlers();
    install_dump_handler();  // SIGUSR2: a flight-recorder dump, never the default (an exit)
  }
  io::silence_hdf5_errors();
  // Buffers up to 64 MiB (HDF5's chunk buffers, activations) come from the heap and are
  // reused, instead of fresh zeroed mmap pages per allocation: perf showed 15% of a
  // checkpoint save in clear_page.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  std::unique_ptr<MpiSession> mpi;
  try {
    mpi = std::make_unique<MpiSession>(&argc, &argv);
  } catch (const JobExit& e) {  // a bad RINGTRAIN_* value on some rank, already reported
    MPI_Finalize();
    return e.code;
  } catch (const Error& e) {  // a failure of MPI start-up: the same on every rank
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::cerr << "ringtrain: error: " << e.what() << std::endl;
    MPI_Finalize();
    return e.exit_code();
  }
  comm::Communicator& world = mpi->world();
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "train") return cmd_train(args, world);
    if (command == "eval") return cmd_eval(args, world);
    if (command == "predict") return cmd_predict(args, world);
    if (command == "sample") return cmd_sample(args, world);
    if (command == "convert") return cmd_convert(args, world);
    if (command == "tokenizer") return cmd_tokenizer(args, world);
    if (command == "inspect") return cmd_inspect(args, world);
    if (command == "model") return cmd_model(args, world);
    if (command == "export") return cmd_export(args, world);
    if (command == "analyze") return cmd_analyze(args, world);
    if (command == "doctor") return cmd_doctor(args, world);
    run_and_agree(world, [&] {
      throw_input(cat("unknown command '", command,
                      "'; expected train, eval, predict, sample, export, convert, "
                      "tokenizer, inspect, model, analyze, doctor or --version"));
    });
  } catch (const JobExit& e) {
    return e.code;
  } catch (const Error& e) {
    fail_job(e.exit_code(), e.what());
  } catch (const std::exception& e) {
    fail_job(2, cat("unexpected failure: ", e.what()));
  }
  return 0;
}
