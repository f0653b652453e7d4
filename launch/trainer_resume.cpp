// Where a run starts: the checkpoint to resume (rank 0 chooses, see choose_checkpoint) and
// restoring from it, or a fresh start (init on rank 0, broadcast). Also fixes the global
// batch: a resumed run continues the checkpoint's global batch sequence unless
// --global-batch-size says otherwise.
#include <filesystem>
#include <iostream>

#include "launch/trainer.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {

std::string Trainer::choose_checkpoint() {
  if (cfg_.resume == "never") {
    if (!store_) return "";
    const auto existing = store_->list();
    if (!existing.empty() && !cfg_.overwrite)
      throw_input(cat("--checkpoint-dir '", cfg_.checkpoint_dir, "' already holds ",
                      existing.size(), " checkpoint(s) (newest ", existing.back(),
                      "); --resume never would mix two runs there. Use --resume auto to "
                      "continue them, another --checkpoint-dir, or --overwrite to delete them"));
    for (const auto& f : existing) fs::remove(f);
    return "";
  }
  if (cfg_.resume != "auto") {
    std::string why;
    RT_REQUIRE(io::validate_checkpoint(cfg_.resume, &why), "--resume '", cfg_.resume,
               "' is not a usable checkpoint: ", why);
    return cfg_.resume;
  }
  if (!store_) return "";
  // Newest first. An intact checkpoint of another model belongs to another run: an error,
  // never silently skipped. A damaged one (checksums, truncation, missing or misshapen
  // datasets) is renamed aside, never deleted, with a warning: it is not chosen again,
  // and pruning by step number cannot prefer it over new checkpoints.
  std::vector<io::NamedTensor> expected;  // every dataset a resume reads, with its shape
  for (const auto& p : master_views(*model_)) expected.push_back({"params/" + p.name, p.tensor});
  for (const auto& b : buffer_views(*model_)) expected.push_back({"buffers/" + b.name, b.tensor});
  for (const auto& s : optimizer_views())
    for (const auto& p : s.per_param)
      expected.push_back({"optimizer/" + p.name + "/" + s.state, p.tensor});
  std::vector<std::pair<std::string, std::string>> skipped;
  const auto latest = store_->latest_valid(
      &skipped, expected, [&](const std::string& file, const io::CheckpointMeta& m) {
        RT_REQUIRE(m.model == model_->spec().to_json(), "checkpoint '", file, "' holds model ",
                   m.model, " but this run builds ", model_->spec().to_json(),
                   "; use the same --model/--hidden/data, another --checkpoint-dir, or "
                   "--resume never --overwrite");
        RT_REQUIRE(m.optimizer == optimizer_->name(), "checkpoint '", file,
                   "' was trained with --optimizer ", m.optimizer, "; this run asks for ",
                   optimizer_->name());
      });
  for (const auto& [file, why] : skipped) {
    std::error_code ec;
    fs::rename(file, file + ".invalid", ec);
    // One write, so that the line never interleaves with stdout through mpirun.
    std::cerr << cat("ringtrain: warning: skipping checkpoint ", file, ": ", why,
                     ec ? "" : cat("; renamed to ", file, ".invalid"), "\n")
              << std::flush;
  }
  if (latest) return *latest;
  return "";
}

void Trainer::make_loader(int64_t global_batch) {
  global_batch_ = global_batch;
  RT_REQUIRE(global_batch_ % comm_.size() == 0, "the global batch ", global_batch_,
             " does not divide by ", comm_.size(),
             " ranks; use --global-batch-size with a multiple of ", comm_.size());
  loader_ = std::make_unique<io::Loader>(*data_, cfg_.seed, global_batch_, comm_.rank(),
                                         comm_.size(), mean_, std_, cfg_.prefetch);
  total_steps_ = cfg_.steps ? cfg_.steps : cfg_.epochs * loader_->steps_per_epoch();
}

void Trainer::start_from(const std::string& path) {
  const int64_t requested =
      cfg_.global_batch_size ? cfg_.global_batch_size : cfg_.batch_size * comm_.size();
  if (path.empty()) {  // the constructor broadcasts rank 0's parameters afterwards
    make_loader(requested);
    if (comm_.rank() == 0) model_->init_parameters(cfg_.seed, *backend_);
    return;
  }
  const io::CheckpointMeta m = io::read_checkpoint_meta(path);
  RT_REQUIRE(m.model == model_->spec().to_json(), "checkpoint '", path, "' holds model ", m.model,
             " but this run builds ", model_->spec().to_json(),
             "; use the same --model/--hidden/data, another --checkpoint-dir, or --resume never");
  RT_REQUIRE(m.optimizer == optimizer_->name(), "checkpoint '", path,
             "' was trained with --optimizer ", m.optimizer, "; this run asks for ",
             optimizer_->name());
  RT_REQUIRE(m.seed == int64_t(cfg_.seed), "checkpoint '", path, "' was trained with --seed ",
             m.seed, "; this run has --seed ", cfg_.seed, " (the data order would differ)");
  // The global batch sequence continues unless --global-batch-size changes it on purpose.
  int64_t g = m.global_batch > 0 && !cfg_.global_batch_size ? m.global_batch : requested;
  if (m.global_batch > 0 && !cfg_.global_batch_size) {
    RT_REQUIRE(g % comm_.size() == 0, "checkpoint '", path, "' continues global batch ", g,
               ", which does not divide by ", comm_.size(),
               " ranks; give --global-batch-size (a multiple of ", comm_.size(),
               ") to change the global batch");
    RT_REQUIRE(!cfg_.batch_size_given || cfg_.batch_size * comm_.size() == g, "--batch-size ",
               cfg_.batch_size, " on ", comm_.size(), " ranks makes global batch ",
               cfg_.batch_size * comm_.size(), ", but checkpoint '", path,
               "' continues global batch ", g, "; use --batch-size ", g / comm_.size(),
               ", drop --batch-size, or give --global-batch-size to change it");
  }
  make_loader(g);
  if (host_) {  // cuda: read into host copies, then upload
    io::read_checkpoint_params(path, host_->params);
    io::read_checkpoint_buffers(path, host_->buffers);
    io::read_checkpoint_optimizer(path, host_->optimizer);
    host_->upload();
  } else {
    io::read_checkpoint_params(path, master_views(*model_));
    io::read_checkpoint_buffers(path, buffer_views(*model_));
    io::read_checkpoint_optimizer(path, optimizer_views());
  }
  optimizer_->set_steps(m.optimizer_step);
  // The loss scale belongs to the precision it was found in: another precision starts anew.
  if (m.precision == dtype_name(cfg_.precision))
    scaler_->restore(float(m.loss_scale), m.growth_tracker);
  loader_->seek(m.data_epoch, m.data_position);
  model_->refresh_working_copy(*backend_);
  step_ = last_saved_step_ = m.step;
  samples_seen_ = m.samples_seen;
  epoch_ = m.data_epoch;
  resumed_from_ = cat("resumed from ", path, " at step ", m.step, " (saved by ", m.world_size,
                      " ranks in ", m.precision, ", global batch ", g, ")");
}

}  // namespace ringtrain::launch
