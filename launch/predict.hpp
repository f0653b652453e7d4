// `ringtrain predict`: the outputs of a checkpoint's model for every sample of a dataset
// (labelled or not), in dataset order. Rank r computes the r-th contiguous slice; an .h5
// output is written by all ranks at once (each its rows), an .npy output by rank 0 after
// a gather. Also the forward pass over a slice that eval's per-class figures share. A language
// model's checkpoint on token data: per-window losses, top-k next tokens and logits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/dataset.hpp"
#include "io/tokens.hpp"
#include "launch/config.hpp"
#include "nn/model.hpp"
#include "train/model_source.hpp"

namespace ringtrain::launch {

// The fp32 logits [hi - lo, classes] of samples [lo, hi) (normalised by `norm`, as the
// model was trained), batch by batch, copied to host memory; their labels into `labels`
// (hi - lo values) when it is not null.
// One sample's output: [classes] for a classifier, else the shape of the targets of the model
// file's loss ([classes, target...] for per-position cross-entropy).
Shape output_shape_of(const Model& model);
std::vector<float> forward_slice(Model& model, io::Dataset& data, kernels::Backend& backend,
                                 int64_t lo, int64_t hi, int64_t batch,
                                 const io::Normalization& norm, int32_t* labels = nullptr);

// Softmax of each row of scores [rows, classes], in place (computed in double).
void softmax_rows(float* scores, int64_t rows, int64_t classes);

// The k largest scores of each row, best first (ties: the lower class index first, the
// rule of the accuracy's arg-max): classes [rows, k] and their scores [rows, k].
void top_k_rows(const float* scores, int64_t rows, int64_t classes, int64_t k, int32_t* top,
                float* top_scores);

// Rank 0 creates the directory of --out (like `mkdir -p`); input error when it cannot, or when
// --out is a directory.
void prepare_output_dir(const std::string& out, int rank);

// The whole command after option parsing (collective).
int run_predict(const PredictConfig& cfg, comm::Communicator& comm);

// --- A language model on token data (predict_tokens.cpp).

// --logits-range writes at most this many fp32 values (1 GiB), or one window when a window
// alone holds more.
inline constexpr int64_t kMaxLogitsValues = int64_t(1) << 28;

struct TokenPredictSetup {
  std::unique_ptr<io::TokenDataset> data;  // windows of seq_len() tokens set
  int64_t k = 0;                           // --top-k (0: none)
  int64_t batch = 0;                       // windows per forward pass
  int64_t step = 0;                        // the checkpoint's
};

// Opens --data and checks it and the options against the model (input errors naming the
// option, file and numbers); `model_name` names the model in messages.
void setup_token_predict(const PredictConfig& cfg, const TokenInput& lm,
                         const std::string& model_name, int64_t model_context,
                         TokenPredictSetup& s);
// The forward passes, this rank's rows of the output file and rank 0's line (collective).
void run_token_predict(const PredictConfig& cfg, comm::Communicator& comm, Model& model,
                       kernels::Backend& backend, TokenPredictSetup& s);

}  // namespace ringtrain::launch
