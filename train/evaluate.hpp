// Loss and accuracy of a model on a dataset, split over the ranks: rank r evaluates the
// r-th contiguous slice of the samples (images, or windows of a token dataset) and one
// allreduce sums the results.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/communicator.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/tokens.hpp"
#include "nn/model.hpp"

namespace ringtrain::launch {

struct EvalResult {
  double loss = 0, accuracy = 0;  // token data: nats/token, and per token
  int64_t samples = 0;            // images, or windows
  int64_t tokens = 0;             // token data: the targets scored
  // A model file's loss block: its metrics in the file's order (name, value), and those with
  // one value per label or class (f1, mean_iou: name, values).
  std::vector<std::pair<std::string, double>> metrics;
  std::vector<std::pair<std::string, std::vector<double>>> per_output;
};

// Plain cross-entropy (no label smoothing), whatever the training loss was. With
// `confusion` (classes x classes, row = label, column = the arg-max class), it is also
// filled with the counts of every (label, prediction) pair, summed over the ranks.
EvalResult evaluate(Model& model, io::Dataset& data, comm::Communicator& comm,
                    kernels::Backend& backend, int64_t batch, const io::Normalization& norm,
                    std::vector<double>* confusion = nullptr);

// A model whose file declares a loss (Model::loss() not the default): the mean of that loss
// over the samples (each batch's loss times its samples) and every metric the file names,
// from sums over all ranks. Reads /targets for a loss on targets.
EvalResult evaluate_loss(Model& model, io::Dataset& data, comm::Communicator& comm,
                         kernels::Backend& backend, int64_t batch, const io::Normalization& norm);

// A language model on token data: every target of the non-overlapping windows of
// data.seq_len() tokens (set_seq_len() first), `batch` windows per forward pass. The loss is
// the mean cross-entropy per target token in nats (over the data's vocabulary, the first
// `vocab_size` of the model's outputs); the accuracy the fraction of targets that are the
// arg-max. `max_windows` > 0 is a budget (--eval-windows): the windows of eval_window_index.
EvalResult evaluate_tokens(Model& model, io::TokenDataset& data, comm::Communicator& comm,
                           kernels::Backend& backend, int64_t batch, int64_t max_windows = 0);

// The windows a budget of `budget` windows evaluates out of `total` (budget 0 or >= total:
// all of them): window floor(i * total / budget) for i in [0, budget), evenly spread over
// the file (every shard), the same at every evaluation and for any number of ranks.
int64_t eval_window_count(int64_t total, int64_t budget);
int64_t eval_window_index(int64_t i, int64_t total, int64_t budget);

// Bits per byte of a loss in nats/token when the tokens are bytes (tokenizer "bytes": one
// byte per token, so bits/byte = nats/token / ln 2); nullopt for other tokenizers.
std::optional<double> bits_per_byte(const io::TokenDatasetInfo& data, double nats_per_token);

// The input normalisation a checkpoint's model trained with (per channel when it has one).
io::Normalization normalization_of(const io::CheckpointMeta& m);

}  // namespace ringtrain::launch
