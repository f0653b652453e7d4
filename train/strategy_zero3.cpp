// The fully sharded strategy (see strategy.hpp), ZeRO-3 (--zero 3): each rank keeps only its
// shard (comm::ShardLayout) of the fp32 masters, the optimizer state, the fp32 gradient and,
// in fp16/bf16, the compute-dtype working weights. A node's parameters exist whole only while
// it runs: before a gather unit (a repeat-body block, a transformer block, or a node outside
// one) runs forward, its parameters are all-gathered in the compute dtype into one transient
// buffer (category `gathered`) that the layers' Param::work views point into, and freed when
// the next unit is gathered; backward gathers each unit again, except the last one of forward,
// which it keeps, and frees the last after node 0. With --recompute blocks a block is gathered
// before its recomputation (the executor's before_backward hook runs first) and serves it and
// its backward. At most one unit is held at a time (the plan allows two).
//
// The gathers run on the training thread, not prefetched: in backward the communication
// thread first finishes the reductions handed to it (GradReducer::gather_params), so the
// collectives keep one order on every rank. Gradients are handled as in ZeRO-2: a node's
// gradients point into their bucket's transient buffer, which is reduce-scattered when
// complete into the fp32 shard sums; every micro-batch is reduced so (--grad-accum sums the
// micro-batches in fp32 in the shard). Clipping: each rank's share of the squared norm of its
// shard, summed in the step's agreement; loss scaling: each rank checks its shard, and the
// agreement makes a skip every rank's.
//
// Tied parameters (the GPT head reads embed.wte): a unit holds the values of every parameter
// its nodes read, so the head's unit gathers embed.wte's range again; its gradient is the
// owner's (Model adds the head's part in at the owner's backward). Parameters read in fp32
// (norms, biases, and all of a layer kept in another dtype) in fp16/bf16: their full fp32
// copy (Model::fp32_copy, O(layers x width)) stays whole on every rank and is all-gathered
// after each update, as under ZeRO-1; in fp32 they are in the gathered unit like the rest.
// Evaluation during training gathers the whole working weights for its duration. Checkpoints:
// each rank writes and reads its hyperslabs of the full-shape datasets.
#include <algorithm>
#include <cstdint>
#include <map>

#include "train/strategy.hpp"

namespace ringtrain::launch {
namespace {

class Zero3 final : public ParallelStrategy {
 public:
  Zero3(comm::Communicator& comm, kernels::Backend& backend, Model& model, DType precision,
        StepObservers& observers)
      : ParallelStrategy(comm, backend, model, precision, observers),
        shards_(model.num_params(), comm.size()) {}

  void place_parameters() override {
    if (mixed()) model_.shard_masters(owned_begin(), owned_end());
    model_.shard_parameters(owned_begin(), owned_end());
    model_.release_grad();
    make_units();
  }

  bool reduces_every_micro_batch() const override { return true; }
  // Every rank draws the same values and keeps its shard (and the whole fp32 copy).
  bool initializes_parameters() const override { return true; }

  void start_weights(bool resumed) override {
    if (resumed) gather_fp32_copy();  // each rank read its shard
  }

  void install_hooks(LayerHooks& hooks) override {
    hooks.before_forward = [this](size_t n) { use_unit_of(n); };
    hooks.before_backward = [this](size_t n) {
      use_unit_of(n);
      point_grads_at_bucket(n);
    };
    auto after = hooks.after_backward;
    hooks.after_backward = [this, after](size_t n, const Tensor& dx) {
      if (after) after(n, dx);
      if (n == 0) release_unit();  // backward's last node
    };
  }

  void begin_forward(int64_t step, int64_t micro) override {
    step_ = step;
    if (micro == 0) position_ = 0;
    hold_before_gather_ = micro == 0;
  }

  // The optimizer on the shard (fp16/bf16: writing the shard's working weights in the same
  // pass), then the fp32 copy of the parameters read in fp32 made whole again.
  void update(float lr, float grad_scale, int64_t /*step*/) override {
    const Tensor master = model_.master(), grad = optimizer_grad(), work = model_.work();
    optimizer_->begin_step(lr, grad_scale);
    optimizer_->update(backend_, master, grad, mixed() ? &work : nullptr, 0, owned_count());
    if (mixed()) {
      model_.copy_shard_to_fp32();
      gather_fp32_copy();
    }
  }

