// `ringtrain predict` for a language model on token data (see predict.hpp): per window of
// --seq-len tokens, the mean next-token cross-entropy and the correct arg-max predictions
// (the same kernel as `eval`, so the windows' losses average to eval's figure); on request the
// top-k next tokens with their log-probabilities per position, and the full logits of a range
// of windows. Rank r takes the r-th contiguous slice of the windows; all ranks write their rows
// of one HDF5 file (parallel HDF5), window i of the dataset at row i.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>

#include "io/convert_output.hpp"
#include "io/output_file.hpp"
#include "launch/predict.hpp"
#include "train/device.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {
namespace {

// What this rank computes for its windows [lo, hi), in host memory.
struct TokenPredictions {
  std::vector<double> loss;       // [windows]: mean cross-entropy per target token, nats
  std::vector<int32_t> correct;   // [windows]: targets that are the first arg-max
  std::vector<int32_t> targets;   // [windows, T]
  std::vector<int32_t> top;       // [windows, T, K]
  std::vector<float> top_scores;  // [windows, T, K]: log-probabilities
  std::vector<float> logits;      // [windows of this rank in the logits range, T, vocab]
};

// The k likeliest of each of `rows` rows of logits (row stride `stride`, the first `vocab`
// columns scored), best first (ties: the lower token id first, as the arg-max), with their
// log-softmax over those columns (computed in double); rows in parallel over `threads`, each
// row's result independent of them.
void top_k_log_probs(const float* x, int64_t rows, int64_t stride, int64_t vocab, int64_t k,
                     int threads, int32_t* top, float* scores) {
#pragma omp parallel num_threads(threads) if (threads > 1 && rows > 1)
  {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * stride;
      const float mx = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(row[j]) - double(mx));
      const double lse = double(mx) + std::log(sum);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      for (int64_t j = 0; j < k; ++j) {
        top[r * k + j] = order[size_t(j)];
        scores[r * k + j] = float(double(row[order[size_t(j)]]) - lse);
      }
    }
  }
}

TokenPredictions predict_windows(const PredictConfig& cfg, Model& model, io::TokenDataset& data,
                                 kernels::Backend& backend, int64_t lo, int64_t hi, int64_t batch,
                                 int64_t k) {
  const int64_t t = data.seq_len(), vocab = data.info().vocab_size, count = hi - lo;
  TokenPredictions p;
  p.loss.resize(size_t(count));
  p.correct.resize(size_t(count));
  p.targets.resize(size_t(count * t));
  p.top.resize(size_t(count * t * k));
  p.top_scores.resize(size_t(count * t * k));
  // The part of the logits range that is this rank's.
  const int64_t llo = std::max(lo, cfg.logits_start), lhi = std::min(hi, cfg.logits_end);
  p.logits.resize(lhi > llo ? size_t((lhi - llo) * t * vocab) : 0);
  Context ctx{backend, model.compute_dtype(), /*training=*/false};
  const Device dev = backend.device();
  DeviceScope on_device(dev);
  OwnedTensor x, xd, yd;
  std::vector<int64_t> idx;
  std::vector<float> host;
  for (int64_t start = lo; start < hi; start += batch) {
    const int64_t b = std::min(batch, hi - start), row0 = start - lo;
    idx.resize(size_t(b));
    std::iota(idx.begin(), idx.end(), start);
    Tensor* xt = &x.ensure({b, t}, DType::i32, Device{});
    int32_t* y = p.targets.data() + row0 * t;
    data.read_windows(idx.data(), b, xt->as<int32_t>(), y);
    Tensor yt(y, {b, t}, DType::i32, Device{});
    if (dev.kind != Device::cpu) {
      Tensor& xu = xd.ensure({b, t}, DType::i32, dev);
      Tensor& yu = yd.ensure({b, t}, DType::i32, dev);
      copy_bytes(xu.data, dev, xt->data, Device{}, xt->bytes());
      copy_bytes(yu.data, dev, y, Device{}, yt.bytes());
      xt = &xu;
      yt = yu;
    }
    const Tensor& logits = model.forward(ctx, *xt);
    const int64_t vp = logits.shape.back();
    RT_CHECK(logits.dtype == DType::f32 && logits.numel() == b * t * vp && vp >= vocab,
             "logits of shape ", shape_str(logits.shape), " for ", b, " windows of ", t,
             " tokens over a vocabulary of ", vocab);
    for (int64_t w = 0; w < b; ++w) {
      const auto r = backend.token_xent(logits.slice(w * t * vp, {1, t, vp}),
                                        yt.slice(w * t, {1, t}), vocab, 1.f, nullptr);
      p.loss[size_t(row0 + w)] = r.loss_sum / double(t);
      p.correct[size_t(row0 + w)] = int32_t(r.correct);
    }
    const int64_t blo = std::max(start, llo), bhi = std::min(start + b, lhi);
    if (k == 0 && bhi <= blo) continue;
    host.resize(size_t(b * t * vp));
    copy_bytes(host.data(), Device{}, logits.data, logits.device, host.size() * sizeof(float));
    if (k > 0)
      top_k_log_probs(host.data(), b * t, vp, vocab, k, backend.threads(),
                      p.top.data() + row0 * t * k, p.top_scores.data() + row0 * t * k);
    for (int64_t w = blo; w < bhi; ++w)
      for (int64_t q = 0; q < t; ++q)
        std::copy_n(host.data() + ((w - start) * t + q) * vp, vocab,
                    p.logits.data() + ((w - llo) * t + q) * vocab);
  }
  return p;
}

