// PrometheusObserver: --prometheus-file, the run's figures in the Prometheus text exposition
// format for node_exporter's textfile collector (docs/formats.md, "Prometheus textfile"):
// step rate, samples (and tokens) per second, loss, loss scale, data wait, exposed
// communication, straggler score, memory per category and checkpoint age, labelled with the
// job id, rank and host. The file is written to PATH.tmp and renamed over PATH every
// --prometheus-every seconds (at a step's end) and after the last step, so a reader never
// sees half a file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/step_observers.hpp"
#include "train/straggler.hpp"

namespace ringtrain::launch {

// "PATH" with "{rank}" replaced by `rank`; "" when PATH has no "{rank}" and rank != 0 (only
// rank 0 writes a shared name).
std::string prometheus_path_for(const std::string& path, int rank);
// Input check of --prometheus-file at start-up: its directory exists and takes files.
void check_prometheus_path(const std::string& path, int rank);

class PrometheusObserver : public StepObserver {
 public:
  struct Labels {
    std::string job, host;
    int rank = 0;
  };
  // `memory`: (category, bytes) of this rank; `straggler` may be null (no detection).
  PrometheusObserver(std::string path, double every_s, Labels labels, int64_t global_batch,
                     int64_t seq_len, std::vector<std::pair<std::string, int64_t>> memory,
                     const StragglerObserver* straggler)
      : path_(std::move(path)),
        every_s_(every_s),
        labels_(std::move(labels)),
        global_batch_(global_batch),
        seq_len_(seq_len),
        memory_(std::move(memory)),
        straggler_(straggler) {}
  void begin_run() override { interval_start_ = Clock::now(); }
  void after(Phase phase, int64_t step, Clock::time_point begin, Clock::time_point end) override;
  void end_step(const StepRecord& record) override;

 private:
  void write(const StepRecord& last);
  std::string path_;
  double every_s_;
  Labels labels_;
  int64_t global_batch_, seq_len_;
  std::vector<std::pair<std::string, int64_t>> memory_;
  const StragglerObserver* straggler_;
  Clock::time_point interval_start_, last_checkpoint_;
  bool checkpointed_ = false, warned_ = false;
  int64_t steps_ = 0;
  double data_s_ = 0, exposed_s_ = 0;  // summed over the interval's steps
  // The last interval's rates, kept until the next one ends.
  double steps_per_s_ = 0, data_per_step_ = 0, exposed_per_step_ = 0;
};

}  // namespace ringtrain::launch
