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
#include "nn/loss_scaler.hpp"
#include "nn/model.hpp"
#include "nn/model_file.hpp"
#include "nn/optimizer.hpp"
#include "nn/schedule.hpp"
#include "train/async_checkpoint.hpp"
#include "train/config.hpp"
#include "train/console.hpp"
#include "train/device.hpp"
#include "train/memory_plan.hpp"
#include "train/metrics.hpp"
#include "train/model_source.hpp"
#include "train/numerics.hpp"
#include "train/step_observers.hpp"
#include "train/strategy.hpp"
#include "train/tensorboard.hpp"
#include "train/timeline.hpp"

namespace ringtrain::launch {

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

  // One step: this rank's batch, forward, backward, gradient reduction, unscale + check,
  // optimizer (or skip), each phase reported to the observers (step_observers.hpp); what the
  // ranks agreed on and this rank's seconds. run() is a loop of these; tests drive it directly.
  StepRecord step_once();

  // A strategy may leave the working weights of a step in flight (an all-gather), the next
  // step's forward waiting node by node for the parts it reads. This waits for all of it
  // (before anything else reads the weights or calls a collective: evaluation, checkpoints,
  // the end of the run, tests). A no-op when nothing is in flight.
  void finish_weight_gather() { strategy_->finish_weight_gather(); }

  Model& model() { return *model_; }
  int64_t step() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t grad_accum() const { return grad_accum_; }
  double lr() const { return lr_; }  // of the last step taken

  // What a rank holds and sends per step, in bytes, as its placement strategy has it.
  using MemoryUse = ParallelStrategy::MemoryUse;
  using WireBytes = ParallelStrategy::WireBytes;
  MemoryUse memory_use() const { return strategy_->memory_use(); }
  // The memory plan of this rank (train/memory_plan.hpp) for the run's batch.
  const MemoryPlan& memory_plan() const { return plan_; }
  WireBytes wire_bytes() const { return strategy_->wire_bytes(); }
  const comm::GradReducer& reducer() const { return *reducer_; }

 private:
  struct InputsOnly {};
  Trainer(TrainConfig cfg, comm::Communicator& comm, InputsOnly);
  void setup();
  // Plugins, data and model file (model_file_): the part of setup() that reads the inputs.
  void setup_inputs();
  void refuse_plugin_parameters() const;  // --zero 3: input error for a plugin op's parameters
  // The training (and validation) data of the kind the model takes: its sample shape and
  // classes ([T] and the vocabulary for token data) for the model file.
  // Input error unless the data holds what the model file's loss reads (labels, float or
  // integer targets).
  void require_targets_fit_loss(const ModelFile& file);
  std::pair<Shape, int64_t> setup_data();
  std::string choose_checkpoint();  // rank 0: the file to resume from, "" for none
  void start_from(const std::string& path);
  void init_weights_from(const std::string& source);  // --init-from (trainer_init.cpp)
  // The loader of global batch G in micro-batches of G / (ranks x grad_accum) per rank, and
  // the schedule over the run's steps.
  void make_loader(int64_t global_batch, int64_t grad_accum);
  // Micro-batches per step on resume: --grad-accum as given, else what keeps the micro-batch
  // (--batch-size, or the checkpoint's) with the checkpoint's global batch on this many ranks.
  int64_t resume_grad_accum(const io::CheckpointMeta& m, int64_t global_batch) const;
  void make_reducer();
  // The memory planner's settings at micro-batch `micro` x `accum`, as the set-up chooses.
  PlanSettings plan_settings(int64_t micro, int64_t accum) const;
  // Before anything is allocated: the plan at the configured batch against --memory-budget
  // (an input error with the figures and what would fit).
  void check_memory_budget();
  // Collective: every rank's measured peaks beside its plan, in the `memory` record and the
  // end-of-run line.
  void report_memory();
  // The run's step observers and the layer hooks built on them (after the restore, so the
  // loss-scale warnings count from the restored scale).
  void add_observers();

