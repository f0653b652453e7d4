// `ringtrain predict` (see predict.hpp). Setup (model, data, output directory) runs under
// run_and_agree(); the forward passes and the writing have collectives (the parallel HDF5 file,
// the gather) and run under run_or_fail(). The output appears under its name only when it
// is complete: it is written as OUT.tmp and renamed; on an error the .tmp is removed.
#include "launch/predict.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "io/convert_output.hpp"
#include "io/npy.hpp"
#include "io/output_file.hpp"
#include "train/device.hpp"
#include "train/evaluate.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {

std::vector<float> forward_slice(Model& model, io::Dataset& data, kernels::Backend& backend,
                                 int64_t lo, int64_t hi, int64_t batch,
                                 const io::Normalization& norm, int32_t* labels) {
  const int64_t classes = shape_numel(output_shape_of(model));  // outputs per sample
  std::vector<float> out(size_t((hi - lo) * classes));
  Context ctx{backend, model.compute_dtype(), /*training=*/false};
  Shape xs = {batch};
  xs.insert(xs.end(), data.info().sample_shape.begin(), data.info().sample_shape.end());
  const Device dev = backend.device();
  DeviceScope on_device(dev);
  OwnedTensor x, xc, xd;
  std::vector<int64_t> idx;
  for (int64_t start = lo; start < hi; start += batch) {
    const int64_t b = std::min(batch, hi - start);
    xs[0] = b;
    idx.resize(size_t(b));
    std::iota(idx.begin(), idx.end(), start);
    Tensor* xf = &x.ensure(xs, DType::f32, Device{});
    data.read(idx.data(), b, xf->as<float>(), labels ? labels + (start - lo) : nullptr, norm);
    if (dev.kind != Device::cpu) {
      Tensor& xu = xd.ensure(xs, DType::f32, dev);
      copy_bytes(xu.data, dev, xf->data, Device{}, xf->bytes());
      xf = &xu;
    }
    const Tensor* in = xf;
    if (ctx.compute != DType::f32) {
      backend.cast(*xf, xc.ensure(xs, ctx.compute));
      in = &xc.view;
    }
    const Tensor& logits = model.forward(ctx, *in);
    RT_CHECK(logits.dtype == DType::f32 && logits.numel() == b * classes, "logits of shape ",
             shape_str(logits.shape), " for ", b, " samples of ", classes, " classes");
    copy_bytes(out.data() + (start - lo) * classes, Device{}, logits.data, logits.device,
               size_t(b * classes) * sizeof(float));
  }
  return out;
}

Shape output_shape_of(const Model& model) {
  const LossSpec& loss = model.loss();
  if (loss.target_kind() == TargetKind::labels) return {model.classes()};
  Shape out = model.target_shape();
  if (loss.target_kind() == TargetKind::int_targets) out.insert(out.begin(), model.classes());
  return out;
}

void softmax_rows(float* s, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * classes;
    const float mx = *std::max_element(x, x + classes);
    double sum = 0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(double(x[j] - mx));
    for (int64_t j = 0; j < classes; ++j) x[j] = float(std::exp(double(x[j] - mx)) / sum);
  }
}

void top_k_rows(const float* s, int64_t rows, int64_t classes, int64_t k, int32_t* top,
                float* top_scores) {
  std::vector<int32_t> order(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = s + r * classes;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      top[r * k + j] = order[size_t(j)];
      top_scores[r * k + j] = x[order[size_t(j)]];
    }
  }
}

void prepare_output_dir(const std::string& out, int rank) {
  if (rank != 0) return;  // like `mkdir -p` for the output's directory
  const fs::path parent = fs::path(out).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  RT_REQUIRE(parent.empty() || fs::is_directory(parent), "--out '", out, "': directory '",
             parent.string(), "' cannot be created",
             ec ? cat(" (", ec.message(), ")") : std::string());
  RT_REQUIRE(!fs::is_directory(out, ec), "--out '", out, "' is a directory; expected a file name");
}

