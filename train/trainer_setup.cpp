// The Trainer's set-up (see trainer.hpp): device, backend, data, model, optimizer, loss
// scaler and gradient reducer, agreed across ranks; the start from a checkpoint or from rank
// 0's initial parameters; the step observers; and the views the checkpoint store reads.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "core/fault_injection.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "nn/op_registry.hpp"
#include "train/evaluate.hpp"
#include "train/flight_observer.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"
#include "train/prometheus.hpp"
#include "train/straggler.hpp"
#include "train/trainer.hpp"

namespace ringtrain::launch {

Trainer::Trainer(TrainConfig cfg, comm::Communicator& comm) : cfg_(std::move(cfg)), comm_(comm) {
  make_grid();
  run_and_agree(comm_, [&] { setup(); });
  run_and_agree(comm_, [&] { make_reducer(); });  // collective: only after every rank's setup
  if (!cfg_.timeline.empty()) {
    const auto [a, b] = parse_step_window(cfg_.timeline_steps);
    timeline_ = Timeline(comm_.mpi(), cfg_.timeline, a, b);
  }
  std::string path;
  run_and_agree(comm_, [&] {
    if (comm_.rank() == 0) path = choose_checkpoint();
  });
  int64_t len = int64_t(path.size());  // rank 0 tells the others which file (if any)
  comm_.broadcast(&len, 1, DType::i64, 0);
  path.resize(size_t(len));
  comm_.broadcast(path.data(), len, DType::u8, 0);
  run_and_agree(comm_, [&] { start_from(path); });
  // --init-from: every rank read its part of the weights, as a resume does.
  strategy_->start_weights(!path.empty() || !cfg_.init_from.empty());          // collective
  plan_ = plan_memory(plan_model_, plan_settings(micro_batch_, grad_accum_));  // (a resume's batch)
  if (path.empty()) sync_buffers();
  add_observers();
  if (store_ && cfg_.async_checkpoint) {
    run_and_agree(comm_, [] { AsyncCheckpointer::require_supported(); });
    async_ckpt_ = std::make_unique<AsyncCheckpointer>(*store_, comm_.mpi(), checkpoint_state());
  }
}

Trainer::Trainer(TrainConfig cfg, comm::Communicator& comm, InputsOnly)
    : cfg_(std::move(cfg)), comm_(comm) {
  make_grid();
  run_and_agree(comm_, [&] { setup_inputs(); });
}

void Trainer::make_grid() {
  grid_ = std::make_unique<ProcessGrid>(comm_, cfg_.tensor_parallel);
  run_and_agree(comm_, [&] { grid_->require_placement(); });
  grid_->connect(cfg_.stall_timeout);
}

void Trainer::check_inputs(TrainConfig cfg, comm::Communicator& comm) {
  Trainer(std::move(cfg), comm, InputsOnly{});
}

Trainer::~Trainer() = default;

void Trainer::sync_buffers() {
  // Like PyTorch DDP's broadcast_buffers: the running averages of rank 0 are the model's.
  // Each rank updates its own from its own batches; before they are used (evaluation) or
  // saved, rank 0's replace the others', so checkpoints and evaluation do not depend on the
  // rank count and a resumed run continues exactly.
  if (model_->num_buffer_elems() > 0)
    comm_.broadcast(model_->state().data, model_->num_buffer_elems(), DType::f32, 0);
}

void Trainer::setup() {
  device_ = choose_device(cfg_.device, comm_);
  backend_ = make_backend(device_, threads_for_rank(cfg_.threads, comm_), cfg_.gpu_memory);
  setup_inputs();
  // The optimizer reads the reduced sums and unscales them as it reads them when the
  // backend can and nothing else reads the fp32 gradient (clipping scales it, histograms
  // show it); the same choice on every rank. Else, in fp16/bf16, the strategy keeps an fp32
  // gradient of what this rank updates.
  optimizer_unscales_ = backend_->supports(kernels::Op::fused_unscale, wire_dtype()) &&
                        cfg_.grad_clip <= 0.f &&
                        !(cfg_.histogram_every > 0 && !cfg_.tensorboard.empty());
  check_memory_budget();
  if (cfg_.cache && data_) data_->enable_cache();
  // The flat buffers, the optimizer state and the fp32 gradient on the run's device.
  DeviceScope on_device(device_);
  // --zero 3: no whole flat buffer, not even while the strategy shards them.
  model_ =
      build_model(*model_file_, cfg_.precision, /*flat_buffers=*/cfg_.zero != 3, grid_->group());
  model_->set_recompute(cfg_.recompute == "blocks");
  plugins_ = plugins_used(*model_file_);  // once: each checkpoint records it
  if (cfg_.zero == 3) refuse_plugin_parameters();
  strategy_ = make_strategy(cfg_, comm_, *grid_, *backend_, *model_, observers_);
  strategy_->place_parameters();
  for (const auto& prefix : cfg_.freeze) {
    bool any = false;
    for (const auto& p : model_->params()) any = any || p.name.starts_with(prefix);
    RT_REQUIRE(any, "--freeze '", prefix, "' matches no tensor of model '", model_file_->name(),
               "' (its tensors: ", model_->params().front().name, ", ... ",
               model_->params().back().name, "; `ringtrain model show` lists them)");
  }
  optimizer_ = strategy_->make_optimizer(cfg_.optimizer, cfg_.decay_all, cfg_.freeze);
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
  console_ = Console(
      comm_.rank(), cfg_.progress == "bar" ||
                        (cfg_.progress == "auto" && isatty(STDOUT_FILENO) && !started_by_mpirun()));
  if (comm_.rank() == 0 && !cfg_.timeline.empty()) {
    check_timeline_path(cfg_.timeline);  // fail now, not after training
  }
  if (!cfg_.prometheus_file.empty()) check_prometheus_path(cfg_.prometheus_file, comm_.rank());
  if (comm_.rank() == 0 && !cfg_.tensorboard.empty())
    tensorboard_ = std::make_unique<EventWriter>(cfg_.tensorboard);

  strategy_->allocate_gradients(optimizer_unscales_);
  // cuda: host copies of what a checkpoint holds on this rank.
  if (device_.kind == Device::cuda) host_ = strategy_->make_host_mirror();
}

void Trainer::refuse_plugin_parameters() const {
  // --zero 3 points a node's parameter views at a transient buffer while the node runs and
  // empties them afterwards; a plugin's layer may keep what they pointed at beyond that, so
  // its parameters cannot be gathered safely.
  for (const PlannedNode& pn : plan_model(*model_file_).nodes) {
    const std::string& lib = op_plugin(pn.op);
    const Layer* layer = model_->find_layer(pn.name);
    if (lib.empty() || layer == nullptr || layer->param_specs().empty()) continue;
    throw_input(cat("--zero 3: node '", pn.name, "' runs op '", pn.op, "' of plugin '", lib,
                    "', which has parameters; --zero 3 gathers parameters into transient "
                    "buffers, which a plugin's layer is not known to allow; use --zero 2 (or 1) "
                    "with this model"));
  }
}

void Trainer::setup_inputs() {
  load_plugins(cfg_.plugins);  // their ops may be the model's first node
  const auto [sample, classes] = setup_data();
  RT_REQUIRE(grid_->tp() == 1 || cfg_.val_data.empty(), "--tensor-parallel ", grid_->tp(),
             " with --val-data: evaluation of a split model is not built yet; evaluate the "
             "checkpoints with `ringtrain eval` or use --tensor-parallel 1");
  RT_REQUIRE(cfg_.global_batch_size == 0 || cfg_.global_batch_size % dp_size() == 0,
             "--global-batch-size ", cfg_.global_batch_size, " does not divide by ", dp_size(),
             " ranks; use a multiple of ", dp_size(), " or --batch-size");
  // What the loss reads, before the data's shape and classes meet the model file.
  if (data_) require_targets_fit_loss(ModelFile::load(cfg_.model));
  if (const BestMetric best = parse_best_metric(cfg_.best_metric_text());
      !data_ && best.name != "loss" && best.name != "accuracy")
    throw_input(cat(cfg_.keep_best.empty() ? "--best-metric " : "--keep-best ", best.label,
                    ": a language model's evaluation reports val_loss and val_accuracy only"));
  model_file_ = std::make_unique<ModelFile>(
      load_model_for_run(cfg_.model, cfg_.model_vars, cfg_.layer_precision, sample, classes,
                         cat("--data '", cfg_.data, "'")));
  if (data_ && loss_spec_of(*model_file_).target_kind() != TargetKind::labels)
    model_file_->set_target_shape(data_->info().target_shape, cat("--data '", cfg_.data, "'"));
  RT_REQUIRE(!val_ || val_->info().num_classes <= classes, "--val-data '", cfg_.val_data, "' has ",
             val_ ? val_->info().num_classes : 0, " classes but the model predicts ", classes);
  if (cfg_.recompute == "blocks") {
    const ModelPlan plan = plan_model(*model_file_);
    const bool has_body = std::any_of(plan.nodes.begin(), plan.nodes.end(),
                                      [](const PlannedNode& n) { return n.repeat_body >= 0; });
    RT_REQUIRE(has_body, "--recompute blocks: model '", cfg_.model,
               "' has no repeat body (a `repeat` node, e.g. a transformer block) whose "
               "activations could be recomputed; use --recompute none");
  }
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
    RT_REQUIRE(cfg_.eval_windows == 0, "--eval-windows ", cfg_.eval_windows, " is for token data; ",
               who, " takes images and labels");
    // Labels or targets: which of them the model's loss reads is checked once the model file
    // is read (require_targets_fit_loss).
    data_ = std::make_unique<io::Dataset>(cfg_.data, false);
    const auto& info = data_->info();
    if (!cfg_.val_data.empty()) {
      val_ = std::make_unique<io::Dataset>(cfg_.val_data, false);
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
    io::require_same_tokenizer(
        io::tokenizer_id_of(tokens_->info()), cat("--data '", cfg_.data, "'"),
        io::tokenizer_id_of(val_tokens_->info()), cat("--val-data '", cfg_.val_data, "'"));
    io::require_tokens_fit_model(val_tokens_->info(), t, lm.vocab, context, cfg_.model);
    val_tokens_->set_seq_len(t);
  }
  return {{t}, tokens_->info().vocab_size};
}

PlanSettings Trainer::plan_settings(int64_t micro, int64_t accum) const {
  PlanSettings s;
  s.world = comm_.size();
  s.rank = comm_.rank();
  s.zero = cfg_.zero;
  s.recompute_blocks = cfg_.recompute == "blocks";
  s.on_gpu = device_.kind != Device::cpu;
  s.precision = cfg_.precision;
  s.wire = wire_dtype();
  s.optimizer_states = cfg_.optimizer.name == "adamw" ? 2 : cfg_.optimizer.momentum != 0.f;
  s.fp32_grad = !optimizer_unscales_;
  s.micro_batch = std::max<int64_t>(micro, 1);
  s.grad_accum = accum;
  s.prefetch = cfg_.prefetch;
  s.bucket_bytes = int64_t(cfg_.bucket_mb * double(1 << 20));
  return s;
}

void Trainer::check_memory_budget() {
  plan_model_ = PlanModel::from_file(*model_file_);
  // The micro-batch of a fresh start (a resume keeps it unless its options change it).
  const int64_t accum = std::max<int64_t>(cfg_.grad_accum, 1);
  const int64_t micro = cfg_.global_batch_size
                            ? cfg_.global_batch_size / std::max<int64_t>(dp_size() * accum, 1)
                            : cfg_.batch_size;
  const PlanSettings s = plan_settings(micro, accum);
  plan_ = plan_memory(plan_model_, s);
  if (cfg_.memory_budget.empty()) return;
  int64_t budget = parse_memory_budget(cfg_.memory_budget);
  if (budget < 0)
    budget = auto_memory_budget(
        comm_.local_size(), device_.kind == Device::cpu
                                ? 0
                                : int64_t(kernels::cuda::device_info(device_.index).total_bytes));
  memory_budget_ = budget;
  const std::string refusal = check_budget(plan_model_, s, budget, cfg_.memory_budget);
  if (!refusal.empty()) throw_input(refusal);
}

void Trainer::require_targets_fit_loss(const ModelFile& file) {
  const LossSpec spec = loss_spec_of(file);
  const BestMetric best = parse_best_metric(cfg_.best_metric_text());
  const char* option = cfg_.keep_best.empty() ? "--best-metric" : "--keep-best";
  const bool has_accuracy = spec.reports_accuracy() ||
                            std::count(spec.metrics.begin(), spec.metrics.end(), "accuracy") > 0;
  RT_REQUIRE(best.name != "accuracy" || has_accuracy, option, " val_accuracy: the loss '",
             spec.name(), "' of model '", file.name(), "' has no accuracy; use ", option,
             " val_loss (or add metric: \"accuracy\" to a loss that has one)");
  if (best.name != "loss" && best.name != "accuracy") {
    std::string known = "val_loss";
    if (has_accuracy) known += ", val_accuracy";
    for (const std::string& m : spec.metrics)
      if (m != "accuracy") known += ", val_" + m;
    RT_REQUIRE(std::count(spec.metrics.begin(), spec.metrics.end(), best.name) > 0, option, " ",
               best.label, ": model '", file.name(), "' reports no metric '", best.name,
               "' (its loss block's metrics give: ", known, ")");
  }
  const TargetKind want = spec.target_kind();
  for (const auto& [option, data] :
       {std::pair<const char*, io::Dataset*>{"--data", data_.get()}, {"--val-data", val_.get()}}) {
    if (!data) continue;
    const auto& info = data->info();
    RT_REQUIRE(info.has_labels || info.has_targets, "dataset '", info.path,
               "' has no /labels; training and eval need labelled data (`ringtrain predict` "
               "reads unlabelled data)");
    const bool ok = want == TargetKind::labels ? info.has_labels
                    : want == TargetKind::float_targets
                        ? info.has_targets && info.target_dtype == DType::f32
                        : info.has_targets && info.target_dtype == DType::i32;
    const std::string has = info.has_targets
                                ? cat(info.target_dtype == DType::f32 ? "float32" : "integer",
                                      " /targets of shape ", shape_str(info.target_shape))
                            : info.has_labels ? std::string("integer /labels only")
                                              : std::string("neither /labels nor /targets");
    RT_REQUIRE(
        ok, option, " '", info.path, "' has ", has, ", but the loss '", spec.name(), "' of model '",
        file.name(), "' reads ", target_kind_name(want),
        want == TargetKind::labels ? "" : " (write them with `ringtrain convert npy --targets`)");
    if (want == TargetKind::labels) continue;
    RT_REQUIRE(data == data_.get() || info.target_shape == data_->info().target_shape, option, " '",
               info.path, "' has targets of shape ", shape_str(info.target_shape),
               " but --data has ", shape_str(data_->info().target_shape));
  }
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
  DeviceScope on_device(device_);  // the wire buffer, when the wire dtype differs
  reducer_ = strategy_->make_reducer(rc, ranges, layer_of);
}

void Trainer::add_observers() {
  const bool sharded = strategy_->partitions_gradients();
  numerics_ =
      std::make_unique<NumericsCheck>(*model_, *backend_, cfg_.check_numerics, comm_.rank());
  if (comm::FlightRecorder* rec = comm::FlightRecorder::instance())
    observers_.add(
        std::make_unique<FlightObserver>(*rec, cfg_.flight_recorder_dump_step, comm_.rank() == 0));
  observers_.add(std::make_unique<TimelineObserver>(timeline_, *model_, *reducer_, sharded));
  const StallHook stall = stall_hook();  // test-only
  const SlowHook slow = slow_forward_hook();
  observers_.add(std::make_unique<FaultObserver>(comm_.rank(), stall.reduce ? -1 : stall.rank,
                                                 stall.step, stall.seconds, stall.gather,
                                                 slow.rank == comm_.rank() ? slow.seconds : 0));
  // Before the skip reporter: a skipped step is charged to its layers before the warning
  // names the layer that overflows most.
  observers_.add(
      std::make_unique<NumericsObserver>(*numerics_, *reducer_, sharded, console_, metrics_));
  // After a restore: "fallen by 2^10" counts from the restored scale.
  observers_.add(
      std::make_unique<SkipReporter>(*scaler_, scaler_->scale(), *numerics_, console_, metrics_));
  // (partitioned: no rank holds the whole fp32 gradient, so no histograms of it)
  if (tensorboard_ && cfg_.histogram_every > 0 && !sharded)
    observers_.add(std::make_unique<HistogramObserver>(*model_, strategy_->grad32(),
                                                       cfg_.histogram_every, *tensorboard_));
  auto reporter = std::make_unique<WindowReporter>(cfg_.log_every, global_batch_,
                                                   tokens_ ? tokens_->seq_len() : 0, comm_.size(),
                                                   console_, metrics_, tensorboard_.get());
  if (!model_->loss().is_default())
    reporter->set_loss(model_->loss().name(), model_->loss().reports_accuracy());
  observers_.add(std::move(reporter));
  auto summary = std::make_unique<RunSummary>(global_batch_, tokens_ ? tokens_->seq_len() : 0);
  summary_ = summary.get();
  observers_.add(std::move(summary));
  const std::vector<std::string> hosts = rank_hosts(comm_);
  StragglerObserver* straggler = nullptr;
  if (cfg_.straggler_window > 0) {
    auto s = std::make_unique<StragglerObserver>(comm_.rank(), hosts, cfg_.straggler_threshold,
                                                 cfg_.straggler_window, console_, metrics_,
                                                 tensorboard_.get(), &timeline_);
    straggler = s.get();
    observers_.add(std::move(s));
  }
  if (const std::string path = prometheus_path_for(cfg_.prometheus_file, comm_.rank());
      !path.empty()) {
    const MemoryUse m = memory_use();
    observers_.add(std::make_unique<PrometheusObserver>(
        path, cfg_.prometheus_every,
        PrometheusObserver::Labels{job_id(), hosts[size_t(comm_.rank())], comm_.rank()},
        global_batch_, tokens_ ? tokens_->seq_len() : 0,
        std::vector<std::pair<std::string, int64_t>>{{"masters", m.masters},
                                                     {"optimizer", m.optimizer},
                                                     {"working_weights", m.work},
                                                     {"fp32_read", m.fp32_read},
                                                     {"gradients", m.grads}},
        straggler));
  }
  node_hooks_ = observers_.layer_hooks();
  strategy_->install_hooks(node_hooks_);
  reduce_hooks_ = node_hooks_;
  reduce_hooks_.grad_ready = [this](size_t p) {
    add_accumulated(p);
    reducer_->mark_ready(p);
  };
}

}  // namespace ringtrain::launch
