// Where a run starts: the checkpoint to resume (rank 0 locks the checkpoint directory and
// chooses, see choose_checkpoint) and restoring from it, or a fresh start (init on rank 0,
// broadcast); a directory holding only damaged checkpoints is an error, not a fresh start. Also
// fixes the global batch: a resumed run continues the checkpoint's global batch sequence unless
// --global-batch-size says otherwise, on fewer ranks by more micro-batches per step
// (--grad-accum), so that each rank's micro-batch, and its memory, stays as it was.
#include <filesystem>
#include <iostream>

#include "train/model_source.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {

std::string Trainer::choose_checkpoint() {
  // First of all: this job owns the directory (a second job there is an input error naming
  // the holder), so nothing below deletes or renames another job's files.
  if (store_) {
    const std::string warning = store_->lock();
    if (!warning.empty()) std::cerr << cat("ringtrain: warning: ", warning, "\n") << std::flush;
  }
  if (cfg_.resume == "never") {
    if (!store_) return "";
    const auto existing = store_->list();
    if (!existing.empty() && !cfg_.overwrite)
      throw_input(cat("--checkpoint-dir '", cfg_.checkpoint_dir, "' already holds ",
                      existing.size(), " checkpoint(s) (newest ", existing.back(),
                      "); --resume never would mix two runs there. Use --resume auto to "
                      "continue them, another --checkpoint-dir, or --overwrite to delete them"));
    // Starting over: the best checkpoint of the run replaced goes, and with --overwrite the
    // checkpoints and the damaged ones renamed aside by --resume auto.
    std::vector<std::string> remove{(fs::path(cfg_.checkpoint_dir) / "best.h5").string()};
    if (cfg_.overwrite)
      for (const auto& list : {existing, store_->list_invalid()})
        remove.insert(remove.end(), list.begin(), list.end());
    for (const auto& f : remove) {
      std::error_code ec;  // a file that is not there is no error for fs::remove
      fs::remove(f, ec);
      RT_REQUIRE(!ec, "--resume never: cannot delete '", f, "': ", ec.message());
    }
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
  for (const auto& p : strategy_->param_views())
    expected.push_back({"params/" + p.name, p.tensor, p.full_shape});
  for (const auto& b : buffer_views(*model_)) expected.push_back({"buffers/" + b.name, b.tensor});
  for (const auto& s : strategy_->optimizer_views())
    for (const auto& p : s.per_param)
      expected.push_back({"optimizer/" + p.name + "/" + s.state, p.tensor, p.full_shape});
  std::vector<std::pair<std::string, std::string>> skipped;
  const auto latest = store_->latest_valid(
      &skipped, expected, [&](const std::string& file, const io::CheckpointMeta& m) {
        require_same_model(*model_file_, model_from_checkpoint(m, file), file);
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
  // Damaged checkpoints and no good one (now, or renamed aside by an earlier attempt): a
  // fresh start would redo the run's work unnoticed, so it must be asked for.
  auto damaged = store_->list_invalid();
  for (const auto& [file, why] : skipped)
    if (std::error_code ec; fs::exists(file, ec)) damaged.push_back(file);  // rename failed
  if (!damaged.empty()) {
    std::string names;
    for (const auto& f : damaged) {
      if (!names.empty()) names += ", ";
      names += f;
    }
    throw_input(cat("--resume auto: --checkpoint-dir '", cfg_.checkpoint_dir,
                    "' holds no valid checkpoint, only damaged ones (", names,
                    "); to start over from step 0 use --resume never --overwrite (it deletes "
                    "them), or give --resume FILE"));
  }
  return "";
}

void Trainer::make_loader(int64_t global_batch, int64_t grad_accum) {
  global_batch_ = global_batch;
  grad_accum_ = grad_accum;
  RT_REQUIRE(global_batch_ % (dp_size() * grad_accum_) == 0, "the global batch ", global_batch_,
             " does not divide by ", dp_size(), " ranks x --grad-accum ", grad_accum_,
             "; use --global-batch-size with a multiple of ", dp_size() * grad_accum_,
             " or another --grad-accum");
  micro_batch_ = global_batch_ / (dp_size() * grad_accum_);
  // The loader hands out this rank's whole slice of the global batch; the step cuts it into
  // grad_accum micro-batches, so the samples of a step do not depend on ranks or K.
  if (tokens_) {
    RT_REQUIRE(cfg_.augment.empty(), "--augment is for images; token data takes none");
    loader_ = std::make_unique<io::Loader>(*tokens_, cfg_.seed, global_batch_, dp_rank(), dp_size(),
                                           cfg_.prefetch);
  } else {
    loader_ = std::make_unique<io::Loader>(*data_, cfg_.seed, global_batch_, dp_rank(), dp_size(),
                                           norm_, cfg_.prefetch, io::parse_augment(cfg_.augment),
                                           model_->loss().target_kind() != TargetKind::labels);
  }
  total_steps_ = cfg_.steps ? cfg_.steps : cfg_.epochs * loader_->steps_per_epoch();
  schedule_ = std::make_unique<LrSchedule>(cfg_.schedule, cfg_.optimizer.lr, total_steps_);
  lr_ = double(float(schedule_->lr(0)));
  strategy_->set_micro_batches(grad_accum_);
  acc32_storage_ = Buffer();
  acc32_ = Tensor();
  if (grad_accum_ > 1 && !strategy_->reduces_every_micro_batch()) {
    DeviceScope on_device(device_);
    acc32_storage_ =
        Buffer(size_t(model_->num_params()) * 4, default_device(), MemCategory::gradients);
    acc32_ =
        Tensor(acc32_storage_.data(), {model_->num_params()}, DType::f32, acc32_storage_.device());
  }
}

int64_t Trainer::resume_grad_accum(const io::CheckpointMeta& m, int64_t g) const {
  const int64_t w = dp_size();
  if (cfg_.grad_accum_given) return cfg_.grad_accum;
  // The micro-batch to keep: --batch-size if given, else the one the checkpoint's run used.
  const int64_t saved_micro = m.global_batch / std::max<int64_t>(m.world_size * m.grad_accum, 1);
  const int64_t micro = cfg_.batch_size_given ? cfg_.batch_size : saved_micro;
  if (micro > 0 && g % (micro * w) == 0) return g / (micro * w);
  return 1;  // more ranks than the micro-batch allows: smaller micro-batches, one per step
}

void Trainer::start_from(const std::string& path) {
  const int64_t requested = cfg_.global_batch_size ? cfg_.global_batch_size
                                                   : cfg_.batch_size * dp_size() * cfg_.grad_accum;
  if (path.empty()) {  // the strategy makes them every rank's afterwards (start_weights)
    make_loader(requested, cfg_.grad_accum);
    if (!cfg_.init_from.empty()) {  // every rank reads what it holds
      model_->init_parameters(cfg_.seed, *backend_);
      init_weights_from(cfg_.init_from);
      return;
    }
    if (strategy_->initializes_parameters()) model_->init_parameters(cfg_.seed, *backend_);
    return;
  }
  const io::CheckpointMeta m = io::read_checkpoint_meta(path);
  require_same_model(*model_file_, model_from_checkpoint(m, path), path);
  RT_REQUIRE(m.optimizer == optimizer_->name(), "checkpoint '", path,
             "' was trained with --optimizer ", m.optimizer, "; this run asks for ",
             optimizer_->name());
  RT_REQUIRE(m.seed == int64_t(cfg_.seed), "checkpoint '", path, "' was trained with --seed ",
             m.seed, "; this run has --seed ", cfg_.seed, " (the data order would differ)");
  if (tokens_ && !m.tokenizer.empty())
    io::require_same_tokenizer(
        {m.tokenizer, m.tokenizer_sha256, 0}, cat("the training data of checkpoint '", path, "'"),
        io::tokenizer_id_of(tokens_->info()), cat("--data '", cfg_.data, "'"));
  // The global batch sequence continues unless --global-batch-size changes it on purpose.
  int64_t g = m.global_batch > 0 && !cfg_.global_batch_size ? m.global_batch : requested;
  if (m.global_batch > 0 && !cfg_.global_batch_size) {
    RT_REQUIRE(g % dp_size() == 0, "checkpoint '", path, "' continues global batch ", g,
               ", which does not divide by ", dp_size(),
               " ranks; give --global-batch-size (a multiple of ", dp_size(),
               ") to change the global batch");
  }
  const int64_t k = resume_grad_accum(m, g);
  RT_REQUIRE(!cfg_.batch_size_given || cfg_.batch_size * dp_size() * k == g, "--batch-size ",
             cfg_.batch_size, " on ", dp_size(), " ranks x --grad-accum ", k,
             " makes global batch ", cfg_.batch_size * dp_size() * k, ", but checkpoint '", path,
             "' continues global batch ", g, "; use --batch-size ", g / (dp_size() * k),
             ", drop --batch-size, or give --global-batch-size to change it");
  make_loader(g, k);
  const auto t_load = Clock::now();
  if (host_) {  // cuda: read into host copies, then upload
    io::read_checkpoint_params(path, host_->params);
    io::read_checkpoint_buffers(path, host_->buffers);
    io::read_checkpoint_optimizer(path, host_->optimizer);
    host_->upload();
  } else {
    io::read_checkpoint_params(path, strategy_->param_views());  // this rank's part
    io::read_checkpoint_buffers(path, buffer_views(*model_));
    io::read_checkpoint_optimizer(path, strategy_->optimizer_views());
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  optimizer_->set_steps(m.optimizer_step);
  // The loss scale belongs to the precision it was found in: another precision starts anew.
  if (m.precision == dtype_name(cfg_.precision))
    scaler_->restore(float(m.loss_scale), m.growth_tracker);
  loader_->seek(m.data_epoch, m.data_position);
  model_->refresh_working_copy(*backend_);
  step_ = last_saved_step_ = m.step;
  samples_seen_ = m.samples_seen;
  epoch_ = m.data_epoch;
  best_value_ = m.best_value;
  best_step_ = m.best_step;
  evals_since_best_ = m.evals_since_best;
  const int64_t saved_micro = m.global_batch / std::max<int64_t>(m.world_size * m.grad_accum, 1);
  resumed_from_ = cat("resumed from ", path, " at step ", m.step, " (saved by ", m.world_size,
                      " ranks in ", m.precision, ", global batch ", g, ")");
  if (m.global_batch == g && (m.world_size != comm_.size() || m.grad_accum != k))
    resumed_from_ += cat("; global batch ", g, " kept: ", m.world_size, " ranks x ", saved_micro,
                         " x ", m.grad_accum, " micro-batch(es) then, ", comm_.size(), " ranks x ",
                         micro_batch_, " x ", k, " now (--grad-accum ", k, ")");
  resumed_ = true;
  resume_line_ = JsonLine()
                     .add("type", "resume")
                     .add("step", m.step)
                     .add("path", path)
                     .add("saved_world_size", m.world_size)
                     .add("world_size", comm_.size())
                     .add("global_batch", g)
                     .add("saved_grad_accum", m.grad_accum)
                     .add("grad_accum", k)
                     .add("micro_batch", micro_batch_)
                     .add("load_s", load_s)
                     .add("bytes", int64_t(fs::file_size(path)));
}

}  // namespace ringtrain::launch
