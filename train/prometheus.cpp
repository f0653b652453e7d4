// The Prometheus textfile (see prometheus.hpp).
#include "train/prometheus.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "core/error.hpp"

namespace ringtrain::launch {
namespace {

// A label value as the exposition format quotes it.
std::string label_value(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

std::string prometheus_path_for(const std::string& path, int rank) {
  const size_t at = path.find("{rank}");
  if (at == std::string::npos) return rank == 0 ? path : "";
  return path.substr(0, at) + std::to_string(rank) + path.substr(at + 6);
}

void check_prometheus_path(const std::string& path, int rank) {
  const std::string mine = prometheus_path_for(path, rank);
  if (mine.empty()) return;
  std::filesystem::path dir = std::filesystem::path(mine).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  RT_REQUIRE(std::filesystem::is_directory(dir, ec), "--prometheus-file '", path,
             "': the directory '", dir.string(),
             "' does not exist (node_exporter's textfile directory, created beforehand)");
  RT_REQUIRE(access(dir.c_str(), W_OK) == 0, "--prometheus-file '", path, "': cannot write into '",
             dir.string(), "' (", std::strerror(errno), ")");
}

void PrometheusObserver::after(Phase phase, int64_t, Clock::time_point, Clock::time_point end) {
  if (phase != Phase::checkpoint) return;
  last_checkpoint_ = end;
  checkpointed_ = true;
}

void PrometheusObserver::end_step(const StepRecord& r) {
  ++steps_;
  data_s_ += r.data_s;
  exposed_s_ += r.exposed_comm_s;
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - interval_start_).count();
  if (secs < every_s_ && r.step != r.total_steps) return;
  steps_per_s_ = double(steps_) / std::max(secs, 1e-9);
  data_per_step_ = data_s_ / double(steps_);
  exposed_per_step_ = exposed_s_ / double(steps_);
  steps_ = 0;
  data_s_ = exposed_s_ = 0;
  interval_start_ = now;
  write(r);
}

void PrometheusObserver::write(const StepRecord& r) {
  const std::string labels = cat("job=\"", label_value(labels_.job), "\",rank=\"", labels_.rank,
                                 "\",host=\"", label_value(labels_.host), "\"");
  std::string out;
  auto metric = [&](const char* name, const char* help, double value,
                    const std::string& extra = "") {
    out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n");
    out += cat(name, "{", labels, extra, "} ", number(value), "\n");
  };
  const double samples_per_s = steps_per_s_ * double(global_batch_);
  metric("ringtrain_step", "The last optimizer step finished.", double(r.step));
  metric("ringtrain_steps_per_second", "Optimizer steps per second over the last interval.",
         steps_per_s_);
  metric("ringtrain_samples_per_second", "Samples per second over the last interval, all ranks.",
         samples_per_s);
  if (seq_len_ > 0)
    metric("ringtrain_tokens_per_second", "Tokens per second over the last interval, all ranks.",
           samples_per_s * double(seq_len_));
  metric("ringtrain_loss", "Training loss of the last step (per token for token data).",
         r.loss_sum / double(std::max<int64_t>(global_batch_, 1)));
  metric("ringtrain_loss_scale", "Loss scale after the last step.", r.loss_scale);
  metric("ringtrain_data_wait_seconds", "This rank's wait for its batch, per step.",
         data_per_step_);
  metric("ringtrain_exposed_comm_seconds",
         "This rank's wait for gradient communication after backward, per step.",
         exposed_per_step_);
  if (straggler_)
    metric("ringtrain_straggler_score",
           "This rank's compute before the gradient reduction over the ranks' median, last "
           "--straggler-window (1: the median; 0: no window yet).",
           straggler_->score());
  out += "# HELP ringtrain_memory_bytes Bytes this rank holds, per category.\n";
  out += "# TYPE ringtrain_memory_bytes gauge\n";
  for (const auto& [category, bytes] : memory_)
    out += cat("ringtrain_memory_bytes{", labels, ",category=\"", category, "\"} ", bytes, "\n");
  if (checkpointed_)
    metric("ringtrain_checkpoint_age_seconds", "Seconds since this run's last checkpoint.",
           std::chrono::duration<double>(Clock::now() - last_checkpoint_).count());

  const std::string tmp = cat(path_, ".tmp.", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f && std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (ok) ok = std::rename(tmp.c_str(), path_.c_str()) == 0;
  if (!ok && !warned_) {  // monitoring never stops a run; one line says it is missing
    warned_ = true;
    std::cerr << cat("ringtrain: warning: could not write --prometheus-file '", path_, "' (",
                     std::strerror(errno), "); training goes on\n")
              << std::flush;
  }
}

}  // namespace ringtrain::launch
