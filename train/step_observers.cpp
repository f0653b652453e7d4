// The observers of the training step (see step_observers.hpp).
#include "train/step_observers.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "core/fault_injection.hpp"
#include "train/device.hpp"

namespace ringtrain::launch {

void StepObservers::begin_run() {
  for (auto& o : list_) o->begin_run();
}

void StepObservers::begin_step(int64_t step) {
  for (auto& o : list_) o->begin_step(step);
}

void StepObservers::before(Phase phase, int64_t step) {
  for (auto& o : list_) o->before(phase, step);
}

void StepObservers::after(Phase phase, int64_t step, Clock::time_point begin,
                          Clock::time_point end) {
  for (auto& o : list_) o->after(phase, step, begin, end);
}

bool StepObservers::veto_update(comm::Communicator& comm, int64_t step) {
  bool veto = false;
  for (auto& o : list_) veto = o->veto_update(comm, step) || veto;  // each one: collectives
  return veto;
}

void StepObservers::exchange(comm::Communicator& comm, int64_t step) {
  for (auto& o : list_) o->exchange(comm, step);
}

void StepObservers::skipped(int64_t step) {
  for (auto& o : list_) o->skipped(step);
}

void StepObservers::end_step(const StepRecord& record) {
  for (auto& o : list_) o->end_step(record);
}

LayerHooks StepObservers::layer_hooks() {
  LayerHooks h;
  h.after_forward = [this](size_t node, const Tensor& y) {
    for (auto& o : list_) o->after_forward_node(node, y);
  };
  h.after_backward = [this](size_t node, const Tensor& dx) {
    for (auto& o : list_) o->after_backward_node(node, dx);
  };
  return h;
}

// --- TimelineObserver

void TimelineObserver::begin_step(int64_t step) {
  step_ = step;
  tracing_ = timeline_.on(step);
}

void TimelineObserver::after(Phase phase, int64_t step, Clock::time_point begin,
                             Clock::time_point end) {
  if (phase == Phase::forward) last_mark_ = end;  // backward's first node starts here
  if (!timeline_.on(step)) return;                // (a checkpoint's step is the one just finished)
  switch (phase) {
    case Phase::data:
      return timeline_.span("data wait", "data", 0, begin, end, step);
    case Phase::forward:
      return timeline_.span("forward + loss", "forward", 0, begin, end, step);
    case Phase::backward:  // a span per node (after_backward_node)
      return;
    case Phase::reduce:
      timeline_.span("wait for gradients", "comm", 0, begin, end, step);
      for (const auto& s : reducer_.spans())  // the communication thread's (tid 1)
        timeline_.span(cat(sharded_ ? "reduce-scatter" : "allreduce", " bucket ", s.bucket), "comm",
                       1, s.begin, s.end, step);
      return;
    case Phase::unscale:
      return timeline_.span("unscale/check", "optimizer", 0, begin, end, step);
    case Phase::optimizer:
      return timeline_.span(sharded_ ? "optimizer (shard)" : "optimizer", "optimizer", 0, begin,
                            end, step);
    case Phase::gather:
      return timeline_.span("wait for all-gather", "comm", 0, begin, end, step);
    case Phase::checkpoint:
      return timeline_.span("checkpoint", "checkpoint", 0, begin, end, step);
  }
}

void TimelineObserver::after_backward_node(size_t node, const Tensor&) {
  if (!tracing_) return;
  const auto now = Clock::now();
  timeline_.span("backward " + model_.layers()[node]->name(), "backward", 0, last_mark_, now,
                 step_);
  last_mark_ = now;
}

// --- FaultObserver

void FaultObserver::begin_step(int64_t step) {
  step_ = step;
  if (!stall_gather_ && stall_rank_ == rank_ && stall_step_ == step)
    std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds_));
}

void FaultObserver::before(Phase phase, int64_t step) {
  if (phase == Phase::optimizer) maybe_inject_fault("optimizer", step);
  if (phase != Phase::gather || !stall_gather_ || stall_rank_ != rank_ || stall_step_ != step)
    return;
  std::cerr << cat("ringtrain: test: rank ", rank_, " (pid ", getpid(),
                   ") held before the all-gather of step ", step, " for ", stall_seconds_, " s\n")
            << std::flush;
  std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds_));
}

void FaultObserver::after(Phase phase, int64_t step, Clock::time_point, Clock::time_point) {
  if (phase == Phase::forward) maybe_inject_fault("forward", step);
}

