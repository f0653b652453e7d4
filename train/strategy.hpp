// ParallelStrategy: where a rank's training state lives and how it moves, for the Trainer.
// It decides which parts of the fp32 masters, the fp32 gradient and the optimizer state a
// rank holds, how the gradient buckets are reduced (allreduce, or reduce-scatter into
// shards), how the optimizer's updates become every rank's working weights, what part of each
// tensor a checkpoint writes and reads on this rank, and the bytes all that takes in memory
// and on the wire. One is chosen at start-up from the configuration (make_strategy); the
// Trainer calls it at phase boundaries and knows no stage. Implementations:
// strategy_replicated.cpp (every rank holds everything), strategy_sharded.cpp (ZeRO-1:
// masters, fp32 gradient and optimizer state partitioned; ZeRO-2: the gradient too, from
// the moment backward computes it) and strategy_zero3.cpp (ZeRO-3: the working weights too,
// gathered unit by unit for the nodes that read them).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/grad_reducer.hpp"
#include "comm/shard_layout.hpp"
#include "io/checkpoint.hpp"
#include "nn/model.hpp"
#include "nn/optimizer.hpp"
#include "train/config.hpp"
#include "train/device.hpp"
#include "train/model_source.hpp"
#include "train/process_grid.hpp"
#include "train/step_observers.hpp"

namespace ringtrain::launch {

class ParallelStrategy {
 public:
  // What a rank holds, in bytes: fp32 masters (in fp32 a sharded strategy's shard of them is
  // part of the working weights), optimizer state, working weights (0 when they are the
  // masters themselves), the full fp32 copy of the parameters layers read in fp32 (sharded
  // masters in fp16/bf16), gradients (compute dtype, the fp32 gradient, the wire buffer),
  // and the most bytes of gradient buckets that exist at once (ZeRO-2/3: allocated as
  // backward reaches a bucket and freed when it is reduced; the other strategies keep none);
  // and the most bytes of parameters gathered at once for the nodes running (ZeRO-3).
  struct MemoryUse {
    int64_t masters = 0, optimizer = 0, work = 0, fp32_read = 0, grads = 0, grad_buckets = 0,
            gathered = 0;
  };
  // Bytes a rank sends per step under the ring model (nccl-tests' bus bytes): the gradient
  // reduction (all micro-batches' where each is reduced), the all-gather of working weights
  // and of the fp32-read parameters; and the reference, one allreduce of the gradient.
  struct WireBytes {
    double reduce = 0, gather = 0, gather_fp32 = 0, allreduce = 0;
  };
  // The reduced gradients after the unscale, as one rank sees them: whether its part holds
  // inf/nan, its share of the squared global norm (when clipping; the ranks' shares sum to
  // it) and the factor 1 / (loss scale x ranks x micro-batches).
  struct UnscaledGrads {
    bool nonfinite = false;
    double sum_sq = 0;
    float unscale = 1.f;
  };

  // `observers` hear of the gather phase (a strategy that all-gathers the working weights).
  ParallelStrategy(comm::Communicator& comm, kernels::Backend& backend, Model& model,
                   DType precision, StepObservers& observers);
  virtual ~ParallelStrategy() = default;
  ParallelStrategy(const ParallelStrategy&) = delete;
  ParallelStrategy& operator=(const ParallelStrategy&) = delete;

  // --- Start-up, in this order.
  // Right after the model is built, before it is initialised: the masters this rank keeps.
  virtual void place_parameters() {}
  // The optimizer over the parameters this rank updates (its decay ranges in its index
  // space: `decay_all`, else each parameter's own).
  // Parameters whose name starts with one of `frozen` (--freeze) are never updated.
  std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, bool decay_all,
                                            const std::vector<std::string>& frozen = {});
  // The fp32 gradient the optimizer reads (fp16/bf16; fp32: the model's gradient itself),
  // unless `optimizer_unscales`: the optimizer then reads the reduced sums and unscales them.
  void allocate_gradients(bool optimizer_unscales);
  bool optimizer_unscales() const { return optimizer_unscales_; }
  // The gradient reducer over the model's gradient, configured as this strategy reduces.
  std::unique_ptr<comm::GradReducer> make_reducer(
      comm::ReducerConfig rc, const std::vector<std::pair<int64_t, int64_t>>& ranges,
      const std::vector<size_t>& layer_of);
  // cuda: host copies of what a checkpoint holds on this rank.
  virtual std::unique_ptr<HostMirror> make_host_mirror() const;
  // How many micro-batches a step has (--grad-accum; the wire bytes count them where each is
  // reduced).
  void set_micro_batches(int64_t k) { micro_batches_ = k; }
  // Whether every micro-batch's gradient is reduced (into sharded fp32 sums) instead of the
  // micro-batches being summed into a full-size fp32 buffer and reduced once per step.
  virtual bool reduces_every_micro_batch() const { return false; }
  // Whether this rank draws the initial parameters (the others receive them).
  virtual bool initializes_parameters() const = 0;
  // After the start (a fresh start or this rank's part of a checkpoint read): every rank's
  // masters and working weights as the run starts. Collective.
  virtual void start_weights(bool resumed) = 0;
  // The layer hooks the step gives the model: what the forward waits for, if anything.
  virtual void install_hooks(LayerHooks& /*hooks*/) {}
  // Before micro-batch `micro` of step `step` runs forward.
  virtual void begin_forward(int64_t /*step*/, int64_t /*micro*/) {}
  // Evaluation runs the model without the hooks: a strategy that holds no whole working
  // weights (ZeRO-3) gathers them all (on) and frees them again (off). Collective.
  virtual void hold_whole_weights(bool /*on*/) {}

