// The training loop (see trainer.hpp).
#include "launch/trainer.hpp"

#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include "core/fault_injection.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/evaluate.hpp"
#include "launch/job.hpp"
#include "launch/model_source.hpp"
#include "launch/signals.hpp"
#include "ringtrain/config.hpp"

namespace ringtrain::launch {

using Clock = std::chrono::steady_clock;

Trainer::Trainer(TrainConfig cfg, comm::Communicator& comm) : cfg_(std::move(cfg)), comm_(comm) {
  agree(comm_, [&] { setup(); });
  agree(comm_, [&] { make_reducer(); });  // collective: only after every rank's setup
  if (!cfg_.timeline.empty()) {
    const auto [a, b] = parse_step_window(cfg_.timeline_steps);
    timeline_ = Timeline(comm_.mpi(), cfg_.timeline, a, b);
  }
  std::string path;
  agree(comm_, [&] {
    if (comm_.rank() == 0) path = choose_checkpoint();
  });
  int64_t len = int64_t(path.size());  // rank 0 tells the others which file (if any)
  comm_.broadcast(&len, 1, DType::i64, 0);
  path.resize(size_t(len));
  comm_.broadcast(path.data(), len, DType::u8, 0);
  agree(comm_, [&] { start_from(path); });
  if (path.empty()) {  // a fresh start: rank 0's initial parameters are every rank's
    comm_.broadcast(model_->master().data, model_->num_params(), DType::f32, 0);
    sync_buffers();
    model_->refresh_working_copy(*backend_);
  }
  initial_scale_ = scaler_->scale();  // after a restore: "fallen by 2^10" counts from here
}

Trainer::~Trainer() = default;

std::vector<io::NamedTensor> master_views(Model& model) {
  std::vector<io::NamedTensor> views;
  for (auto& p : model.params()) views.push_back({p.name, p.master});
  return views;
}

std::vector<io::NamedTensor> buffer_views(Model& model) {
  std::vector<io::NamedTensor> views;
  for (auto& b : model.buffers()) views.push_back({b.name, b.value});
  return views;
}

void Trainer::sync_buffers() {
  // Like PyTorch DDP's broadcast_buffers: the running averages of rank 0 are the model's.
  // Each rank updates its own from its own batches; before they are used (evaluation) or
  // saved, rank 0's replace the others', so checkpoints and evaluation do not depend on the
  // rank count and a resumed run continues exactly.
  if (model_->num_buffer_elems() > 0)
    comm_.broadcast(model_->state().data, model_->num_buffer_elems(), DType::f32, 0);
}

std::vector<io::OptimizerState> Trainer::optimizer_views() const {
  std::vector<io::OptimizerState> states;
  for (size_t s = 0; s < optimizer_->state_names().size(); ++s) {
    io::OptimizerState st{optimizer_->state_names()[s], {}};
    for (auto& p : model_->params()) {
      if (shards_.empty()) {
        st.per_param.push_back({p.name, optimizer_->state(s).slice(p.offset, p.shape)});
        continue;
      }
      // --zero 1: this rank's part of the parameter (possibly none), at its shard offset.
      const int64_t lo = std::max(p.offset, shards_.begin(comm_.rank()));
      const int64_t hi =
          std::max(lo, std::min(p.offset + p.master.numel(), shards_.end(comm_.rank())));
      st.per_param.push_back(
          {p.name, optimizer_->state(s).slice(lo - shards_.begin(comm_.rank()), {hi - lo}), p.shape,
           lo - p.offset});
    }
    states.push_back(std::move(st));
  }
  return states;
}

void Trainer::say(const std::string& line) {
  if (comm_.rank() != 0) return;
  if (bar_active_) std::cout << '\n';  // keep the progress bar's last state on its line
  bar_active_ = false;
  std::cout << line << std::endl;
}

void Trainer::warn(const char* kind, const std::string& message) {
  if (comm_.rank() != 0) return;
  if (bar_active_) std::cout << std::endl;  // the bar's line ends before the message
  bar_active_ = false;
  std::cerr << cat("ringtrain: ", kind, ": ", message, "\n") << std::flush;  // one write
}

void Trainer::progress(const std::string& line, double fraction) {
  if (comm_.rank() != 0) return;
  if (!progress_bar_) return say(line);  // batch jobs and files: plain lines
  // A terminal: one line redrawn in place, with a bar.
  constexpr int kWidth = 20;
  const int filled = int(fraction * kWidth + 0.5);
  std::cout << "\r[" << std::string(size_t(filled), '#')
            << std::string(size_t(kWidth - filled), '.') << "] " << line << "\033[K" << std::flush;
  bar_active_ = true;
}

std::string duration_str(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600) return cat(s / 3600, "h", (s / 60) % 60 < 10 ? "0" : "", (s / 60) % 60, "m");
  if (s >= 60) return cat(s / 60, "m", s % 60 < 10 ? "0" : "", s % 60, "s");
  return cat(s, "s");
}

