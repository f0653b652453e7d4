// Observers of the training step: everything that watches a step without being part of it.
// Trainer::step_once calls them at phase boundaries through StepObservers (in the order they
// were added), so the step itself reads one line per phase. The observers of a run:
//   TimelineObserver   --timeline: a span per phase, per node in backward, per bucket
//   FaultObserver      test-only: RINGTRAIN_TEST_FAIL's step points, --test-stall holds
//   NumericsObserver   --check-numerics (may veto the update), overflow charging per layer
//   SkipReporter       the skip record of a skipped step and the loss-scale warnings
//   HistogramObserver  --tensorboard's weight and gradient histograms (--histogram-every)
//   WindowReporter     per --log-every window: the progress line, the step record, scalars;
//                      a bar is also redrawn on time (every kRedrawSeconds) between them
//   RunSummary         the run's totals for the summary line at its end
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/grad_reducer.hpp"
#include "nn/loss_scaler.hpp"
#include "nn/model.hpp"
#include "train/console.hpp"
#include "train/metrics.hpp"
#include "train/numerics.hpp"
#include "train/tensorboard.hpp"
#include "train/timeline.hpp"

namespace ringtrain::launch {

using Clock = std::chrono::steady_clock;

// The phases of a step, in order (a skipped step has no optimizer or gather phase), and the
// checkpoint written after a step.
enum class Phase {
  data,       // waiting for this rank's batch (and its upload)
  forward,    // one micro-batch's forward and loss
  backward,   // one micro-batch's backward (the last one's buckets reduced as they fill)
  reduce,     // waiting for the gradient buckets still in flight after backward
  unscale,    // unscale + non-finite check into the fp32 gradient
  optimizer,  // clip, then the optimizer (--zero 1: on this rank's shard)
  gather,     // --zero 1: the all-gather of the updated masters
  checkpoint,
};

// A step once it is done: what the reporters see, and what Trainer::step_once returns.
struct StepRecord {
  int64_t step = 0, total_steps = 0, epoch = 0;
  double loss_scale = 1, lr = 0;
  // What the ranks agreed on over the global batch: the loss summed over samples (token
  // data: each window's mean over its tokens) and the correct predictions (token data: the
  // correct tokens, so that accuracy is correct tokens / tokens).
  double loss_sum = 0, correct = 0;
  // This rank's seconds: waiting for data, forward + backward, the bucket allreduces (mostly
  // hidden behind backward), the part of them backward did not hide, the whole step.
  // (A strategy that leaves the working weights in flight: what of them the next forward
  // waits for counts in that step.)
  double data_s = 0, compute_s = 0, comm_s = 0, exposed_comm_s = 0, step_s = 0;
  bool stop = false;      // some rank got a stop signal: all stop after this step
  bool save_due = false;  // --checkpoint-secs elapsed on rank 0
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void begin_run() {}  // the loop starts (after the run's first lines)
  virtual void begin_step(int64_t /*step*/) {}
  virtual void before(Phase /*phase*/, int64_t /*step*/) {}
  virtual void after(Phase /*phase*/, int64_t /*step*/, Clock::time_point /*begin*/,
                     Clock::time_point /*end*/) {}
  virtual void after_forward_node(size_t /*node*/, const Tensor& /*y*/) {}
  virtual void after_backward_node(size_t /*node*/, const Tensor& /*dx*/) {}
  // Collective: called on every rank, on every step, after the ranks agreed on the step's
  // gradients. True when the update must be skipped although the gradients are finite.
  virtual bool veto_update(comm::Communicator& /*comm*/, int64_t /*step*/) { return false; }
  // Collective: called on every rank, on every step, after the ranks agreed on the step and
  // before veto_update: figures an observer trades between ranks (straggler detection).
  virtual void exchange(comm::Communicator& /*comm*/, int64_t /*step*/) {}
  virtual void skipped(int64_t /*step*/) {}  // the update was skipped (after the scaler's update)
  virtual void end_step(const StepRecord& /*record*/) {}
};

// The observers of a run, called in order; the layer hooks the step passes to the model.
class StepObservers {
 public:
  void add(std::unique_ptr<StepObserver> o) { list_.push_back(std::move(o)); }
  void begin_run();
  void begin_step(int64_t step);
  void before(Phase phase, int64_t step);
  void after(Phase phase, int64_t step, Clock::time_point begin, Clock::time_point end);
  bool veto_update(comm::Communicator& comm, int64_t step);  // every observer asked
  void exchange(comm::Communicator& comm, int64_t step);
  void skipped(int64_t step);
  void end_step(const StepRecord& record);
  // after_forward/after_backward of the model's nodes, to every observer.
  LayerHooks layer_hooks();

