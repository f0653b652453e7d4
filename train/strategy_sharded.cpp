// The sharded strategies (see strategy.hpp), ZeRO-1 (--zero 1) and ZeRO-2 (--zero 2): each
// rank owns one contiguous shard of the flat parameters (comm::ShardLayout). The buckets are
// reduce-scattered into the shards; a rank keeps the fp32 gradient and optimizer state of its
// shard only (in fp16/bf16 also only its shard of the fp32 masters), updates it bucket by
// bucket, and all-gathers each bucket's working weights while the next is updated and while
// the next step's forward runs, which waits node by node for the buckets it reads.
// Checkpoints: each rank its hyperslabs.
// ZeRO-1 keeps the whole compute-dtype gradient (and, with --grad-accum, a whole fp32 sum of
// the micro-batches). ZeRO-2 keeps no whole gradient: before a node's backward its
// parameters' gradients are pointed into their bucket's buffer, which the reducer allocates
// then and frees once the bucket is reduce-scattered and this rank's piece is in the fp32
// shard; every micro-batch is reduced so, its sums added to the shard in fp32.
#include <algorithm>
#include <cstdint>

#include "train/strategy.hpp"

namespace ringtrain::launch {
namespace {

class Sharded final : public ParallelStrategy {
 public:
  Sharded(int stage, comm::Communicator& comm, kernels::Backend& backend, Model& model,
          DType precision, StepObservers& observers)
      : ParallelStrategy(comm, backend, model, precision, observers),
        stage_(stage),
        shards_(model.num_params(), comm.size()) {}

  // fp16/bf16: fp32 masters of this rank's shard only (in fp32 the full fp32 copy is needed
  // anyway as the working weights, and the shard is a slice of it). ZeRO-2: no whole
  // gradient buffer.
  void place_parameters() override {
    if (precision_ != DType::f32) model_.shard_masters(owned_begin(), owned_end());
    if (stage_ == 2) model_.release_grad();
  }

  bool reduces_every_micro_batch() const override { return stage_ == 2; }

  // Sharded masters: every rank draws the same values and keeps its shard.
  bool initializes_parameters() const override {
    return comm_.rank() == 0 || model_.masters_sharded();
  }

  void start_weights(bool resumed) override {
    if (resumed)
      gather_weights();  // each rank read its shard
    else if (!model_.masters_sharded())
      broadcast_parameters();
  }

  void install_hooks(LayerHooks& hooks) override {
    hooks.before_forward = [this](size_t n) { wait_for_node_weights(n); };
    if (stage_ == 2) hooks.before_backward = [this](size_t n) { point_grads_at_bucket(n); };
  }

  // The shard's part of each bucket, from the last bucket (the first layers) to bucket 0;
  // the communication thread all-gathers a bucket's working weights (fp16/bf16: written by
  // the optimizer in the same pass, with the bucket's part of the fp32 copy of the
  // parameters layers read in fp32; fp32: the masters themselves) while the next bucket is
  // updated and while the next step's forward runs (wait_for_node_weights).
  void update(float lr, float grad_scale, int64_t step) override {
    const int64_t lo = owned_begin(), n = owned_count();
    const bool mixed = model_.masters_sharded();
    const Tensor work = model_.work();
    const Tensor master = mixed ? model_.master() : model_.master().slice(lo, {n});
    const Tensor grad = optimizer_grad(), work_shard = work.slice(lo, {n});
    optimizer_->begin_step(lr, grad_scale);
    reducer_->start_gather(work, mixed ? model_.fp32_copy() : Tensor(), fp32_counts_);
    observers_.before(Phase::gather, step);
    const auto& buckets = reducer_->buckets();
    for (size_t b = buckets.size(); b-- > 0;) {  // the reducer gathers the last bucket first
      const int64_t a = std::max(lo, buckets[b].offset);
      const int64_t e = std::min(lo + n, buckets[b].offset + buckets[b].count);
      if (a < e) {
        optimizer_->update(backend_, master, grad, mixed ? &work_shard : nullptr, a - lo, e - lo);
        if (mixed) model_.copy_shard_to_fp32(a, e);
      }
      reducer_->gather_ready(b);
    }
    gather_pending_ = true;
    gather_step_ = step;
  }

  void finish_weight_gather() override {
    if (!gather_pending_) return;
    const auto t0 = Clock::now();
    if (reducer_->finish_gather() > 0)
      observers_.after(Phase::gather, gather_step_, t0, Clock::now());
    gather_pending_ = false;
  }