namespace {

struct PredictSetup {
  std::unique_ptr<kernels::Backend> backend;
  LoadedModel loaded;
  std::unique_ptr<io::Dataset> data;
  std::vector<std::string> class_names;
  int64_t classes = 0, k = 1;  // classes: outputs per sample for a model file's own loss
  Shape out_shape;             // one sample's output
  bool own_loss = false;       // the model file declares its loss: outputs, no classes
  bool npy = false;
};

// A model with its own loss, into .h5: /outputs [N, output...] (in the targets' shape), and
// /targets when the data has them.
void write_outputs_h5(const PredictConfig& cfg, const PredictSetup& s, MPI_Comm comm, int64_t lo,
                      int64_t count, const std::vector<float>& outputs) {
  const int64_t n = s.data->info().num_samples;
  Shape shape = {n};
  shape.insert(shape.end(), s.out_shape.begin(), s.out_shape.end());
  const std::string tmp = cfg.out + ".tmp";
  bool committed = false;
  try {
    io::H5Lock lock;
    io::CollectiveFileScope collective;
    io::ParallelH5Writer w(comm);
    {
      const std::vector<io::ChunkedExtent> extents = {
          io::ParallelH5Writer::extent(shape, DType::f32)};
      io::H5Id f =
          w.create(tmp, io::h5_file_bytes_bound(extents, io::fs_block_size(tmp),
                                                cfg.checkpoint.size() + cfg.data.size() + 1024));
      io::write_attr(f, "format", std::string("ringtrain-predictions"));
      io::write_attr(f, "format_version", int64_t(1));
      io::write_attr(f, "checkpoint", cfg.checkpoint);
      io::write_attr(f, "step", s.loaded.meta.step);
      io::write_attr(f, "data", cfg.data);
      io::write_attr(f, "loss", s.loaded.model->loss().name());
      io::write_attr(f, "precision", std::string(dtype_name(cfg.precision)));
      w.write_rows(f, "outputs", DType::f32, shape, lo, count, outputs.data(), true);
      io::ParallelH5Writer::close(f, tmp);
    }
    MPI_Barrier(comm);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) {
      io::commit_output(tmp, cfg.out);
      committed = true;
    }
  } catch (...) {
    io::rethrow_write_failure(cfg.out, [&] { io::remove_quietly(committed ? cfg.out : tmp); });
  }
}

// Removes `tmp` on this rank if `fn` throws, then rethrows.
void write_h5(const PredictConfig& cfg, const PredictSetup& s, MPI_Comm comm, int64_t lo,
              int64_t count, const std::vector<float>& scores, const std::vector<int32_t>& labels) {
  const int64_t n = s.data->info().num_samples, c = s.classes, k = s.k;
  std::vector<int32_t> top(size_t(count * k));
  std::vector<float> top_scores(size_t(count * k));
  top_k_rows(scores.data(), count, c, k, top.data(), top_scores.data());
  const std::string tmp = cfg.out + ".tmp";
  bool committed = false;
  try {
    io::H5Lock lock;
    io::CollectiveFileScope collective;
    io::ParallelH5Writer w(comm);
    {
      uint64_t names_bytes = 0;
      for (const auto& cn : s.class_names) names_bytes += cn.size() + 8;
      const std::vector<io::ChunkedExtent> extents = {
          io::ParallelH5Writer::extent({n, c}, DType::f32),
          io::ParallelH5Writer::extent({n, k}, DType::i32),
          io::ParallelH5Writer::extent({n, k}, DType::f32),
          io::ParallelH5Writer::extent({n}, DType::i32),
          {names_bytes, names_bytes}};
      io::H5Id f =
          w.create(tmp, io::h5_file_bytes_bound(extents, io::fs_block_size(tmp),
                                                cfg.checkpoint.size() + cfg.data.size() + 1024));
      io::write_attr(f, "format", std::string("ringtrain-predictions"));
      io::write_attr(f, "format_version", int64_t(1));
      io::write_attr(f, "checkpoint", cfg.checkpoint);
      io::write_attr(f, "step", s.loaded.meta.step);
      io::write_attr(f, "data", cfg.data);
      io::write_attr(f, "scores", std::string(cfg.probabilities ? "probabilities" : "logits"));
      io::write_attr(f, "precision", std::string(dtype_name(cfg.precision)));
      io::write_attr(f, "num_classes", c);
      w.write_rows(f, cfg.probabilities ? "probabilities" : "logits", DType::f32, {n, c}, lo, count,
                   scores.data(), true);
      w.write_rows(f, "top_k", DType::i32, {n, k}, lo, count, top.data(), true);
      w.write_rows(f, "top_k_scores", DType::f32, {n, k}, lo, count, top_scores.data(), true);
      if (!labels.empty())
        w.write_rows(f, "labels", DType::i32, {n}, lo, count, labels.data(), true);
      if (!s.class_names.empty()) w.write_strings(f, "class_names", s.class_names);
      io::ParallelH5Writer::close(f, tmp);
    }
    MPI_Barrier(comm);  // closed everywhere before it gets its name
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) {
      io::commit_output(tmp, cfg.out);
      committed = true;
    }
  } catch (...) {
    io::rethrow_write_failure(cfg.out, [&] { io::remove_quietly(committed ? cfg.out : tmp); });
  }
}

