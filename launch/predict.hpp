// `ringtrain predict`: the outputs of a checkpoint's model for every sample of a dataset
// (labelled or not), in dataset order. Rank r computes the r-th contiguous slice; an .h5
// output is written by all ranks at once (each its rows), an .npy output by rank 0 after
// a gather. Also the forward pass over a slice that eval's per-class figures share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/dataset.hpp"
#include "launch/config.hpp"
#include "nn/model.hpp"

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

// The whole command after option parsing (collective).
int run_predict(const PredictConfig& cfg, comm::Communicator& comm);

}  // namespace ringtrain::launch