void Trainer::setup() {
  device_ = choose_device(cfg_.device, comm_);
  backend_ = make_backend(device_, threads_for_rank(cfg_.threads, comm_), cfg_.gpu_memory);
  load_plugins(cfg_.plugins);  // their ops may be the model's first node
  const auto [sample, classes] = setup_data();
  RT_REQUIRE(cfg_.global_batch_size == 0 || cfg_.global_batch_size % comm_.size() == 0,
             "--global-batch-size ", cfg_.global_batch_size, " does not divide by ", comm_.size(),
             " ranks; use a multiple of ", comm_.size(), " or --batch-size");
  if (cfg_.cache && data_) data_->enable_cache();

  model_file_ = std::make_unique<ModelFile>(
      load_model_for_run(cfg_.model, cfg_.model_vars, cfg_.layer_precision, sample, classes,
                         cat("--data '", cfg_.data, "'")));
  // The flat buffers, the optimizer state and the fp32 gradient on the run's device.
  DeviceScope on_device(device_);
  model_ = build_model(*model_file_, cfg_.precision);
  if (cfg_.zero) shards_ = comm::ShardLayout(model_->num_params(), comm_.size());
  optimizer_ = make_optimizer(cfg_.optimizer,
                              cfg_.zero ? shards_.count(comm_.rank()) : model_->num_params());
  set_decay_groups();
  LossScalerConfig ls = cfg_.loss_scale;
  if (cfg_.precision == DType::f32 && ls.dynamic) {
    // No scaling in fp32: a constant scale of 1 (non-finite steps are still skipped).
    ls.dynamic = false;
    ls.init_scale = ls.min_scale = 1.f;
  }
  scaler_ = std::make_unique<LossScaler>(ls);
  if (!cfg_.checkpoint_dir.empty())
    store_ = std::make_unique<io::CheckpointStore>(cfg_.checkpoint_dir, cfg_.keep);
  RT_REQUIRE(!val_ || val_->info().num_classes <= classes, "--val-data '", cfg_.val_data, "' has ",
             val_ ? val_->info().num_classes : 0, " classes but the model predicts ", classes);
  if (comm_.rank() == 0) metrics_ = MetricsWriter(cfg_.metrics);
  // auto: a bar on a terminal. Open MPI gives every rank a pseudo-terminal whatever mpirun's
  // own stdout is, so under mpirun auto means plain lines (--progress bar forces the bar).
  progress_bar_ = cfg_.progress == "bar" || (cfg_.progress == "auto" && isatty(STDOUT_FILENO) &&
                                             !std::getenv("OMPI_COMM_WORLD_SIZE"));
  if (comm_.rank() == 0 && !cfg_.timeline.empty()) {
    check_timeline_path(cfg_.timeline);  // fail now, not after training
  }
  if (comm_.rank() == 0 && !cfg_.tensorboard.empty())
    tensorboard_ = std::make_unique<EventWriter>(cfg_.tensorboard);

  // fp16/bf16: the fp32 gradient the optimizer reads (--zero 1: this rank's shard of it).
  const int64_t g32 = cfg_.zero ? shards_.count(comm_.rank()) : model_->num_params();
  grad32_storage_ = cfg_.precision == DType::f32 ? Buffer() : Buffer(size_t(g32) * 4);
  grad32_ = cfg_.precision == DType::f32
                ? model_->grad()
                : Tensor(grad32_storage_.data(), {g32}, DType::f32, grad32_storage_.device());
  RT_REQUIRE(!cfg_.zero || device_.kind == Device::cpu,
             "--zero 1 runs on --device cpu in this build (the checkpoint mirror of device "
             "buffers is not sharded yet); use --zero 0 with --device cuda");
  if (device_.kind == Device::cuda) host_ = std::make_unique<HostMirror>(*model_, optimizer_.get());
}

