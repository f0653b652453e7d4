// Numerics diagnostics (--check-numerics): after forward and backward, the first layer
// (forward order for activations, backward order for gradients) whose output or gradients
// hold inf/nan on each rank; the ranks agree on the earliest one with one allreduce, and
// rank 0 says where before the step is skipped. Independently of the flag, every step that
// overflows is charged to the layers whose summed gradients are non-finite, so the
// loss-scale warnings can name the layer that overflows most often.
// Test hook: RINGTRAIN_TEST_INJECT_NAN=RANK:STEP:LAYER writes a nan into LAYER's output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "nn/model.hpp"

namespace ringtrain::launch {

class NumericsCheck {
 public:
  NumericsCheck(Model& model, kernels::Backend& backend, bool enabled, int rank);
  bool enabled() const { return enabled_; }
  void begin_step(int64_t step);
  void after_forward(size_t layer, const Tensor& y);    // Model::forward hook
  void after_backward(size_t layer, const Tensor& dx);  // Model backward hook
  // Collective when enabled: "" or the one message naming stage, layer and rank.
  std::string agree(comm::Communicator& comm);
  // On a skipped step: charge each layer whose part of the summed gradient is non-finite.
  void charge_overflow(const Tensor& summed);
  std::string worst_layer() const;  // "" when nothing overflowed yet

 private:
  Model& model_;
  kernels::Backend& backend_;
  bool enabled_;
  int rank_;
  int64_t step_ = 0;
  int64_t first_bad_ = -1;  // 2 * position + stage (0 forward, 1 backward); -1: none
  size_t backward_seen_ = 0;
  std::vector<int64_t> overflows_;  // per layer
  int inject_rank_ = -1;
  int64_t inject_step_ = 0;
  std::string inject_layer_;
};

}  // namespace ringtrain::launch
