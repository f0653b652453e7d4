// What every ParallelStrategy shares (see strategy.hpp): the optimizer, fp32 gradient and
// reducer over the range of parameters a rank owns, the unscale and check of that range, the
// broadcast of a fresh start; and make_strategy, which picks one from the configuration.
#include "train/strategy.hpp"

namespace ringtrain::launch {

ParallelStrategy::ParallelStrategy(comm::Communicator& comm, kernels::Backend& backend,
                                   Model& model, DType precision, StepObservers& observers)
    : comm_(comm), backend_(backend), model_(model), precision_(precision), observers_(observers) {}

std::unique_ptr<Optimizer> ParallelStrategy::make_optimizer(
    const OptimizerConfig& cfg, bool decay_all, const std::vector<std::string>& frozen) {
  MemoryScope in(MemCategory::optimizer);
  auto opt = ringtrain::make_optimizer(cfg, owned_count());
  // Each parameter's part of the owned range, in the optimizer's index space.
  const int64_t lo = owned_begin(), hi = owned_end();
  std::vector<DecayRange> ranges;
  for (const auto& p : model_.params()) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + shape_numel(p.shape));
    bool freeze = false;
    for (const auto& prefix : frozen) freeze = freeze || p.name.starts_with(prefix);
    if (a < b) ranges.push_back({a - lo, b - a, decay_all || p.decay, freeze});
  }
  opt->set_decay_ranges(std::move(ranges));
  optimizer_ = opt.get();
  return opt;
}

void ParallelStrategy::allocate_gradients(bool optimizer_unscales) {
  optimizer_unscales_ = optimizer_unscales;
  const int64_t g32 = owned_count();
  const bool shard_only = keeps_gradient_shard_only();
  const bool own32 = shard_only || (precision_ != DType::f32 && !optimizer_unscales);
  grad32_storage_ =
      own32 ? Buffer(size_t(g32) * 4, default_device(), MemCategory::gradients) : Buffer();
  grad32_ =
      precision_ == DType::f32 && !shard_only
          ? model_.grad()
          : (own32 ? Tensor(grad32_storage_.data(), {g32}, DType::f32, grad32_storage_.device())
                   : Tensor());
}

std::unique_ptr<comm::GradReducer> ParallelStrategy::make_reducer(
    comm::ReducerConfig rc, const std::vector<std::pair<int64_t, int64_t>>& ranges,
    const std::vector<size_t>& layer_of) {
  rc.shards = reduce_layout();
  if (keeps_gradient_shard_only()) {
    rc.transient_buckets = true;
    rc.shard_sums = grad32_;
  }
  MemoryScope in(MemCategory::gradients);  // the wire buffer
  auto reducer = std::make_unique<comm::GradReducer>(comm_, rc, model_.grad(), ranges, layer_of);
  reducer_ = reducer.get();
  reducer_made();
  return reducer;
}

std::unique_ptr<HostMirror> ParallelStrategy::make_host_mirror() const {
  return std::make_unique<HostMirror>(param_views(), optimizer_views(), buffer_views(model_));
}

Tensor ParallelStrategy::owned_grad() const {
  // fp16/bf16 or a gradient shard only: allocated as the owned range; fp32: the model's
  // whole gradient.
  if (precision_ != DType::f32 || keeps_gradient_shard_only()) return grad32_;
  return grad32_.slice(owned_begin(), {owned_count()});
}

Tensor ParallelStrategy::optimizer_grad() const {
  if (!optimizer_unscales_) return owned_grad();
  return reduced_sums();
}

Tensor ParallelStrategy::reduced_sums() const {
  if (keeps_gradient_shard_only()) return grad32_;  // the reducer wrote the fp32 sums there
  return reducer_->result().slice(owned_begin(), {owned_count()});
}

ParallelStrategy::UnscaledGrads ParallelStrategy::unscale_and_check(float unscale,
                                                                    bool clipping) const {
  UnscaledGrads u;
  u.unscale = unscale;
  if (optimizer_unscales_) {
    u.nonfinite = backend_.unscale_check(optimizer_grad(), unscale, Tensor());
    return u;
  }
  const Tensor sums = reduced_sums();
  u.nonfinite = backend_.unscale_check(sums, unscale, owned_grad());
  if (!u.nonfinite && clipping) u.sum_sq = norm_sq_share();
  return u;
}

void ParallelStrategy::broadcast_parameters() {
  comm_.broadcast(model_.master().data, model_.num_params(), DType::f32, 0);
  model_.refresh_working_copy(backend_);
}

int64_t ParallelStrategy::gradient_bytes() const {
  const int64_t p = model_.num_params();
  const DType wire = reducer_->result().dtype;
  return p * int64_t(dtype_size(precision_)) + int64_t(grad32_storage_.bytes()) +
         (wire == precision_ ? 0 : p * int64_t(dtype_size(wire)));
}

std::unique_ptr<ParallelStrategy> make_strategy(const TrainConfig& cfg, comm::Communicator& comm,
                                                const ProcessGrid& grid, kernels::Backend& backend,
                                                Model& model, StepObservers& observers) {
  if (grid.tp() > 1) return make_tensor_parallel(grid, backend, model, cfg.precision, observers);
  if (cfg.zero == 3) return make_zero3(comm, backend, model, cfg.precision, observers);
  if (cfg.zero == 1 || cfg.zero == 2)
    return make_sharded(cfg.zero, comm, backend, model, cfg.precision, observers);
  return make_replicated(comm, backend, model, cfg.precision, observers);
}

}  // namespace ringtrain::launch