void FaultObserver::after_forward_node(size_t node, const Tensor&) {
  if (node == 0 && slow_forward_seconds_ > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(slow_forward_seconds_));
}

void FaultObserver::after_backward_node(size_t, const Tensor&) {
  maybe_inject_fault("backward", step_);
}

// --- NumericsObserver

bool NumericsObserver::veto_update(comm::Communicator& comm, int64_t step) {
  const std::string where = check_.agree(comm);  // collective when enabled
  if (where.empty()) return false;
  console_.warn("numerics", where);
  metrics_.write(JsonLine().add("type", "numerics").add("step", step).add("message", where));
  return true;
}

void NumericsObserver::skipped(int64_t) {
  if (!sharded_) check_.charge_overflow(reducer_.result());
}

// --- SkipReporter

void SkipReporter::skipped(int64_t step) {
  metrics_.write(JsonLine()
                     .add("type", "skip")
                     .add("step", step)
                     .add("reason", "non-finite gradients")
                     .add("loss_scale", double(scaler_.scale())));
  const bool fell = !warned_scale_drop_ && scaler_.scale() <= initial_scale_ / 1024.f;
  if (!scaler_.floor_hit() && !fell) return;
  warned_scale_drop_ = warned_scale_drop_ || fell;
  const std::string worst = numerics_.worst_layer();
  const std::string msg =
      cat(scaler_.floor_hit() ? "loss scale is at its floor " : "loss scale has fallen by 2^10 to ",
          scaler_.scale(), " at step ", step, " and gradients still overflow",
          worst.empty() ? "" : cat("; most often in layer ", worst),
          "; the run is diverging (lower --lr, use bf16, or set --min-scale lower)");
  console_.warn("warning", msg);
  metrics_.write(JsonLine().add("type", "warning").add("step", step).add("message", msg));
}

// --- HistogramObserver

void HistogramObserver::end_step(const StepRecord& r) {
  if (r.step % every_ != 0) return;
  // fp32 masters and this step's gradient (cuda: copied to the host first)
  const float* masters = host_floats(model_.master(), values_[0]);
  const float* grads = host_floats(grad32_, values_[1]);
  for (const auto& par : model_.params()) {
    writer_.histogram("weights/" + par.name, r.step, masters + par.offset, par.master.numel());
    writer_.histogram("gradients/" + par.name, r.step, grads + par.offset, par.master.numel());
  }
}

// --- WindowReporter

namespace {
std::string fixed_str(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
}  // namespace

std::string duration_str(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600) return cat(s / 3600, "h", (s / 60) % 60 < 10 ? "0" : "", (s / 60) % 60, "m");
  if (s >= 60) return cat(s / 60, "m", s % 60 < 10 ? "0" : "", s % 60, "s");
  return cat(s, "s");
}

void WindowReporter::begin_run() { window_start_ = last_draw_ = Clock::now(); }

std::string WindowReporter::window_line(const StepRecord& r, double* samples_per_sec) const {
  const double secs = std::chrono::duration<double>(Clock::now() - window_start_).count();
  const double samples = double(window_steps_ * global_batch_);
  const double tokens = samples * double(std::max<int64_t>(seq_len_, 1));  // scored per sample
  const double loss = sums_.loss_sum / samples, acc = sums_.correct / tokens;
  const double sps = samples / std::max(secs, 1e-9);
  const double eta = double(r.total_steps - r.step) * secs / double(window_steps_);
  const double tps = sps * double(std::max<int64_t>(seq_len_, 1));  // tokens (or samples)/s
  char line[320];
  const std::string loss_part =
      loss_name_.empty() ? cat("loss ", fixed_str(loss, 4), " acc ", fixed_str(acc, 3))
      : accuracy_ ? cat("loss(", loss_name_, ") ", fixed_str(loss, 4), " acc ", fixed_str(acc, 3))
                  : cat("loss(", loss_name_, ") ", fixed_str(loss, 4));
  std::snprintf(line, sizeof line, "step %lld/%lld epoch %lld %s scale %g lr %g %.0f %s/s ETA %s",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps),
                static_cast<long long>(r.epoch), loss_part.c_str(), r.loss_scale, r.lr, tps,
                seq_len_ > 0 ? "tokens" : "samples", duration_str(eta).c_str());
  if (samples_per_sec) *samples_per_sec = sps;
  return line;
}

