// SGD (momentum, Nesterov, weight decay) and AdamW, each a thin owner of its state that
// calls the backend's fused kernel over the whole flat buffer in one launch.
#include "nn/optimizer.hpp"

#include "core/error.hpp"

namespace ringtrain {

Optimizer::Optimizer(int64_t n, std::vector<std::string> names)
    : ranges_{{0, n, true}}, n_(n), names_(std::move(names)) {
  for (size_t i = 0; i < names_.size(); ++i) state_.emplace_back(size_t(n) * 4);
}

void Optimizer::update(kernels::Backend& be, const Tensor& master, const Tensor& grad,
                       const Tensor* work, int64_t lo, int64_t hi) {
  RT_CHECK((grad.dtype == DType::f32 && grad_scale_ == 1.f) ||
               be.supports(kernels::Op::fused_unscale, grad.dtype),
           "the ", be.name(), " backend's optimizer steps take an fp32 gradient with scale 1, not ",
           dtype_name(grad.dtype), " times ", grad_scale_);
  update_ranges(be, master, grad, work, lo, hi);
}

void Optimizer::set_decay_ranges(std::vector<DecayRange> ranges) {
  // Neighbours with the same setting merge: one fused kernel call per group run.
  std::vector<DecayRange> merged;
  int64_t next = 0;
  for (const auto& r : ranges) {
    RT_CHECK(r.offset == next && r.count >= 0, "decay range at ", r.offset, " after ", next);
    next += r.count;
    if (!merged.empty() && merged.back().decay == r.decay && merged.back().frozen == r.frozen)
      merged.back().count += r.count;
    else if (r.count > 0)
      merged.push_back(r);
  }
  RT_CHECK(next == n_, "decay ranges cover ", next, " of ", n_, " parameters");
  ranges_ = std::move(merged);
}

namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& c, int64_t n)
      : Optimizer(n, c.momentum != 0.f ? std::vector<std::string>{"momentum"}
                                       : std::vector<std::string>{}),
        cfg_{c.lr, c.momentum, c.weight_decay, c.nesterov} {}
  const char* name() const override { return "sgd"; }
  void start_step(float lr) override {
    lr_ = lr;
    ++steps_;
  }
  void update_ranges(kernels::Backend& be, const Tensor& master, const Tensor& grad,
                     const Tensor* work, int64_t lo, int64_t hi) override {
    for_ranges(lo, hi, [&](int64_t off, int64_t count, bool decay) {
      kernels::SgdConfig c = cfg_;
      c.lr = lr_;
      c.grad_scale = grad_scale_;
      if (!decay) c.weight_decay = 0.f;
      Tensor m = state_.empty() ? Tensor() : state(0).slice(off, {count});
      Tensor w = work ? work->slice(off, {count}) : Tensor();
      be.sgd_step(c, master.slice(off, {count}), grad.slice(off, {count}),
                  state_.empty() ? nullptr : &m, work ? &w : nullptr);
    });
  }

 private:
  kernels::SgdConfig cfg_;
  float lr_ = 0.f;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& c, int64_t n)
      : Optimizer(n, {"exp_avg", "exp_avg_sq"}), cfg_{c.lr,  c.beta1,        c.beta2,
                                                      c.eps, c.weight_decay, 1} {}
  const char* name() const override { return "adamw"; }
  void start_step(float lr) override {
    cfg_.lr = lr;
    cfg_.step = ++steps_;
  }
  void update_ranges(kernels::Backend& be, const Tensor& master, const Tensor& grad,
                     const Tensor* work, int64_t lo, int64_t hi) override {
    for_ranges(lo, hi, [&](int64_t off, int64_t count, bool decay) {
      kernels::AdamWConfig c = cfg_;
      c.grad_scale = grad_scale_;
      if (!decay) c.weight_decay = 0.f;
      Tensor w = work ? work->slice(off, {count}) : Tensor();
      be.adamw_step(c, master.slice(off, {count}), grad.slice(off, {count}),
                    state(0).slice(off, {count}), state(1).slice(off, {count}),
                    work ? &w : nullptr);
    });
  }

 private:
  kernels::AdamWConfig cfg_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c, int64_t n) {
  RT_REQUIRE(c.lr > 0.f, "--lr ", c.lr, " is not valid; expected a positive learning rate");
  RT_REQUIRE(c.weight_decay >= 0.f, "--weight-decay ", c.weight_decay, " is negative");
  if (c.name == "sgd") {
    RT_REQUIRE(c.momentum >= 0.f && c.momentum < 1.f, "--momentum ", c.momentum,
               " is not valid; expected a value in [0, 1)");
    return std::make_unique<Sgd>(c, n);
  }
  if (c.name == "adamw") {
    RT_REQUIRE(c.beta1 >= 0.f && c.beta1 < 1.f && c.beta2 >= 0.f && c.beta2 < 1.f,
               "--beta1/--beta2 must be in [0, 1), got ", c.beta1, " and ", c.beta2);
    return std::make_unique<AdamW>(c, n);
  }
  throw_input(cat("--optimizer '", c.name, "' is not known; expected sgd or adamw"));
}

}  // namespace ringtrain