void write_token_h5(const PredictConfig& cfg, const TokenPredictSetup& s, MPI_Comm comm, int64_t lo,
                    int64_t count, const TokenPredictions& p) {
  const int64_t n = s.data->num_windows(), t = s.data->seq_len(), v = s.data->info().vocab_size;
  const int64_t k = s.k, ln = cfg.logits_end - cfg.logits_start;
  const int64_t llo = std::max(lo, cfg.logits_start), lhi = std::min(lo + count, cfg.logits_end);
  const std::string tmp = cfg.out + ".tmp";
  bool committed = false;
  try {
    io::H5Lock lock;
    io::CollectiveFileScope collective;
    io::ParallelH5Writer w(comm);
    {
      std::vector<io::ChunkedExtent> extents = {io::ParallelH5Writer::extent({n}, DType::f64),
                                                io::ParallelH5Writer::extent({n}, DType::i32),
                                                io::ParallelH5Writer::extent({n, t}, DType::i32)};
      if (k > 0) {
        extents.push_back(io::ParallelH5Writer::extent({n, t, k}, DType::i32));
        extents.push_back(io::ParallelH5Writer::extent({n, t, k}, DType::f32));
      }
      if (ln > 0) extents.push_back(io::ParallelH5Writer::extent({ln, t, v}, DType::f32));
      io::H5Id f =
          w.create(tmp, io::h5_file_bytes_bound(extents, io::fs_block_size(tmp),
                                                cfg.checkpoint.size() + cfg.data.size() + 2048));
      io::write_attr(f, "format", std::string("ringtrain-predictions"));
      io::write_attr(f, "format_version", int64_t(1));
      io::write_attr(f, "kind", std::string("tokens"));
      io::write_attr(f, "checkpoint", cfg.checkpoint);
      io::write_attr(f, "step", s.step);
      io::write_attr(f, "data", cfg.data);
      io::write_attr(f, "precision", std::string(dtype_name(cfg.precision)));
      io::write_attr(f, "tokenizer", s.data->info().tokenizer);
      io::write_attr(f, "vocab_size", v);
      io::write_attr(f, "seq_len", t);
      io::write_attr(f, "windows", n);
      io::write_attr(f, "tokens", n * t);
      if (k > 0) io::write_attr(f, "top_k", k);
      if (ln > 0) {
        io::write_attr(f, "logits_start", cfg.logits_start);
        io::write_attr(f, "logits_end", cfg.logits_end);
      }
      w.write_rows(f, "loss", DType::f64, {n}, lo, count, p.loss.data(), true);
      w.write_rows(f, "correct", DType::i32, {n}, lo, count, p.correct.data(), true);
      w.write_rows(f, "targets", DType::i32, {n, t}, lo, count, p.targets.data(), true);
      if (k > 0) {
        w.write_rows(f, "top_k", DType::i32, {n, t, k}, lo, count, p.top.data(), true);
        w.write_rows(f, "top_k_scores", DType::f32, {n, t, k}, lo, count, p.top_scores.data(),
                     true);
      }
      if (ln > 0)
        w.write_rows(f, "logits", DType::f32, {ln, t, v}, lhi > llo ? llo - cfg.logits_start : 0,
                     std::max<int64_t>(0, lhi - llo), p.logits.data(), true);
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

}  // namespace

void setup_token_predict(const PredictConfig& cfg, const TokenInput& lm,
                         const std::string& model_name, int64_t model_context,
                         TokenPredictSetup& s) {
  RT_REQUIRE(!cfg.probabilities, "--probabilities is for classifiers; the model '", model_name,
             "' is a language model: --top-k K gives the K likeliest next tokens with their "
             "log-probabilities");
  s.data = std::make_unique<io::TokenDataset>(cfg.data);
  const int64_t t = cfg.seq_len ? cfg.seq_len : model_context;
  io::require_tokens_fit_model(s.data->info(), t, lm.vocab, lm.context ? lm.context : t,
                               model_name);
  s.data->set_seq_len(t);
  const int64_t v = s.data->info().vocab_size, n = s.data->num_windows();
  RT_REQUIRE(!cfg.top_k_given || cfg.top_k <= v, "--top-k ", cfg.top_k,
             " is not valid; expected 1 to ", v, " (the vocabulary of '", cfg.data, "')");
  s.k = cfg.top_k_given ? cfg.top_k : 0;
  if (cfg.logits_end > 0) {
    // At most 2^28 values, or one window when a window alone holds more.
    const int64_t windows = cfg.logits_end - cfg.logits_start, per_window = t * v;
    const int64_t most = std::max<int64_t>(1, kMaxLogitsValues / per_window);
    const std::string values = windows <= INT64_MAX / per_window ? cat(windows * per_window)
                                                                 : cat("more than ", INT64_MAX);
    RT_REQUIRE(windows <= most, "--logits-range ", cfg.logits_start, ":", cfg.logits_end,
               " asks for ", values, " logits (", windows, " windows x ", t, " tokens x ", v,
               " vocabulary), more than ", kMaxLogitsValues, " (1 GiB); give at most ", most,
               " windows");
    RT_REQUIRE(cfg.logits_end <= n, "--logits-range ", cfg.logits_start, ":", cfg.logits_end,
               " is outside the ", n, " windows of ", t, " tokens of '", cfg.data,
               "'; expected START:END with END <= ", n);
  }
  s.batch = cfg.batch_size_given ? cfg.batch_size : std::max<int64_t>(1, 8192 / t);
}

void run_token_predict(const PredictConfig& cfg, comm::Communicator& comm, Model& model,
                       kernels::Backend& backend, TokenPredictSetup& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = s.data->num_windows(), t = s.data->seq_len();
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  double sums[2] = {0, 0};  // loss summed over tokens, correct tokens
  // The forward passes have no collective: an input error in them (a token outside the
  // vocabulary) is agreed on before any rank creates the output.
  TokenPredictions p;
  run_and_agree(comm,
                [&] { p = predict_windows(cfg, model, *s.data, backend, lo, hi, s.batch, s.k); });
  for (int64_t i = 0; i < hi - lo; ++i) {
    sums[0] += p.loss[size_t(i)] * double(t);
    sums[1] += p.correct[size_t(i)];
  }
  run_or_fail([&] {
    write_token_h5(cfg, s, comm.mpi(), lo, hi - lo, p);
    comm.allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() != 0) return;
  const double tokens = double(n) * double(t);
  std::string extra;
  if (s.k > 0) extra += cat(", top-", s.k, " next tokens");
  if (cfg.logits_end > 0)
    extra += cat(", logits of windows ", cfg.logits_start, " to ", cfg.logits_end - 1);
  std::printf(
      "predicted %lld windows of %lld tokens of %s with %s (step %lld, %s) into %s: loss per "
      "window (mean %.4f nats/token, accuracy %.4f over %.0f tokens)%s, %.0f tokens/s\n",
      static_cast<long long>(n), static_cast<long long>(t), cfg.data.c_str(),
      cfg.checkpoint.c_str(), static_cast<long long>(s.step), dtype_name(cfg.precision),
      cfg.out.c_str(), sums[0] / tokens, sums[1] / tokens, tokens, extra.c_str(),
      tokens / std::max(secs, 1e-9));
}

}  // namespace ringtrain::launch