  void hold_whole_weights(bool on) override {
    if (on) {
      release_unit();
      gather_unit(units_.size() - 1);
    } else {
      release_unit();
    }
  }

  std::vector<io::NamedTensor> param_views() const override { return shard_views(model_.master()); }

  std::vector<io::OptimizerState> optimizer_views() const override {
    std::vector<io::OptimizerState> states;
    for (size_t s = 0; s < optimizer_->state_names().size(); ++s)
      states.push_back({optimizer_->state_names()[s], shard_views(optimizer_->state(s))});
    return states;
  }

  MemoryUse memory_use() const override {
    MemoryUse m;
    m.masters = owned_count() * 4;
    m.work = mixed() ? int64_t(model_.work().bytes()) : 0;
    m.gathered = largest_unit_ * int64_t(dtype_size(precision_));
    m.fp32_read = int64_t(model_.fp32_copy().bytes());
    m.optimizer = optimizer_->state_bytes();
    m.grads = int64_t(grad32_storage_.bytes());
    m.grad_buckets = reducer_->bucket_bytes_bound();
    return m;
  }

  // Per micro-batch: the reduce-scatter of the gradient, and the all-gathers of the units
  // (forward's, and backward's but the one it keeps); per step the fp32 copy's all-gather.
  // For reference the ring model's allreduce of the gradient, 2(W-1)/W; ZeRO-3's total is
  // 1.5 times it when each unit is gathered twice.
  WireBytes wire_bytes() const override {
    const double w = comm_.size(), f = (w - 1) / w, p = double(model_.num_params());
    const double wire = double(dtype_size(reducer_->result().dtype));
    const double k = double(micro_batches_);
    WireBytes b;
    b.reduce = f * p * wire * k;
    b.allreduce = 2 * f * p * wire;
    b.gather = f * double(gathered_per_pass_) * double(dtype_size(precision_)) * k;
    b.gather_fp32 = f * double(model_.fp32_copy().numel()) * 4;
    return b;
  }

  std::string memory_report() const override {
    const MemoryUse m = memory_use();
    const WireBytes b = wire_bytes();
    return cat("memory/rank: masters ", m.masters, " B (shard of ", owned_count(), " of ",
               model_.num_params(), "), optimizer state ", m.optimizer, " B, working weights ",
               m.work, " B (shard) + gathered unit <= ", m.gathered, " B (", units_.size() - 1,
               " units, not prefetched)",
               m.fp32_read > 0 ? cat(" + fp32-read parameters ", m.fp32_read, " B") : "",
               ", gradients ", m.grads, " B (fp32 shard) + buckets in flight <= ", m.grad_buckets,
               " B; --zero 3; wire/step/rank: reduce-scatter ", int64_t(b.reduce), " B",
               micro_batches_ > 1 ? cat(" (", micro_batches_, " micro-batches)") : "",
               " + parameter all-gather ", int64_t(b.gather), " B",
               b.gather_fp32 > 0 ? cat(" + fp32-read ", int64_t(b.gather_fp32), " B") : "",
               " (ring model: allreduce ", int64_t(b.allreduce), " B)");
  }

  bool partitions_gradients() const override { return true; }

 protected:
  int64_t owned_begin() const override { return shards_.begin(comm_.rank()); }
  int64_t owned_end() const override { return shards_.end(comm_.rank()); }
  comm::ShardLayout reduce_layout() const override { return shards_; }
  bool keeps_gradient_shard_only() const override { return true; }
  double norm_sq_share() const override { return backend_.sum_squares(owned_grad()); }

  void reducer_made() override {
    const auto& buckets = reducer_->buckets();
    param_bucket_.assign(model_.params().size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b)
      for (size_t i = 0; i < buckets[b].params; ++i) param_bucket_[buckets[b].first_param + i] = b;
    pointed_.assign(buckets.size(), nullptr);
  }

