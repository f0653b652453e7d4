// Trainer: the training loop of design.md's "one training step", driving core (model,
// optimizer, loss scaler), comm (gradient allreduce) and io (loader, checkpoints), with the
// metrics, progress lines, evaluation and stop-on-signal of the CLI contract.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/grad_reducer.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/loader.hpp"
#include "io/tokens.hpp"
#include "launch/config.hpp"
#include "launch/console.hpp"
#include "launch/device.hpp"
#include "launch/metrics.hpp"
#include "launch/numerics.hpp"
#include "launch/step_observers.hpp"
#include "launch/tensorboard.hpp"
#include "launch/timeline.hpp"
#include "nn/loss_scaler.hpp"
#include "nn/model.hpp"
#include "nn/model_file.hpp"
#include "nn/optimizer.hpp"
#include "nn/schedule.hpp"

namespace ringtrain::launch {

// The fp32 masters as the checkpoint names them: one view per parameter.
std::vector<io::NamedTensor> master_views(Model& model);
std::vector<io::NamedTensor> buffer_views(Model& model);  // BatchNorm running averages etc.

class Trainer {
 public:
  // Sets everything up; input errors are agreed across ranks (JobExit on every rank).
  Trainer(TrainConfig cfg, comm::Communicator& comm);
  // What the constructor checks of the data and the model (with the same messages), and
  // nothing else: --print-config's check before it prints.
  static void check_inputs(TrainConfig cfg, comm::Communicator& comm);
  ~Trainer();
  // Trains to the end (returns 0) or until a stop signal (saves, returns 75).
  int run();

  // What one step agreed on across ranks (one small allreduce per step).
  struct StepOutcome {
    // Over the global batch: the loss summed over samples (a language model's per-sample
    // loss is its mean over tokens), the correct predictions (a language model's: tokens).
    double loss_sum = 0, correct = 0;
    // This rank's seconds: waiting for data, forward + backward, the bucket allreduces
    // (mostly hidden behind backward), the part of them backward did not hide, whole step.
    // (--zero 1: what of the all-gather the next forward waits for counts in that step.)
    double data_s = 0, compute_s = 0, comm_s = 0, exposed_comm_s = 0, step_s = 0;
    bool stop = false;      // some rank got a stop signal
    bool save_due = false;  // --checkpoint-secs elapsed on rank 0
  };
  // One step: this rank's batch, forward, backward, gradient allreduce, unscale + check,
  // optimizer (or skip), each phase reported to the observers (step_observers.hpp). run() is
  // a loop of these; tests drive it directly.
  StepOutcome step_once();

  // --zero 1: a step leaves its all-gather of the working weights in flight; the next
  // step's forward waits node by node for the buckets it reads. This waits for all of it
  // (before anything else reads the weights or calls a collective: evaluation, checkpoints,
  // the end of the run, tests). A no-op when nothing is in flight.
  void finish_weight_gather();

  Model& model() { return *model_; }
  int64_t step() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t grad_accum() const { return grad_accum_; }
  double lr() const { return lr_; }  // of the last step taken

  // What a rank holds, in bytes: fp32 masters (--zero 1: its shard; in fp32 that shard is
  // part of the working weights), optimizer state, working weights (fp32 with --zero 1: the
  // all-gathered full copy; 0 without: the masters themselves), the full fp32 copy of the
  // parameters layers read in fp32 (fp16/bf16 with --zero 1), gradients (compute dtype, fp32
  // shard or whole, wire buffer).
  struct MemoryUse {
    int64_t masters = 0, optimizer = 0, work = 0, fp32_read = 0, grads = 0;
  };
  MemoryUse memory_use() const;
  // Bytes a rank sends per step under the ring model (nccl-tests' bus bytes): the
  // allreduce 2(W-1)/W x S, or under --zero 1 reduce-scatter and all-gather (W-1)/W x S each
  // (S: the buffer in the wire and the working dtype), plus the fp32-read parameters'
  // all-gather.
  struct WireBytes {
    double reduce = 0, gather = 0, gather_fp32 = 0;
  };
  WireBytes wire_bytes() const;