  // --- A step.
  // After the reduction: the sums this rank owns unscaled and checked for inf/nan (into the
  // fp32 gradient, or a read-only pass when the optimizer unscales), with its share of the
  // squared norm when `clipping`. This rank's view, before the ranks agree.
  UnscaledGrads unscale_and_check(float unscale, bool clipping) const;
  // The fp32 gradient of the parameters this rank updates (what clipping scales).
  Tensor owned_grad() const;
  // What the optimizer reads as the gradient: the reduced sums this rank owns when the
  // optimizer unscales, else owned_grad().
  Tensor optimizer_grad() const;
  // The optimizer on what this rank owns at learning rate `lr` (`grad_scale`: the unscale,
  // when the optimizer applies it), then the working weights from the masters; a strategy
  // may return with that still in flight (finish_weight_gather).
  virtual void update(float lr, float grad_scale, int64_t step) = 0;
  // Waits for working weights still in flight (before anything else reads the weights or
  // calls a collective). A no-op when nothing is.
  virtual void finish_weight_gather() {}

  // --- Checkpoints: what of each tensor this rank writes and reads (full shapes named).
  virtual std::vector<io::NamedTensor> param_views() const = 0;
  virtual std::vector<io::OptimizerState> optimizer_views() const = 0;

  // --- Reports.
  virtual MemoryUse memory_use() const = 0;
  virtual WireBytes wire_bytes() const = 0;
  virtual std::string memory_report() const = 0;  // the run's first line: bytes per rank
  // Whether the reduced gradients are partitioned (no rank holds the whole fp32 gradient:
  // reduce-scatter buckets, the optimizer on a shard).
  virtual bool partitions_gradients() const = 0;
  // The whole fp32 gradient when a rank holds it (histograms read it).
  const Tensor& grad32() const { return grad32_; }

 protected:
  // The flat range [begin, end) of the parameters whose update this rank owns.
  virtual int64_t owned_begin() const = 0;
  virtual int64_t owned_end() const = 0;
  int64_t owned_count() const { return owned_end() - owned_begin(); }
  virtual comm::ShardLayout reduce_layout() const { return {}; }  // empty: allreduce
  // Whether the gradient exists only bucket by bucket, reduced into the fp32 gradient of this
  // rank's shard (ZeRO-2: grad32_ is that shard in any precision, and the reducer's sums).
  virtual bool keeps_gradient_shard_only() const { return false; }
  // The reduced sums of the parameters this rank owns.
  Tensor reduced_sums() const;
  virtual void reducer_made() {}  // after make_reducer: what depends on its buckets
  // What this rank adds to the squared global norm of the fp32 gradient.
  virtual double norm_sq_share() const = 0;
  // A fresh start: rank 0's initial parameters are every rank's. Collective.
  void broadcast_parameters();
  // The gradient bytes: the compute-dtype gradient, the fp32 gradient, the wire buffer.
  int64_t gradient_bytes() const;

  comm::Communicator& comm_;
  kernels::Backend& backend_;
  Model& model_;
  DType precision_;
  StepObservers& observers_;
  Optimizer* optimizer_ = nullptr;        // make_optimizer's
  comm::GradReducer* reducer_ = nullptr;  // make_reducer's
  Buffer grad32_storage_;
  Tensor grad32_;
  bool optimizer_unscales_ = false;
  int64_t micro_batches_ = 1;
};

// The strategy the configuration asks for (--zero 0: replicated, 1: ZeRO-1, 2: ZeRO-2,
// 3: ZeRO-3; --tensor-parallel T > 1: tensor-parallel over `grid`, data-parallel over its DP
// communicator).
std::unique_ptr<ParallelStrategy> make_strategy(const TrainConfig& cfg, comm::Communicator& comm,
                                                const ProcessGrid& grid, kernels::Backend& backend,
                                                Model& model, StepObservers& observers);
// strategy_tensor.cpp: --tensor-parallel T > 1 with --zero 0.
std::unique_ptr<ParallelStrategy> make_tensor_parallel(const ProcessGrid& grid,
                                                       kernels::Backend& backend, Model& model,
                                                       DType precision, StepObservers& observers);
std::unique_ptr<ParallelStrategy> make_replicated(comm::Communicator& comm,
                                                  kernels::Backend& backend, Model& model,
                                                  DType precision, StepObservers& observers);
// stage 1 or 2.
std::unique_ptr<ParallelStrategy> make_sharded(int stage, comm::Communicator& comm,
                                               kernels::Backend& backend, Model& model,
                                               DType precision, StepObservers& observers);
std::unique_ptr<ParallelStrategy> make_zero3(comm::Communicator& comm, kernels::Backend& backend,
                                             Model& model, DType precision,
                                             StepObservers& observers);

}  // namespace ringtrain::launch