 private:
  // A gather unit: its nodes and the flat ranges of the parameters they read (their own and
  // those they share), merged, each at `at` in the unit's buffer.
  struct Range {
    int64_t flat = 0, count = 0, at = 0;
  };
  struct Unit {
    std::vector<size_t> nodes;
    std::vector<Range> ranges;
    int64_t total = 0;
  };

  bool mixed() const { return precision_ != DType::f32; }

  // The units: each repeat-body block, each other node that reads parameters; and last, one
  // of every node and parameter (evaluation's whole weights). Also what a forward and
  // backward pass gathers (the wire bytes) and the largest unit.
  void make_units() {
    const size_t n = model_.layers().size();
    node_unit_.assign(n, -1);
    units_.clear();
    std::map<int, size_t> of_segment;
    for (size_t l = 0; l < n; ++l) {
      if (model_.node_bindings(l).empty()) continue;
      const int s = model_.segment_of(l);
      size_t u = units_.size();
      if (s >= 0 && of_segment.count(s)) {
        u = of_segment[s];
      } else {
        units_.emplace_back();
        if (s >= 0) of_segment[s] = u;
      }
      units_[u].nodes.push_back(l);
      node_unit_[l] = int(u);
    }
    // A block's nodes without parameters (a residual add) use its unit too: a recomputation
    // of the block starts at its last node's backward hook.
    for (size_t l = 0; l < n; ++l)
      if (const int s = model_.segment_of(l); s >= 0 && of_segment.count(s))
        node_unit_[l] = int(of_segment[s]);
    Unit all;
    for (size_t l = 0; l < n; ++l) all.nodes.push_back(l);
    units_.push_back(all);
    largest_unit_ = 0;
    for (Unit& u : units_) {
      std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end)
      for (size_t l : u.nodes)
        for (const auto& [p, owner] : model_.node_bindings(l)) {
          const Param& o = model_.params()[owner];
          spans.push_back({o.offset, o.offset + shape_numel(o.shape)});
        }
      std::sort(spans.begin(), spans.end());
      for (const auto& [a, b] : spans) {
        if (!u.ranges.empty() && a <= u.ranges.back().flat + u.ranges.back().count) {
          Range& r = u.ranges.back();
          r.count = std::max(r.count, b - r.flat);
        } else {
          u.ranges.push_back({a, b - a, 0});
        }
      }
      u.total = 0;
      for (Range& r : u.ranges) {
        r.at = u.total;
        u.total += r.count;
      }
      if (&u != &units_.back()) largest_unit_ = std::max(largest_unit_, u.total);
    }
    // One micro-batch: forward gathers each unit as its nodes come, backward in reverse and
    // keeps the unit forward ended with.
    gathered_per_pass_ = 0;
    int held = -1;
    auto visit = [&](size_t l) {
      const int u = node_unit_[l];
      if (u < 0 || u == held) return;
      gathered_per_pass_ += units_[size_t(u)].total;
      held = u;
    };
    for (size_t l = 0; l < n; ++l) visit(l);
    for (size_t l = n; l-- > 0;) visit(l);
  }

  void use_unit_of(size_t node) {
    const int u = node_unit_[node];
    if (u < 0 || u == held_) return;
    release_unit();
    gather_unit(size_t(u));
  }