 private:
  struct InputsOnly {};
  Trainer(TrainConfig cfg, comm::Communicator& comm, InputsOnly);
  void setup();
  // Plugins, data and model file (model_file_): the part of setup() that reads the inputs.
  void setup_inputs();
  // The training (and validation) data of the kind the model takes: its sample shape and
  // classes ([T] and the vocabulary for token data) for the model file.
  std::pair<Shape, int64_t> setup_data();
  std::string choose_checkpoint();  // rank 0: the file to resume from, "" for none
  void start_from(const std::string& path);
  // The loader of global batch G in micro-batches of G / (ranks x grad_accum) per rank, and
  // the schedule over the run's steps.
  void make_loader(int64_t global_batch, int64_t grad_accum);
  // Micro-batches per step on resume: --grad-accum as given, else what keeps the micro-batch
  // (--batch-size, or the checkpoint's) with the checkpoint's global batch on this many ranks.
  int64_t resume_grad_accum(const io::CheckpointMeta& m, int64_t global_batch) const;
  void set_decay_groups();  // the optimizer's decay ranges from Param::decay (--decay-all: all)
  void make_reducer();
  // The run's step observers and the layer hooks built on them (after the restore, so the
  // loss-scale warnings count from the restored scale).
  void add_observers();

  // Parts of a step (trainer.cpp). Every micro-batch's forward, loss and backward, summed.
  kernels::XentResult forward_backward_all(const io::Batch& batch, float scale, int64_t step);
  // One micro-batch's; the last one of a step hands its gradients to the reducer as they are
  // ready.
  kernels::XentResult forward_backward(const io::Batch& batch, int64_t micro, float scale,
                                       int64_t step);
  // The loss of the logits against the labels (classifier) or target tokens (language
  // model: logits [B, T, V]), and dlogits.
  kernels::XentResult loss_and_gradient(const Tensor& logits, const Tensor& y, float scale,
                                        const Tensor& dlogits);
  // The sums (wire dtype) checked for inf/nan after the unscale (1 / (loss scale x ranks x
  // micro-batches)); --zero 1: this rank's shard, with its squared norm when clipping. With
  // optimizer_unscales_ a read-only pass, the optimizer multiplying as it reads the sums;
  // else the sums unscaled into the fp32 gradient in the same pass. This rank's view, before
  // the ranks agree.
  struct Unscaled {
    bool nonfinite = false;
    double sum_sq = 0;
    float unscale = 1.f;
  };
  Unscaled unscale_and_check(float scale);
  // One small allreduce agrees on the loss and accuracy sums, a stop signal, a due save,
  // non-finite gradients and the squared norm of the shards; then who was signalled.
  struct Agreed {
    double loss_sum = 0, correct = 0, sum_sq = 0;
    bool stop = false, save_due = false, nonfinite = false;
  };
  Agreed agree_on_step(const kernels::XentResult& xent, const Unscaled& mine);
  void accumulate_micro_grads(int64_t micro);  // micro-batches before the last: into acc32_
  void add_accumulated(size_t param);          // the last one: acc32_ added before the reduce
  // Clip (by the norm whose square, summed over ranks, is `sum_sq` under --zero 1), then the
  // optimizer at the schedule's lr; under --zero 1 on this rank's shard, bucket by bucket,
  // each bucket's working weights all-gathered while the next is updated and while the next
  // step's forward runs (the step returns with the all-gather in flight).
  void apply_update(int64_t step, double sum_sq, float unscale);
  // What the optimizer reads as the gradient: the wire sums (this rank's shard of them)
  // with optimizer_unscales_, else the fp32 gradient (shard_grad()).
  Tensor optimizer_grad() const;
  DType wire_dtype() const;  // of the allreduce
  // --zero 1: this rank's shard of the fp32 gradient (the optimizer's index space).
  Tensor shard_grad() const;
  // --zero 1, the layer hook before node `node`: waits for the buckets of its parameters
  // (and of every earlier node's, which covers a parameter it shares with one of them).
  void wait_for_node_weights(size_t node);
  std::string memory_report() const;  // bytes per rank of the training state and the wire
  // --zero 1: the parameters' parts of this rank's shard of `shard` (a flat fp32 tensor of
  // the shard's size), as the checkpoint's full-shape datasets name them.
  std::vector<io::NamedTensor> shard_views(const Tensor& shard) const;
  // The fp32 masters as the checkpoint names them: master_views(), or its shard's parts.
  std::vector<io::NamedTensor> param_views() const;
  // --zero 1 after a resume read each rank's shard: every rank's full working weights (and
  // the fp32-read parameters) from all shards. Collective.
  void gather_weights();