 private:
  std::vector<std::unique_ptr<StepObserver>> list_;
};

class TimelineObserver : public StepObserver {
 public:
  // `sharded`: --zero 1 (reduce-scatter buckets, the optimizer on a shard, an all-gather).
  TimelineObserver(Timeline& timeline, const Model& model, const comm::GradReducer& reducer,
                   bool sharded)
      : timeline_(timeline), model_(model), reducer_(reducer), sharded_(sharded) {}
  void begin_step(int64_t step) override;
  void after(Phase phase, int64_t step, Clock::time_point begin, Clock::time_point end) override;
  void after_backward_node(size_t node, const Tensor& dx) override;

 private:
  Timeline& timeline_;
  const Model& model_;
  const comm::GradReducer& reducer_;
  bool sharded_;
  int64_t step_ = 0;
  bool tracing_ = false;         // this step is inside --timeline-steps
  Clock::time_point last_mark_;  // where the next backward node's span starts
};

// Test-only: RINGTRAIN_TEST_FAIL's points forward, backward and optimizer (core/
// fault_injection.hpp), RINGTRAIN_TEST_STALL=RANK:STEP:SECONDS[:gather], which holds one rank
// back before a step (or before its all-gather) so that the others' stall detection fires,
// and RINGTRAIN_TEST_SLOW_FORWARD's delay in every forward of one rank (a straggler).
class FaultObserver : public StepObserver {
 public:
  FaultObserver(int rank, int stall_rank, int64_t stall_step, double stall_seconds,
                bool stall_gather, double slow_forward_seconds)
      : rank_(rank),
        stall_rank_(stall_rank),
        stall_step_(stall_step),
        stall_seconds_(stall_seconds),
        stall_gather_(stall_gather),
        slow_forward_seconds_(slow_forward_seconds) {}
  void begin_step(int64_t step) override;
  void before(Phase phase, int64_t step) override;
  void after(Phase phase, int64_t step, Clock::time_point begin, Clock::time_point end) override;
  void after_forward_node(size_t node, const Tensor& y) override;
  void after_backward_node(size_t node, const Tensor& dx) override;

 private:
  int rank_, stall_rank_;
  int64_t stall_step_;
  double stall_seconds_;
  bool stall_gather_;
  double slow_forward_seconds_;  // RINGTRAIN_TEST_SLOW_FORWARD, on this rank (0: none)
  int64_t step_ = 0;
};

// --check-numerics through NumericsCheck: each node's output and gradients looked at, the
// ranks' findings agreed on (one allreduce, when enabled), the step vetoed with one warning
// and a numerics record. Skipped steps are charged to the layers that overflowed (not under
// --zero 1, where no rank holds the whole summed gradient).
class NumericsObserver : public StepObserver {
 public:
  NumericsObserver(NumericsCheck& check, const comm::GradReducer& reducer, bool sharded,
                   Console& console, MetricsWriter& metrics)
      : check_(check), reducer_(reducer), sharded_(sharded), console_(console), metrics_(metrics) {}
  void begin_step(int64_t step) override { check_.begin_step(step); }
  void after_forward_node(size_t node, const Tensor& y) override { check_.after_forward(node, y); }
  void after_backward_node(size_t node, const Tensor& dx) override {
    check_.after_backward(node, dx);
  }
  bool veto_update(comm::Communicator& comm, int64_t step) override;
  void skipped(int64_t step) override;

 private:
  NumericsCheck& check_;
  const comm::GradReducer& reducer_;
  bool sharded_;
  Console& console_;
  MetricsWriter& metrics_;
};

// A skipped step's record, and the warning that the run is diverging: the loss scale at its
// floor, or fallen by 2^10 from `initial_scale` (once), naming the layer that overflows most.
class SkipReporter : public StepObserver {
 public:
  SkipReporter(const LossScaler& scaler, float initial_scale, const NumericsCheck& numerics,
               Console& console, MetricsWriter& metrics)
      : scaler_(scaler),
        initial_scale_(initial_scale),
        numerics_(numerics),
        console_(console),
        metrics_(metrics) {}
  void skipped(int64_t step) override;

