// The training loop (see trainer.hpp): the step, phase by phase, with its observers called at
// the phase boundaries; checkpoints, evaluation and the run loop with its stop on a signal.
#include "launch/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/rng.hpp"
#include "launch/evaluate.hpp"
#include "launch/job.hpp"
#include "launch/model_source.hpp"
#include "launch/signals.hpp"
#include "ringtrain/config.hpp"

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
  const auto t0 = Clock::now();
  // Dropout's stream is that of the micro-batch's place in the global batch, so it does not
  // change when ranks and micro-batches trade places (4 ranks x 1 = 2 ranks x 2).
  const uint64_t slots = uint64_t(comm_.size()) * uint64_t(grad_accum_);
  const uint64_t slot = uint64_t(comm_.rank()) * uint64_t(grad_accum_) + uint64_t(micro);
  Context ctx{*backend_, cfg_.precision, true,
              mix_seed(mix_seed(cfg_.seed, hash_name("dropout")), uint64_t(step) * slots + slot)};
  const Tensor xb = micro_rows(batch.x, micro, micro_batch_);
  const Tensor yb = micro_rows(batch.y, micro, micro_batch_);
  const Tensor* x = &xb;
  if (cfg_.precision != DType::f32 && is_float(xb.dtype)) {  // token ids stay int32
    backend_->cast(xb, xc_.ensure(xb.shape, cfg_.precision));
    x = &xc_.view;
  }
  const Tensor& logits = model_->forward(ctx, *x, node_hooks_);
  finish_weight_gather();  // nodes that read no parameter leave nothing else to wait for
  Tensor& dlogits = dlogits_.ensure(logits.shape, DType::f32);
  auto xent = loss_and_gradient(logits, yb, scale, dlogits);
  observers_.after(Phase::forward, step, t0, Clock::now());
  if (!last) {  // no communication before the last micro-batch (DDP's no_sync)
    model_->backward(ctx, dlogits, node_hooks_);
    accumulate_micro_grads(micro);
    return xent;
  }
  reducer_->start_step(step);
  model_->backward(ctx, dlogits, reduce_hooks_);  // buckets allreduced as they fill
  return xent;
}

kernels::XentResult Trainer::loss_and_gradient(const Tensor& logits, const Tensor& y, float scale,
                                               const Tensor& dlogits) {
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
  if (grad_accum_ == 1) return;
  const Param& p = model_->params()[param];
  // Summed in fp32, rounded once to the compute dtype for the allreduce.
  backend_->add(acc32_.slice(p.offset, p.shape), p.grad, p.grad);
}

void Trainer::apply_update(int64_t step, double sum_sq, float unscale) {
  if (cfg_.grad_clip > 0.f) {
    const Tensor g = shards_.empty() ? grad32_ : shard_grad();
    const double norm = std::sqrt(shards_.empty() ? backend_->sum_squares(grad32_) : sum_sq);
    if (norm > cfg_.grad_clip) backend_->scale(g, float(cfg_.grad_clip / (norm + 1e-6)));
  }
  Tensor work = model_->work();
  const auto t_opt = Clock::now();
  observers_.before(Phase::optimizer, step);
  // The schedule's position is the steps before this one; lr_ is the fp32 value applied.
  lr_ = double(float(schedule_->lr(step - 1)));
  const float grad_scale = optimizer_unscales_ ? unscale : 1.f;
  if (shards_.empty()) {
    optimizer_->step(*backend_, model_->master(), optimizer_grad(),
                     cfg_.precision == DType::f32 ? nullptr : &work, float(lr_), grad_scale);
    observers_.after(Phase::optimizer, step, t_opt, Clock::now());
    return;
  }
  // --zero 1: the shard's part of each bucket, from the last bucket (the first layers) to
  // bucket 0; the communication thread all-gathers a bucket's working weights (fp16/bf16:
  // written by the optimizer in the same pass, with the bucket's part of the fp32 copy of
  // the parameters layers read in fp32; fp32: the masters themselves) while the next bucket
  // is updated and while the next step's forward runs (wait_for_node_weights).
  const int64_t lo = shards_.begin(comm_.rank()), n = shards_.count(comm_.rank());
  const bool mixed = model_->masters_sharded();
  const Tensor master = mixed ? model_->master() : model_->master().slice(lo, {n});
  const Tensor grad = optimizer_grad(), work_shard = work.slice(lo, {n});
  optimizer_->begin_step(float(lr_), grad_scale);
  reducer_->start_gather(work, mixed ? model_->fp32_copy() : Tensor(), fp32_counts_);
  observers_.before(Phase::gather, step);
  const auto& buckets = reducer_->buckets();
  for (size_t b = buckets.size(); b-- > 0;) {  // the reducer gathers the last bucket first
    const int64_t a = std::max(lo, buckets[b].offset);
    const int64_t e = std::min(lo + n, buckets[b].offset + buckets[b].count);
    if (a < e) {
      optimizer_->update(*backend_, master, grad, mixed ? &work_shard : nullptr, a - lo, e - lo);
      if (mixed) model_->copy_shard_to_fp32(a, e);
    }
    reducer_->gather_ready(b);
  }
  gather_pending_ = true;
  gather_step_ = step;
  observers_.after(Phase::optimizer, step, t_opt, Clock::now());
  if (!cfg_.overlap) finish_weight_gather();  // --no-overlap: the buckets in turn, now
}

