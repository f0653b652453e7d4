// The tensor-parallel strategy (--tensor-parallel T > 1 with --zero 0; see strategy.hpp and
// process_grid.hpp): each rank holds the masters, gradient and optimizer state of its part of
// the model (the split layers' parts, every unsplit parameter whole), reduces the gradient
// over its data-parallel communicator and updates everything it holds. The unsplit
// parameters' gradients are the same on every rank of a group by construction (their
// inputs and output gradients are), so the ranks of a group keep identical copies of them
// without a collective. Checkpoints hold the whole tensors: each group writes its parts of
// the split ones (data-parallel rank 0's copy) as hyperslabs of the full-shape datasets.
#include "train/strategy.hpp"

namespace ringtrain::launch {
namespace {

class TensorParallel final : public ParallelStrategy {
 public:
  TensorParallel(const ProcessGrid& grid, kernels::Backend& backend, Model& model, DType precision,
                 StepObservers& observers)
      : ParallelStrategy(grid.dp_comm(), backend, model, precision, observers), grid_(grid) {}

  // Every rank draws its own part of the whole tensors from the seed (model.cpp): the same
  // values as a run without tensor parallelism, no broadcast.
  bool initializes_parameters() const override { return true; }
  void start_weights(bool /*resumed*/) override {}

  void update(float lr, float grad_scale, int64_t /*step*/) override {
    Tensor work = model_.work();
    optimizer_->step(backend_, model_.master(), optimizer_grad(),
                     precision_ == DType::f32 ? nullptr : &work, lr, grad_scale);
  }

  std::unique_ptr<HostMirror> make_host_mirror() const override {
    return std::make_unique<HostMirror>(param_views(), optimizer_views(), buffer_views(model_));
  }

  std::vector<io::NamedTensor> param_views() const override {
    std::vector<io::NamedTensor> v;
    for (const auto& p : model_.params()) v.push_back(view(p, p.master));
    return v;
  }

  std::vector<io::OptimizerState> optimizer_views() const override {
    std::vector<io::OptimizerState> states;
    for (size_t s = 0; s < optimizer_->state_names().size(); ++s) {
      io::OptimizerState st{optimizer_->state_names()[s], {}};
      for (const auto& p : model_.params())
        st.per_param.push_back(view(p, optimizer_->state(s).slice(p.offset, p.shape)));
      states.push_back(std::move(st));
    }
    return states;
  }

  MemoryUse memory_use() const override {
    MemoryUse m;
    m.masters = int64_t(model_.master().bytes());
    m.work = precision_ == DType::f32 ? 0 : int64_t(model_.work().bytes());
    m.fp32_read = int64_t(model_.fp32_copy().bytes());
    m.optimizer = optimizer_->state_bytes();
    m.grads = gradient_bytes();
    return m;
  }

  // The allreduce over the D ranks of the data-parallel communicator (the layers' own sums
  // over the group are not counted here).
  WireBytes wire_bytes() const override {
    const double d = comm_.size(), f = (d - 1) / d;
    WireBytes b;
    b.reduce = 2 * f * double(model_.num_params()) * double(dtype_size(reducer_->result().dtype));
    b.allreduce = b.reduce;
    return b;
  }

  std::string memory_report() const override {
    const MemoryUse m = memory_use();
    int64_t split = 0;
    for (const auto& p : model_.params())
      if (p.split.split()) split += shape_numel(p.shape);
    return cat("memory/rank: masters ", m.masters, " B (", split,
               " of the rank's parameters are its part of split layers), optimizer state ",
               m.optimizer, " B, working weights ", m.work,
               precision_ == DType::f32 ? " B (the masters)" : " B", ", gradients ", m.grads,
               " B; --tensor-parallel ", grid_.tp(), " --zero 0; wire/step/rank: allreduce over ",
               grid_.dp(), " data-parallel rank(s) ", int64_t(wire_bytes().reduce), " B");
  }

  bool partitions_gradients() const override { return false; }

 protected:
  int64_t owned_begin() const override { return 0; }
  int64_t owned_end() const override { return model_.num_params(); }
  // Summed over the world: the data-parallel rank 0 of each position counts its parts of the
  // split parameters, and the group's rank 0 among them also the unsplit ones.
  double norm_sq_share() const override {
    if (grid_.dp_rank() != 0) return 0.0;
    double s = 0;
    for (const auto& p : model_.params())
      if (p.split.split() || grid_.tp_rank() == 0)
        s += backend_.sum_squares(grad32_.slice(p.offset, p.shape));
    return s;
  }

 private:
  // A parameter's (or its optimizer state's) tensor as the checkpoint holds it: whole, or
  // this rank's ranges of the full-shape tensor (written by data-parallel rank 0).
  io::NamedTensor view(const Param& p, const Tensor& t) const {
    if (!p.split.split()) return {p.name, t};
    io::NamedTensor v(p.name, t, p.split.full);
    v.split_axis = p.split.axis;
    v.split_ranges = p.split.ranges();
    v.writes = grid_.dp_rank() == 0;
    return v;
  }

  const ProcessGrid& grid_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_tensor_parallel(const ProcessGrid& grid,
                                                       kernels::Backend& backend, Model& model,
                                                       DType precision, StepObservers& observers) {
  return std::make_unique<TensorParallel>(grid, backend, model, precision, observers);
}

}  // namespace ringtrain::launch