  std::vector<io::NamedTensor> param_views() const override {
    // fp32: the masters are whole (they are the working weights) and the shard is a slice.
    const Tensor m = model_.master();
    return shard_views(model_.masters_sharded() ? m : m.slice(owned_begin(), {owned_count()}));
  }

  std::vector<io::OptimizerState> optimizer_views() const override {
    std::vector<io::OptimizerState> states;
    for (size_t s = 0; s < optimizer_->state_names().size(); ++s)
      states.push_back({optimizer_->state_names()[s], shard_views(optimizer_->state(s))});
    return states;
  }

  MemoryUse memory_use() const override {
    // fp32: the shard of the masters counts as masters and the rest as working weights.
    const bool fp32 = precision_ == DType::f32;
    MemoryUse m;
    m.masters = fp32 ? owned_count() * 4 : int64_t(model_.master().bytes());
    m.work = fp32 ? int64_t(model_.master().bytes()) - m.masters : int64_t(model_.work().bytes());
    m.fp32_read = int64_t(model_.fp32_copy().bytes());
    m.optimizer = optimizer_->state_bytes();
    if (stage_ == 1) {
      m.grads = gradient_bytes();
    } else {  // the fp32 shard, and at most max_in_flight() buckets at a time
      m.grads = int64_t(grad32_storage_.bytes());
      m.grad_buckets = reducer_->bucket_bytes_bound();
    }
    return m;
  }

  // Reduce-scatter and all-gather: (W-1)/W of the buffer each, in the wire and the working
  // dtype, plus the fp32-read parameters' all-gather; ZeRO-2 reduce-scatters each
  // micro-batch. The ring model's allreduce of the gradient, 2(W-1)/W, for reference.
  WireBytes wire_bytes() const override {
    const double w = comm_.size(), f = (w - 1) / w, p = double(model_.num_params());
    const double wire = double(dtype_size(reducer_->result().dtype));
    WireBytes b;
    b.reduce = f * p * wire * double(stage_ == 2 ? micro_batches_ : 1);
    b.allreduce = 2 * f * p * wire;
    b.gather = f * p * double(dtype_size(model_.work().dtype));
    b.gather_fp32 = f * double(model_.fp32_copy().numel()) * 4;
    return b;
  }

  std::string memory_report() const override {
    const MemoryUse m = memory_use();
    const WireBytes b = wire_bytes();
    return cat(
        "memory/rank: masters ", m.masters, " B (shard of ", owned_count(), " of ",
        model_.num_params(), "), optimizer state ", m.optimizer, " B, working weights ", m.work,
        precision_ == DType::f32 ? " B (the all-gathered rest)" : " B",
        m.fp32_read > 0 ? cat(" + fp32-read parameters ", m.fp32_read, " B") : "", ", gradients ",
        m.grads,
        stage_ == 2 ? cat(" B (fp32 shard) + buckets in flight <= ", m.grad_buckets, " B")
                    : std::string(" B"),
        "; --zero ", stage_, "; wire/step/rank: reduce-scatter ", int64_t(b.reduce), " B",
        stage_ == 2 && micro_batches_ > 1 ? cat(" (", micro_batches_, " micro-batches)") : "",
        " + all-gather ", int64_t(b.gather), " B",
        b.gather_fp32 > 0 ? cat(" + fp32-read ", int64_t(b.gather_fp32), " B") : "",
        " (ring model: allreduce ", int64_t(b.allreduce), " B)");
  }

  bool partitions_gradients() const override { return true; }

 protected:
  int64_t owned_begin() const override { return shards_.begin(comm_.rank()); }
  int64_t owned_end() const override { return shards_.end(comm_.rank()); }
  comm::ShardLayout reduce_layout() const override { return shards_; }
  bool keeps_gradient_shard_only() const override { return stage_ == 2; }
  double norm_sq_share() const override { return backend_.sum_squares(owned_grad()); }

