// Sharded evaluation (see evaluate.hpp).
#include "train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/fault_injection.hpp"

namespace ringtrain::launch {
namespace {

// Counts (label, arg-max) pairs of b rows of logits into confusion (classes x classes); the
// arg-max is the first largest logit, as softmax_xent's `correct` counts it.
void add_confusion(const Tensor& logits, const int32_t* labels, int64_t b,
                   std::vector<double>& confusion, std::vector<float>& host) {
  const int64_t c = logits.dim(1);
  host.resize(size_t(b * c));
  copy_bytes(host.data(), Device{}, logits.data, logits.device, host.size() * sizeof(float));
  for (int64_t r = 0; r < b; ++r) {
    const float* x = host.data() + r * c;
    int64_t arg = 0;
    for (int64_t j = 1; j < c; ++j)
      if (x[j] > x[arg]) arg = j;
    confusion[size_t(labels[r] * c + arg)] += 1;
  }
}

}  // namespace

io::Normalization normalization_of(const io::CheckpointMeta& m) {
  if (!m.input_channel_mean.empty()) return {m.input_channel_mean, m.input_channel_std};
  return {{m.input_mean}, {m.input_std}};
}

EvalResult evaluate(Model& model, io::Dataset& data, comm::Communicator& comm,
                    kernels::Backend& backend, int64_t batch, const io::Normalization& norm,
                    std::vector<double>* confusion) {
  const int64_t n = data.info().num_samples;
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  Context ctx{backend, model.compute_dtype(), /*training=*/false};
  Shape xs = {batch};
  xs.insert(xs.end(), data.info().sample_shape.begin(), data.info().sample_shape.end());
  // The samples are read into host memory; on a GPU they are uploaded, and the model's
  // activations are allocated on the backend's device.
  const Device dev = backend.device();
  DeviceScope on_device(dev);
  OwnedTensor x, xc, y, xd, yd;
  std::vector<int64_t> idx;
  double sums[2] = {0, 0};  // loss sum, correct
  std::vector<float> host_logits;
  if (confusion) {
    const size_t c = size_t(model.classes());
    confusion->assign(c * c, 0.0);
  }
  for (int64_t start = lo; start < hi; start += batch) {
    maybe_inject_fault("eval");
    const int64_t b = std::min(batch, hi - start);
    xs[0] = b;
    idx.resize(size_t(b));
    for (int64_t i = 0; i < b; ++i) idx[size_t(i)] = start + i;
    Tensor* xf = &x.ensure(xs, DType::f32, Device{});
    Tensor* yt = &y.ensure({b}, DType::i32, Device{});
    data.read(idx.data(), b, xf->as<float>(), yt->as<int32_t>(), norm);
    if (dev.kind != Device::cpu) {
      Tensor& xu = xd.ensure(xs, DType::f32, dev);
      Tensor& yu = yd.ensure({b}, DType::i32, dev);
      copy_bytes(xu.data, dev, xf->data, Device{}, xf->bytes());
      copy_bytes(yu.data, dev, yt->data, Device{}, yt->bytes());
      xf = &xu;
      yt = &yu;
    }
    const Tensor* in = xf;
    if (ctx.compute != DType::f32) {
      backend.cast(*xf, xc.ensure(xs, ctx.compute));
      in = &xc.view;
    }
    const Tensor& logits = model.forward(ctx, *in);
    auto r = backend.softmax_xent(logits, *yt, 1.f, nullptr);
    sums[0] += r.loss_sum;
    sums[1] += double(r.correct);
    if (confusion) add_confusion(logits, y.view.as<int32_t>(), b, *confusion, host_logits);
  }
  comm.allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  if (confusion)
    comm.allreduce(confusion->data(), int64_t(confusion->size()), DType::f64, comm::ReduceOp::sum);
  EvalResult r;
  r.loss = sums[0] / double(n);
  r.accuracy = sums[1] / double(n);
  r.samples = n;
  return r;
}

std::optional<double> bits_per_byte(const io::TokenDatasetInfo& data, double nats_per_token) {
  if (data.tokenizer != "bytes") return std::nullopt;
  return nats_per_token / std::log(2.0);
}

int64_t eval_window_count(int64_t total, int64_t budget) {
  return budget > 0 ? std::min(budget, total) : total;
}

int64_t eval_window_index(int64_t i, int64_t total, int64_t budget) {
  const int64_t n = eval_window_count(total, budget);
  if (n == total) return i;
  // In 128 bits: i * total may exceed 2^63 for a very large file.
  return int64_t((__int128(i) * total) / n);
}

EvalResult evaluate_tokens(Model& model, io::TokenDataset& data, comm::Communicator& comm,
                           kernels::Backend& backend, int64_t batch, int64_t max_windows) {
  const int64_t total = data.num_windows(), t = data.seq_len(), vocab = data.info().vocab_size;
  const int64_t n = eval_window_count(total, max_windows);
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  Context ctx{backend, model.compute_dtype(), /*training=*/false};
  const Device dev = backend.device();
  DeviceScope on_device(dev);
  OwnedTensor x, y, xd, yd;
  std::vector<int64_t> idx;
  double sums[2] = {0, 0};  // loss summed over tokens, correct tokens
  for (int64_t start = lo; start < hi; start += batch) {
    maybe_inject_fault("eval");
    const int64_t b = std::min(batch, hi - start);
    idx.resize(size_t(b));
    for (int64_t i = 0; i < b; ++i)
      idx[size_t(i)] = eval_window_index(start + i, total, max_windows);
    Tensor* xt = &x.ensure({b, t}, DType::i32, Device{});
    Tensor* yt = &y.ensure({b, t}, DType::i32, Device{});
    data.read_windows(idx.data(), b, xt->as<int32_t>(), yt->as<int32_t>());
    if (dev.kind != Device::cpu) {
      Tensor& xu = xd.ensure({b, t}, DType::i32, dev);
      Tensor& yu = yd.ensure({b, t}, DType::i32, dev);
      copy_bytes(xu.data, dev, xt->data, Device{}, xt->bytes());
      copy_bytes(yu.data, dev, yt->data, Device{}, yt->bytes());
      xt = &xu;
      yt = &yu;
    }
    const auto r = backend.token_xent(model.forward(ctx, *xt), *yt, vocab, 1.f, nullptr);
    sums[0] += r.loss_sum;
    sums[1] += double(r.correct);
  }
  comm.allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  const double tokens = double(n) * double(t);
  EvalResult r;
  r.loss = sums[0] / tokens;
  r.accuracy = sums[1] / tokens;
  r.samples = n;
  r.tokens = n * t;
  return r;
}

}  // namespace ringtrain::launch

