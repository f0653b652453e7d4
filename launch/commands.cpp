// train, eval, predict and convert (see commands.hpp; inspect is in inspect.cpp).
#include "launch/commands.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "comm/flight_recorder.hpp"
#include "comm/recording_communicator.hpp"
#include "io/checkpoint.hpp"
#include "io/convert_output.hpp"
#include "io/convert_source.hpp"
#include "io/convert_text.hpp"
#include "io/idx.hpp"
#include "io/token_baselines.hpp"
#include "io/tokenizer.hpp"
#include "launch/doctor.hpp"
#include "launch/options.hpp"
#include "launch/predict.hpp"
#include "launch/sample.hpp"
#include "train/device.hpp"
#include "train/evaluate.hpp"
#include "train/job.hpp"
#include "train/metrics.hpp"
#include "train/model_source.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"

namespace ringtrain::launch {
namespace {

// Parses the options on every rank under run_and_agree(); on --help, rank 0 prints the help and
// the command has nothing more to do (returns false).
template <typename Config>
bool parse_agreed(bool (*parse)(const std::vector<std::string>&, Config&, std::string*),
                  const std::vector<std::string>& args, Config& cfg, comm::Communicator& comm) {
  std::string help;
  bool run = true;
  run_and_agree(comm, [&] { run = parse(args, cfg, &help); });
  if (!run && comm.rank() == 0) std::cout << help;
  return run;
}

}  // namespace

// The run's flight recorder (--flight-recorder K; null when 0), dumping into --debug-dir or
// else --checkpoint-dir, on SIGUSR2 too.
std::unique_ptr<comm::FlightRecorder> make_flight_recorder(const TrainConfig& cfg,
                                                           const comm::Communicator& comm) {
  if (cfg.flight_recorder <= 0) return nullptr;
  comm::FlightRecorder::Identity who;
  who.rank = comm.rank();
  who.world_size = comm.size();
  who.job = job_id();
  who.hosts = rank_hosts(comm);
  auto rec = std::make_unique<comm::FlightRecorder>(
      size_t(cfg.flight_recorder), cfg.debug_dir.empty() ? cfg.checkpoint_dir : cfg.debug_dir,
      std::move(who));
  rec->dump_on_readable(install_dump_handler());
  return rec;
}

int cmd_train(const std::vector<std::string>& args, comm::Communicator& comm) {
  install_stop_handlers();  // from the start: a signal during setup stops at the first step
  install_dump_handler();
  TrainConfig cfg;
  if (!parse_agreed(parse_train, args, cfg, comm)) return 0;
  if (cfg.print_config) {  // only after the checks a run's start makes of data and model
    Trainer::check_inputs(cfg, comm);
    if (comm.rank() == 0) std::cout << cfg.config_ini << std::flush;
    return 0;
  }
  if (cfg.preflight || cfg.preflight_strict) {
    DoctorConfig check;
    check.threads = cfg.threads;
    const int marked = run_or_fail([&] { return run_doctor(check, comm); });
    if (marked > 0 && cfg.preflight_strict) {
      if (comm.rank() == 0)
        std::cerr << "ringtrain: error: --preflight-strict: the pre-flight check marked " << marked
                  << " outlier" << (marked == 1 ? "" : "s") << " (above); not training"
                  << std::endl;
      return 2;
    }
  }
  // hierarchical, or on cuda NCCL or MPI staged through host memory; null: comm itself.
  std::unique_ptr<comm::Communicator> own = make_train_communicator(cfg, comm);
  comm::Communicator* train_comm = own ? own.get() : &comm;
  // Every collective of the run through the recorder (it outlives the trainer's threads).
  const std::unique_ptr<comm::FlightRecorder> recorder = make_flight_recorder(cfg, comm);
  std::unique_ptr<comm::RecordingCommunicator> recorded;
  if (recorder) {
    recorded = std::make_unique<comm::RecordingCommunicator>(*train_comm, *recorder);
    train_comm = recorded.get();
  }
  // Setup agrees on its errors; from the first collective on, an error ends the job from
  // the rank that saw it, with the trainer (its threads, open files) left as it is.
  std::optional<Trainer> trainer;
  run_or_fail([&] { trainer.emplace(cfg, *train_comm); });
  return run_or_fail([&] { return trainer->run(); });
}

namespace {

// Per class k of the confusion matrix m (rows: label, columns: prediction), one-vs-rest:
// accuracy (TP + TN) / N, precision TP / predicted k (NaN when nothing was), recall TP /
// samples of k (NaN when there are none).
struct ClassFigures {
  int64_t samples = 0, predicted = 0;
  double accuracy = 0, precision = 0, recall = 0;
};

std::vector<ClassFigures> per_class(const std::vector<double>& m, int64_t c, int64_t n) {
  std::vector<ClassFigures> out(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) {
    double row = 0, col = 0;
    for (int64_t j = 0; j < c; ++j) {
      row += m[size_t(k * c + j)];
      col += m[size_t(j * c + k)];
    }
    const double tp = m[size_t(k * c + k)];
    ClassFigures& f = out[size_t(k)];
    f.samples = int64_t(row);
    f.predicted = int64_t(col);
    f.accuracy = (double(n) - row - col + 2 * tp) / double(n);
    f.precision = col > 0 ? tp / col : NAN;
    f.recall = row > 0 ? tp / row : NAN;
  }
  return out;
}

std::string fixed4(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// The per-class table and (up to 20 classes) the confusion matrix, as eval prints them.
void print_per_class(const std::vector<ClassFigures>& f, const std::vector<double>& m,
                     const std::vector<std::string>& names) {
  const int64_t c = int64_t(f.size());
  auto name = [&](int64_t k) {
    return size_t(k) < names.size() ? names[size_t(k)] : std::to_string(k);
  };
  size_t w = 5;
  for (int64_t k = 0; k < c; ++k) w = std::max(w, name(k).size());
  std::printf("%-*s %8s %9s %9s %9s %9s\n", int(w), "class", "samples", "predicted", "accuracy",
              "precision", "recall");
  for (int64_t k = 0; k < c; ++k)
    std::printf("%-*s %8lld %9lld %9s %9s %9s\n", int(w), name(k).c_str(),
                static_cast<long long>(f[size_t(k)].samples),
                static_cast<long long>(f[size_t(k)].predicted),
                fixed4(f[size_t(k)].accuracy).c_str(), fixed4(f[size_t(k)].precision).c_str(),
                fixed4(f[size_t(k)].recall).c_str());
  if (c > 20) {
    std::printf("confusion matrix: %lld x %lld, in the --metrics record\n",
                static_cast<long long>(c), static_cast<long long>(c));
    return;
  }
  std::printf("confusion matrix (rows: label, columns: predicted class)\n%*s", int(w), "");
  for (int64_t j = 0; j < c; ++j) std::printf(" %6lld", static_cast<long long>(j));
  std::printf("\n");
  for (int64_t k = 0; k < c; ++k) {
    std::printf("%-*s", int(w), name(k).c_str());
    for (int64_t j = 0; j < c; ++j) std::printf(" %6.0f", m[size_t(k * c + j)]);
    std::printf("\n");
  }
}

// eval --baselines: rank 0 counts the training split and scores the n-gram models on the
// evaluated split over the targets of windows of `seq_len` (0: every token; the other ranks
// wait for the outcome); prints them and writes a record. Returns rank 0's figures.
io::BaselineLoss print_baselines(const EvalConfig& cfg, int64_t seq_len, comm::Communicator& comm) {
  io::BaselineLoss b;
  run_and_agree(comm, [&] {
    if (comm.rank() != 0) return;
    io::TokenDataset train(cfg.baselines), val(cfg.data);
    const io::NgramCounts counts = io::count_ngrams(train);
    b = io::baseline_loss(counts, val, seq_len);
    // Byte tokens: one byte per token, so bits/byte = nats/token / ln 2.
    const double bits = 1.0 / std::log(2.0);
    const std::string windows =
        seq_len > 0 ? cat("windows of ", seq_len, " tokens") : std::string("every token");
    std::printf(
        "baselines on %s (%lld target tokens, %s), counted on %s (%lld tokens), add-one "
        "smoothing:\n",
        cfg.data.c_str(), static_cast<long long>(b.targets), windows.c_str(), cfg.baselines.c_str(),
        static_cast<long long>(counts.tokens));
    std::printf("  unigram  %.4f nats/token  %.4f bits/byte\n", b.unigram, b.unigram * bits);
    std::printf("  bigram   %.4f nats/token  %.4f bits/byte\n", b.bigram, b.bigram * bits);
    MetricsWriter metrics(cfg.metrics);
    metrics.write(JsonLine()
                      .add("type", "baseline")
                      .add("split", cfg.data)
                      .add("train", cfg.baselines)
                      .add("seq_len", seq_len)
                      .add("targets", b.targets)
                      .add("unigram", b.unigram)
                      .add("bigram", b.bigram));
  });
  return b;
}

// eval of a language model on token data: every non-overlapping window of --seq-len (the
// length the model trained at by default) tokens, each rank its slice; the loss in
// nats/token and bits/byte, and with --baselines the n-gram models on the same targets.
int eval_tokens(const EvalConfig& cfg, LoadedModel& loaded, kernels::Backend& backend,
                const TokenInput& lm, const std::string& model_name, comm::Communicator& comm) {
  std::unique_ptr<io::TokenDataset> data;
  int64_t t = 0;
  run_and_agree(comm, [&] {
    data = std::make_unique<io::TokenDataset>(cfg.data);
    if (!loaded.meta.tokenizer.empty())  // checkpoints before tokenizers were recorded: none
      io::require_same_tokenizer({loaded.meta.tokenizer, loaded.meta.tokenizer_sha256, 0},
                                 cat("the training data of checkpoint '", cfg.checkpoint, "'"),
                                 io::tokenizer_id_of(data->info()), cat("--data '", cfg.data, "'"));
    t = cfg.seq_len ? cfg.seq_len : loaded.model->input_shape().at(0);
    io::require_tokens_fit_model(data->info(), t, lm.vocab, lm.context ? lm.context : t,
                                 model_name);
    data->set_seq_len(t);
  });
  // Windows of about 8192 tokens a pass unless --batch-size says: [B, T, V] fp32 logits of
  // 256 windows of 1024 tokens over GPT-2's vocabulary would be 52 GB.
  const int64_t batch = cfg.batch_size_given ? cfg.batch_size : std::max<int64_t>(1, 8192 / t);
  const EvalResult r = run_or_fail([&] {
    return evaluate_tokens(*loaded.model, *data, comm, backend, batch, cfg.eval_windows);
  });
  const double bits = bits_per_byte(data->info(), r.loss).value_or(-1);  // -1: not bytes
  if (comm.rank() == 0) {
    char bpb[40] = "";
    if (bits >= 0) std::snprintf(bpb, sizeof bpb, "  %.4f bits/byte", bits);
    std::printf(
        "eval %s on %s (%lld%s windows of %lld tokens: %lld target tokens, computed in %s):\n"
        "  model    %.4f nats/token%s  accuracy %.4f\n",
        cfg.checkpoint.c_str(), cfg.data.c_str(), static_cast<long long>(r.samples),
        r.samples < data->num_windows() ? cat(" of ", data->num_windows()).c_str() : "",
        static_cast<long long>(t), static_cast<long long>(r.tokens), dtype_name(cfg.precision),
        r.loss, bpb, r.accuracy);
    std::fflush(stdout);
  }
  std::optional<io::BaselineLoss> base;
  if (!cfg.baselines.empty()) base = print_baselines(cfg, t, comm);
  if (comm.rank() != 0) return 0;
  if (base)
    std::printf("  model / bigram = %.4f, model / unigram = %.4f\n", r.loss / base->bigram,
                r.loss / base->unigram);
  JsonLine record;
  record.add("type", "eval")
      .add("step", loaded.meta.step)
      .add("split", cfg.data)
      .add("loss", r.loss)
      .add("accuracy", r.accuracy)
      .add("seq_len", t)
      .add("windows", r.samples)
      .add("windows_total", data->num_windows())
      .add("tokens", r.tokens);
  if (bits >= 0) record.add("bits_per_byte", bits);
  if (base) record.add("unigram", base->unigram).add("bigram", base->bigram);
  MetricsWriter metrics(cfg.metrics);
  metrics.write(record);
  return 0;
}

}  // namespace

// eval of a model whose file declares its loss: the loss, each metric, and the metrics with one
// value per label or class (f1, mean_iou) label by label.
int eval_loss(const EvalConfig& cfg, const LoadedModel& loaded, io::Dataset& data,
              kernels::Backend& backend, comm::Communicator& comm) {
  const EvalResult r = run_or_fail([&] {
    return evaluate_loss(*loaded.model, data, comm, backend, cfg.batch_size,
                         normalization_of(loaded.meta));
  });
  if (comm.rank() != 0) return 0;
  const LossSpec& spec = loaded.model->loss();
  std::printf("eval %s on %s (%lld samples, computed in %s): loss(%s) %.4f\n",
              cfg.checkpoint.c_str(), cfg.data.c_str(), static_cast<long long>(r.samples),
              dtype_name(cfg.precision), spec.name().c_str(), r.loss);
  JsonLine record;
  record.add("type", "eval")
      .add("step", loaded.meta.step)
      .add("split", cfg.data)
      .add("loss_name", spec.name())
      .add("loss", r.loss);
  for (const auto& [name, value] : r.metrics) {
    std::printf("  %-10s %.4f\n", name.c_str(), value);
    record.add(name, value);
  }
  for (const auto& [name, values] : r.per_output) {
    std::printf("  %s per %s:", name.c_str(), name == "f1" ? "label" : "class");
    std::vector<JsonLine> each;
    for (size_t k = 0; k < values.size(); ++k) {
      std::printf(" %zu:%.4f", k, values[k]);
      each.emplace_back().add("index", int64_t(k)).add(name, values[k]);
    }
    std::printf("\n");
    record.add(cat(name, "_per_", name == "f1" ? "label" : "class"), each);
  }
  MetricsWriter metrics(cfg.metrics);
  metrics.write(record);
  return 0;
}

int cmd_eval(const std::vector<std::string>& args, comm::Communicator& comm) {
  EvalConfig cfg;
  if (!parse_agreed(parse_eval, args, cfg, comm)) return 0;
  if (cfg.checkpoint.empty()) {
    print_baselines(cfg, cfg.seq_len, comm);
    return 0;
  }
  LoadedModel loaded;
  std::unique_ptr<io::Dataset> data;
  std::unique_ptr<kernels::Backend> backend;
  std::vector<std::string> names;
  TokenInput lm;
  std::string model_name;  // for messages: "NAME' of checkpoint 'C"
  run_and_agree(comm, [&] {
    const Device device = choose_device(cfg.device, comm);
    backend = make_backend(device, threads_for_rank(cfg.threads, comm), cfg.gpu_memory);
    load_plugins(cfg.plugins);
    loaded = load_model_from_checkpoint(cfg.checkpoint, cfg.precision, device, *backend);
    const ModelFile file = model_from_checkpoint(loaded.meta, cfg.checkpoint);
    lm = token_input_of(plan_model(file));
    model_name = cat(file.name(), "' of checkpoint '", cfg.checkpoint);
    const io::DataKind want = lm.takes_tokens ? io::DataKind::tokens : io::DataKind::images;
    io::require_data_kind(cfg.data, io::data_kind_of(cfg.data), want,
                          cat("the model of checkpoint '", cfg.checkpoint, "'"));
    RT_REQUIRE(lm.takes_tokens || cfg.baselines.empty(),
               "--baselines is for token data; the model of checkpoint '", cfg.checkpoint,
               "' takes images and labels");
    RT_REQUIRE(lm.takes_tokens || cfg.eval_windows == 0, "--eval-windows ", cfg.eval_windows,
               " is for token data; the model of checkpoint '", cfg.checkpoint,
               "' takes images and labels");
    if (lm.takes_tokens) return;
    data = std::make_unique<io::Dataset>(cfg.data);
    require_data_fits(*loaded.model, data->info(), cfg.checkpoint);
    if (comm.rank() == 0) names = io::read_class_names(io::resolve_dataset_files(cfg.data).front());
  });
  if (lm.takes_tokens) return eval_tokens(cfg, loaded, *backend, lm, model_name, comm);
  const io::CheckpointMeta& meta = loaded.meta;
  if (loaded.model->loss().own_evaluation()) return eval_loss(cfg, loaded, *data, *backend, comm);
  // Collective (the sums): an error in it ends the job from the rank that saw it.
  std::vector<double> confusion;
  const EvalResult r = run_or_fail([&] {
    return evaluate(*loaded.model, *data, comm, *backend, cfg.batch_size, normalization_of(meta),
                    &confusion);
  });
  if (comm.rank() == 0) {
    std::printf("eval %s on %s (%lld samples, computed in %s): loss %.4f accuracy %.4f\n",
                cfg.checkpoint.c_str(), cfg.data.c_str(), static_cast<long long>(r.samples),
                dtype_name(cfg.precision), r.loss, r.accuracy);
    const int64_t c = loaded.model->classes();
    const std::vector<ClassFigures> figures = per_class(confusion, c, r.samples);
    print_per_class(figures, confusion, names);
    std::vector<JsonLine> classes;
    std::vector<std::vector<int64_t>> matrix(static_cast<size_t>(c),
                                             std::vector<int64_t>(static_cast<size_t>(c)));
    for (int64_t k = 0; k < c; ++k) {
      const ClassFigures& f = figures[size_t(k)];
      JsonLine& one = classes.emplace_back();
      one.add("class", k);
      if (size_t(k) < names.size()) one.add("name", names[size_t(k)]);
      one.add("samples", f.samples)
          .add("predicted", f.predicted)
          .add("accuracy", f.accuracy)
          .add("precision", f.precision)
          .add("recall", f.recall);
      for (int64_t j = 0; j < c; ++j)
        matrix[size_t(k)][size_t(j)] = int64_t(confusion[size_t(k * c + j)]);
    }
    MetricsWriter metrics(cfg.metrics);
    metrics.write(JsonLine()
                      .add("type", "eval")
                      .add("step", meta.step)
                      .add("split", cfg.data)
                      .add("loss", r.loss)
                      .add("accuracy", r.accuracy)
                      .add("per_class", classes)
                      .add("confusion", matrix));
  }
  return 0;
}

int cmd_predict(const std::vector<std::string>& args, comm::Communicator& comm) {
  PredictConfig cfg;
  if (!parse_agreed(parse_predict, args, cfg, comm)) return 0;
  return run_predict(cfg, comm);
}

int cmd_sample(const std::vector<std::string>& args, comm::Communicator& comm) {
  SampleConfig cfg;
  if (!parse_agreed(parse_sample, args, cfg, comm)) return 0;
  return run_sample(cfg, comm);
}

namespace {

// convert npy|images|cifar: every rank opens the source and reads (decodes) its own slice
// under run_and_agree(), so a bad file or record is one agreed message; the statistics and the
// parallel write are collective.
int convert_in_parallel(const std::string& format, const ConvertConfig& cfg,
                        comm::Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<io::ConvertSource> src;
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
  std::vector<uint8_t> targets;  // 4 bytes per element (float32 or int32)
  std::vector<double> stats;     // per channel: sums, then sums of squares
  int64_t lo = 0, hi = 0, channels = 1;
  run_and_agree(comm, [&] {
    if (comm.rank() == 0) {  // like `mkdir -p`, as convert idx
      const std::filesystem::path parent = std::filesystem::path(cfg.out).parent_path();
      std::error_code ec;
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
      RT_REQUIRE(parent.empty() || std::filesystem::is_directory(parent), "--out '", cfg.out,
                 "': directory '", parent.string(), "' cannot be created",
                 ec ? cat(" (", ec.message(), ")") : std::string());
    }
    if (format == "npy")
      src = io::open_npy_source(cfg.images, cfg.labels, cfg.layout, cfg.targets);
    else if (format == "images")
      src = io::open_image_folder(cfg.root, cfg.height, cfg.width, cfg.grayscale ? 1 : 3);
    else
      src = io::open_cifar(cfg.inputs, cfg.cifar100);
    const io::SourceInfo& info = src->info();
    const int64_t n = info.num_samples;
    RT_REQUIRE(cfg.shards <= n, "--shards ", cfg.shards, " is not valid for ", n,
               " samples; expected 1 to ", n);
    lo = n * comm.rank() / comm.size();
    hi = n * (comm.rank() + 1) / comm.size();
    images.resize(size_t((hi - lo) * src->sample_bytes()));
    labels.resize(size_t(hi - lo));
    src->read(lo, hi, images.data(), labels.data());
    targets.resize(size_t((hi - lo) * shape_numel(src->info().target_shape)) * 4);
    if (!src->info().target_shape.empty()) src->read_targets(lo, hi, targets.data());
    channels = info.sample_shape.size() == 3 ? info.sample_shape[0] : 1;
    stats.assign(size_t(2 * channels), 0.0);
    io::add_channel_stats(images.data(), hi - lo, info.sample_shape, info.dtype, stats.data(),
                          stats.data() + channels);
  });
  const io::SourceInfo& info = src->info();
  std::vector<std::string> files;
  io::DatasetHeader h;
  run_or_fail([&] {
    comm.allreduce(stats.data(), int64_t(stats.size()), DType::f64, comm::ReduceOp::sum);
    h.num_samples = info.num_samples;
    h.sample_shape = info.sample_shape;
    h.dtype = info.dtype;
    h.has_labels = info.has_labels;
    h.num_classes = info.num_classes;
    h.class_names = info.class_names;
    h.target_shape = info.target_shape;
    h.target_dtype = info.target_dtype;
    const double per = double(info.num_samples) * double(shape_numel(info.sample_shape) / channels);
    const double scale = info.dtype == DType::u8 ? 1.0 / 255.0 : 1.0;  // to [0, 1]
    double sum = 0, sq = 0;
    for (int64_t ch = 0; ch < channels; ++ch) {
      const double s = stats[size_t(ch)] * scale, q = stats[size_t(channels + ch)] * scale * scale;
      h.mean.push_back(s / per);
      h.std.push_back(std::sqrt(std::max(0.0, q / per - (s / per) * (s / per))));
      sum += s;
      sq += q;
    }
    h.mean_all = sum / (per * double(channels));
    h.std_all = std::sqrt(std::max(0.0, sq / (per * double(channels)) - h.mean_all * h.mean_all));
    files = io::write_dataset_parallel(comm.mpi(), cfg.out, cfg.shards, h, lo, hi - lo,
                                       images.data(), labels.data(), targets.data());
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() == 0) {
    const std::string where = files.size() == 1 ? files[0]
                                                : cat(files.front(), " ... ", files.back(), " (",
                                                      files.size(), " shards)");
    std::string classes = info.has_labels ? cat(info.num_classes, " classes") : "no labels";
    if (!info.target_shape.empty())
      classes += cat(", targets ", shape_str(info.target_shape), " ",
                     info.target_dtype == DType::f32 ? "float32" : "int32");
    if (!info.class_names.empty()) classes += " (names stored)";
    std::printf("wrote %s: %lld samples of %s %s, %s; %d rank(s), %.2f s, %.0f samples/s\n",
                where.c_str(), static_cast<long long>(info.num_samples),
                shape_str(info.sample_shape).c_str(), dtype_name(info.dtype), classes.c_str(),
                comm.size(), secs, double(info.num_samples) / std::max(secs, 1e-9));
  }
  return 0;
}

// convert text: one writer (the corpus is read once; tokenising is a copy, or SentencePiece on
// rank 0's threads); the other ranks check the tokenizer model too and wait for the outcome.
int convert_text_on_rank0(const ConvertConfig& cfg, comm::Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  run_and_agree(comm, [&] {
    std::optional<io::SentencePieceTokenizer> tok;
    if (!cfg.tokenizer.empty())
      tok = io::SentencePieceTokenizer::from_file(cfg.tokenizer, "--tokenizer");
    if (comm.rank() != 0) return;
    const int threads =
        cfg.threads > 0 ? cfg.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    const io::TextConvertResult r =
        io::convert_text(cfg.inputs, cfg.out, cfg.shards, cfg.val_fraction,
                         uint64_t(cfg.max_input_mb) << 20, tok ? &*tok : nullptr, threads);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string where = r.train_files.size() == 1
                                  ? r.train_files[0]
                                  : cat(r.train_files.front(), " ... ", r.train_files.back(), " (",
                                        r.train_files.size(), " shards)");
    const std::string kind =
        tok ? cat("SentencePiece, vocabulary ", r.vocab_size, ", end of text ", tok->eos_id())
            : std::string("bytes, vocabulary 256");
    std::printf("wrote %s: %lld tokens (%s) of %lld documents from %lld files\n", where.c_str(),
                static_cast<long long>(r.train_tokens), kind.c_str(),
                static_cast<long long>(r.documents - r.val_documents),
                static_cast<long long>(r.files));
    if (!r.val_file.empty())
      std::printf("wrote %s: %lld tokens of %lld documents (validation, %.1f%% of the tokens)\n",
                  r.val_file.c_str(), static_cast<long long>(r.val_tokens),
                  static_cast<long long>(r.val_documents),
                  100.0 * double(r.val_tokens) / double(r.val_tokens + r.train_tokens));
    if (tok) {
      const double e = std::max(r.encode_seconds, 1e-9);
      std::printf(
          "encoded %lld bytes into %lld tokens in %.3f s on %d thread(s): %.0f tokens/s, "
          "%.2f MB/s (%.2f MB/s per thread)\n",
          static_cast<long long>(r.input_bytes),
          static_cast<long long>(r.train_tokens + r.val_tokens), r.encode_seconds, threads,
          double(r.train_tokens + r.val_tokens) / e, double(r.input_bytes) / e / 1e6,
          double(r.input_bytes) / e / 1e6 / threads);
    }
    std::printf("%.2f s\n", secs);
  });
  return 0;
}

}  // namespace

int cmd_convert(const std::vector<std::string>& args, comm::Communicator& comm) {
  const char* usage =
      "usage: ringtrain convert FORMAT [options] --out PATH [--shards N]\n"
      "  idx     --images F --labels F            MNIST-style IDX files (.gz or plain)\n"
      "  npy     --images X.npy|X.npz[:KEY] [--labels Y.npy|Y.npz[:KEY]] [--layout nchw|nhwc]\n"
      "  images  --root DIR [--size H,W]           ImageFolder: DIR/<class>/<image>.png|.jpg\n"
      "  cifar   --input FILE... [--cifar100]      CIFAR-10/100 binary batches\n"
      "  text    --input FILE|DIR|GLOB... [--val-fraction F] [--tokenizer tok.model]\n"
      "                                            byte or SentencePiece tokens for language "
      "models\n"
      "  hf      --in DIR --out CKPT.h5            a Hugging Face GPT-2 or Llama (config.json + "
      "safetensors)\n"
      "                                            as a ringtrain checkpoint\n"
      "`ringtrain convert FORMAT --help` lists a format's options.\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.rank() == 0) std::cout << usage;
    return 0;
  }
  std::vector<std::string> rest = args;
  run_and_agree(comm, [&] {
    RT_REQUIRE(
        !rest.empty() && (rest[0] == "idx" || rest[0] == "npy" || rest[0] == "images" ||
                          rest[0] == "cifar" || rest[0] == "text" || rest[0] == "hf"),
        "ringtrain convert: expected a source format: idx, npy, images, cifar, text or hf, e.g. "
        "`ringtrain convert images --root DIR --out PATH`",
        rest.empty() ? "" : cat(" (got '", rest[0], "')"));
  });
  const std::string format = rest[0];
  rest.erase(rest.begin());
  ConvertConfig cfg;
  if (format == "hf") {
    if (!parse_agreed(parse_convert_hf, rest, cfg, comm)) return 0;
    return convert_hf(cfg, comm);
  }
  if (format == "text") {
    if (!parse_agreed(parse_convert_text, rest, cfg, comm)) return 0;
    return convert_text_on_rank0(cfg, comm);
  }
  if (format != "idx") {
    auto parse = format == "npy"      ? parse_convert_npy
                 : format == "images" ? parse_convert_images
                                      : parse_convert_cifar;
    if (!parse_agreed(parse, rest, cfg, comm)) return 0;
    return convert_in_parallel(format, cfg, comm);
  }
  if (!parse_agreed(parse_convert, rest, cfg, comm)) return 0;
  run_and_agree(comm, [&] {  // one writer; the other ranks (if any) only wait for the outcome
    if (comm.rank() != 0) return;
    // Like `mkdir -p`: the README's first command writes data/train.h5 in a fresh directory.
    const std::filesystem::path parent = std::filesystem::path(cfg.out).parent_path();
    if (!parent.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
      RT_REQUIRE(std::filesystem::is_directory(parent), "--out '", cfg.out, "': directory '",
                 parent.string(), "' cannot be created",
                 ec ? cat(" (", ec.message(), ")") : std::string());
    }
    auto r = io::convert_idx(cfg.images, cfg.labels, cfg.out, cfg.shards);
    const std::string where = r.files.size() == 1 ? r.files[0]
                                                  : cat(r.files.front(), " ... ", r.files.back(),
                                                        " (", r.files.size(), " shards)");
    std::printf("wrote %s: %lld samples of %s, %lld classes\n", where.c_str(),
                static_cast<long long>(r.samples), shape_str(r.sample_shape).c_str(),
                static_cast<long long>(r.num_classes));
  });
  return 0;
}

}  // namespace ringtrain::launch