void Trainer::wait_for_node_weights(size_t node) {
  if (!gather_pending_ || node_bucket_[node] == SIZE_MAX) return;
  const auto t0 = Clock::now();
  if (reducer_->wait_gathered(node_bucket_[node]) > 0)
    observers_.after(Phase::gather, gather_step_, t0, Clock::now());
}

void Trainer::finish_weight_gather() {
  if (!gather_pending_) return;
  const auto t0 = Clock::now();
  if (reducer_->finish_gather() > 0)
    observers_.after(Phase::gather, gather_step_, t0, Clock::now());
  gather_pending_ = false;
}

Trainer::Unscaled Trainer::unscale_and_check(float scale) {
  const float unscale = 1.f / (scale * float(comm_.size()) * float(grad_accum_));
  Unscaled u;
  u.unscale = unscale;
  if (optimizer_unscales_) {
    u.nonfinite = backend_->unscale_check(optimizer_grad(), unscale, Tensor());
    return u;
  }
  if (shards_.empty()) {
    u.nonfinite = backend_->unscale_check(reducer_->result(), unscale, grad32_);
    return u;
  }
  const int64_t lo = shards_.begin(comm_.rank()), n = shards_.count(comm_.rank());
  u.nonfinite = backend_->unscale_check(reducer_->result().slice(lo, {n}), unscale, shard_grad());
  if (!u.nonfinite && cfg_.grad_clip > 0.f) u.sum_sq = backend_->sum_squares(shard_grad());
  return u;
}

Trainer::Agreed Trainer::agree_on_step(const kernels::XentResult& xent, const Unscaled& mine) {
  const bool save_due =
      comm_.rank() == 0 && cfg_.checkpoint_secs > 0 &&
      std::chrono::duration<double>(Clock::now() - last_save_time_).count() >= cfg_.checkpoint_secs;
  double reduced[6] = {xent.loss_sum,      double(xent.correct),     stop_requested() ? 1. : 0.,
                       save_due ? 1. : 0., mine.nonfinite ? 1. : 0., mine.sum_sq};
  comm_.allreduce(reduced, 6, DType::f64, comm::ReduceOp::sum);
  if (reduced[2] > 0) {  // rare: which rank (the lowest) received which signal
    int64_t who =
        stop_requested() ? (int64_t(stop_signal()) << 32) | (comm_.size() - comm_.rank()) : 0;
    comm_.allreduce(&who, 1, DType::i64, comm::ReduceOp::max);
    stop_signal_ = int(who >> 32);
    stop_rank_ = comm_.size() - int(who & 0xffffffff);
    stop_ranks_ = int(reduced[2]);
  }
  Agreed a;
  a.loss_sum = reduced[0];
  a.correct = reduced[1];
  a.stop = reduced[2] > 0;
  a.save_due = reduced[3] > 0;
  a.nonfinite = reduced[4] > 0;  // --zero 1: some shard overflowed (else the same everywhere)
  a.sum_sq = reduced[5];
  return a;
}