void WindowReporter::end_step(const StepRecord& r) {
  ++window_steps_;
  sums_.loss_sum += r.loss_sum;
  sums_.correct += r.correct;
  sums_.data_s += r.data_s;
  sums_.compute_s += r.compute_s;
  sums_.comm_s += r.comm_s;
  sums_.exposed_comm_s += r.exposed_comm_s;
  sums_.step_s += r.step_s;
  const double fraction = double(r.step) / double(std::max<int64_t>(r.total_steps, 1));
  if (r.step % log_every_ != 0 && r.step != r.total_steps) {
    // A bar between the window's lines: the window so far, after the first step and on time.
    if (!console_.live()) return;
    const auto now = Clock::now();
    if (drawn_ && std::chrono::duration<double>(now - last_draw_).count() < kRedrawSeconds) return;
    console_.progress(window_line(r, nullptr), fraction);
    drawn_ = true;
    last_draw_ = now;
    return;
  }
  double sps = 0;
  console_.progress(window_line(r, &sps), fraction);
  drawn_ = true;
  last_draw_ = Clock::now();
  maybe_inject_fault("metrics", r.step);
  const double samples = double(window_steps_ * global_batch_);
  const double loss = sums_.loss_sum / samples;
  const double acc = sums_.correct / (samples * double(std::max<int64_t>(seq_len_, 1)));
  const double tps = sps * double(std::max<int64_t>(seq_len_, 1));
  const double n = double(window_steps_);
  if (tensorboard_) {
    for (auto [tag, v] : {std::pair<const char*, double>{"train/loss", loss},
                          {"train/accuracy", acc},
                          {"train/learning_rate", r.lr},
                          {"train/loss_scale", r.loss_scale},
                          {"train/samples_per_sec", sps},
                          {"time/step_s", sums_.step_s / n},
                          {"time/compute_s", sums_.compute_s / n},
                          {"time/exposed_comm_s", sums_.exposed_comm_s / n},
                          {"time/data_wait_s", sums_.data_s / n}})
      tensorboard_->scalar(tag, r.step, v);
    tensorboard_->flush();
  }
  JsonLine rec;
  rec.add("type", "step").add("step", r.step).add("epoch", r.epoch);
  if (!loss_name_.empty()) rec.add("loss_name", loss_name_);
  rec.add("loss", loss);
  if (accuracy_) rec.add("accuracy", acc);
  metrics_.write(rec.add("loss_scale", r.loss_scale)
                     .add("lr", r.lr)
                     .add("samples_per_sec", sps)
                     .add("tokens_per_sec", tps)
                     .add("world_size", world_size_)
                     .add("step_s", sums_.step_s / n)
                     .add("data_wait_s", sums_.data_s / n)
                     .add("compute_s", sums_.compute_s / n)
                     .add("comm_s", sums_.comm_s / n)
                     .add("exposed_comm_s", sums_.exposed_comm_s / n));
  sums_ = StepRecord{};
  window_start_ = Clock::now();
  window_steps_ = 0;
}

// --- RunSummary

void RunSummary::end_step(const StepRecord& r) {
  if (steps_++ == 0) first_step_ = r.step;
  last_step_end_ = Clock::now();
}

void RunSummary::evaluated(int64_t step, double loss, double accuracy) {
  if (best_step_ >= 0 && !(loss < best_loss_)) return;
  best_step_ = step;
  best_loss_ = loss;
  best_accuracy_ = accuracy;
}

std::string RunSummary::totals(int64_t step, int64_t total) const {
  const double wall = std::chrono::duration<double>(Clock::now() - start_).count();
  if (steps_ == 0)
    return cat("no steps to take (at step ", step, " of ", total, "), ", fixed_str(wall, 1), "s");
  const double train_s = std::chrono::duration<double>(last_step_end_ - start_).count();
  const double samples = double(steps_ * global_batch_);
  const double rate = samples * double(std::max<int64_t>(seq_len_, 1)) / std::max(train_s, 1e-9);
  return cat(steps_, " step(s) (", first_step_, "-", step, " of ", total, ") in ",
             fixed_str(wall, 1), "s, ", fixed_str(rate, 0),
             seq_len_ > 0 ? " tokens/s" : " samples/s");
}

std::string RunSummary::best_eval() const {
  if (best_step_ < 0) return "";
  return cat("best val loss ", fixed_str(best_loss_, 4), seq_len_ > 0 ? " nats/token" : "",
             std::isnan(best_accuracy_) ? std::string()
                                        : cat(" (accuracy ", fixed_str(best_accuracy_, 4), ")"),
             " at step ", best_step_);
}

}  // namespace ringtrain::launch