void write_npy(const PredictConfig& cfg, const PredictSetup& s, comm::Communicator& comm,
               int64_t count, const std::vector<float>& scores) {
  const int64_t n = s.data->info().num_samples, c = s.classes;
  const int w = comm.size();
  std::vector<int64_t> counts(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    const int64_t rows = n * (r + 1) / w - n * r / w;
    RT_REQUIRE(rows * c <= INT32_MAX, "--out '", cfg.out, "': ", rows * c,
               " values per rank are too many for one .npy gather; use an .h5 output");
    counts[size_t(r)] = rows * c;
  }
  std::vector<float> all(comm.rank() == 0 ? size_t(n * c) : 0);
  comm.gatherv(scores.data(), all.data(), counts, DType::f32, 0);
  if (comm.rank() != 0) return;
  Shape shape = {n};
  shape.insert(shape.end(), s.out_shape.begin(), s.out_shape.end());
  io::write_outputs({cfg.out},
                    [&](std::string*) { io::write_npy_f32(cfg.out + ".tmp", all.data(), shape); });
}

}  // namespace

int run_predict(const PredictConfig& cfg, comm::Communicator& comm) {
  PredictSetup s;
  TokenPredictSetup tokens;
  TokenInput lm;
  run_and_agree(comm, [&] {
    const auto ends_with = [&](const char* ext) {
      const std::string e = ext;
      return cfg.out.size() > e.size() &&
             cfg.out.compare(cfg.out.size() - e.size(), e.size(), e) == 0;
    };
    s.npy = ends_with(".npy");
    RT_REQUIRE(s.npy || ends_with(".h5"), "--out '", cfg.out,
               "' must end in .h5 (logits, top-k, labels and class names) or .npy (one array)");
    const Device device = choose_device(cfg.device, comm);
    s.backend = make_backend(device, threads_for_rank(cfg.threads, comm), cfg.gpu_memory);
    load_plugins(cfg.plugins);
    s.loaded = load_model_from_checkpoint(cfg.checkpoint, cfg.precision, device, *s.backend);
    const ModelFile file = model_from_checkpoint(s.loaded.meta, cfg.checkpoint);
    lm = token_input_of(plan_model(file));
    const std::string who = cat("the model of checkpoint '", cfg.checkpoint, "'");
    io::require_data_kind(cfg.data, io::data_kind_of(cfg.data),
                          lm.takes_tokens ? io::DataKind::tokens : io::DataKind::images, who);
    if (lm.takes_tokens) {
      RT_REQUIRE(!s.npy, "--out '", cfg.out,
                 "': the predictions of a language model (per-window loss, top-k, logits) are "
                 "written as .h5; give --out P.h5");
      setup_token_predict(cfg, lm, cat(file.name(), "' of checkpoint '", cfg.checkpoint),
                          s.loaded.model->input_shape().at(0), tokens);
      tokens.step = s.loaded.meta.step;
      prepare_output_dir(cfg.out, comm.rank());
      return;
    }
    RT_REQUIRE(cfg.seq_len == 0 && cfg.logits_end == 0,
               cfg.seq_len ? "--seq-len" : "--logits-range", " is for token data; ", who,
               " takes images");
    s.data = std::make_unique<io::Dataset>(cfg.data, /*labels_required=*/false);
    require_data_fits(*s.loaded.model, s.data->info(), cfg.checkpoint);
    s.own_loss = !s.loaded.model->loss().is_default();
    s.out_shape = output_shape_of(*s.loaded.model);
    RT_REQUIRE(!s.own_loss || !cfg.probabilities,
               "--probabilities is for classifiers; the model "
               "of checkpoint '",
               cfg.checkpoint, "' trains with the loss '", s.loaded.model->loss().name(),
               "' and predicts outputs of shape ", shape_str(s.out_shape));
    s.classes = s.own_loss ? shape_numel(s.out_shape) : s.loaded.model->classes();
    // One rule with `sample`: a K above the model's classes is an error, not clamped; only
    // the default (5) is lowered for a model of fewer classes.
    RT_REQUIRE(!cfg.top_k_given || !s.own_loss,
               "--top-k is for classifiers; the model of "
               "checkpoint '",
               cfg.checkpoint, "' trains with the loss '", s.loaded.model->loss().name(), "'");
    RT_REQUIRE(!cfg.top_k_given || cfg.top_k <= s.classes, "--top-k ", cfg.top_k,
               " is not valid; expected 1 to ", s.classes, " (the model's classes)");
    s.k = std::min<int64_t>(cfg.top_k, s.classes);
    s.class_names = io::read_class_names(io::resolve_dataset_files(cfg.data).front());
    if (int64_t(s.class_names.size()) != s.classes) s.class_names.clear();
    prepare_output_dir(cfg.out, comm.rank());
  });
  if (lm.takes_tokens) {
    run_token_predict(cfg, comm, *s.loaded.model, *s.backend, tokens);
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = s.data->info().num_samples;
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  run_or_fail([&] {
    std::vector<int32_t> labels(s.data->info().has_labels && !s.npy ? size_t(hi - lo) : 0);
    std::vector<float> scores =
        forward_slice(*s.loaded.model, *s.data, *s.backend, lo, hi, cfg.batch_size,
                      normalization_of(s.loaded.meta), labels.empty() ? nullptr : labels.data());
    if (cfg.probabilities) softmax_rows(scores.data(), hi - lo, s.classes);
    if (s.npy)
      write_npy(cfg, s, comm, hi - lo, scores);
    else if (s.own_loss)
      write_outputs_h5(cfg, s, comm.mpi(), lo, hi - lo, scores);
    else
      write_h5(cfg, s, comm.mpi(), lo, hi - lo, scores, labels);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() == 0 && s.own_loss)
    std::printf(
        "predicted %lld samples of %s with %s (step %lld, %s) into %s: outputs of shape %s "
        "(loss %s), %.0f samples/s\n",
        static_cast<long long>(n), cfg.data.c_str(), cfg.checkpoint.c_str(),
        static_cast<long long>(s.loaded.meta.step), dtype_name(cfg.precision), cfg.out.c_str(),
        shape_str(s.out_shape).c_str(), s.loaded.model->loss().name().c_str(),
        double(n) / std::max(secs, 1e-9));
  else if (comm.rank() == 0)
    std::printf(
        "predicted %lld samples of %s with %s (step %lld, %s) into %s: %s of %lld classes%s, "
        "%.0f samples/s\n",
        static_cast<long long>(n), cfg.data.c_str(), cfg.checkpoint.c_str(),
        static_cast<long long>(s.loaded.meta.step), dtype_name(cfg.precision), cfg.out.c_str(),
        cfg.probabilities ? "probabilities" : "logits", static_cast<long long>(s.classes),
        s.npy ? "" : cat(", top-", s.k, s.class_names.empty() ? "" : ", class names").c_str(),
        double(n) / std::max(secs, 1e-9));
  return 0;
}

}  // namespace ringtrain::launch