  // Parts of a step (trainer.cpp). Every micro-batch's forward, loss and backward, summed.
  kernels::XentResult forward_backward_all(const io::Batch& batch, float scale, int64_t step);
  // One micro-batch's; the last one of a step hands its gradients to the reducer as they are
  // ready.
  kernels::XentResult forward_backward(const io::Batch& batch, int64_t micro, float scale,
                                       int64_t step);
  std::unique_ptr<LossFunction> loss_fn_;  // a model file's loss block (nn/loss.hpp)
  // The loss of the logits against the labels (classifier), the model file's loss against
  // the targets, or target tokens (language model: logits [B, T, V]), and dlogits.
  kernels::XentResult loss_and_gradient(const Tensor& logits, const Tensor& y, float scale,
                                        const Tensor& dlogits);
  // After the reduction: the sums unscaled by 1 / (loss scale x ranks x micro-batches) and
  // checked for inf/nan, as the strategy holds them; this rank's view, before the ranks agree.
  using UnscaledGrads = ParallelStrategy::UnscaledGrads;
  UnscaledGrads unscale_and_check(float scale);
  // One small allreduce agrees on the loss and accuracy sums (into `record`), a stop signal
  // and a due save (into `record`), non-finite gradients and the squared gradient norm (the
  // ranks' shares summed: returned); then who was signalled.
  UnscaledGrads agree_on_step(const kernels::XentResult& xent, const UnscaledGrads& mine,
                              StepRecord& record);
  void accumulate_micro_grads(int64_t micro);  // micro-batches before the last: into acc32_
  void add_accumulated(size_t param);          // the last one: acc32_ added before the reduce
  // Clip (by the norm whose square, summed over ranks, is `agreed.sum_sq`), then the
  // optimizer at the schedule's lr on what this rank updates; the strategy produces the
  // working weights (possibly still in flight when the step returns).
  void apply_update(int64_t step, const UnscaledGrads& agreed);
  DType wire_dtype() const;  // of the gradient reduction

  // The recipe's loop parts (trainer_recipe.cpp).
  void eval_if_due(bool epoch_done);  // --eval-every and epoch ends (not twice a step)
  // --keep-best and --early-stop: `value` is the evaluation's figure of their metric.
  void track_best(double loss, double accuracy, double value);
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
  // Saves this step (collective; nothing when it is saved already). With --async-checkpoint the
  // state is staged and written in the background; `wait` then also waits for the write
  // (a run's last save, a stop, --keep-best's copy).
  void save_checkpoint(bool wait = false);
  io::CheckpointMeta checkpoint_meta() const;         // of this step
  AsyncCheckpointer::State checkpoint_state() const;  // views of what a save writes
  // The checkpoint record of a background save that has finished, if any (rank 0 writes it).
  void report_finished_save();
  bool run_eval();      // false without --val-data
  void sync_buffers();  // rank 0's non-trainable state (BatchNorm running averages) to all
  void say(const std::string& line) { console_.say(line); }  // rank 0, stdout
  void finish_timeline();  // collective: rank 0 writes the merged trace

  TrainConfig cfg_;
  comm::Communicator& comm_;
  // The ranks as tensor-parallel groups x data-parallel replicas (T = 1: the world is
  // data-parallel); the data, batches and gradient averages are per data-parallel rank.
  std::unique_ptr<ProcessGrid> grid_;
  int dp_size() const { return grid_->dp(); }
  int dp_rank() const { return grid_->dp_rank(); }
  // Collective: the grid of --tensor-parallel, its placement agreed.
  void make_grid();
  Device device_;  // cpu, or this rank's GPU (--device cuda): see train/device.hpp
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Backend> wire_backend_;         // cuda: the wire-dtype casts of buckets
  BatchStage stage_batch_;                                 // cuda: the batch uploaded
  std::unique_ptr<HostMirror> host_;                       // cuda: host copies for checkpoints
  std::unique_ptr<io::Dataset> data_, val_;                // image data, or
  std::unique_ptr<io::TokenDataset> tokens_, val_tokens_;  // token data (a language model)
  std::unique_ptr<io::Loader> loader_;
  std::unique_ptr<ModelFile> model_file_;  // what model_ was built from (resume compares it)
  std::string plugins_;                    // plugins_used(*model_file_), for checkpoints
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<io::CheckpointStore> store_;
  std::unique_ptr<AsyncCheckpointer> async_ckpt_;  // --async-checkpoint (destroyed before store_)
  double async_blocking_s_ = 0, async_waited_s_ = 0;  // of the save in flight, for its record
  std::unique_ptr<comm::GradReducer> reducer_;
  // Where parameters, gradients and optimizer state live and how they move (strategy.hpp).
  std::unique_ptr<ParallelStrategy> strategy_;
  std::unique_ptr<NumericsCheck> numerics_;
  std::unique_ptr<EventWriter> tensorboard_;
  Console console_;  // rank 0's progress, announcements and warnings
  MetricsWriter metrics_;
  Timeline timeline_;
  OwnedTensor xc_, dlogits_;
  PlanModel plan_model_;  // the model's shapes, for the memory plan
  MemoryPlan plan_;       // this rank's, at the run's batch
  bool optimizer_unscales_ = false;
  int64_t memory_budget_ = 0;    // bytes per rank; 0: none
  MemoryCounts startup_memory_;  // what set-up held at its peak (before the training's peaks)
  Buffer acc32_storage_;         // --grad-accum > 1: the fp32 sum of the earlier micro-batches
  Tensor acc32_;
  double micro_exposed_comm_s_ = 0;  // the step's reductions of micro-batches before the last
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
