// The Trainer's set-up (see trainer.hpp): device, backend, data, model, optimizer, loss
// scaler and gradient reducer, agreed across ranks; the start from a checkpoint or from rank
// 0's initial parameters; the step observers; and the views the checkpoint store reads.
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "core/fault_injection.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "launch/evaluate.hpp"
#include "launch/job.hpp"
#include "launch/model_source.hpp"
#include "launch/trainer.hpp"

namespace ringtrain::launch {

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
  if (path.empty() && !model_->masters_sharded()) {
    // A fresh start: rank 0's initial parameters are every rank's. (Sharded masters: every
    // rank drew the same values and kept its shard.)
    comm_.broadcast(model_->master().data, model_->num_params(), DType::f32, 0);
    model_->refresh_working_copy(*backend_);
  }
  if (path.empty()) sync_buffers();
  if (!path.empty() && !shards_.empty()) gather_weights();  // each rank read its shard
  add_observers();
}

Trainer::Trainer(TrainConfig cfg, comm::Communicator& comm, InputsOnly)
    : cfg_(std::move(cfg)), comm_(comm) {
  agree(comm_, [&] { setup_inputs(); });
}

void Trainer::check_inputs(TrainConfig cfg, comm::Communicator& comm) {
  Trainer(std::move(cfg), comm, InputsOnly{});
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

std::vector<io::NamedTensor> Trainer::shard_views(const Tensor& shard) const {
  std::vector<io::NamedTensor> views;
  const int64_t begin = shards_.begin(comm_.rank()), end = shards_.end(comm_.rank());
  for (const auto& p : model_->params()) {
    // This rank's part of the parameter (possibly none), at its shard offset.
    const int64_t lo = std::max(p.offset, begin);
    const int64_t hi = std::max(lo, std::min(p.offset + shape_numel(p.shape), end));
    views.push_back({p.name, shard.slice(lo - begin, {hi - lo}), p.shape, lo - p.offset});
  }
  return views;
}

std::vector<io::NamedTensor> Trainer::param_views() const {
  if (shards_.empty()) return master_views(*model_);
  // fp32: the masters are whole (they are the working weights) and the shard is a slice.
  const Tensor m = model_->master();
  return shard_views(model_->masters_sharded()
                         ? m
                         : m.slice(shards_.begin(comm_.rank()), {shards_.count(comm_.rank())}));
}

void Trainer::gather_weights() {
  const auto counts = shards_.counts_in(0, model_->num_params());
  if (!model_->masters_sharded()) {  // fp32: the masters are the working weights
    comm_.allgatherv(model_->master().data, counts, DType::f32);
    return;
  }
  comm_.allgatherv(model_->work().data, counts, model_->work().dtype);
  const Tensor f = model_->fp32_copy();
  if (f.numel() == 0) return;
  std::vector<int64_t> fc;
  for (int r = 0; r < comm_.size(); ++r)
    fc.push_back(model_->fp32_count_in(shards_.begin(r), shards_.end(r)));
  comm_.allgatherv(f.data, fc, DType::f32);
}

std::vector<io::OptimizerState> Trainer::optimizer_views() const {
  std::vector<io::OptimizerState> states;
  for (size_t s = 0; s < optimizer_->state_names().size(); ++s) {
    io::OptimizerState st{optimizer_->state_names()[s], {}};
    if (shards_.empty()) {
      for (auto& p : model_->params())
        st.per_param.push_back({p.name, optimizer_->state(s).slice(p.offset, p.shape)});
    } else {
      st.per_param = shard_views(optimizer_->state(s));
    }
    states.push_back(std::move(st));
  }
  return states;
}

void Trainer::setup() {
  device_ = choose_device(cfg_.device, comm_);
  backend_ = make_backend(device_, threads_for_rank(cfg_.threads, comm_), cfg_.gpu_memory);
  setup_inputs();
  if (cfg_.cache && data_) data_->enable_cache();
  // The flat buffers, the optimizer state and the fp32 gradient on the run's device.
  DeviceScope on_device(device_);
  model_ = build_model(*model_file_, cfg_.precision);
  if (cfg_.zero) shards_ = comm::ShardLayout(model_->num_params(), comm_.size());
  // --zero 1 in fp16/bf16: fp32 masters of this rank's shard only (in fp32 the full fp32
  // copy is needed anyway as the working weights, and the shard is a slice of it).
  if (cfg_.zero && cfg_.precision != DType::f32)
    model_->shard_masters(shards_.begin(comm_.rank()), shards_.end(comm_.rank()));
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
  if (comm_.rank() == 0) metrics_ = MetricsWriter(cfg_.metrics);
  // auto: a bar on a terminal. Open MPI gives every rank a pseudo-terminal whatever mpirun's
  // own stdout is, so under mpirun auto means plain lines (--progress bar forces the bar).
  console_ = Console(comm_.rank(),
                     cfg_.progress == "bar" || (cfg_.progress == "auto" && isatty(STDOUT_FILENO) &&
                                                !started_by_mpirun()));
  if (comm_.rank() == 0 && !cfg_.timeline.empty()) {
    check_timeline_path(cfg_.timeline);  // fail now, not after training
  }
  if (comm_.rank() == 0 && !cfg_.tensorboard.empty())
    tensorboard_ = std::make_unique<EventWriter>(cfg_.tensorboard);

  // The optimizer reads the allreduced sums and unscales them as it reads them when the
  // backend can and nothing else reads the fp32 gradient (clipping scales it, histograms
  // show it); the same choice on every rank.
  optimizer_unscales_ = backend_->supports(kernels::Op::fused_unscale, wire_dtype()) &&
                        cfg_.grad_clip <= 0.f &&
                        !(cfg_.histogram_every > 0 && !cfg_.tensorboard.empty());
  // Else in fp16/bf16: the fp32 gradient the optimizer reads (--zero 1: this rank's shard).
  const int64_t g32 = cfg_.zero ? shards_.count(comm_.rank()) : model_->num_params();
  const bool own32 = cfg_.precision != DType::f32 && !optimizer_unscales_;
  grad32_storage_ = own32 ? Buffer(size_t(g32) * 4) : Buffer();
  grad32_ =
      cfg_.precision == DType::f32
          ? model_->grad()
          : (own32 ? Tensor(grad32_storage_.data(), {g32}, DType::f32, grad32_storage_.device())
                   : Tensor());
  // cuda: host copies of what a checkpoint holds (--zero 1: this rank's shards of it).
  if (device_.kind == Device::cuda)
    host_ = shards_.empty() ? std::make_unique<HostMirror>(*model_, optimizer_.get())
                            : std::make_unique<HostMirror>(param_views(), optimizer_views(),
                                                           buffer_views(*model_));
}

void Trainer::setup_inputs() {
  load_plugins(cfg_.plugins);  // their ops may be the model's first node
  const auto [sample, classes] = setup_data();
  RT_REQUIRE(cfg_.global_batch_size == 0 || cfg_.global_batch_size % comm_.size() == 0,
             "--global-batch-size ", cfg_.global_batch_size, " does not divide by ", comm_.size(),
             " ranks; use a multiple of ", comm_.size(), " or --batch-size");
  model_file_ = std::make_unique<ModelFile>(
      load_model_for_run(cfg_.model, cfg_.model_vars, cfg_.layer_precision, sample, classes,
                         cat("--data '", cfg_.data, "'")));
  RT_REQUIRE(!val_ || val_->info().num_classes <= classes, "--val-data '", cfg_.val_data, "' has ",
             val_ ? val_->info().num_classes : 0, " classes but the model predicts ", classes);
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
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + shape_numel(p.shape));
    if (a < b) ranges.push_back({a - lo, b - a, cfg_.decay_all || p.decay});
  }
  optimizer_->set_decay_ranges(std::move(ranges));
}