std::pair<Shape, int64_t> Trainer::setup_data() {
  // The model says which kind of data it takes (an embedding first: token ids); the data
  // of the other kind is named as such, not as a damaged dataset.
  const TokenInput lm = token_input_of_run(cfg_.model, cfg_.model_vars);
  const io::DataKind want = lm.takes_tokens ? io::DataKind::tokens : io::DataKind::images;
  const std::string who = cat("model '", cfg_.model, "'");
  io::require_data_kind(cfg_.data, io::data_kind_of(cfg_.data), want, who);
  if (!cfg_.val_data.empty())
    io::require_data_kind(cfg_.val_data, io::data_kind_of(cfg_.val_data), want, who);
  if (!lm.takes_tokens) {
    RT_REQUIRE(cfg_.seq_len == 0, "--seq-len ", cfg_.seq_len, " is for token data; ", who,
               " takes images and labels");
    data_ = std::make_unique<io::Dataset>(cfg_.data);
    const auto& info = data_->info();
    if (!cfg_.val_data.empty()) {
      val_ = std::make_unique<io::Dataset>(cfg_.val_data);
      RT_REQUIRE(val_->info().sample_shape == info.sample_shape, "--val-data '", cfg_.val_data,
                 "' has samples of shape ", shape_str(val_->info().sample_shape),
                 " but --data has ", shape_str(info.sample_shape));
    }
    norm_ = io::normalization_of(info);
    return {info.sample_shape, info.num_classes};
  }
  // Windows of T tokens, T = --seq-len or the model's context; the vocabulary must fit the
  // embedding and every shard (training and validation) must hold a window.
  tokens_ = std::make_unique<io::TokenDataset>(cfg_.data);
  const int64_t t = cfg_.seq_len ? cfg_.seq_len : lm.context;
  RT_REQUIRE(t > 0, "--seq-len is needed: ", who, " has no positional embedding to take ",
             "its length from");
  const int64_t context = lm.context ? lm.context : t;
  io::require_tokens_fit_model(tokens_->info(), t, lm.vocab, context, cfg_.model);
  tokens_->set_seq_len(t);
  if (!cfg_.val_data.empty()) {
    val_tokens_ = std::make_unique<io::TokenDataset>(cfg_.val_data);
    io::require_tokens_fit_model(val_tokens_->info(), t, lm.vocab, context, cfg_.model);
    val_tokens_->set_seq_len(t);
  }
  return {{t}, tokens_->info().vocab_size};
}

void Trainer::set_decay_groups() {
  // --zero 1: each parameter's part of this rank's shard, in the shard's index space.
  const int64_t lo = shards_.empty() ? 0 : shards_.begin(comm_.rank());
  const int64_t hi = shards_.empty() ? model_->num_params() : shards_.end(comm_.rank());
  std::vector<DecayRange> ranges;
  for (const auto& p : model_->params()) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.master.numel());
    if (a < b) ranges.push_back({a - lo, b - a, cfg_.decay_all || p.decay});
  }
  optimizer_->set_decay_ranges(std::move(ranges));
}

Tensor Trainer::shard_grad() const {
  if (cfg_.precision != DType::f32) return grad32_;  // allocated as the shard
  return grad32_.slice(shards_.begin(comm_.rank()), {shards_.count(comm_.rank())});
}

