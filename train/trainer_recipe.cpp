// The training recipe's parts of the Trainer's loop: evaluation cadence (--eval-every),
// the best checkpoint (--keep-best, DIR/best.h5) and early stopping (--early-stop), the
// records that describe a run to the programs that read its metrics and TensorBoard files
// (start with the configuration, stop with the reason), and the lines that end a run for
// the person watching it (the stop after a signal, the summary).
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/fault_injection.hpp"
#include "io/checkpoint_schema.hpp"
#include "io/hdf5.hpp"
#include "io/meta_checksum.hpp"
#include "ringtrain/config.hpp"
#include "ringtrain/git_commit.hpp"
#include "train/job.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"
#include "train/version.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {
namespace {

// "key = value" lines as (key, value) pairs.
std::vector<std::pair<std::string, std::string>> ini_pairs(const std::string& ini) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(ini);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out.push_back({line.substr(0, eq), line.substr(eq + 3)});
  }
  return out;
}

}  // namespace

void Trainer::eval_if_due(bool epoch_done) {
  const bool cadence = cfg_.eval_every > 0 && step_ % cfg_.eval_every == 0;
  if ((epoch_done || cadence) && last_eval_step_ != step_) run_eval();
}

void Trainer::track_best(double loss, double accuracy, double v) {
  if (summary_) summary_->evaluated(step_, loss, accuracy);
  if (cfg_.keep_best.empty() && cfg_.early_stop == 0) return;
  // The same sums on every rank (allreduced), so every rank takes the same decisions. A
  // metric with no value (nan: e.g. R^2 of constant targets) is no improvement.
  const BestMetric best = parse_best_metric(cfg_.best_metric_text());
  const std::string& metric = best.label;
  const bool better = !std::isnan(v) && (best_step_ < 0 || std::isnan(best_value_) ||
                                         (best.lower ? v < best_value_ : v > best_value_));
  if (better) {
    best_value_ = v;
    best_step_ = step_;
    evals_since_best_ = 0;
    if (!cfg_.keep_best.empty()) save_best(metric, v);
    return;
  }
  ++evals_since_best_;
  if (cfg_.early_stop > 0 && evals_since_best_ >= cfg_.early_stop) stop_early_ = true;
}

void Trainer::save_best(const std::string& metric, double value) {
  save_checkpoint(/*wait=*/true);  // collective; the file complete before it is copied
  maybe_inject_fault("best", step_);
  if (comm_.rank() != 0) return;
  // A copy (not a link, so that its attributes are its own), written as best.h5.tmp,
  // fsync'd and renamed over best.h5: a crash leaves the previous best or the new one.
  const fs::path dir(cfg_.checkpoint_dir);
  const std::string src = store_->path_for(step_);
  const std::string tmp = (dir / "best.h5.tmp").string(), dst = (dir / "best.h5").string();
  std::error_code ec;
  fs::copy_file(src, tmp, fs::copy_options::overwrite_existing, ec);
  RT_REQUIRE(!ec, "--keep-best: cannot copy ", src, " to ", tmp, ": ", ec.message(),
             ec == std::errc::no_space_on_device ? " (the file system is full)" : "");
  {
    io::H5Lock lock;
    io::H5Id f(H5_CHECK(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)));
    io::CheckpointMeta best;
    best.best_metric = metric;
    best.best_value = value;
    best.best_step = step_;
    for (const char* name : {"best_metric", "best_value", "best_step"})
      io::write_checkpoint_attr(f, *io::find_checkpoint_attr("", name), best);
    io::write_meta_checksum(f);  // the attributes changed
    H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
  }
  io::fsync_path(tmp);
  fs::rename(tmp, dst, ec);
  RT_REQUIRE(!ec, "--keep-best: cannot rename ", tmp, " to ", dst, ": ", ec.message());
  io::fsync_path(cfg_.checkpoint_dir, /*dir=*/true);
  say(cat("best ", metric, " ", value, " at step ", step_, ": ", dst));
  metrics_.write(JsonLine()
                     .add("type", "best")
                     .add("step", step_)
                     .add("metric", metric)
                     .add("value", value)
                     .add("path", dst));
}

