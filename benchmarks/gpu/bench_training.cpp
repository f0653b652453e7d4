// gpu_bench, training section: step times of the built-in models and tokens/s of GPT-2
// 124M, from the training state GpuTraining holds on cuda:0.
#include <functional>

#include "benchmarks/gpu/bench_common.hpp"
#include "benchmarks/gpu/bench_sections.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"

namespace ringtrain::gpubench {
namespace {

std::unique_ptr<Model> build_model(const ModelSpec& s, DType precision) {
  std::string widths;
  for (int64_t h : s.hidden) {
    if (!widths.empty()) widths += ',';
    widths += std::to_string(h);
  }
  std::vector<std::pair<std::string, std::string>> vars;
  if (s.name == "mlp") vars.push_back({"hidden", widths});
  return ringtrain::build_model(s.name, s.input, s.classes, vars, precision);
}

// A model on cuda:0 holding the values init_parameters(1) draws on the host (masters and
// BatchNorm state uploaded), with AdamW and the fp32 gradient it reads: the training state
// of the benchmarks' steps.
struct GpuTraining {
  GpuTraining(kernels::Backend& be, DType precision,
              const std::function<std::unique_ptr<Model>()>& build)
      : be_(be), precision_(precision) {
    {
      auto host = build();
      host->init_parameters(1, *kernels::make_cpu_backend(1));
      DeviceScope scope(kGpu);
      model = build();
      copy_bytes(model->master().data, kGpu, host->master().data, Device{},
                 model->master().bytes());
      if (model->num_buffer_elems() > 0)
        copy_bytes(model->state().data, kGpu, host->state().data, Device{}, model->state().bytes());
    }
    model->refresh_working_copy(be);
    opt = make_optimizer(oc, model->num_params());
    g32 = Buffer(size_t(model->num_params()) * 4, kGpu);
    grad32 = precision == DType::f32 ? model->grad()
                                     : Tensor(g32.data(), {model->num_params()}, DType::f32, kGpu);
  }
  // Unscale + check, then AdamW on the masters (writing the 16-bit working copy) unless a
  // gradient was not finite.
  void update(float loss_scale) {
    const bool bad = be_.unscale_check(model->grad(), 1.f / loss_scale, grad32);
    Tensor work = model->work();
    if (!bad)
      opt->step(be_, model->master(), grad32, precision_ == DType::f32 ? nullptr : &work, oc.lr);
  }

  std::unique_ptr<Model> model;
  OptimizerConfig oc;  // AdamW
  std::unique_ptr<Optimizer> opt;
  Buffer g32;
  Tensor grad32;

