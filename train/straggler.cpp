// Straggler detection (see straggler.hpp).
#include "train/straggler.hpp"

#include <algorithm>
#include <cstdio>

#include "core/error.hpp"

namespace ringtrain::launch {
namespace {

// A rank is a straggler only when it is also this much slower per step than the median.
constexpr double kMinExcessS = 1e-3;

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

void StragglerObserver::after(Phase phase, int64_t step, Clock::time_point begin,
                              Clock::time_point end) {
  // The run's first step carries one-time costs (first touch of every buffer) on every rank.
  if (!warm_) return;
  if (phase == Phase::data) {
    if (steps_ == 0) first_step_ = step;
    data_s_ += std::chrono::duration<double>(end - begin).count();
    data_end_ = end;
  } else if (phase == Phase::reduce) {
    // From the batch in hand to entering the wait for the gradients: forward and backward.
    compute_.push_back(std::chrono::duration<double>(begin - data_end_).count());
    compute_begin_ = data_end_;
    compute_end_ = begin;
    comm_s_ += std::chrono::duration<double>(end - begin).count();
    ++steps_;
  }
}

void StragglerObserver::exchange(comm::Communicator& comm, int64_t step) {
  const bool first_of_run = !warm_;
  warm_ = true;
  if (window_ <= 0 || step % window_ != 0 || (first_of_run && window_ > 1)) return;
  const int n = comm.size();
  const double steps = double(std::max<int64_t>(steps_, 1));
  // The median step's compute: a step or two where the rank lost its core to another
  // process (an oversubscribed or noisy node) does not make it a straggler; a rank slow in
  // most steps is one.
  const double mine[3] = {median_of(compute_), data_s_ / steps, comm_s_ / steps};
  std::vector<double> all(size_t(3 * n));
  comm.allgather(mine, all.data(), 3, DType::f64);
  std::vector<double> compute(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) compute[size_t(r)] = all[size_t(3 * r)];
  const double median = median_of(compute);
  auto ratio = [&](int r) { return median > 0 ? compute[size_t(r)] / median : 1.0; };
  score_ = ratio(rank_);
  if (timeline_ && timeline_->on(step) && n > 1 && score_ > 1 + threshold_ &&
      compute[size_t(rank_)] - median > kMinExcessS) {
    char x[32];
    std::snprintf(x, sizeof x, "%.2fx", score_);
    timeline_->span(
        cat("straggler: compute ", x, " the median (steps ", first_step_, "-", step, ")"),
        "straggler", 0, compute_begin_, compute_end_, step);
  }
  const int64_t first = first_step_;
  steps_ = 0;
  compute_.clear();
  data_s_ = comm_s_ = 0;
  if (rank_ != 0) return;
  int slowest = 0;
  for (int r = 1; r < n; ++r)
    if (compute[size_t(r)] > compute[size_t(slowest)]) slowest = r;
  if (tensorboard_) {
    tensorboard_->scalar("straggler/slowest_ratio", step, ratio(slowest));
    tensorboard_->scalar("straggler/slowest_rank", step, double(slowest));
  }
  auto ms = [](double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
    return std::string(buf);
  };
  for (int r = 0; r < n && n > 1; ++r) {
    const bool slow = ratio(r) > 1 + threshold_ && compute[size_t(r)] - median > kMinExcessS;
    const auto i = size_t(r);
    if (!slow) {
      named_[i] = false;
      continue;
    }
    const double data = all[size_t(3 * r + 1)], wait = all[size_t(3 * r + 2)];
    const std::string& host = i < hosts_.size() ? hosts_[i] : "?";
    metrics_.write(JsonLine()
                       .add("type", "straggler")
                       .add("step", step)
                       .add("first_step", first)
                       .add("rank", r)
                       .add("host", host)
                       .add("compute_s", compute[i])
                       .add("median_compute_s", median)
                       .add("ratio", ratio(r))
                       .add("data_wait_s", data)
                       .add("comm_wait_s", wait)
                       .add("threshold", threshold_));
    if (named_[i]) continue;  // one warning while it stays slow
    named_[i] = true;
    char x[32];
    std::snprintf(x, sizeof x, "%.2fx", ratio(r));
    console_.warn("straggler",
                  cat("rank ", r, " on ", host, " computes ", ms(compute[i]),
                      "/step before the gradient reduction, ", x, " the median ", ms(median),
                      " of ", n, " ranks (steps ", first, "-", step, "; its data wait ", ms(data),
                      ", comm wait ", ms(wait), "; --straggler-threshold ", threshold_, ")"));
  }
}

}  // namespace ringtrain::launch
