// Numerics diagnostics (see numerics.hpp).
#include "train/numerics.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/env.hpp"
#include "core/error.hpp"

namespace ringtrain::launch {

NumericsCheck::NumericsCheck(Model& model, kernels::Backend& backend, bool enabled, int rank)
    : model_(model),
      backend_(backend),
      enabled_(enabled),
      rank_(rank),
      overflows_(model.layers().size(), 0) {
  if (const std::string t = env::test_inject_nan(); !t.empty()) {
    char layer[128] = {0};
    long long step = 0;
    if (std::sscanf(t.c_str(), "%d:%lld:%127s", &inject_rank_, &step, layer) == 3) {
      inject_step_ = step;
      inject_layer_ = layer;
    }
  }
}

void NumericsCheck::begin_step(int64_t step) {
  step_ = step;
  first_bad_ = -1;
  backward_seen_ = 0;
}

void NumericsCheck::after_forward(size_t layer, const Tensor& y) {
  if (rank_ == inject_rank_ && step_ == inject_step_ &&
      model_.layers()[layer]->name() == inject_layer_) {
    // Through copy_bytes, so that an output in GPU memory takes the nan too.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const uint16_t nan16 = y.dtype == DType::f16 ? float_to_half(nan) : float_to_bf16(nan);
    if (y.dtype == DType::f32)
      copy_bytes(y.data, y.device, &nan, Device{}, sizeof nan);
    else
      copy_bytes(y.data, y.device, &nan16, Device{}, sizeof nan16);
  }
  if (enabled_ && first_bad_ < 0 && backend_.any_nonfinite(y)) first_bad_ = 2 * int64_t(layer);
}

void NumericsCheck::after_backward(size_t layer, const Tensor& dx) {
  const size_t position = model_.layers().size() + backward_seen_++;  // after every forward one
  if (!enabled_ || first_bad_ >= 0) return;
  bool bad = dx.data && backend_.any_nonfinite(dx);
  const auto [first, count] = model_.layer_params()[layer];
  for (size_t p = first; p < first + count && !bad; ++p)
    bad = backend_.any_nonfinite(model_.params()[p].grad);
  if (bad) first_bad_ = 2 * int64_t(position) + 1;
}

std::string NumericsCheck::agree(comm::Communicator& comm) {
  if (!enabled_) return "";
  // The earliest (stage position, then rank) wins: one min-allreduce of an encoded value.
  const int64_t none = std::numeric_limits<int64_t>::max();
  int64_t code = first_bad_ < 0 ? none : first_bad_ * 65536 + rank_;
  comm.allreduce(&code, 1, DType::i64, comm::ReduceOp::min);
  if (code == none) return "";
  const int64_t where = code / 65536, rank = code % 65536;
  const size_t nl = model_.layers().size();
  const bool backward = where % 2 == 1;
  const size_t position = size_t(where / 2);
  const size_t layer = backward ? nl - 1 - (position - nl) : position;
  return cat("step ", step_, ": non-finite ", backward ? "gradients" : "activations",
             " first appear in layer ", model_.layers()[layer]->name(), " (",
             backward ? "backward" : "forward", ") on rank ", rank, "; the step is skipped");
}

void NumericsCheck::charge_overflow(const Tensor& summed) {
  const auto& lp = model_.layer_params();
  for (size_t l = 0; l < lp.size(); ++l)
    for (size_t p = lp[l].first; p < lp[l].first + lp[l].second; ++p) {
      const Param& par = model_.params()[p];
      if (backend_.any_nonfinite(summed.slice(par.offset, par.shape))) {
        ++overflows_[l];
        break;
      }
    }
}

std::string NumericsCheck::worst_layer() const {
  size_t best = 0;
  for (size_t l = 1; l < overflows_.size(); ++l)
    if (overflows_[l] > overflows_[best]) best = l;
  if (overflows_.empty() || overflows_[best] == 0) return "";
  return cat(model_.layers()[best]->name(), " (", overflows_[best], " overflowing steps)");
}

}  // namespace ringtrain::launch
