// Sharded evaluation (see evaluate.hpp).
#include "train/evaluate.hpp"

#include <algorithm>
#include <cmath>
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
  return {sums[0] / double(n), sums[1] / double(n), n};
}

std::optional<double> bits_per_byte(const io::TokenDatasetInfo& data, double nats_per_token) {
  if (data.tokenizer != "bytes") return std::nullopt;
  return nats_per_token / std::log(2.0);
}

EvalResult evaluate_tokens(Model& model, io::TokenDataset& data, comm::Communicator& comm,
                           kernels::Backend& backend, int64_t batch) {
  const int64_t n = data.num_windows(), t = data.seq_len(), vocab = data.info().vocab_size;
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
    for (int64_t i = 0; i < b; ++i) idx[size_t(i)] = start + i;
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
  return {sums[0] / tokens, sums[1] / tokens, n, n * t};
}

}  // namespace ringtrain::launch