void Trainer::write_start_record() {
  if (comm_.rank() != 0) return;
  std::string versions = version_text();
  versions.erase(std::remove(versions.begin(), versions.end(), '\0'), versions.end());
  JsonLine config;
  for (const auto& [key, value] : ini_pairs(cfg_.config_ini)) config.add(key, value);
  metrics_.write(JsonLine()
                     .add("type", "start")
                     .add("step", step_)
                     .add("total_steps", total_steps_)
                     .add("world_size", comm_.size())
                     .add("nodes", comm_.num_nodes())
                     .add("global_batch", global_batch_)
                     .add("micro_batch", micro_batch_)
                     .add("grad_accum", grad_accum_)
                     .add("ringtrain_version", RINGTRAIN_VERSION)
                     .add("git_commit", RINGTRAIN_GIT_COMMIT)
                     .add("versions", versions)
                     .add("config", config)
                     .add("async_checkpoint_staging_bytes",
                          int64_t(async_ckpt_ ? async_ckpt_->staging_bytes() : 0)));
  if (resumed_) metrics_.write(resume_line_);
}

void Trainer::write_stop_record(const char* reason, int code) {
  metrics_.write(JsonLine()
                     .add("type", "stop")
                     .add("step", step_)
                     .add("reason", reason)
                     .add("exit_code", code)
                     .add("best_step", best_step_)
                     .add("best_value", best_value_));
}

void Trainer::announce_stop() {
  const std::string who = stop_ranks_ == comm_.size() && comm_.size() > 1
                              ? cat("all ", stop_ranks_, " ranks")
                              : cat("rank ", stop_rank_);
  const std::string ckpt = store_->path_for(step_);
  say(cat("stopped by ", signal_name(stop_signal_), " on ", who, " at step ", step_,
          "; checkpoint ", ckpt, " saved. Run the same command again to continue."));
  const bool under_mpirun = started_by_mpirun();
  if (stop_signal_ == SIGTERM && under_mpirun && stop_ranks_ == comm_.size())
    say("(mpirun forwards Ctrl-C and SIGTERM to every rank as SIGTERM, and itself exits 1 "
        "after Ctrl-C; `kill -USR1 <mpirun pid>` stops the job with exit 75)");
  // The launcher reports the ranks' 75 after this line, in words that read as a failure
  // (Open MPI: "the job has been aborted ... Exit code: 75"; Slurm: "srun: error: ...
  // Exited with exit code 75"): one line on stderr, beside that report, says what it is.
  const char* report = under_mpirun ? "mpirun's \"job has been aborted ... Exit code: 75\" report"
                       : std::getenv("SLURM_STEP_ID") ? "srun's \"error: ... exit code 75\" report"
                       : comm_.size() > 1             ? "the launcher's report of exit code 75"
                                                      : nullptr;
  if (report)
    console_.warn("stop", cat("requested by ", signal_name(stop_signal_), ", done at step ", step_,
                              " with checkpoint ", ckpt, "; ", report,
                              " that follows is this stop, not a failure. Run the same command "
                              "again to continue."));
}