std::string Trainer::memory_report() const {
  const int64_t p = model_->num_params(), es = int64_t(dtype_size(cfg_.precision));
  const int64_t masters = p * 4;  // full: every layer reads them (fp32 layers, biases)
  const int64_t work = cfg_.precision == DType::f32 ? 0 : p * es;
  const int64_t opt = optimizer_->state_bytes();
  const DType wire = reducer_->result().dtype;
  const int64_t grads = p * es + (cfg_.precision == DType::f32 ? 0 : grad32_.numel() * 4) +
                        (wire == cfg_.precision ? 0 : p * int64_t(dtype_size(wire)));
  return cat("memory/rank: masters ", masters, " B, optimizer state ", opt, " B",
             cfg_.zero ? cat(" (shard of ", shards_.count(comm_.rank()), " of ", p, ")") : "",
             ", working weights ", work, cfg_.precision == DType::f32 ? " B (the masters)" : " B",
             ", gradients ", grads, " B; --zero ", cfg_.zero);
}

void Trainer::make_reducer() {
  comm::ReducerConfig rc;
  rc.wire = cfg_.wire_dtype_given ? cfg_.wire_dtype : cfg_.precision;
  rc.bucket_bytes = int64_t(cfg_.bucket_mb * double(1 << 20));
  rc.first_bucket_bytes = std::min<int64_t>(rc.bucket_bytes, 1 << 20);
  rc.overlap = cfg_.overlap;
  rc.stall_timeout_s = cfg_.stall_timeout;
  if (device_.kind == Device::cuda && rc.wire != cfg_.precision) {
    // Device buckets are cast on the device, by a backend of the communication thread's own
    // (its scratch apart from the main thread's), on the device's stream, so the cast runs
    // after the backward kernels that wrote the bucket and before the collective reads it.
    wire_backend_ = make_backend(device_, 1, cfg_.gpu_memory);
    rc.cast = [this](const Tensor& src, const Tensor& dst) {
      kernels::cuda::queue_cast(*wire_backend_, device_.index, src, dst);  // stream-ordered
    };
  }
  // The communication thread and the stall watch call MPI beside the main thread.
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    if (comm_.rank() == 0 && (rc.overlap || rc.stall_timeout_s > 0))
      std::cerr << "ringtrain: warning: this MPI gives no MPI_THREAD_MULTIPLE: gradient "
                   "communication runs after backward and stalls are not detected\n";
    rc.overlap = false;
    rc.stall_timeout_s = 0;
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& p : model_->params()) ranges.push_back({p.offset, p.master.numel()});
  std::vector<size_t> layer_of(ranges.size());
  for (size_t l = 0; l < model_->layer_params().size(); ++l) {
    const auto [first, count] = model_->layer_params()[l];
    for (size_t i = first; i < first + count; ++i) layer_of[i] = l;
  }
  rc.shards = shards_;
  DeviceScope on_device(device_);  // the wire buffer, when the wire dtype differs
  reducer_ = std::make_unique<comm::GradReducer>(comm_, rc, model_->grad(), ranges, layer_of);
  numerics_ =
      std::make_unique<NumericsCheck>(*model_, *backend_, cfg_.check_numerics, comm_.rank());
  model_->set_backward_hook([this](size_t l, const Tensor& dx) {
    maybe_inject_fault("backward", step_ + 1);
    numerics_->after_backward(l, dx);
    if (!tracing_) return;
    const auto now = Clock::now();
    timeline_.span("backward " + model_->layers()[l]->name(), "backward", 0, last_mark_, now,
                   step_ + 1);
    last_mark_ = now;
  });
}

// Micro-batch `micro` of this rank's slice: rows [micro * b, (micro + 1) * b).
static Tensor micro_rows(const Tensor& t, int64_t micro, int64_t b) {
  Shape s = t.shape;
  s[0] = b;
  return t.slice(micro * b * (t.numel() / t.shape[0]), s);
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
  const Tensor& logits =
      model_->forward(ctx, *x, [&](size_t l, const Tensor& y) { numerics_->after_forward(l, y); });
  maybe_inject_fault("forward", step);
  Tensor& dlogits = dlogits_.ensure(logits.shape, DType::f32);
  auto xent = loss_and_gradient(logits, yb, scale, dlogits);
  last_mark_ = Clock::now();
  if (tracing_) timeline_.span("forward + loss", "forward", 0, t0, last_mark_, step);
  if (!last) {  // no communication before the last micro-batch (DDP's no_sync)
    model_->backward(ctx, dlogits);
    accumulate_micro_grads(micro);
    return xent;
  }
  reducer_->start_step(step);
  model_->backward(ctx, dlogits, [&](size_t p) {
    add_accumulated(p);
    reducer_->mark_ready(p);
  });
  return xent;
}