  // Unit u's parameters whole in a transient buffer in the compute dtype (this rank's pieces
  // copied in, the rest all-gathered range by range), and the views of its nodes' parameters
  // pointed into it.
  void gather_unit(size_t u) {
    const Unit& unit = units_[u];
    const DType dt = precision_;
    const size_t es = dtype_size(dt);
    const Device dev = model_.device();
    {
      MemoryScope in(MemCategory::gathered);
      gathered_ = Buffer(size_t(unit.total) * es, dev);
    }
    const Tensor all(gathered_.data(), {unit.total}, dt, dev);
    const Tensor mine = mixed() ? model_.work() : model_.master();  // the shard, compute dtype
    const int64_t lo = owned_begin(), hi = owned_end();
    if (hold_before_gather_) {  // test-only stall holds (and the flight recorder) see it
      observers_.before(Phase::gather, step_);
      hold_before_gather_ = false;
    }
    const auto t0 = Clock::now();
    for (const Range& r : unit.ranges) {
      const Tensor dst = all.slice(r.at, {r.count});
      const int64_t a = std::max(lo, r.flat), b = std::min(hi, r.flat + r.count);
      if (a < b)
        copy_bytes(static_cast<char*>(dst.data) + size_t(a - r.flat) * es, dev,
                   static_cast<const char*>(mine.data) + size_t(a - lo) * es, dev,
                   size_t(b - a) * es);
      reducer_->gather_params(dst, r.flat, step_,
                              int64_t(2 * reducer_->buckets().size()) + position_++, int64_t(u));
    }
    observers_.after(Phase::gather, step_, t0, Clock::now());
    for (size_t l : unit.nodes)
      for (const auto& [p, owner] : model_.node_bindings(l)) {
        const Param& o = model_.params()[owner];
        const Range* r = &unit.ranges.front();
        for (const Range& c : unit.ranges)
          if (c.flat <= o.offset && o.offset < c.flat + c.count) r = &c;
        p->work = all.slice(r->at + (o.offset - r->flat), p->shape);
        if (!mixed()) p->master = p->work;
      }
    held_ = int(u);
  }

  // The held unit's buffer freed and its views emptied (a read of them fails loudly).
  void release_unit() {
    if (held_ < 0) return;
    const Device dev = model_.device();
    for (size_t l : units_[size_t(held_)].nodes)
      for (const auto& [p, owner] : model_.node_bindings(l)) {
        p->work = Tensor(nullptr, p->shape, precision_, dev);
        if (!mixed()) p->master = p->work;
      }
    gathered_ = Buffer();
    held_ = -1;
  }

  // As ZeRO-2: before node `node`'s backward, its bucket's buffer for this reduction, and the
  // bucket's parameters' gradients pointed into it.
  void point_grads_at_bucket(size_t node) {
    const auto [first, count] = model_.layer_params()[node];
    if (count == 0) return;
    const size_t b = param_bucket_[first];
    const Tensor g = reducer_->bucket_grad(b);
    if (pointed_[b] == g.data) return;
    const comm::Bucket& k = reducer_->buckets()[b];
    auto& params = model_.params();
    for (size_t i = k.first_param; i < k.first_param + k.params; ++i)
      params[i].grad = g.slice(params[i].offset - k.offset, params[i].shape);
    pointed_[b] = g.data;
  }

  // fp16/bf16: the fp32 copy of the parameters read in fp32, whole on every rank from each
  // rank's shard of it. Collective; the communication thread is idle (after the reduction).
  void gather_fp32_copy() {
    const Tensor f = model_.fp32_copy();
    if (!mixed() || f.numel() == 0) return;
    std::vector<int64_t> counts;
    for (int r = 0; r < comm_.size(); ++r)
      counts.push_back(model_.fp32_count_in(shards_.begin(r), shards_.end(r)));
    comm_.allgatherv(f.data, counts, DType::f32);
  }

  std::vector<io::NamedTensor> shard_views(const Tensor& shard) const {
    std::vector<io::NamedTensor> views;
    const int64_t begin = owned_begin(), end = owned_end();
    for (const auto& p : model_.params()) {
      const int64_t lo = std::max(p.offset, begin);
      const int64_t hi = std::max(lo, std::min(p.offset + shape_numel(p.shape), end));
      views.push_back({p.name, shard.slice(lo - begin, {hi - lo}), p.shape, lo - p.offset});
    }
    return views;
  }

  comm::ShardLayout shards_;
  std::vector<Unit> units_;     // the last: every node (evaluation)
  std::vector<int> node_unit_;  // per node; -1: reads no parameter
  int64_t largest_unit_ = 0, gathered_per_pass_ = 0;
  Buffer gathered_;  // the held unit's parameters
  int held_ = -1;
  int64_t step_ = 0, position_ = 0;
  bool hold_before_gather_ = false;
  std::vector<size_t> param_bucket_;
  std::vector<void*> pointed_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_zero3(comm::Communicator& comm, kernels::Backend& backend,
                                             Model& model, DType precision,
                                             StepObservers& observers) {
  return std::make_unique<Zero3>(comm, backend, model, precision, observers);
}

}  // namespace ringtrain::launch