 private:
  kernels::Backend& be_;
  DType precision_;
};

}  // namespace

int64_t num_params(const ModelSpec& spec) { return build_model(spec, DType::f32)->num_params(); }

TrainRow bench_train(kernels::Backend& be, const ModelSpec& spec, int64_t batch, DType precision,
                     int steps) {
  GpuTraining tr(be, precision, [&] { return build_model(spec, precision); });
  Model* model = tr.model.get();
  DeviceScope scope(kGpu);  // the layers' activations too
  Shape xs{batch};
  for (int64_t d : spec.input) xs.push_back(d);
  OwnedTensor x32, xc, labels, dl;
  fill_uniform(x32.ensure(xs, DType::f32, kGpu), 3);
  std::vector<int32_t> lab(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) lab[size_t(i)] = int32_t(i % spec.classes);
  copy_bytes(labels.ensure({batch}, DType::i32, kGpu).data, kGpu, lab.data(), Device{},
             lab.size() * 4);
  const float scale = precision == DType::f32 ? 1.f : 1024.f;
  double total = 0, opt_total = 0;
  for (int step = -3; step < steps; ++step) {  // 3 warm-up steps
    kernels::cuda::synchronize(0);
    const auto t0 = Clock::now();
    const Tensor* x = &x32.view;
    if (precision != DType::f32) {
      be.cast(x32.view, xc.ensure(xs, precision, kGpu));
      x = &xc.view;
    }
    Context ctx{be, precision, true, uint64_t(step + 100)};
    const Tensor& logits = model->forward(ctx, *x);
    Tensor& dlt = dl.ensure(logits.shape, DType::f32, kGpu);
    be.softmax_xent(logits, labels.view, scale, &dlt);
    model->backward(ctx, dlt);
    kernels::cuda::synchronize(0);
    const auto t1 = Clock::now();
    tr.update(scale);
    kernels::cuda::synchronize(0);
    const auto t2 = Clock::now();
    if (step < 0) continue;
    total += std::chrono::duration<double>(t2 - t0).count();
    opt_total += std::chrono::duration<double>(t2 - t1).count();
  }
  std::string row_name = spec.name;
  if (spec.name == "mlp" && !spec.hidden.empty()) row_name += cat("-", spec.hidden[0]);
  TrainRow r{row_name, dtype_name(precision), batch, model->num_params(), 0, 0, 0, 0};
  const double step_s = total / steps;
  r.step_ms = step_s * 1e3;
  r.samples_per_s = double(batch) / step_s;
  r.opt_share = opt_total / total;
  r.model_tflops = 6.0 * double(model->num_params()) * double(batch) / step_s / 1e12;
  return r;
}

// Training steps of the GPT-2 124M model file on cuda:0: random token windows resident on
// the device, forward, the token cross-entropy over the real vocabulary (the padded rows
// of the head take no part), backward, unscale + check, AdamW.
GptRow bench_gpt(kernels::Backend& be, DType precision, int64_t batch, int64_t seq, int steps) {
  constexpr int64_t kVocab = 50257;
  GpuTraining tr(be, precision,
                 [&] { return ringtrain::build_model("gpt2-124m", {seq}, kVocab, {}, precision); });
  Model* model = tr.model.get();
  DeviceScope scope(kGpu);  // the layers' activations too
  std::vector<int32_t> ids(size_t(batch * (seq + 1)));
  uint64_t st = 7;
  for (auto& id : ids) id = int32_t(splitmix64(st) % uint64_t(kVocab));
  OwnedTensor tokens, targets, dl;
  std::vector<int32_t> in(size_t(batch * seq)), out(size_t(batch * seq));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) {
      in[size_t(b * seq + t)] = ids[size_t(b * (seq + 1) + t)];
      out[size_t(b * seq + t)] = ids[size_t(b * (seq + 1) + t + 1)];
    }
  copy_bytes(tokens.ensure({batch, seq}, DType::i32, kGpu).data, kGpu, in.data(), Device{},
             in.size() * 4);
  copy_bytes(targets.ensure({batch, seq}, DType::i32, kGpu).data, kGpu, out.data(), Device{},
             out.size() * 4);
  const float scale = precision == DType::f32 ? 1.f : 1024.f;
  const kernels::cuda::AttentionCalls calls_before = kernels::cuda::attention_calls();
  double total = 0;
  for (int step = -2; step < steps; ++step) {  // 2 warm-up steps
    kernels::cuda::synchronize(0);
    const auto t0 = Clock::now();
    Context ctx{be, precision, true, uint64_t(step + 100)};
    const Tensor& logits = model->forward(ctx, tokens.view);
    Tensor& dlt = dl.ensure(logits.shape, DType::f32, kGpu);
    be.token_xent(logits, targets.view, kVocab, scale, &dlt);
    model->backward(ctx, dlt);
    tr.update(scale);
    kernels::cuda::synchronize(0);
    if (step >= 0) total += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double step_s = total / steps;
  const double tokens_per_s = double(batch * seq) / step_s;
  // 12 L C T per token for the attention scores: L = 12 layers, C = 768.
  const double flop_per_token = 6.0 * double(model->num_params()) + 12.0 * 12 * 768 * double(seq);
  return {dtype_name(precision),
          batch,
          seq,
          model->num_params(),
          step_s * 1e3,
          tokens_per_s,
          flop_per_token * tokens_per_s / 1e12,
          kernels::cuda::attention_paths_between(calls_before, kernels::cuda::attention_calls())};
}

}  // namespace ringtrain::gpubench
