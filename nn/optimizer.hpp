// Optimizers over the flat fp32 master buffer: SGD with momentum and AdamW. Each keeps its
// state as flat fp32 buffers laid out like the masters, so a parameter's state is the same
// slice as the parameter (what the checkpoint writes as /optimizer/<param>/<state>).
// Weight decay applies per range of the flat buffer (decay groups): a parameter whose
// Param::decay is false is updated with weight decay 0.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain {

struct OptimizerConfig {
  std::string name = "adamw";  // sgd | adamw
  float lr = 1e-3f;
  float momentum = 0.9f;  // sgd
  bool nesterov = false;  // sgd
  float weight_decay = 0.f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
};

// A run of consecutive flat elements that share one decay setting.
struct DecayRange {
  int64_t offset = 0, count = 0;
  bool decay = true;
  bool frozen = false;  // --freeze: never updated (no step, no weight decay, state untouched)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;
  // One update of `master` from the gradient grad * grad_scale; `work` (if given) receives
  // the new values in the compute dtype in the same pass. grad is fp32 with grad_scale 1,
  // or (the loss scaler's unscale folded into the optimizer's read of the allreduced
  // gradient) of any float dtype with any scale where be.supports(Op::fused_unscale, dtype).
  void step(kernels::Backend& be, const Tensor& master, const Tensor& grad, const Tensor* work,
            float lr, float grad_scale = 1.f) {
    begin_step(lr, grad_scale);
    update(be, master, grad, work, 0, n_);
  }
  // The same update in pieces (ZeRO-1 hands each piece's working weights to the all-gather
  // while the next is updated): begin_step once, then update() over ranges [lo, hi) that
  // cover [0, n) once each; the tensors span all n elements. The result does not depend on
  // the pieces: every element is updated on its own.
  void begin_step(float lr, float grad_scale = 1.f) {
    grad_scale_ = grad_scale;
    start_step(lr);
  }
  void update(kernels::Backend& be, const Tensor& master, const Tensor& grad, const Tensor* work,
              int64_t lo, int64_t hi);
  int64_t size() const { return n_; }
  // Bytes of optimizer state this optimizer holds.
  int64_t state_bytes() const { return int64_t(state_.size()) * n_ * 4; }
  // Named flat state buffers ("momentum"; "exp_avg", "exp_avg_sq").
  const std::vector<std::string>& state_names() const { return names_; }
  Tensor state(size_t i) const {
    return Tensor(state_[i].data(), {n_}, DType::f32, state_[i].device());
  }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  // The decay groups (ranges covering [0, n) in order); by default one range with decay.
  void set_decay_ranges(std::vector<DecayRange> ranges);
  const std::vector<DecayRange>& decay_ranges() const { return ranges_; }

 protected:
  Optimizer(int64_t n, std::vector<std::string> names);
  virtual void start_step(float lr) = 0;
  // update() after its checks: one fused kernel call per decay range in [lo, hi).
  virtual void update_ranges(kernels::Backend& be, const Tensor& master, const Tensor& grad,
                             const Tensor* work, int64_t lo, int64_t hi) = 0;
  // f(offset, count, decay) for each decay range's part of [lo, hi), in order; frozen
  // ranges are skipped.
  template <typename F>
  void for_ranges(int64_t lo, int64_t hi, F f) const {
    for (const auto& r : ranges_) {
      if (r.frozen) continue;
      const int64_t a = std::max(lo, r.offset), b = std::min(hi, r.offset + r.count);
      if (a < b) f(a, b - a, r.decay);
    }
  }
  std::vector<DecayRange> ranges_;
  int64_t n_;
  int64_t steps_ = 0;
  float grad_scale_ = 1.f;  // this step's
  std::vector<std::string> names_;
  std::vector<Buffer> state_;
};

// Input error naming --optimizer for an unknown name or a bad hyper-parameter.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t num_params);

}  // namespace ringtrain