kernels::XentResult Trainer::loss_and_gradient(const Tensor& logits, const Tensor& y, float scale,
                                               const Tensor& dlogits) {
  if (logits.shape.size() != 3)
    return backend_->softmax_xent(logits, y, scale, &dlogits, cfg_.label_smoothing);
  // A language model: logits [B, T, V] against targets [B, T], the cross-entropy of every
  // token over the data's vocabulary (the first `classes` of V, which may be padded). The
  // loss is the mean over tokens; reported per sample as that mean (sum / T), and the
  // correct predictions as whole samples' worth (correct tokens / T, rounded down).
  RT_REQUIRE(cfg_.label_smoothing == 0.f,
             "--label-smoothing is for classifiers; a language "
             "model's token loss takes none");
  auto r = backend_->token_xent(logits, y, model_->classes(), scale, &dlogits);
  const int64_t t = logits.dim(1);
  r.loss_sum /= double(t);
  r.correct /= t;
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

void Trainer::apply_update(int64_t step, double sum_sq) {
  if (cfg_.grad_clip > 0.f) {
    const Tensor g = shards_.empty() ? grad32_ : shard_grad();
    const double norm = std::sqrt(shards_.empty() ? backend_->sum_squares(grad32_) : sum_sq);
    if (norm > cfg_.grad_clip) backend_->scale(g, float(cfg_.grad_clip / (norm + 1e-6)));
  }
  Tensor work = model_->work();
  const auto t_opt = Clock::now();
  maybe_inject_fault("optimizer", step);
  // The schedule's position is the steps before this one; lr_ is the fp32 value applied.
  lr_ = double(float(schedule_->lr(step - 1)));
  if (shards_.empty()) {
    optimizer_->step(*backend_, model_->master(), grad32_,
                     cfg_.precision == DType::f32 ? nullptr : &work, float(lr_));
    if (tracing_) timeline_.span("optimizer", "optimizer", 0, t_opt, Clock::now(), step);
    return;
  }
  // --zero 1: the shard's part of each bucket, in bucket order; the communication thread
  // all-gathers a bucket's fp32 masters while the next bucket is updated.
  const int64_t lo = shards_.begin(comm_.rank()), n = shards_.count(comm_.rank());
  const Tensor master = model_->master().slice(lo, {n}), grad = shard_grad();
  optimizer_->begin_step(float(lr_));
  reducer_->start_gather(model_->master());
  if (cfg_.test_stall_gather && cfg_.test_stall_rank == comm_.rank() &&
      cfg_.test_stall_step == step) {
    std::cerr << cat("ringtrain: test: rank ", comm_.rank(), " (pid ", getpid(),
                     ") held before the all-gather of step ", step, " for ",
                     cfg_.test_stall_seconds, " s\n")
              << std::flush;
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.test_stall_seconds));
  }
  const auto& buckets = reducer_->buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t a = std::max(lo, buckets[b].offset);
    const int64_t e = std::min(lo + n, buckets[b].offset + buckets[b].count);
    if (a < e) optimizer_->update(*backend_, master, grad, nullptr, a - lo, e - lo);
    reducer_->gather_ready(b);
  }
  const auto t_update = Clock::now();
  reducer_->finish_gather();
  model_->refresh_working_copy(*backend_);  // fp16/bf16: the gathered masters, cast
  if (tracing_) {
    timeline_.span("optimizer (shard)", "optimizer", 0, t_opt, t_update, step);
    timeline_.span("wait for all-gather", "comm", 0, t_update, Clock::now(), step);
  }
}