 private:
  const LossScaler& scaler_;
  float initial_scale_;
  const NumericsCheck& numerics_;
  Console& console_;
  MetricsWriter& metrics_;
  bool warned_scale_drop_ = false;
};

// Every `every` steps: each parameter's fp32 masters and this step's fp32 gradient
// (`grad32`, the whole gradient: not under --zero 1) as TensorBoard histograms.
class HistogramObserver : public StepObserver {
 public:
  HistogramObserver(Model& model, const Tensor& grad32, int64_t every, EventWriter& writer)
      : model_(model), grad32_(grad32), every_(every), writer_(writer) {}
  void end_step(const StepRecord& record) override;

 private:
  Model& model_;
  const Tensor& grad32_;
  int64_t every_;
  EventWriter& writer_;
  std::vector<float> values_[2];  // cuda: the values staged on the host
};

// The steps of each --log-every window (and the last step) summed into one progress line,
// one step record of the metrics file and TensorBoard scalars (when `tensorboard`). Token
// data (seq_len > 0): the loss is per token already; the line gives tokens/s. With a bar
// (Console::live) the line is also redrawn from the window so far after the first step and
// whenever kRedrawSeconds have passed, so that it moves however large --log-every is.
class WindowReporter : public StepObserver {
 public:
  WindowReporter(int64_t log_every, int64_t global_batch, int64_t seq_len, int world_size,
                 Console& console, MetricsWriter& metrics, EventWriter* tensorboard)
      : log_every_(log_every),
        global_batch_(global_batch),
        seq_len_(seq_len),
        world_size_(world_size),
        console_(console),
        metrics_(metrics),
        tensorboard_(tensorboard) {}
  void begin_run() override;
  void end_step(const StepRecord& record) override;
  // A model file's loss (not softmax cross-entropy on labels): the line and the records name
  // it ("loss(mse) 0.0123"), and give an accuracy only when the loss has one.
  void set_loss(std::string name, bool accuracy) {
    loss_name_ = std::move(name);
    accuracy_ = accuracy;
  }

  static constexpr double kRedrawSeconds = 0.5;

 private:
  // The progress line of the window so far, and its throughput in samples/s.
  std::string window_line(const StepRecord& last, double* samples_per_sec) const;

  int64_t log_every_, global_batch_, seq_len_;
  int world_size_;
  std::string loss_name_;  // empty: the default loss
  bool accuracy_ = true;
  Console& console_;
  MetricsWriter& metrics_;
  EventWriter* tensorboard_;
  Clock::time_point window_start_, last_draw_;
  bool drawn_ = false;  // a line was drawn in this run
  int64_t window_steps_ = 0;
  StepRecord sums_;  // the window's summed losses, correct predictions and seconds
};

// The totals of this run (not of earlier runs a resume continues) for the line that ends it:
// steps, wall time, throughput, and the best validation loss of its evaluations.
class RunSummary : public StepObserver {
 public:
  RunSummary(int64_t global_batch, int64_t seq_len)
      : global_batch_(global_batch), seq_len_(seq_len) {}
  void begin_run() override { start_ = last_step_end_ = Clock::now(); }
  void end_step(const StepRecord& record) override;
  void evaluated(int64_t step, double loss, double accuracy);  // each validation
  // "N steps (A-B of T) in 12.3s, 4567 samples/s": `step` and `total` the trainer's.
  std::string totals(int64_t step, int64_t total) const;
  // The best validation of this run ("best val loss 0.41 (accuracy 0.87) at step 200"), or
  // "" without one.
  std::string best_eval() const;

 private:
  int64_t global_batch_, seq_len_;
  Clock::time_point start_, last_step_end_;
  int64_t steps_ = 0, first_step_ = 0;
  int64_t best_step_ = -1;
  double best_loss_ = 0, best_accuracy_ = 0;
};

// "42s", "3m07s", "2h05m": an ETA for progress lines.
std::string duration_str(double seconds);

}  // namespace ringtrain::launch