Trainer::StepOutcome Trainer::step_once() {
  const int64_t step = step_ + 1;
  observers_.begin_step(step);
  const auto t_start = Clock::now();
  const io::Batch& batch = stage_batch_(loader_->next(), device_);  // cuda: uploaded
  const auto t_data = Clock::now();
  observers_.after(Phase::data, step, t_start, t_data);
  DeviceScope on_device(device_);  // activations and scratch (after the loader's host batch)
  epoch_ = batch.epoch;
  const float scale = scaler_->scale();
  const kernels::XentResult xent = forward_backward_all(batch, scale, step);
  const auto t_backward = Clock::now();
  const double exposed = reducer_->finish();  // what of the allreduce backward did not hide
  const auto t_reduced = Clock::now();
  observers_.after(Phase::reduce, step, t_backward, t_reduced);
  const Unscaled mine = unscale_and_check(scale);
  observers_.after(Phase::unscale, step, t_reduced, Clock::now());
  const Agreed agreed = agree_on_step(xent, mine);
  const bool veto = observers_.veto_update(comm_, step);         // --check-numerics (collective)
  const bool apply = scaler_->update(agreed.nonfinite || veto);  // the same on every rank
  if (apply)
    apply_update(step, agreed.sum_sq, mine.unscale);
  else
    observers_.skipped(step);
  ++step_;
  samples_seen_ += global_batch_;
  StepOutcome out;
  out.loss_sum = agreed.loss_sum;
  out.correct = agreed.correct;
  out.stop = agreed.stop;
  out.save_due = agreed.save_due;
  out.data_s = std::chrono::duration<double>(t_data - t_start).count();
  out.compute_s = std::chrono::duration<double>(t_backward - t_data).count();
  out.comm_s = reducer_->comm_seconds();
  out.exposed_comm_s = exposed;
  out.step_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return out;
}

void Trainer::save_checkpoint() {
  finish_weight_gather();
  if (cfg_.checkpoint_dir.empty() || last_saved_step_ == step_) return;
  const auto t_ckpt = Clock::now();
  {  // collective: every rank writes its share (an error ends the job: run_or_fail)
    const auto t0 = Clock::now();
    io::CheckpointMeta m;
    m.step = step_;
    m.epoch = loader_->epoch();
    m.samples_seen = samples_seen_;
    m.world_size = comm_.size();
    m.global_batch = global_batch_;
    m.precision = dtype_name(cfg_.precision);
    m.model = model_->text();
    m.ringtrain_version = RINGTRAIN_VERSION;
    m.plugins = plugins_used(*model_file_);
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
    m.grad_accum = grad_accum_;
    m.best_value = best_value_;
    m.best_step = best_step_;
    m.evals_since_best = evals_since_best_;
    sync_buffers();
    if (host_) host_->download();  // cuda: the store writes host memory
    const uint64_t bytes =
        host_ ? store_->save(comm_.mpi(), m, host_->params, host_->optimizer, {}, host_->buffers)
              : store_->save(comm_.mpi(), m, param_views(), optimizer_views(), {},
                             buffer_views(*model_));
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (comm_.rank() == 0)
      metrics_.write(JsonLine()
                         .add("type", "checkpoint")
                         .add("step", step_)
                         .add("path", store_->path_for(step_))
                         .add("seconds", secs)
                         .add("bytes", int64_t(bytes)));
  }
  last_saved_step_ = step_;
  last_save_time_ = Clock::now();
  observers_.after(Phase::checkpoint, step_, t_ckpt, last_save_time_);
}