Trainer::StepOutcome Trainer::step_once() {
  if (!cfg_.test_stall_gather && cfg_.test_stall_rank == comm_.rank() &&
      cfg_.test_stall_step == step_ + 1) {
    // Test-only: hold this rank back so the others' stall detection fires.
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.test_stall_seconds));
  }
  const int64_t step = step_ + 1;
  tracing_ = timeline_.on(step);  // one branch per span site when --timeline is off
  const auto t_start = Clock::now();
  const io::Batch& batch = stage_batch_(loader_->next(), device_);  // cuda: uploaded
  const auto t_data = Clock::now();
  DeviceScope on_device(device_);  // activations and scratch (after the loader's host batch)
  if (tracing_) timeline_.span("data wait", "data", 0, t_start, t_data, step);
  epoch_ = batch.epoch;
  numerics_->begin_step(step);
  const float scale = scaler_->scale();
  kernels::XentResult xent;
  for (int64_t micro = 0; micro < grad_accum_; ++micro) {
    const auto r = forward_backward(batch, micro, scale, step);
    xent.loss_sum += r.loss_sum;
    xent.correct += r.correct;
  }
  const auto t_backward = Clock::now();
  // Whatever of the bucketed allreduce is still in flight: the exposed communication.
  const double exposed = reducer_->finish();
  const auto t_reduced = Clock::now();
  if (tracing_) {
    timeline_.span("wait for gradients", "comm", 0, t_backward, t_reduced, step);
    for (const auto& s : reducer_->spans())
      timeline_.span(cat(shards_.empty() ? "allreduce" : "reduce-scatter", " bucket ", s.bucket),
                     "comm", 1, s.begin, s.end, step);
  }

  // The sums (wire dtype) unscaled and averaged into the fp32 gradient in one pass; under
  // --zero 1 this rank's shard only, its non-finite flag and squared norm summed below.
  const float unscale = 1.f / (scale * float(comm_.size()) * float(grad_accum_));
  bool nonfinite = false;
  double sum_sq = 0;
  if (shards_.empty()) {
    nonfinite = backend_->unscale_check(reducer_->result(), unscale, grad32_);
  } else {
    const int64_t lo = shards_.begin(comm_.rank()), n = shards_.count(comm_.rank());
    nonfinite = backend_->unscale_check(reducer_->result().slice(lo, {n}), unscale, shard_grad());
    if (!nonfinite && cfg_.grad_clip > 0.f) sum_sq = backend_->sum_squares(shard_grad());
  }
  if (tracing_) timeline_.span("unscale/check", "optimizer", 0, t_reduced, Clock::now(), step);

  // One small allreduce agrees on the metrics and on stopping/saving.
  const bool save_due =
      comm_.rank() == 0 && cfg_.checkpoint_secs > 0 &&
      std::chrono::duration<double>(Clock::now() - last_save_time_).count() >= cfg_.checkpoint_secs;
  double reduced[6] = {xent.loss_sum,      double(xent.correct), stop_requested() ? 1. : 0.,
                       save_due ? 1. : 0., nonfinite ? 1. : 0.,  sum_sq};
  comm_.allreduce(reduced, 6, DType::f64, comm::ReduceOp::sum);
  nonfinite = reduced[4] > 0;  // --zero 1: some shard overflowed (else the same everywhere)
  if (reduced[2] > 0) {        // rare: which rank (the lowest) received which signal
    int64_t who =
        stop_requested() ? (int64_t(stop_signal()) << 32) | (comm_.size() - comm_.rank()) : 0;
    comm_.allreduce(&who, 1, DType::i64, comm::ReduceOp::max);
    stop_signal_ = int(who >> 32);
    stop_rank_ = comm_.size() - int(who & 0xffffffff);
    stop_ranks_ = int(reduced[2]);
  }

  // --check-numerics: where the first inf/nan appeared (one small allreduce, all ranks).
  const std::string where = numerics_->agree(comm_);
  if (!where.empty()) warn("numerics", where);
  if (!where.empty())
    metrics_.write(JsonLine().add("type", "numerics").add("step", step_ + 1).add("message", where));
  const bool apply = scaler_->update(nonfinite || !where.empty());  // same on all ranks
  // The layers to blame need the whole summed gradient, which --zero 1 does not hold.
  if (!apply && shards_.empty()) numerics_->charge_overflow(reducer_->result());
  if (apply) {
    apply_update(step, reduced[5]);
  } else {
    metrics_.write(JsonLine()
                       .add("type", "skip")
                       .add("step", step_ + 1)
                       .add("reason", "non-finite gradients")
                       .add("loss_scale", double(scaler_->scale())));
    const bool fell = !warned_scale_drop_ && scaler_->scale() <= initial_scale_ / 1024.f;
    if (scaler_->floor_hit() || fell) {
      warned_scale_drop_ = warned_scale_drop_ || fell;
      const std::string worst = numerics_->worst_layer();
      const std::string msg =
          cat(scaler_->floor_hit() ? "loss scale is at its floor "
                                   : "loss scale has fallen by 2^10 to ",
              scaler_->scale(), " at step ", step_ + 1, " and gradients still overflow",
              worst.empty() ? "" : cat("; most often in layer ", worst),
              "; the run is diverging (lower --lr, use bf16, or set --min-scale lower)");
      warn("warning", msg);
      metrics_.write(JsonLine().add("type", "warning").add("step", step_ + 1).add("message", msg));
    }
  }
  ++step_;
  samples_seen_ += global_batch_;
  StepOutcome out;
  out.loss_sum = reduced[0];
  out.correct = reduced[1];
  out.stop = reduced[2] > 0;
  out.save_due = reduced[3] > 0;
  out.data_s = std::chrono::duration<double>(t_data - t_start).count();
  out.compute_s = std::chrono::duration<double>(t_backward - t_data).count();
  out.comm_s = reducer_->comm_seconds();
  out.exposed_comm_s = exposed;
  out.step_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return out;
}

