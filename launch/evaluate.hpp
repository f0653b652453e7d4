// Loss and accuracy of a model on a dataset, split over the ranks: rank r evaluates the
// r-th contiguous slice of the samples and one allreduce sums the results.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "nn/model.hpp"

namespace ringtrain::launch {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

// Plain cross-entropy (no label smoothing), whatever the training loss was. With
// `confusion` (classes x classes, row = label, column = the arg-max class), it is also
// filled with the counts of every (label, prediction) pair, summed over the ranks.
EvalResult evaluate(Model& model, io::Dataset& data, comm::Communicator& comm,
                    kernels::Backend& backend, int64_t batch, const io::Normalization& norm,
                    std::vector<double>* confusion = nullptr);

// The input normalisation a checkpoint's model trained with (per channel when it has one).
io::Normalization normalization_of(const io::CheckpointMeta& m);

}  // namespace ringtrain::launch
