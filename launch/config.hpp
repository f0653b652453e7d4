// The settings of each subcommand but `train` (TrainConfig, in train/config.hpp), filled from
// the command line and the --config INI file by options.cpp (the option names are the CLI
// contract of docs/usage.md). The initialisers below are the defaults: the option table reads
// them, and --help prints them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "io/convert_text.hpp"
#include "train/config.hpp"

namespace ringtrain::launch {

struct EvalConfig {
  std::string checkpoint, data;
  std::vector<std::string> plugins;
  std::string baselines;     // token data: the training split the n-gram baselines count
  int64_t seq_len = 0;       // token data: windows of this many targets (0: every token)
  int64_t eval_windows = 0;  // token data: a budget of windows (0: every window)
  int64_t batch_size = 256;
  bool batch_size_given = false;  // token data: else windows of about 8192 tokens together
  DType precision = DType::f32;
  int threads = 0;
  std::string device = "cpu";       // cpu | cuda
  std::string gpu_memory = "grow";  // cuda: grow | reserve:FRACTION
  std::string metrics;
};

struct SampleConfig {
  std::string checkpoint, prompt;
  std::vector<std::string> plugins;
  int64_t tokens = 0;        // new tokens per sample
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: the whole vocabulary
  int64_t seed = 0;
  int64_t num_samples = 1;  // sample i draws from stream (seed, i); ranks share them out
  std::string tokenizer;    // a SentencePiece model file (empty: the one the checkpoint records)
  DType precision = DType::f32;
  int threads = 0;
  std::string device = "cpu";
  std::string gpu_memory = "grow";
};

struct ModelShowConfig {
  std::string model;  // a built-in name or a model file
  std::vector<TrainConfig::VarOverride> model_vars;
  std::vector<std::string> plugins;
  std::string input;            // C,H,W or D: overrides the file's input_shape
  int64_t classes = 0;          // 0: the file's, else 10
  std::string layer_precision;  // "conv1=fp32,...", as train's --layer-precision
  // --plan: the memory plan per rank (train/memory_plan.hpp) instead of the layer table.
  bool plan = false;
  int ranks = 1, zero = 0;
  int tensor_parallel = 1;         // T > 1: what each block splits and the parameters per rank
  std::string recompute = "none";  // none | blocks
  int64_t batch_size = TrainConfig::kDefaultBatchSize, seq_len = 0, grad_accum = 1;
  std::string optimizer = "adamw";
  std::string device = "cpu";
};

struct ConvertConfig {
  std::string images, labels, out;  // idx, npy (labels optional for npy)
  std::string targets;              // npy: /targets (optional)
  int shards = 1;
  std::string layout = "nchw";      // npy: nchw | nhwc
  std::string root;                 // images: ROOT/<class>/<image>
  std::string hf_dir;               // hf: a Hugging Face model directory
  std::string size;                 // images: "H,W" (empty: every image has the first's size)
  int64_t height = 0, width = 0;    // parsed from size
  bool grayscale = false;           // images: 1 channel instead of RGB
  std::vector<std::string> inputs;  // cifar: batch files, in order; text: files, dirs, globs
  bool cifar100 = false;
  double val_fraction = 0.1;  // text: held out as OUT-val.h5 (0: none)
  int64_t max_input_mb = int64_t(io::kDefaultMaxTextInputBytes >> 20);  // text: corpus bound
  std::string tokenizer;  // text: a SentencePiece model file (empty: bytes)
  int threads = 0;        // text --tokenizer: encoding threads on rank 0 (0: every core)
};

struct TokenizerTrainConfig {
  std::vector<std::string> inputs;  // files, directories, globs (as convert text)
  int64_t vocab_size = 0;
  std::string model_type = "bpe";  // bpe | unigram
  std::string out;
  int threads = 0;  // 0: every core
  int64_t max_input_mb = int64_t(io::kDefaultMaxTextInputBytes >> 20);
};

struct PredictConfig {
  std::string checkpoint, data, out;
  std::vector<std::string> plugins;  // --plugin: the ops of the checkpoint's model
  int64_t top_k = 5;                 // at most the model's classes
  bool top_k_given = false;          // --top-k given: more than the classes is an error
  bool probabilities = false;        // softmax instead of logits
  int64_t batch_size = 256;
  bool batch_size_given = false;  // token data: else windows of about 8192 tokens together
  int64_t seq_len = 0;            // token data: tokens per window (0: the model's context)
  // Token data: --logits-range START:END, the windows whose full logits are written
  // (logits_end 0: none).
  int64_t logits_start = 0, logits_end = 0;
  DType precision = DType::f32;
  int threads = 0;
  std::string device = "cpu";
  std::string gpu_memory = "grow";
};

// `ringtrain export`: a checkpoint's network as a file for other runtimes.
struct ExportConfig {
  std::string checkpoint, out;
  std::string format = "onnx";
  int64_t opset = 17;  // the ONNX operator set the graph is written for
};

}  // namespace ringtrain::launch