Tensor Trainer::optimizer_grad() const {
  if (!optimizer_unscales_) return shards_.empty() ? grad32_ : shard_grad();
  if (shards_.empty()) return reducer_->result();
  return reducer_->result().slice(shards_.begin(comm_.rank()), {shards_.count(comm_.rank())});
}

Tensor Trainer::shard_grad() const {
  if (cfg_.precision != DType::f32) return grad32_;  // allocated as the shard
  return grad32_.slice(shards_.begin(comm_.rank()), {shards_.count(comm_.rank())});
}

Trainer::MemoryUse Trainer::memory_use() const {
  const int64_t p = model_->num_params(), es = int64_t(dtype_size(cfg_.precision));
  const bool fp32 = cfg_.precision == DType::f32;
  MemoryUse m;
  // The buffers as allocated: in fp32 the masters are the working weights, whole; --zero 1
  // counts its shard of them as masters and the rest as working weights.
  m.masters = fp32 && !shards_.empty() ? shards_.count(comm_.rank()) * 4
                                       : int64_t(model_->master().bytes());
  m.work = fp32 ? (shards_.empty() ? 0 : int64_t(model_->master().bytes()) - m.masters)
                : int64_t(model_->work().bytes());
  m.fp32_read = int64_t(model_->fp32_copy().bytes());
  m.optimizer = optimizer_->state_bytes();
  const DType wire = reducer_->result().dtype;
  m.grads = p * es + int64_t(grad32_storage_.bytes()) +
            (wire == cfg_.precision ? 0 : p * int64_t(dtype_size(wire)));
  return m;
}

Trainer::WireBytes Trainer::wire_bytes() const {
  const double w = comm_.size(), f = (w - 1) / w;
  const double p = double(model_->num_params());
  WireBytes b;
  const double wire = double(dtype_size(reducer_->result().dtype));
  if (shards_.empty()) {
    b.reduce = 2 * f * p * wire;
    return b;
  }
  b.reduce = f * p * wire;
  b.gather = f * p * double(dtype_size(model_->work().dtype));
  b.gather_fp32 = f * double(model_->fp32_copy().numel()) * 4;
  return b;
}