bool Trainer::run_eval() {
  finish_weight_gather();
  if (!val_ && !val_tokens_) return false;
  last_eval_step_ = step_;
  sync_buffers();
  // Collective (its sums): an error in it ends the job from the rank that saw it.
  // Token data: the training micro-batch of windows (its [B, T, V] logits fit); images: 256.
  const int64_t batch = val_tokens_ ? micro_batch_ : std::max<int64_t>(256, micro_batch_);
  const EvalResult r = val_tokens_ ? evaluate_tokens(*model_, *val_tokens_, comm_, *backend_, batch)
                                   : evaluate(*model_, *val_, comm_, *backend_, batch, norm_);
  char line[240];
  // -1: not byte tokens (no bits/byte)
  const double bits = val_tokens_ ? bits_per_byte(val_tokens_->info(), r.loss).value_or(-1) : -1;
  if (val_tokens_) {
    char bpb[40] = "";
    if (bits >= 0) std::snprintf(bpb, sizeof bpb, " (%.4f bits/byte)", bits);
    std::snprintf(line, sizeof line,
                  "eval step %lld: val loss %.4f nats/token%s accuracy %.4f (%lld windows of "
                  "%lld tokens, computed in %s)",
                  static_cast<long long>(step_), r.loss, bpb, r.accuracy,
                  static_cast<long long>(r.samples), static_cast<long long>(val_tokens_->seq_len()),
                  dtype_name(model_->compute_dtype()));
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
  record.add("type", "eval")
      .add("step", step_)
      .add("split", "val")
      .add("loss", r.loss)
      .add("accuracy", r.accuracy)
      .add("precision", dtype_name(model_->compute_dtype()));
  if (val_tokens_) record.add("tokens", r.tokens);
  if (bits >= 0) record.add("bits_per_byte", bits);
  metrics_.write(record);
  track_best(r.loss, r.accuracy);
  return true;
}

int Trainer::run() {
  say(cat("ringtrain ", RINGTRAIN_VERSION, ": ", comm_.size(), " rank(s) on ", comm_.num_nodes(),
          " node(s), device ", device_str(device_), ", ", backend_->threads(),
          " thread(s)/rank (from ", threads_rule(cfg_.threads, comm_), "), precision ",
          dtype_name(cfg_.precision), cfg_.precision == DType::f32 ? "" : " (fp32 masters)",
          ", global batch ", global_batch_, " (", micro_batch_, "/rank",
          grad_accum_ > 1 ? cat(" x ", grad_accum_, " micro-batches") : std::string(), "), comm ",
          comm_.backend(), " in ", dtype_name(reducer_->result().dtype), ", ",
          reducer_->buckets().size(), " gradient bucket(s)", cfg_.overlap ? " overlapped" : "",
          device_.kind == Device::cpu ? cat("; ", kernels::describe_cpu_gemm()) : std::string(),
          "; ", memory_report()));
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
  announce_device(device_, cfg_.precision, comm_);
  write_start_record();
  write_tensorboard_config();
  last_save_time_ = Clock::now();
  observers_.begin_run();
  while (step_ < total_steps_) {
    const StepOutcome out = step_once();
    StepRecord r;
    r.step = step_;
    r.total_steps = total_steps_;
    r.epoch = epoch_;
    r.loss_scale = double(scaler_->scale());
    r.lr = lr_;
    r.loss_sum = out.loss_sum;
    r.correct = out.correct;
    r.data_s = out.data_s;
    r.compute_s = out.compute_s;
    r.comm_s = out.comm_s;
    r.exposed_comm_s = out.exposed_comm_s;
    r.step_s = out.step_s;
    observers_.end_step(r);  // histograms, the --log-every window's line and records
    if (out.stop) {          // a rank got a stop signal: all stop here, at the same step
      finish_weight_gather();
      if (cfg_.checkpoint_dir.empty()) {
        run_and_agree(comm_, [&] {
          throw Error(ErrorKind::runtime, cat("stopped by a signal at step ", step_,
                                              "; nothing was saved (no --checkpoint-dir)"));
        });
      }
      save_checkpoint();
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
  save_checkpoint();
  if (stopped_early)
    say(cat(
        "early stop at step ", step_, ": ", cfg_.early_stop, " evaluations without improvement of ",
        cfg_.keep_best.empty() ? "val_loss" : cfg_.keep_best, " (best at step ", best_step_, ")"));
  finish_timeline();
  end_run(stopped_early ? "early_stop" : "finished", 0);
  return 0;
}

void Trainer::finish_timeline() {
  const std::string path = timeline_.write(comm_.mpi());  // collective: not under run_and_agree()
  if (!path.empty()) say(cat("timeline of steps ", cfg_.timeline_steps, " written to ", path));
}

}  // namespace ringtrain::launch
