// The option tables of `ringtrain eval`, `ringtrain predict` and `ringtrain export`: the
// commands that read a checkpoint (see options.hpp).
#include <algorithm>

#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/option_parsing.hpp"
#include "launch/options.hpp"

namespace ringtrain::launch {

using namespace opts;  // NOLINT: the tables are written in the helpers' vocabulary

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

bool parse_export(const std::vector<std::string>& args, ExportConfig& c, std::string* help) {
  po::options_description d("export options");
  // clang-format off
  d.add_options()
      ("checkpoint", po::value(&c.checkpoint)->required(), "checkpoint file (ckpt-*.h5)")
      ("format", value_or_default(&c.format), "onnx (the only format)")
      ("out", po::value(&c.out)->required(), "the model file to write (M.onnx); its directory is created if missing")
      ("opset", value_or_default(&c.opset), "ONNX operator set of the graph (17 is the one supported)");
  // clang-format on
  po::options_description desc;
  desc.add(general_options()).add(d).add(debug_options());
  po::variables_map vm;
  if (!parse("export", desc, args, vm, help)) return false;
  RT_REQUIRE(c.format == "onnx", "--format '", c.format, "' is not known; expected onnx");
  RT_REQUIRE(c.opset == 17, "--opset ", c.opset,
             " is not supported; ringtrain writes ONNX opset 17 (LayerNormalization needs 17; "
             "the ONNX library built in knows no later one)");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

}  // namespace ringtrain::launch
