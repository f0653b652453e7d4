// Where every command that needs a trained network (eval, predict; later export) gets it:
// the model a checkpoint describes, built and filled with the checkpoint's parameters and
// buffers, and the check that a dataset fits it. One place, so that how a checkpoint
// describes its model (today ModelSpec JSON, next a model file) changes here only.
#pragma once

#include <memory>
#include <string>

#include "core/model.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::launch {

struct LoadedModel {
  std::unique_ptr<Model> model;
  io::CheckpointMeta meta;  // step, input_mean/input_std, ...
};

// Reads `checkpoint`'s metadata, builds its model in `precision` on `device` and loads the
// parameters and buffers (through host copies on a GPU); the working copy is refreshed.
// Input errors name the checkpoint. No collectives (runs under agree()).
LoadedModel load_model_from_checkpoint(const std::string& checkpoint, DType precision,
                                       Device device, kernels::Backend& backend);

// Input error naming both files unless `data`'s samples have the model's input shape and
// its classes (when known) are at most the model's outputs.
void require_data_fits(const Model& model, const io::DatasetInfo& data,
                       const std::string& checkpoint);

// Outputs per sample (the number of classes the model predicts).
int64_t model_classes(const Model& model);

}  // namespace ringtrain::launch