namespace ringtrain::launch {
namespace {

// Sums over the samples from which every metric follows; one flat vector so that the ranks
// add theirs with one allreduce.
struct MetricSums {
  int64_t k = 0, c = 0;      // labels (bce: the last dimension), classes (pixel / softmax)
  std::vector<int64_t> top;  // the K of each top<K>
  std::vector<double> v;
  enum { kLoss, kElems, kAbs, kSq, kT, kT2, kCorrect, kCounted, kFixed };
  double& at(size_t i) { return v[i]; }
  double& top_hits(size_t i) { return v[kFixed + i]; }
  double* label(int64_t j) { return v.data() + kFixed + top.size() + 3 * j; }  // TP, FP, FN
  double* cls(int64_t j) { return v.data() + kFixed + top.size() + 3 * k + 3 * j; }
};

void add_batch_metrics(const LossSpec& spec, const Tensor& out, const Tensor& y, MetricSums& m,
                       std::vector<float>& host_out, std::vector<char>& host_y) {
  const int64_t b = out.dim(0), per = out.numel() / b;
  host_out.resize(size_t(out.numel()));
  copy_bytes(host_out.data(), Device{}, out.data, out.device, host_out.size() * 4);
  host_y.resize(y.bytes());
  copy_bytes(host_y.data(), Device{}, y.data, y.device, y.bytes());
  const float* p = host_out.data();
  switch (spec.target_kind()) {
    case TargetKind::float_targets: {
      const float* t = reinterpret_cast<const float*>(host_y.data());
      const bool bce = spec.terms[0].kind == LossKind::bce_logits;
      for (int64_t i = 0; i < out.numel(); ++i) {
        const double d = double(p[i]) - double(t[i]);
        m.at(MetricSums::kElems) += 1;
        m.at(MetricSums::kAbs) += std::fabs(d);
        m.at(MetricSums::kSq) += d * d;
        m.at(MetricSums::kT) += t[i];
        m.at(MetricSums::kT2) += double(t[i]) * t[i];
        if (bce) {
          const bool pred = p[i] > 0.f, truth = t[i] >= 0.5f;
          m.at(MetricSums::kCorrect) += pred == truth;
          double* l = m.label(i % m.k);
          l[0] += pred && truth;
          l[1] += pred && !truth;
          l[2] += !pred && truth;
        }
      }
      m.at(MetricSums::kCounted) += double(out.numel());
      break;
    }
    case TargetKind::int_targets: {
      const int32_t* t = reinterpret_cast<const int32_t*>(host_y.data());
      const int64_t c = out.dim(1), s = per / c;
      const int32_t ignore = spec.terms[0].ignore_index;
      for (int64_t n = 0; n < b; ++n)
        for (int64_t q = 0; q < s; ++q) {
          const int32_t label = t[n * s + q];
          if (label == ignore) continue;
          const float* x = p + n * per + q;
          int64_t arg = 0;
          for (int64_t j = 1; j < c; ++j)
            if (x[j * s] > x[arg * s]) arg = j;
          m.at(MetricSums::kCounted) += 1;
          m.at(MetricSums::kCorrect) += arg == label;
          if (label >= 0 && label < c) {
            m.cls(label)[0] += arg == label;
            m.cls(label)[2] += arg != label;
          }
          if (arg != label) m.cls(arg)[1] += 1;
        }
      break;
    }
    case TargetKind::labels: {
      const int32_t* t = reinterpret_cast<const int32_t*>(host_y.data());
      for (int64_t n = 0; n < b; ++n) {
        const float* x = p + n * per;
        int64_t above = 0;  // logits ranked before the label's (larger, or equal and earlier)
        for (int64_t j = 0; j < per; ++j) above += x[j] > x[t[n]] || (x[j] == x[t[n]] && j < t[n]);
        m.at(MetricSums::kCounted) += 1;
        m.at(MetricSums::kCorrect) += above == 0;
        for (size_t i = 0; i < m.top.size(); ++i) m.top_hits(i) += above < m.top[i];
      }
      break;
    }
  }
}

}  // namespace

EvalResult evaluate_loss(Model& model, io::Dataset& data, comm::Communicator& comm,
                         kernels::Backend& backend, int64_t batch, const io::Normalization& norm) {
  const LossSpec& spec = model.loss();
  const bool targets = spec.target_kind() != TargetKind::labels;
  const auto& info = data.info();
  RT_REQUIRE(!targets || info.has_targets, "dataset '", info.path, "' has no /targets; the loss '",
             spec.name(), "' of the model reads ", target_kind_name(spec.target_kind()));
  RT_REQUIRE(!targets || info.target_shape == model.target_shape(), "dataset '", info.path,
             "' has targets of shape ", shape_str(info.target_shape),
             " but the model was trained on targets of shape ", shape_str(model.target_shape()));
  const int64_t n = info.num_samples;
  const int64_t lo = n * comm.rank() / comm.size(), hi = n * (comm.rank() + 1) / comm.size();
  Context ctx{backend, model.compute_dtype(), /*training=*/false};
  Shape xs = {batch}, ys = {batch};
  xs.insert(xs.end(), info.sample_shape.begin(), info.sample_shape.end());
  if (targets) ys.insert(ys.end(), info.target_shape.begin(), info.target_shape.end());
  const DType yt = targets ? info.target_dtype : DType::i32;
  const Device dev = backend.device();
  DeviceScope on_device(dev);
  OwnedTensor x, xc, y, xd, yd;
  std::vector<int64_t> idx;
  LossFunction loss(spec);
  MetricSums m;
  if (spec.terms[0].kind == LossKind::bce_logits) m.k = model.target_shape().back();
  if (spec.target_kind() == TargetKind::int_targets) m.c = model.classes();
  for (const auto& name : spec.metrics)
    if (name.rfind("top", 0) == 0) m.top.push_back(std::atoll(name.c_str() + 3));
  m.v.assign(MetricSums::kFixed + m.top.size() + 3 * size_t(m.k) + 3 * size_t(m.c), 0.0);
  std::vector<float> host_out;
  std::vector<char> host_y;
  for (int64_t start = lo; start < hi; start += batch) {
    maybe_inject_fault("eval");
    const int64_t b = std::min(batch, hi - start);
    xs[0] = ys[0] = b;
    idx.resize(size_t(b));
    for (int64_t i = 0; i < b; ++i) idx[size_t(i)] = start + i;
    Tensor* xf = &x.ensure(xs, DType::f32, Device{});
    Tensor* yh = &y.ensure(ys, yt, Device{});
    if (targets) {
      data.read(idx.data(), b, xf->as<float>(), nullptr, norm);
      data.read_targets(idx.data(), b, yh->data);
    } else {
      data.read(idx.data(), b, xf->as<float>(), yh->as<int32_t>(), norm);
    }
    if (dev.kind != Device::cpu) {
      Tensor& xu = xd.ensure(xs, DType::f32, dev);
      Tensor& yu = yd.ensure(ys, yt, dev);
      copy_bytes(xu.data, dev, xf->data, Device{}, xf->bytes());
      copy_bytes(yu.data, dev, yh->data, Device{}, yh->bytes());
      xf = &xu;
      yh = &yu;
    }
    const Tensor* in = xf;
    if (ctx.compute != DType::f32) {
      backend.cast(*xf, xc.ensure(xs, ctx.compute));
      in = &xc.view;
    }
    const Tensor& out = model.forward(ctx, *in);
    m.at(MetricSums::kLoss) += loss.apply(backend, out, *yh, 1.f, nullptr).loss_sum;
    add_batch_metrics(spec, out, *yh, m, host_out, host_y);
  }
  comm.allreduce(m.v.data(), int64_t(m.v.size()), DType::f64, comm::ReduceOp::sum);
  EvalResult r;
  r.samples = n;
  r.loss = m.at(MetricSums::kLoss) / double(n);
  const double counted = std::max(1.0, m.at(MetricSums::kCounted));
  r.accuracy = m.at(MetricSums::kCorrect) / counted;
  const double elems = std::max(1.0, m.at(MetricSums::kElems));
  size_t top = 0;
  for (const auto& name : spec.metrics) {
    double value = 0;
    if (name == "accuracy") {
      value = r.accuracy;
    } else if (name.rfind("top", 0) == 0) {
      value = m.top_hits(top++) / counted;
    } else if (name == "mae") {
      value = m.at(MetricSums::kAbs) / elems;
    } else if (name == "rmse") {
      value = std::sqrt(m.at(MetricSums::kSq) / elems);
    } else if (name == "r2") {
      const double mean = m.at(MetricSums::kT) / elems;
      const double tot = m.at(MetricSums::kT2) - elems * mean * mean;
      value = tot > 0 ? 1 - m.at(MetricSums::kSq) / tot : NAN;
    } else if (name == "f1" || name == "mean_iou") {
      const bool f1 = name == "f1";
      const int64_t count = f1 ? m.k : m.c;
      std::vector<double> each;
      double sum = 0;
      int64_t present = 0;
      for (int64_t j = 0; j < count; ++j) {
        const double* s = f1 ? m.label(j) : m.cls(j);
        const double denom = f1 ? 2 * s[0] + s[1] + s[2] : s[0] + s[1] + s[2];
        const double e = denom > 0 ? (f1 ? 2 * s[0] : s[0]) / denom : NAN;
        each.push_back(e);
        if (denom > 0) {
          sum += e;
          ++present;
        }
      }
      value = present ? sum / double(present) : NAN;
      r.per_output.push_back({name, each});
    }
    r.metrics.push_back({name, value});
  }
  return r;
}

}  // namespace ringtrain::launch