void Trainer::save_checkpoint() {
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
              : store_->save(comm_.mpi(), m, master_views(*model_), optimizer_views(), {},
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
  if (timeline_.on(step_))
    timeline_.span("checkpoint", "checkpoint", 0, t_ckpt, last_save_time_, step_);
}

bool Trainer::run_eval() {
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
  auto window_start = Clock::now();
  int64_t window_steps = 0;
  double window_loss = 0, window_correct = 0;
  StepOutcome times;  // summed seconds of the window's steps
  while (step_ < total_steps_) {
    const StepOutcome out = step_once();
    // (--zero 1: no rank holds the whole fp32 gradient, so no histograms of it)
    if (tensorboard_ && cfg_.histogram_every > 0 && step_ % cfg_.histogram_every == 0 &&
        shards_.empty()) {
      // fp32 masters and this step's gradient (cuda: copied to the host first)
      const float* masters = host_floats(model_->master(), hist_values_[0]);
      const float* grads = host_floats(grad32_, hist_values_[1]);
      for (const auto& par : model_->params()) {
        tensorboard_->histogram("weights/" + par.name, step_, masters + par.offset,
                                par.master.numel());
        tensorboard_->histogram("gradients/" + par.name, step_, grads + par.offset,
                                par.master.numel());
      }
    }
    ++window_steps;
    window_loss += out.loss_sum;
    window_correct += out.correct;
    times.data_s += out.data_s;
    times.compute_s += out.compute_s;
    times.comm_s += out.comm_s;
    times.exposed_comm_s += out.exposed_comm_s;
    times.step_s += out.step_s;
    if (step_ % cfg_.log_every == 0 || step_ == total_steps_) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double samples = double(window_steps * global_batch_);
      const double loss = window_loss / samples, acc = window_correct / samples;
      const double sps = samples / std::max(secs, 1e-9);
      const double eta = double(total_steps_ - step_) * secs / double(window_steps);
      char line[240];
      // Token data: the loss in nats/token, the accuracy per token, and tokens/s.
      const int64_t t = tokens_ ? tokens_->seq_len() : 1;
      std::snprintf(line, sizeof line,
                    "step %lld/%lld epoch %lld loss %.4f acc %.3f scale %g lr %g %.0f %s/s ETA %s",
                    static_cast<long long>(step_), static_cast<long long>(total_steps_),
                    static_cast<long long>(epoch_), loss, acc, double(scaler_->scale()), lr_,
                    sps * double(t), tokens_ ? "tokens" : "samples", duration_str(eta).c_str());
      progress(line, double(step_) / double(std::max<int64_t>(total_steps_, 1)));
      maybe_inject_fault("metrics", step_);
      if (tensorboard_) {
        const double n = double(window_steps);
        for (auto [tag, v] : {std::pair<const char*, double>{"train/loss", loss},
                              {"train/accuracy", acc},
                              {"train/learning_rate", lr_},
                              {"train/loss_scale", scaler_->scale()},
                              {"train/samples_per_sec", sps},
                              {"time/step_s", times.step_s / n},
                              {"time/compute_s", times.compute_s / n},
                              {"time/exposed_comm_s", times.exposed_comm_s / n},
                              {"time/data_wait_s", times.data_s / n}})
          tensorboard_->scalar(tag, step_, v);
        tensorboard_->flush();
      }
      metrics_.write(JsonLine()
                         .add("type", "step")
                         .add("step", step_)
                         .add("epoch", epoch_)
                         .add("loss", loss)
                         .add("accuracy", acc)
                         .add("loss_scale", double(scaler_->scale()))
                         .add("lr", lr_)
                         .add("samples_per_sec", sps)
                         .add("tokens_per_sec", sps * double(t))
                         .add("world_size", comm_.size())
                         .add("step_s", times.step_s / double(window_steps))
                         .add("data_wait_s", times.data_s / double(window_steps))
                         .add("compute_s", times.compute_s / double(window_steps))
                         .add("comm_s", times.comm_s / double(window_steps))
                         .add("exposed_comm_s", times.exposed_comm_s / double(window_steps)));
      times = StepOutcome{};
      window_start = Clock::now();
      window_steps = 0;
      window_loss = window_correct = 0;
    }
    if (out.stop) {  // a rank got a stop signal: all stop here, at the same step
      if (cfg_.checkpoint_dir.empty()) {
        agree(comm_, [&] {
          throw Error(ErrorKind::runtime, cat("stopped by a signal at step ", step_,
                                              "; nothing was saved (no --checkpoint-dir)"));
        });
      }
      save_checkpoint();
      finish_timeline();
      say(cat("stopped by ", signal_name(stop_signal_), " on ",
              stop_ranks_ == comm_.size() && comm_.size() > 1 ? cat("all ", stop_ranks_, " ranks")
                                                              : cat("rank ", stop_rank_),
              " at step ", step_, "; checkpoint ", store_->path_for(step_),
              " saved. Run the same command again to continue."));
      if (stop_signal_ == SIGTERM && std::getenv("OMPI_COMM_WORLD_SIZE") &&
          stop_ranks_ == comm_.size())
        say("(mpirun forwards Ctrl-C and SIGTERM to every rank as SIGTERM, and itself exits 1 "
            "after Ctrl-C; `kill -USR1 <mpirun pid>` stops the job with exit 75)");
      write_stop_record("signal", 75);
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
  if (last_eval_step_ != step_) run_eval();
  save_checkpoint();
  if (stopped_early)
    say(cat(
        "early stop at step ", step_, ": ", cfg_.early_stop, " evaluations without improvement of ",
        cfg_.keep_best.empty() ? "val_loss" : cfg_.keep_best, " (best at step ", best_step_, ")"));
  finish_timeline();
  if (bar_active_) std::cout << std::endl;  // end the progress bar's line
  write_stop_record(stopped_early ? "early_stop" : "finished", 0);
  return 0;
}

void Trainer::finish_timeline() {
  const std::string path = timeline_.write(comm_.mpi());  // collective: not under agree()
  if (!path.empty()) say(cat("timeline of steps ", cfg_.timeline_steps, " written to ", path));
}

}  // namespace ringtrain::launch
