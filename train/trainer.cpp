// The training loop (see trainer.hpp): the step, phase by phase, with its observers called at
// the phase boundaries; checkpoints, evaluation and the run loop with its stop on a signal.
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/rng.hpp"
#include "ringtrain/config.hpp"
#include "train/evaluate.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"
#include "train/signals.hpp"

namespace ringtrain::launch {

// Micro-batch `micro` of this rank's slice: rows [micro * b, (micro + 1) * b).
static Tensor micro_rows(const Tensor& t, int64_t micro, int64_t b) {
  Shape s = t.shape;
  s[0] = b;
  return t.slice(micro * b * (t.numel() / t.shape[0]), s);
}

kernels::XentResult Trainer::forward_backward_all(const io::Batch& batch, float scale,
                                                  int64_t step) {
  kernels::XentResult xent;
  micro_exposed_comm_s_ = 0;
  for (int64_t micro = 0; micro < grad_accum_; ++micro) {
    const auto r = forward_backward(batch, micro, scale, step);
    xent.loss_sum += r.loss_sum;
    xent.correct += r.correct;
  }
  return xent;
}

kernels::XentResult Trainer::forward_backward(const io::Batch& batch, int64_t micro, float scale,
                                              int64_t step) {
  const bool last = micro + 1 == grad_accum_;
  observers_.before(Phase::forward, step);
  const auto t0 = Clock::now();
  // Dropout's stream is that of the micro-batch's place in the global batch, so it does not
  // change when ranks and micro-batches trade places (4 ranks x 1 = 2 ranks x 2).
  const uint64_t slots = uint64_t(dp_size()) * uint64_t(grad_accum_);
  const uint64_t slot = uint64_t(dp_rank()) * uint64_t(grad_accum_) + uint64_t(micro);
  Context ctx{*backend_, cfg_.precision, true,
              mix_seed(mix_seed(cfg_.seed, hash_name("dropout")), uint64_t(step) * slots + slot)};
  const Tensor xb = micro_rows(batch.x, micro, micro_batch_);
  const Tensor yb = micro_rows(batch.y, micro, micro_batch_);
  const Tensor* x = &xb;
  if (cfg_.precision != DType::f32 && is_float(xb.dtype)) {  // token ids stay int32
    MemoryScope in(MemCategory::activations);
    backend_->cast(xb, xc_.ensure(xb.shape, cfg_.precision));
    x = &xc_.view;
  }
  strategy_->begin_forward(step, micro);
  const Tensor& logits = model_->forward(ctx, *x, node_hooks_);
  finish_weight_gather();  // nodes that read no parameter leave nothing else to wait for
  Tensor& dlogits = [&]() -> Tensor& {
    MemoryScope in(MemCategory::activations);
    return dlogits_.ensure(logits.shape, DType::f32);
  }();
  auto xent = loss_and_gradient(logits, yb, scale, dlogits);
  const auto t_forward = Clock::now();
  observers_.after(Phase::forward, step, t0, t_forward);
  observers_.before(Phase::backward, step);
  const bool each = strategy_->reduces_every_micro_batch();  // into sharded fp32 sums
  if (!last && !each) {  // no communication before the last micro-batch (DDP's no_sync)
    model_->backward(ctx, dlogits, node_hooks_);
    accumulate_micro_grads(micro);
    observers_.after(Phase::backward, step, t_forward, Clock::now());
    return xent;
  }
  reducer_->start_step(step, each && micro > 0);
  model_->backward(ctx, dlogits, reduce_hooks_);  // buckets allreduced as they fill
  observers_.after(Phase::backward, step, t_forward, Clock::now());
  // A micro-batch before the last: its reduction done before the next one's backward.
  if (!last) micro_exposed_comm_s_ += reducer_->finish();
  return xent;
}

kernels::XentResult Trainer::loss_and_gradient(const Tensor& logits, const Tensor& y, float scale,
                                               const Tensor& dlogits) {
  if (!model_->loss().is_default()) {
    if (!loss_fn_) loss_fn_ = std::make_unique<LossFunction>(model_->loss());
    return loss_fn_->apply(*backend_, logits, y, scale, &dlogits, cfg_.label_smoothing);
  }
  if (logits.shape.size() != 3)
    return backend_->softmax_xent(logits, y, scale, &dlogits, cfg_.label_smoothing);
  // A language model: logits [B, T, V] against targets [B, T], the cross-entropy of every
  // token over the data's vocabulary (the first `classes` of V, which may be padded). The
  // loss is the mean over tokens, reported per sample as that mean (sum / T); the correct
  // predictions stay a count of tokens (the reporters divide by samples x T).
  RT_REQUIRE(cfg_.label_smoothing == 0.f,
             "--label-smoothing is for classifiers; a language "
             "model's token loss takes none");
  auto r = backend_->token_xent(logits, y, model_->classes(), scale, &dlogits);
  r.loss_sum /= double(logits.dim(1));
  return r;
}

void Trainer::accumulate_micro_grads(int64_t micro) {
  if (micro == 0)
    backend_->cast(model_->grad(), acc32_);
  else
    backend_->add(acc32_, model_->grad(), acc32_);
}

void Trainer::add_accumulated(size_t param) {
  if (acc32_.data == nullptr) return;  // one micro-batch, or each one reduced
  const Param& p = model_->params()[param];
  // Summed in fp32, rounded once to the compute dtype for the allreduce.
  backend_->add(acc32_.slice(p.offset, p.shape), p.grad, p.grad);
}

void Trainer::apply_update(int64_t step, const UnscaledGrads& agreed) {
  if (cfg_.grad_clip > 0.f) {
    const double norm = std::sqrt(agreed.sum_sq);
    if (norm > cfg_.grad_clip)
      backend_->scale(strategy_->owned_grad(), float(cfg_.grad_clip / (norm + 1e-6)));
  }
  const auto t_opt = Clock::now();
  observers_.before(Phase::optimizer, step);
  // The schedule's position is the steps before this one; lr_ is the fp32 value applied.
  lr_ = double(float(schedule_->lr(step - 1)));
  strategy_->update(float(lr_), strategy_->optimizer_unscales() ? agreed.unscale : 1.f, step);
  observers_.after(Phase::optimizer, step, t_opt, Clock::now());
  if (!cfg_.overlap) finish_weight_gather();  // --no-overlap: the weights whole, now
}

Trainer::UnscaledGrads Trainer::unscale_and_check(float scale) {
  const float unscale = 1.f / (scale * float(dp_size()) * float(grad_accum_));
  return strategy_->unscale_and_check(unscale, cfg_.grad_clip > 0.f);
}

Trainer::UnscaledGrads Trainer::agree_on_step(const kernels::XentResult& xent,
                                              const UnscaledGrads& mine, StepRecord& record) {
  const bool save_due =
      comm_.rank() == 0 && cfg_.checkpoint_secs > 0 &&
      std::chrono::duration<double>(Clock::now() - last_save_time_).count() >= cfg_.checkpoint_secs;
  // The ranks of a tensor-parallel group compute the same loss: its rank 0 counts it.
  const bool counts_loss = grid_->tp_rank() == 0;
  double reduced[6] = {counts_loss ? xent.loss_sum : 0., counts_loss ? double(xent.correct) : 0.,
                       stop_requested() ? 1. : 0.,       save_due ? 1. : 0.,
                       mine.nonfinite ? 1. : 0.,         mine.sum_sq};
  comm_.allreduce(reduced, 6, DType::f64, comm::ReduceOp::sum);
  if (reduced[2] > 0) {  // rare: which rank (the lowest) received which signal
    int64_t who =
        stop_requested() ? (int64_t(stop_signal()) << 32) | (comm_.size() - comm_.rank()) : 0;
    comm_.allreduce(&who, 1, DType::i64, comm::ReduceOp::max);
    stop_signal_ = int(who >> 32);
    stop_rank_ = comm_.size() - int(who & 0xffffffff);
    stop_ranks_ = int(reduced[2]);
  }
  record.loss_sum = reduced[0];
  record.correct = reduced[1];
  record.stop = reduced[2] > 0;
  record.save_due = reduced[3] > 0;
  UnscaledGrads agreed = mine;
  agreed.nonfinite = reduced[4] > 0;  // some rank's part overflowed
  agreed.sum_sq = reduced[5];
  return agreed;
}

StepRecord Trainer::step_once() {
  const int64_t step = step_ + 1;
  grid_->set_step(step);
  observers_.begin_step(step);
  StepRecord r;
  observers_.before(Phase::data, step);
  const auto t_start = Clock::now();
  const io::Batch& batch = stage_batch_(loader_->next(), device_);  // cuda: uploaded
  const auto t_data = Clock::now();
  observers_.after(Phase::data, step, t_start, t_data);
  DeviceScope on_device(device_);  // activations and scratch (after the loader's host batch)
  epoch_ = batch.epoch;
  const float scale = scaler_->scale();
  const kernels::XentResult xent = forward_backward_all(batch, scale, step);
  const auto t_backward = Clock::now();
  observers_.before(Phase::reduce, step);
  // What of the reduction backward did not hide.
  r.exposed_comm_s = micro_exposed_comm_s_ + reducer_->finish();
  const auto t_reduced = Clock::now();
  observers_.after(Phase::reduce, step, t_backward, t_reduced);
  observers_.before(Phase::unscale, step);
  const UnscaledGrads mine = unscale_and_check(scale);
  observers_.after(Phase::unscale, step, t_reduced, Clock::now());
  const UnscaledGrads agreed = agree_on_step(xent, mine, r);
  observers_.exchange(comm_, step);                              // straggler figures (collective)
  const bool veto = observers_.veto_update(comm_, step);         // --check-numerics (collective)
  const bool apply = scaler_->update(agreed.nonfinite || veto);  // the same on every rank
  if (apply)
    apply_update(step, agreed);
  else
    observers_.skipped(step);
  ++step_;
  samples_seen_ += global_batch_;
  r.step = step_;
  r.total_steps = total_steps_;
  r.epoch = epoch_;
  r.loss_scale = double(scaler_->scale());
  r.lr = lr_;
  r.data_s = std::chrono::duration<double>(t_data - t_start).count();
  r.compute_s = std::chrono::duration<double>(t_backward - t_data).count();
  r.comm_s = reducer_->comm_seconds();
  r.step_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return r;
}

io::CheckpointMeta Trainer::checkpoint_meta() const {
  io::CheckpointMeta m;
  m.step = step_;
  m.epoch = loader_->epoch();
  m.samples_seen = samples_seen_;
  m.world_size = comm_.size();
  m.global_batch = global_batch_;
  m.precision = dtype_name(cfg_.precision);
  m.model = model_->text();
  m.ringtrain_version = RINGTRAIN_VERSION;
  m.plugins = plugins_;
  m.data_epoch = loader_->epoch();
  m.data_position = loader_->position();
  m.loss_scale = scaler_->scale();
  m.growth_tracker = scaler_->growth_tracker();
  m.optimizer = optimizer_->name();
  m.optimizer_step = optimizer_->steps();
  m.seed = int64_t(cfg_.seed);
  if (data_) {  // token ids take no normalisation
    const auto& info = data_->info();
    m.input_mean = info.has_norm ? info.mean : 0.0;
    m.input_std = info.has_norm ? info.std : 1.0;
    m.input_channel_mean = info.channel_mean;
    m.input_channel_std = info.channel_std;
  }
  if (tokens_) {
    const auto& info = tokens_->info();
    m.tokenizer = info.tokenizer;
    m.tokenizer_sha256 = info.tokenizer_sha256;
    if (!info.tokenizer_sha256.empty())
      m.tokenizer_data = std::filesystem::absolute(tokens_->shard(0).path()).string();
  }
  m.grad_accum = grad_accum_;
  m.best_value = best_value_;
  m.best_step = best_step_;
  m.evals_since_best = evals_since_best_;
  return m;
}

AsyncCheckpointer::State Trainer::checkpoint_state() const {
  if (host_) return {host_->params, host_->optimizer, host_->buffers};  // cuda: host copies
  return {strategy_->param_views(), strategy_->optimizer_views(), buffer_views(*model_)};
}

void Trainer::save_checkpoint(bool wait) {
  finish_weight_gather();
  if (cfg_.checkpoint_dir.empty() || last_saved_step_ == step_) {
    if (wait && async_ckpt_) {
      async_ckpt_->wait();
      report_finished_save();
    }
    return;
  }
  observers_.before(Phase::checkpoint, step_);
  const auto t_ckpt = Clock::now();
  // Collective: every rank writes its share (an error ends the job: run_or_fail, or the
  // background writer's fail_job).
  const io::CheckpointMeta m = checkpoint_meta();
  sync_buffers();
  if (host_) host_->download();  // cuda: the store writes host memory
  if (async_ckpt_) {
    // At most one save in flight: a due save first waits for the previous one, whose record
    // is written before this one starts.
    const double waited = async_ckpt_->wait();
    report_finished_save();  // the previous save's record, with its own waited_s
    async_ckpt_->start(m, checkpoint_state());
    async_waited_s_ = waited;
    async_blocking_s_ = std::chrono::duration<double>(Clock::now() - t_ckpt).count();
    last_saved_step_ = step_;
    last_save_time_ = Clock::now();
    observers_.after(Phase::checkpoint, step_, t_ckpt, last_save_time_);
    if (wait) {
      async_ckpt_->wait();
      report_finished_save();
    }
    return;
  }
  const AsyncCheckpointer::State state = checkpoint_state();
  const uint64_t bytes =
      store_->save(comm_.mpi(), m, state.params, state.optimizer, {}, state.buffers);
  const double secs = std::chrono::duration<double>(Clock::now() - t_ckpt).count();
  if (comm_.rank() == 0)
    metrics_.write(JsonLine()
                       .add("type", "checkpoint")
                       .add("step", step_)
                       .add("path", store_->path_for(step_))
                       .add("seconds", secs)
                       .add("bytes", int64_t(bytes))
                       .add("blocking_s", secs)
                       .add("async", false));
  last_saved_step_ = step_;
  last_save_time_ = Clock::now();
  observers_.after(Phase::checkpoint, step_, t_ckpt, last_save_time_);
}

void Trainer::report_finished_save() {
  if (!async_ckpt_) return;
  const auto done = async_ckpt_->take_finished();
  if (!done || comm_.rank() != 0) return;
  metrics_.write(JsonLine()
                     .add("type", "checkpoint")
                     .add("step", done->step)
                     .add("path", store_->path_for(done->step))
                     .add("seconds", done->seconds)
                     .add("bytes", int64_t(done->bytes))
                     .add("blocking_s", async_blocking_s_)
                     .add("waited_s", async_waited_s_)
                     .add("async", true));
}

namespace {
std::string fixed4(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}
}  // namespace

bool Trainer::run_eval() {
  finish_weight_gather();
  if (!val_ && !val_tokens_) return false;
  last_eval_step_ = step_;
  sync_buffers();
  // Collective (its sums): an error in it ends the job from the rank that saw it.
  // Token data: the training micro-batch of windows (its [B, T, V] logits fit); images: 256.
  const int64_t batch = val_tokens_ ? micro_batch_ : std::max<int64_t>(256, micro_batch_);
  const bool own_loss = !val_tokens_ && model_->loss().own_evaluation();
  strategy_->hold_whole_weights(true);  // --zero 3: gathered for the evaluation
  const EvalResult r = val_tokens_ ? evaluate_tokens(*model_, *val_tokens_, comm_, *backend_, batch,
                                                     cfg_.eval_windows)
                       : own_loss  ? evaluate_loss(*model_, *val_, comm_, *backend_, batch, norm_)
                                   : evaluate(*model_, *val_, comm_, *backend_, batch, norm_);
  strategy_->hold_whole_weights(false);
  char line[240];
  // -1: not byte tokens (no bits/byte)
  const double bits = val_tokens_ ? bits_per_byte(val_tokens_->info(), r.loss).value_or(-1) : -1;
  if (val_tokens_) {
    char bpb[40] = "";
    if (bits >= 0) std::snprintf(bpb, sizeof bpb, " (%.4f bits/byte)", bits);
    std::snprintf(
        line, sizeof line,
        "eval step %lld: val loss %.4f nats/token%s accuracy %.4f (%lld%s windows of "
        "%lld tokens, computed in %s)",
        static_cast<long long>(step_), r.loss, bpb, r.accuracy, static_cast<long long>(r.samples),
        r.samples < val_tokens_->num_windows() ? cat(" of ", val_tokens_->num_windows()).c_str()
                                               : "",
        static_cast<long long>(val_tokens_->seq_len()), dtype_name(model_->compute_dtype()));
  } else if (own_loss) {
    std::string metrics;
    for (const auto& [name, value] : r.metrics) metrics += cat(" ", name, " ", fixed4(value));
    std::snprintf(
        line, sizeof line, "eval step %lld: val loss(%s) %.4f%s (%lld samples, computed in %s)",
        static_cast<long long>(step_), model_->loss().name().c_str(), r.loss, metrics.c_str(),
        static_cast<long long>(r.samples), dtype_name(model_->compute_dtype()));
  } else {
    std::snprintf(line, sizeof line,
                  "eval step %lld: val loss %.4f accuracy %.4f (%lld samples, computed in %s)",
                  static_cast<long long>(step_), r.loss, r.accuracy,
                  static_cast<long long>(r.samples), dtype_name(model_->compute_dtype()));
  }
  say(line);
  if (tensorboard_) {
    tensorboard_->scalar("val/loss", step_, r.loss);
    tensorboard_->scalar("val/accuracy", step_, r.accuracy);
    tensorboard_->flush();
  }
  JsonLine record;
  record.add("type", "eval").add("step", step_).add("split", "val");
  if (own_loss) record.add("loss_name", model_->loss().name());
  record.add("loss", r.loss);
  if (!own_loss || model_->loss().reports_accuracy()) record.add("accuracy", r.accuracy);
  for (const auto& [name, value] : r.metrics)
    if (name != "accuracy") record.add(name, value);
  record.add("precision", dtype_name(model_->compute_dtype()));
  if (val_tokens_) record.add("windows", r.samples).add("tokens", r.tokens);
  if (bits >= 0) record.add("bits_per_byte", bits);
  metrics_.write(record);
  const bool has_accuracy =
      !own_loss || model_->loss().reports_accuracy() ||
      std::count(model_->loss().metrics.begin(), model_->loss().metrics.end(), "accuracy") > 0;
  const BestMetric best = parse_best_metric(cfg_.best_metric_text());
  double value = NAN;
  if (best.name == "loss")
    value = r.loss;
  else if (best.name == "accuracy")
    value = has_accuracy ? r.accuracy : NAN;
  else
    for (const auto& [name, v] : r.metrics)
      if (name == best.name) value = v;
  track_best(r.loss, has_accuracy ? r.accuracy : NAN, value);
  return true;
}

int Trainer::run() {
  say(cat("ringtrain ", RINGTRAIN_VERSION, ": ", comm_.size(), " rank(s) on ", comm_.num_nodes(),
          " node(s), ", grid_->tp() > 1 ? grid_->describe() + ", " : std::string(), "device ",
          device_str(device_), ", ", backend_->threads(), " thread(s)/rank (from ",
          threads_rule(cfg_.threads, comm_), "), precision ", dtype_name(cfg_.precision),
          cfg_.precision == DType::f32 ? "" : " (fp32 masters)", ", global batch ", global_batch_,
          " (", micro_batch_, "/rank",
          grad_accum_ > 1 ? cat(" x ", grad_accum_, " micro-batches") : std::string(), "), comm ",
          comm_.backend(), " in ", dtype_name(reducer_->result().dtype), ", ",
          reducer_->buckets().size(), " gradient bucket(s)", cfg_.overlap ? " overlapped" : "",
          device_.kind == Device::cpu ? cat("; ", kernels::describe_cpu_gemm()) : std::string(),
          "; ", strategy_->memory_report(),
          async_ckpt_
              ? cat("; async checkpoint staging ", int64_t(async_ckpt_->staging_bytes()), " B")
              : std::string()));
  const std::string data_line =
      tokens_
          ? cat("data '", tokens_->info().path, "': ", tokens_->info().num_tokens,
                " tokens (vocabulary ", tokens_->info().vocab_size, ", tokenizer '",
                tokens_->info().tokenizer, "'), ", loader_->num_samples(), " windows of ",
                tokens_->seq_len(), " tokens, ", global_batch_ * tokens_->seq_len(), " tokens/step")
          : cat("data '", data_->info().path, "': ", data_->info().num_samples, " samples of ",
                shape_str(data_->info().sample_shape), ", ", data_->info().num_classes, " classes");
  say(cat(data_line, "; model '", model_file_->name(), "' (", model_file_->origin(), ") with ",
          model_->layers().size(), " nodes, ", model_->num_params(), " parameters; ",
          loader_->steps_per_epoch(), " steps/epoch, ", total_steps_, " steps"));
  if (!resumed_from_.empty()) say(resumed_from_);
  say(cat("memory plan/rank (rank 0 of ", comm_.size(), ", --zero ", cfg_.zero, ", ", micro_batch_,
          " sample(s)/micro-batch): ", plan_summary(plan_),
          memory_budget_ > 0 ? cat(" of --memory-budget ", human_bytes(memory_budget_))
                             : std::string()));
  announce_device(device_, cfg_.precision, comm_);
  write_start_record();
  write_tensorboard_config();
  last_save_time_ = Clock::now();
  // From here the peaks are the training's; set-up's (e.g. the full masters a model is built
  // with before --zero 1 keeps its shard) are reported beside them.
  startup_memory_ = memory_counts(device_.kind != Device::cpu);
  reset_memory_peaks();
  observers_.begin_run();
  while (step_ < total_steps_) {
    const StepRecord out = step_once();
    observers_.end_step(out);  // histograms, the --log-every window's line and records
    report_finished_save();    // a background save that finished during the step
    if (out.stop) {            // a rank got a stop signal: all stop here, at the same step
      finish_weight_gather();
      if (cfg_.checkpoint_dir.empty()) {
        run_and_agree(comm_, [&] {
          throw Error(ErrorKind::runtime, cat("stopped by a signal at step ", step_,
                                              "; nothing was saved (no --checkpoint-dir)"));
        });
      }
      save_checkpoint(/*wait=*/true);  // after the save in flight, if any
      finish_timeline();
      announce_stop();
      end_run("signal", 75);
      return 75;
    }
    // Evaluation first: a checkpoint of this step then carries its verdict (best, patience).
    const bool epoch_done = loader_->position() + global_batch_ > loader_->num_samples();
    if (step_ < total_steps_) eval_if_due(epoch_done);
    if ((cfg_.checkpoint_every > 0 && step_ % cfg_.checkpoint_every == 0) || out.save_due)
      save_checkpoint();
    if (stop_early_) break;
  }
  const bool stopped_early = stop_early_;  // not the final evaluation's verdict
  finish_weight_gather();
  if (last_eval_step_ != step_) run_eval();
  save_checkpoint(/*wait=*/true);
  if (stopped_early)
    say(cat("early stop at step ", step_, ": ", cfg_.early_stop,
            " evaluations without improvement of ",
            parse_best_metric(cfg_.best_metric_text()).label, " (best at step ", best_step_, ")"));
  finish_timeline();
  end_run(stopped_early ? "early_stop" : "finished", 0);
  return 0;
}

void Trainer::finish_timeline() {
  const std::string path = timeline_.write(comm_.mpi());  // collective: not under run_and_agree()
  if (!path.empty()) say(cat("timeline of steps ", cfg_.timeline_steps, " written to ", path));
}

}  // namespace ringtrain::launch