  // The recipe's loop parts (trainer_recipe.cpp).
  void eval_if_due(bool epoch_done);              // --eval-every and epoch ends (not twice a step)
  void track_best(double loss, double accuracy);  // --keep-best and --early-stop
  void save_best(const std::string& metric, double value);
  void write_start_record();
  void write_stop_record(const char* reason, int code);
  // Rank 0: the stop line after a signal's checkpoint (stdout) and, under a launcher that
  // reports exit code 75 as a failure, one line on stderr saying that it is this stop.
  void announce_stop();
  // The run's summary line (what it did, the best validation, the last checkpoint and how
  // to continue) and its stop record; `reason` as the stop record names it.
  void end_run(const char* reason, int code);
  void write_tensorboard_config();  // hparams and the config as text
  void save_checkpoint();
  bool run_eval();      // false without --val-data
  void sync_buffers();  // rank 0's non-trainable state (BatchNorm running averages) to all
  void say(const std::string& line) { console_.say(line); }  // rank 0, stdout
  void finish_timeline();  // collective: rank 0 writes the merged trace
  // The optimizer state as the checkpoint names it: one view per state and parameter.
  std::vector<io::OptimizerState> optimizer_views() const;

  TrainConfig cfg_;
  comm::Communicator& comm_;
  Device device_;  // cpu, or this rank's GPU (--device cuda): see launch/device.hpp
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Backend> wire_backend_;         // cuda: the wire-dtype casts of buckets
  BatchStage stage_batch_;                                 // cuda: the batch uploaded
  std::unique_ptr<HostMirror> host_;                       // cuda: host copies for checkpoints
  std::unique_ptr<io::Dataset> data_, val_;                // image data, or
  std::unique_ptr<io::TokenDataset> tokens_, val_tokens_;  // token data (a language model)
  std::unique_ptr<io::Loader> loader_;
  std::unique_ptr<ModelFile> model_file_;  // what model_ was built from (resume compares it)
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<io::CheckpointStore> store_;
  std::unique_ptr<comm::GradReducer> reducer_;
  std::unique_ptr<NumericsCheck> numerics_;
  std::unique_ptr<EventWriter> tensorboard_;
  Console console_;  // rank 0's progress, announcements and warnings
  MetricsWriter metrics_;
  Timeline timeline_;
  Buffer grad32_storage_;
  Tensor grad32_;  // --zero 1 in fp16/bf16: only this rank's shard
  // The optimizer reads the wire sums and unscales them itself (the backend supports it, and
  // nothing else reads the fp32 gradient: no clipping, no gradient histograms).
  bool optimizer_unscales_ = false;
  comm::ShardLayout shards_;  // --zero 1: the ranks' shards of the flat buffers
  // --zero 1: per node, the lowest bucket holding a parameter of it or of an earlier node
  // (the last one gathered that it needs; SIZE_MAX: none); per bucket and rank, the
  // fp32-read parameters' elements in both (fp16/bf16); whether a step's all-gather is in
  // flight, and which step's.
  std::vector<size_t> node_bucket_;
  std::vector<std::vector<int64_t>> fp32_counts_;
  bool gather_pending_ = false;
  int64_t gather_step_ = 0;
  OwnedTensor xc_, dlogits_;
  Buffer acc32_storage_;  // --grad-accum > 1: the fp32 sum of the earlier micro-batches
  Tensor acc32_;
  std::unique_ptr<LrSchedule> schedule_;
  double lr_ = 0;
  int64_t global_batch_ = 0, total_steps_ = 0, step_ = 0, samples_seen_ = 0;
  int64_t grad_accum_ = 1, micro_batch_ = 0;
  int64_t last_saved_step_ = -1, epoch_ = 0, last_eval_step_ = -1;
  double best_value_ = 0;  // --keep-best/--early-stop (the checkpoint carries them)
  int64_t best_step_ = -1, evals_since_best_ = 0;
  bool stop_early_ = false;
  io::Normalization norm_;
  JsonLine resume_line_;  // start_from(): the resume record, written when the run starts
  bool resumed_ = false;
  int stop_signal_ = 0, stop_rank_ = 0, stop_ranks_ = 0;  // agreed when a rank got a signal
  std::string resumed_from_;       // what start_state() resumed from, for the first lines
  RunSummary* summary_ = nullptr;  // one of observers_: this run's totals
  std::chrono::steady_clock::time_point last_save_time_;
  // Last: they watch the members above. node_hooks_ reports nodes to the observers;
  // reduce_hooks_ also hands each finished gradient to the reducer (a step's last micro-batch).
  StepObservers observers_;
  LayerHooks node_hooks_, reduce_hooks_;
};

}  // namespace ringtrain::launch