std::string Trainer::memory_report() const {
  const MemoryUse m = memory_use();
  const bool fp32 = cfg_.precision == DType::f32;
  const WireBytes b = wire_bytes();
  return cat(
      "memory/rank: masters ", m.masters, " B",
      cfg_.zero ? cat(" (shard of ", shards_.count(comm_.rank()), " of ", model_->num_params(), ")")
                : "",
      ", optimizer state ", m.optimizer, " B, working weights ", m.work,
      fp32 ? (shards_.empty() ? " B (the masters)" : " B (the all-gathered rest)") : " B",
      m.fp32_read > 0 ? cat(" + fp32-read parameters ", m.fp32_read, " B") : "", ", gradients ",
      m.grads, " B; --zero ", cfg_.zero, "; wire/step/rank: ",
      shards_.empty()
          ? cat("allreduce ", int64_t(b.reduce), " B")
          : cat("reduce-scatter ", int64_t(b.reduce), " B + all-gather ", int64_t(b.gather), " B",
                b.gather_fp32 > 0 ? cat(" + fp32-read ", int64_t(b.gather_fp32), " B") : ""));
}

DType Trainer::wire_dtype() const {
  return cfg_.wire_dtype_given ? cfg_.wire_dtype : cfg_.precision;
}

void Trainer::make_reducer() {
  comm::ReducerConfig rc;
  rc.wire = wire_dtype();
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
  for (const auto& p : model_->params()) ranges.push_back({p.offset, shape_numel(p.shape)});
  std::vector<size_t> layer_of(ranges.size());
  for (size_t l = 0; l < model_->layer_params().size(); ++l) {
    const auto [first, count] = model_->layer_params()[l];
    for (size_t i = first; i < first + count; ++i) layer_of[i] = l;
  }
  rc.shards = shards_;
  DeviceScope on_device(device_);  // the wire buffer, when the wire dtype differs
  reducer_ = std::make_unique<comm::GradReducer>(comm_, rc, model_->grad(), ranges, layer_of);
  if (shards_.empty()) return;
  // --zero 1: what each node's forward waits for, and the buckets' parts of the fp32 copy.
  const auto& buckets = reducer_->buckets();
  std::vector<size_t> bucket_of(ranges.size());
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t i = 0; i < buckets[b].params; ++i) bucket_of[buckets[b].first_param + i] = b;
  node_bucket_.assign(model_->layer_params().size(), SIZE_MAX);
  size_t lowest = SIZE_MAX;
  for (size_t l = 0; l < node_bucket_.size(); ++l) {
    const auto [first, count] = model_->layer_params()[l];
    for (size_t i = first; i < first + count; ++i) lowest = std::min(lowest, bucket_of[i]);
    node_bucket_[l] = lowest;
  }
  fp32_counts_.clear();
  if (!model_->masters_sharded()) return;
  for (const auto& k : buckets) {
    std::vector<int64_t> per_rank;
    for (int r = 0; r < comm_.size(); ++r)
      per_rank.push_back(model_->fp32_count_in(std::max(k.offset, shards_.begin(r)),
                                               std::min(k.offset + k.count, shards_.end(r))));
    fp32_counts_.push_back(std::move(per_rank));
  }
}

void Trainer::add_observers() {
  const bool sharded = !shards_.empty();
  numerics_ =
      std::make_unique<NumericsCheck>(*model_, *backend_, cfg_.check_numerics, comm_.rank());
  observers_.add(std::make_unique<TimelineObserver>(timeline_, *model_, *reducer_, sharded));
  const StallHook stall = stall_hook();  // test-only
  observers_.add(std::make_unique<FaultObserver>(comm_.rank(), stall.rank, stall.step,
                                                 stall.seconds, stall.gather));
  // Before the skip reporter: a skipped step is charged to its layers before the warning
  // names the layer that overflows most.
  observers_.add(
      std::make_unique<NumericsObserver>(*numerics_, *reducer_, sharded, console_, metrics_));
  // After a restore: "fallen by 2^10" counts from the restored scale.
  observers_.add(
      std::make_unique<SkipReporter>(*scaler_, scaler_->scale(), *numerics_, console_, metrics_));
  // (--zero 1: no rank holds the whole fp32 gradient, so no histograms of it)
  if (tensorboard_ && cfg_.histogram_every > 0 && !sharded)
    observers_.add(
        std::make_unique<HistogramObserver>(*model_, grad32_, cfg_.histogram_every, *tensorboard_));
  observers_.add(std::make_unique<WindowReporter>(cfg_.log_every, global_batch_,
                                                  tokens_ ? tokens_->seq_len() : 0, comm_.size(),
                                                  console_, metrics_, tensorboard_.get()));
  auto summary = std::make_unique<RunSummary>(global_batch_, tokens_ ? tokens_->seq_len() : 0);
  summary_ = summary.get();
  observers_.add(std::move(summary));
  node_hooks_ = observers_.layer_hooks();
  if (!shards_.empty()) node_hooks_.before_forward = [this](size_t n) { wait_for_node_weights(n); };
  reduce_hooks_ = node_hooks_;
  reduce_hooks_.grad_ready = [this](size_t p) {
    add_accumulated(p);
    reducer_->mark_ready(p);
  };
}

}  // namespace ringtrain::launch