void Trainer::end_run(const char* reason, int code) {
  console_.end_bar();
  std::string line = cat("run summary: ", summary_->totals(step_, total_steps_));
  // The best validation: --keep-best/--early-stop's metric (carried over a resume), else the
  // lowest validation loss of this run's evaluations.
  if (best_step_ >= 0) {
    const std::string metric = parse_best_metric(cfg_.best_metric_text()).label;
    line += cat("; best ", metric, " ", best_value_, " at step ", best_step_);
  } else if (const std::string best = summary_->best_eval(); !best.empty()) {
    line += "; " + best;
  }
  if (cfg_.checkpoint_dir.empty()) {
    line += "; no checkpoint (no --checkpoint-dir): a longer run starts from step 0";
  } else {
    line += cat("; last checkpoint ",
                last_saved_step_ >= 0 ? store_->path_for(last_saved_step_) : std::string("none"));
    if (code != 75)  // (after a stop, the stop line says how to continue)
      line +=
          cat("; to train further, run the same command with a larger --steps or --epochs "
              "(it resumes from the newest checkpoint in ",
              cfg_.checkpoint_dir, ")");
  }
  report_memory();  // (the summary stays the last line)
  say(line);
  write_stop_record(reason, code);
}

void Trainer::report_memory() {
  // Per rank: the training's peak per category and in total, set-up's, and the plan.
  constexpr int k = kMemCategories + 1;
  const MemoryCounts now = memory_counts(device_.kind != Device::cpu);
  std::vector<int64_t> mine(3 * k);
  for (int c = 0; c < kMemCategories; ++c) {
    mine[size_t(c)] = now.peak[size_t(c)];
    mine[size_t(k + c)] = startup_memory_.peak[size_t(c)];
    mine[size_t(2 * k + c)] = plan_.bytes[size_t(c)];
  }
  mine[k - 1] = now.total_peak;
  mine[2 * k - 1] = startup_memory_.total_peak;
  mine[3 * k - 1] = plan_.total();
  std::vector<int64_t> all(mine.size() * size_t(comm_.size()));
  comm_.allgather(mine.data(), all.data(), int64_t(mine.size()), DType::i64);
  if (comm_.rank() != 0) return;
  auto object = [&](const int64_t* v) {
    JsonLine o;
    for (int c = 0; c < kMemCategories; ++c) o.add(mem_category_name(MemCategory(c)), v[c]);
    return o.add("total", v[kMemCategories]);
  };
  std::vector<JsonLine> ranks;
  std::vector<int64_t> largest(size_t(k), 0);
  int64_t startup = 0;
  for (int r = 0; r < comm_.size(); ++r) {
    const int64_t* v = all.data() + size_t(r) * mine.size();
    ranks.push_back(JsonLine()
                        .add("rank", r)
                        .add("peak", object(v))
                        .add("planned", object(v + 2 * k))
                        .add("startup_peak", object(v + k)));
    for (int c = 0; c < k; ++c) largest[size_t(c)] = std::max(largest[size_t(c)], v[c]);
    startup = std::max(startup, v[2 * k - 1]);
  }
  std::string line = cat("memory peak/rank (measured, the largest of ", comm_.size(),
                         " rank(s); [rank 0's plan]):");
  for (int c = 0; c < k; ++c)
    line +=
        cat(c ? ", " : " ", c < kMemCategories ? mem_category_name(MemCategory(c)) : "total", " ",
            human_bytes(largest[size_t(c)]), " [", human_bytes(mine[size_t(2 * k + c)]), "]");
  say(line + cat("; set-up peak ", human_bytes(startup)));
  metrics_.write(JsonLine()
                     .add("type", "memory")
                     .add("step", step_)
                     .add("world_size", comm_.size())
                     .add("device", device_str(device_))
                     .add("zero", cfg_.zero)
                     .add("micro_batch", micro_batch_)
                     .add("budget", memory_budget_)
                     .add("ranks", ranks));
}

void Trainer::write_tensorboard_config() {
  if (!tensorboard_) return;
  const auto pairs = ini_pairs(cfg_.config_ini);
  tensorboard_->hparams(pairs);
  std::string table = "| option | value |\n|---|---|\n";
  for (const auto& [key, value] : pairs) table += cat("| ", key, " | ", value, " |\n");
  tensorboard_->text("config", step_, table);
  tensorboard_->flush();
}

}  // namespace ringtrain::launch
