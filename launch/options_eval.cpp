// The option tables of `ringtrain eval`, `predict`, `sample` and `export`: the commands that
// read a checkpoint (see options.hpp).
#include <algorithm>
#include <exception>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/option_parsing.hpp"
#include "launch/options.hpp"

namespace ringtrain::launch {

using namespace opts;  // NOLINT: the tables are written in the helpers' vocabulary

namespace {

// --threads, --device and --gpu-memory, as every command that runs a checkpoint's model has
// them, and their checks.
po::options_description device_options(int& threads, std::string& device, std::string& gpu_memory,
                                       const char* threads_help) {
  po::options_description dev("device");
  // clang-format off
  dev.add_options()
      ("threads", value_or_default(&threads), threads_help)
      ("device", value_or_default(&device), "cpu | cuda")
      ("gpu-memory", value_or_default(&gpu_memory), "cuda: grow | reserve:FRACTION");
  // clang-format on
  return dev;
}

void check_device_options(int threads, const std::string& device, const std::string& gpu_memory) {
  RT_REQUIRE(threads >= 0, "--threads ", threads, " is not valid: must be >= 0");
  RT_REQUIRE(device == "cpu" || device == "cuda", "--device '", device,
             "' is not known; expected cpu or cuda");
  kernels::cuda::MemoryPolicy::parse(gpu_memory);
  RT_REQUIRE(device != "cuda" || kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
}

}  // namespace

bool parse_eval(const std::vector<std::string>& args, EvalConfig& c, std::string* help) {
  std::string precision = "fp32";
  // clang-format off
  po::options_description data("data");
  data.add_options()
      ("checkpoint", po::value(&c.checkpoint), "checkpoint file (ckpt-*.h5); may be left out with --baselines")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)")
      ("data", po::value(&c.data)->required(), "dataset to evaluate on")
      ("batch-size", value_or_default(&c.batch_size), "samples per rank per forward pass (token data: windows; default 8192 / T)")
      ("baselines", po::value(&c.baselines), "token data: also print the unigram and bigram cross-entropy on --data, counted on this training split")
      ("seq-len", value_or_default(&c.seq_len), "token data: windows of this many tokens (0: every token of the stream is a target)")
      ("eval-windows", po::value<int64_t>(), "token data: evaluate N windows, window floor(i * W / N) of the W in the file for i < N (default: all)");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 compute (the training precision is not implied)");
  const po::options_description dev = device_options(c.threads, c.device, c.gpu_memory,
      "threads per rank (0: OMP_NUM_THREADS if set, else the rank's CPU set if bound, else cores / ranks on the node)");
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
  require_positive_int(vm, "eval-windows");
  c.eval_windows = vm.count("eval-windows") ? vm["eval-windows"].as<int64_t>() : 0;
  RT_REQUIRE(c.eval_windows == 0 || !c.checkpoint.empty(),
             "--eval-windows is for the model's evaluation; give --checkpoint");
  RT_REQUIRE(c.eval_windows == 0 || c.baselines.empty(),
             "--eval-windows with --baselines: the baselines score every window; give one of them");
  c.precision = parse_float_dtype(precision, "--precision");
  require_positive_int(vm, "batch-size");
  c.batch_size_given = !vm["batch-size"].defaulted();
  check_device_options(c.threads, c.device, c.gpu_memory);
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
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)")
      ("batch-size", value_or_default(&c.batch_size), "samples per rank per forward pass (token data: windows; default 8192 / T)")
      ("seq-len", value_or_default(&c.seq_len), "token data: tokens per window (0: the model's context)");
  po::options_description out("output");
  out.add_options()
      ("out", po::value(&c.out)->required(), "P.h5 (scores, top-k, labels, class names; token data: per-window loss; written by all ranks) or P.npy (the scores only)")
      ("top-k", value_or_default(&c.top_k), "classes kept per sample in /top_k: 1 to the model's classes (the default is lowered to them); token data: the K likeliest next tokens per position, 1 to the vocabulary (none unless given)")
      ("probabilities", po::bool_switch(&c.probabilities), "softmax probabilities instead of logits")
      ("logits-range", po::value<std::string>(), "token data: START:END, write the full logits of windows START to END - 1 (at most 2^28 values, or one window)");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 compute");
  const po::options_description dev =
      device_options(c.threads, c.device, c.gpu_memory, "threads per rank (0: as for train)");
  // clang-format on
  po::options_description desc("predict options");
  desc.add(general_options()).add(data).add(out).add(prec).add(dev).add(debug_options());
  po::variables_map vm;
  if (!parse("predict", desc, args, vm, help)) return false;
  c.precision = parse_float_dtype(precision, "--precision");
  require_positive_int(vm, "batch-size");
  require_positive_int(vm, "top-k");
  c.top_k_given = vm.count("top-k") && !vm["top-k"].defaulted();
  c.batch_size_given = !vm["batch-size"].defaulted();
  RT_REQUIRE(c.seq_len >= 0, "--seq-len ", c.seq_len, " is not valid: must be >= 0");
  if (vm.count("logits-range")) {
    const std::string r = vm["logits-range"].as<std::string>();
    const size_t colon = r.find(':');
    size_t used_a = 0, used_b = 0;
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < r.size();
    try {
      if (ok) c.logits_start = std::stoll(r.substr(0, colon), &used_a);
      if (ok) c.logits_end = std::stoll(r.substr(colon + 1), &used_b);
    } catch (const std::exception&) {
      ok = false;
    }
    ok = ok && used_a == colon && used_b == r.size() - colon - 1 && r[0] != '+' &&
         r[colon + 1] != '+';
    RT_REQUIRE(ok && c.logits_start >= 0 && c.logits_end > c.logits_start, "--logits-range '", r,
               "' is not valid; expected START:END, window indices with 0 <= START < END (END "
               "excluded), e.g. 0:4");
  }
  check_device_options(c.threads, c.device, c.gpu_memory);
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
      ("prompt", po::value(&c.prompt)->required(), "text the samples continue (encoded with the checkpoint's tokenizer; bytes: any bytes)")
      ("tokenizer", po::value(&c.tokenizer), "the SentencePiece model file the training data was converted with (default: read from the training shard the checkpoint names); its SHA-256 must be the one the checkpoint records")
      ("tokens", po::value(&c.tokens)->required(), "new tokens per sample")
      ("temperature", value_or_default(&c.temperature), "softmax temperature, > 0 (below 1: more conservative)")
      ("top-k", value_or_default(&c.top_k), "draw from the K most likely tokens only (0: all)")
      ("seed", value_or_default(&c.seed), "the same seed gives the same text")
      ("num-samples", value_or_default(&c.num_samples), "samples to draw, shared out over the ranks")
      ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load the ops a plugin registers (repeatable)");
  po::options_description prec("precision");
  prec.add_options()
      ("precision", po::value(&precision)->default_value(precision), "fp32 | fp16 | bf16 compute");
  // clang-format on
  const po::options_description dev =
      device_options(c.threads, c.device, c.gpu_memory, "threads per rank (0: as for train)");
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
  check_device_options(c.threads, c.device, c.gpu_memory);
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
      ("format", value_or_default(&c.format), "onnx, or hf (Hugging Face: config.json + model.safetensors of a GPT-2 or Llama, for transformers' from_pretrained)")
      ("out", po::value(&c.out)->required(), "the model file to write (M.onnx), or with --format hf the directory; created if missing")
      ("opset", value_or_default(&c.opset), "ONNX operator set of the graph (17 is the one supported)");
  // clang-format on
  po::options_description desc;
  desc.add(general_options()).add(d).add(debug_options());
  po::variables_map vm;
  if (!parse("export", desc, args, vm, help)) return false;
  RT_REQUIRE(c.format == "onnx" || c.format == "hf", "--format '", c.format,
             "' is not known; expected onnx or hf");
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