  // What each node's forward waits for, and the buckets' parts of the fp32 copy.
  void reducer_made() override {
    const auto& buckets = reducer_->buckets();
    const auto& params = model_.params();
    std::vector<size_t> bucket_of(params.size());
    for (size_t b = 0; b < buckets.size(); ++b)
      for (size_t i = 0; i < buckets[b].params; ++i) bucket_of[buckets[b].first_param + i] = b;
    param_bucket_ = bucket_of;
    pointed_.assign(buckets.size(), nullptr);
    node_bucket_.assign(model_.layer_params().size(), SIZE_MAX);
    size_t lowest = SIZE_MAX;
    for (size_t l = 0; l < node_bucket_.size(); ++l) {
      const auto [first, count] = model_.layer_params()[l];
      for (size_t i = first; i < first + count; ++i) lowest = std::min(lowest, bucket_of[i]);
      node_bucket_[l] = lowest;
    }
    fp32_counts_.clear();
    if (!model_.masters_sharded()) return;
    for (const auto& k : buckets) {
      std::vector<int64_t> per_rank;
      for (int r = 0; r < comm_.size(); ++r)
        per_rank.push_back(model_.fp32_count_in(std::max(k.offset, shards_.begin(r)),
                                                std::min(k.offset + k.count, shards_.end(r))));
      fp32_counts_.push_back(std::move(per_rank));
    }
  }

 private:
  // The layer hook before node `node`: waits for the buckets of its parameters (and of every
  // earlier node's, which covers a parameter it shares with one of them).
  void wait_for_node_weights(size_t node) {
    if (!gather_pending_ || node_bucket_[node] == SIZE_MAX) return;
    const auto t0 = Clock::now();
    if (reducer_->wait_gathered(node_bucket_[node]) > 0)
      observers_.after(Phase::gather, gather_step_, t0, Clock::now());
  }

  // ZeRO-2, the layer hook before node `node`'s backward: its bucket's buffer for this
  // reduction (allocated by the first node of the bucket), and the gradients of the
  // bucket's parameters pointed into it (a node's parameters lie in one bucket).
  void point_grads_at_bucket(size_t node) {
    const auto [first, count] = model_.layer_params()[node];
    if (count == 0) return;
    const size_t b = param_bucket_[first];
    const Tensor g = reducer_->bucket_grad(b);
    if (pointed_[b] == g.data) return;  // (a buffer at the same address: the same views)
    const comm::Bucket& k = reducer_->buckets()[b];
    auto& params = model_.params();
    for (size_t i = k.first_param; i < k.first_param + k.params; ++i)
      params[i].grad = g.slice(params[i].offset - k.offset, params[i].shape);
    pointed_[b] = g.data;
  }

  // After a resume read each rank's shard: every rank's full working weights (and the
  // fp32-read parameters) from all shards. Collective.
  void gather_weights() {
    const auto counts = shards_.counts_in(0, model_.num_params());
    if (!model_.masters_sharded()) {  // fp32: the masters are the working weights
      comm_.allgatherv(model_.master().data, counts, DType::f32);
      return;
    }
    comm_.allgatherv(model_.work().data, counts, model_.work().dtype);
    const Tensor f = model_.fp32_copy();
    if (f.numel() == 0) return;
    std::vector<int64_t> fc;
    for (int r = 0; r < comm_.size(); ++r)
      fc.push_back(model_.fp32_count_in(shards_.begin(r), shards_.end(r)));
    comm_.allgatherv(f.data, fc, DType::f32);
  }

  // The parameters' parts of this rank's shard of `shard` (a flat fp32 tensor of the shard's
  // size), as the checkpoint's full-shape datasets name them.
  std::vector<io::NamedTensor> shard_views(const Tensor& shard) const {
    std::vector<io::NamedTensor> views;
    const int64_t begin = owned_begin(), end = owned_end();
    for (const auto& p : model_.params()) {
      // This rank's part of the parameter (possibly none), at its shard offset.
      const int64_t lo = std::max(p.offset, begin);
      const int64_t hi = std::max(lo, std::min(p.offset + shape_numel(p.shape), end));
      views.push_back({p.name, shard.slice(lo - begin, {hi - lo}), p.shape, lo - p.offset});
    }
    return views;
  }

  int stage_;
  comm::ShardLayout shards_;
  // ZeRO-2: each parameter's bucket, and the buffer each bucket's parameters point into.
  std::vector<size_t> param_bucket_;
  std::vector<void*> pointed_;
  // Per node, the lowest bucket holding a parameter of it or of an earlier node (the last
  // one gathered that it needs; SIZE_MAX: none); per bucket and rank, the fp32-read
  // parameters' elements in both (fp16/bf16); whether a step's all-gather is in flight, and
  // which step's.
  std::vector<size_t> node_bucket_;
  std::vector<std::vector<int64_t>> fp32_counts_;
  bool gather_pending_ = false;
  int64_t gather_step_ = 0;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_sharded(int stage, comm::Communicator& comm,
                                               kernels::Backend& backend, Model& model,
                                               DType precision, StepObservers& observers) {
  return std::make_unique<Sharded>(stage, comm, backend, model, precision, observers);
}

}  // namespace ringtrain::launch
