// The replicated strategy (--zero 0; see strategy.hpp): every rank holds all masters, the
// whole fp32 gradient and all optimizer state, the buckets are allreduced, and every rank
// updates everything, its working weights cast from its own masters.
#include "train/strategy.hpp"

namespace ringtrain::launch {
namespace {

class Replicated final : public ParallelStrategy {
 public:
  using ParallelStrategy::ParallelStrategy;

  bool initializes_parameters() const override { return comm_.rank() == 0; }

  void start_weights(bool resumed) override {
    if (!resumed) broadcast_parameters();
  }

  void update(float lr, float grad_scale, int64_t /*step*/) override {
    Tensor work = model_.work();
    optimizer_->step(backend_, model_.master(), optimizer_grad(),
                     precision_ == DType::f32 ? nullptr : &work, lr, grad_scale);
  }

  std::unique_ptr<HostMirror> make_host_mirror() const override {
    return std::make_unique<HostMirror>(model_, optimizer_);  // whole buffers, one copy each
  }

  std::vector<io::NamedTensor> param_views() const override { return master_views(model_); }

  std::vector<io::OptimizerState> optimizer_views() const override {
    std::vector<io::OptimizerState> states;
    for (size_t s = 0; s < optimizer_->state_names().size(); ++s) {
      io::OptimizerState st{optimizer_->state_names()[s], {}};
      for (auto& p : model_.params())
        st.per_param.push_back({p.name, optimizer_->state(s).slice(p.offset, p.shape)});
      states.push_back(std::move(st));
    }
    return states;
  }

  MemoryUse memory_use() const override {
    // In fp32 the masters are the working weights.
    MemoryUse m;
    m.masters = int64_t(model_.master().bytes());
    m.work = precision_ == DType::f32 ? 0 : int64_t(model_.work().bytes());
    m.fp32_read = int64_t(model_.fp32_copy().bytes());
    m.optimizer = optimizer_->state_bytes();
    m.grads = gradient_bytes();
    return m;
  }

  // The allreduce: 2(W-1)/W of the buffer in the wire dtype.
  WireBytes wire_bytes() const override {
    const double w = comm_.size(), f = (w - 1) / w;
    WireBytes b;
    b.reduce = 2 * f * double(model_.num_params()) * double(dtype_size(reducer_->result().dtype));
    b.allreduce = b.reduce;
    return b;
  }

  std::string memory_report() const override {
    const MemoryUse m = memory_use();
    return cat("memory/rank: masters ", m.masters, " B, optimizer state ", m.optimizer,
               " B, working weights ", m.work, precision_ == DType::f32 ? " B (the masters)" : " B",
               m.fp32_read > 0 ? cat(" + fp32-read parameters ", m.fp32_read, " B") : "",
               ", gradients ", m.grads, " B; --zero 0; wire/step/rank: allreduce ",
               int64_t(wire_bytes().reduce), " B");
  }

  bool partitions_gradients() const override { return false; }

 protected:
  int64_t owned_begin() const override { return 0; }
  int64_t owned_end() const override { return model_.num_params(); }
  // The gradient is the same on every rank: rank 0 counts it once.
  double norm_sq_share() const override {
    return comm_.rank() == 0 ? backend_.sum_squares(grad32_) : 0.0;
  }
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_replicated(comm::Communicator& comm,
                                                  kernels::Backend& backend, Model& model,
                                                  DType precision, StepObservers& observers) {
  return std::make_unique<Replicated>(comm, backend, model, precision, observers);
}

}  // namespace ringtrain::launch
