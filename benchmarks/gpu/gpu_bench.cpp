// gpu_bench: the measurements of benchmarks/gpu/check.sh on one GPU, each with a reference
// measured in the same run (style.md):
//   gemm       TFLOP/s of our path (CudaBackend::gemm) against calling cuBLAS directly on
//              the same shapes and buffers (the faster of cublasGemmEx and cublasLtMatmul
//              with its heuristic's first algorithm), in fp32, TF32, fp16 and bf16; outputs
//              compared after timing.
//   bandwidth  the memory-bound passes against a device-to-device copy measured here: the
//              fused unscale + check + AdamW over a flat buffer the size of the GEMM-bound
//              model (36 bytes moved per parameter in every precision), and a convolution's
//              bias gradient (dy read once). Their share of a step is a matter of batch size
//              (at batch 4096 the GEMMs do ~24.6 kFLOP per parameter against those 36 bytes:
//              14-20 % on an H200), so the goal is the bandwidth they reach.
//   train      step time and samples/s of the MLP, the CNN and a GEMM-bound MLP (4096 wide,
//              batch 4096) in fp32, fp16 and bf16 (AdamW, the batch resident on the device
//              as a prefetching loader leaves it), and the share of the step spent in
//              unscale + check + optimizer (reported, no target).
//   gpt        tokens/s of models/gpt2-124m.pbtxt (batch 8 x 1024 tokens, AdamW, tied head,
//              fused token cross-entropy) in fp32 and bf16, and its model FLOP utilisation:
//              (6 N + 12 L C T) FLOP per token (PaLM's count: the parameters' GEMMs and the
//              attention scores, forward and backward) x tokens/s over the bf16 GEMM TFLOP/s
//              of the large square measured in the first table.
// --gemm-only runs the first table alone (check.sh --quick). Writes one JSON object (--json
// FILE) and prints a table.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_CUBLAS(x)                                                                           \
  do {                                                                                            \
    cublasStatus_t s_ = (x);                                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

const Device kGpu{Device::cuda, 0};

cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

// Seconds per call of f, timed with events on the compute stream after warm-up.
template <typename F>
double time_it(cudaStream_t s, int warmup, int iters, F f) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / 1e3 / iters;
}

void fill_uniform(const Tensor& t, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (auto& x : v) x = 2.f * rng.uniform() - 1.f;
  std::vector<char> raw(t.bytes());
  if (t.dtype == DType::f32)
    std::memcpy(raw.data(), v.data(), raw.size());
  else
    kernels::host_from_f32(v.data(), raw.data(), t.dtype, t.numel());
  copy_bytes(t.data, kGpu, raw.data(), Device{}, raw.size());
}

std::vector<float> download(const Tensor& t) {
  std::vector<char> raw(t.bytes());
  copy_bytes(raw.data(), Device{}, t.data, kGpu, raw.size());
  std::vector<float> v(static_cast<size_t>(t.numel()));
  kernels::host_to_f32(raw.data(), t.dtype, v.data(), t.numel());
  return v;
}

struct GemmRow {
  std::string name, dtype;
  int64_t m, n, k;
  double ours_tflops, ref_tflops, ratio, max_rel_diff;
};

// Our row-major C[m,n] = A[m,k] B[n,k]^T (Linear's forward) against cuBLAS directly.
GemmRow bench_gemm(kernels::Backend& be, cublasHandle_t h, cublasLtHandle_t lt, cudaStream_t s,
                   const std::string& name, int64_t m, int64_t n, int64_t k, DType t, bool tf32) {
  kernels::cuda::set_tf32(tf32);
  OwnedTensor a, b, c, c_ref;
  a.ensure({m, k}, t, kGpu);
  b.ensure({n, k}, t, kGpu);
  c.ensure({m, n}, t, kGpu);
  c_ref.ensure({m, n}, t, kGpu);
  fill_uniform(a.view, 1);
  fill_uniform(b.view, 2);
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const int iters = flops > 1e12 ? 10 : flops > 1e10 ? 50 : 200;
  const double t_ours =
      time_it(s, 3, iters, [&] { be.gemm(false, true, 1.f, a.view, b.view, 0.f, c.view); });
  // Direct cuBLAS, column-major: C^T[n,m] = B[n,k] (as col-major k x n, transposed) * A^T.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float one = 1.f, zero = 0.f;
  CHECK_CUBLAS(cublasSetStream(h, s));
  const double t_ex = time_it(s, 3, iters, [&] {
    CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one,
                              b.view.data, cuda_type(t), int(k), a.view.data, cuda_type(t), int(k),
                              &zero, c_ref.view.data, cuda_type(t), int(n), compute,
                              CUBLAS_GEMM_DEFAULT));
  });
  // cuBLASLt with its heuristic's first algorithm, chosen outside the timing.
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, cuda_type(t), uint64_t(k), uint64_t(n), k));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, cuda_type(t), uint64_t(k), uint64_t(m), k));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, cuda_type(t), uint64_t(n), uint64_t(m), n));
  cublasLtMatmulPreference_t pref;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws_bytes = 32 << 20;
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found));
  Buffer ws(ws_bytes, kGpu);
  double t_lt = 1e30;
  if (found > 0)
    t_lt = time_it(s, 3, iters, [&] {
      CHECK_CUBLAS(cublasLtMatmul(lt, op, &one, b.view.data, la, a.view.data, lb, &zero,
                                  c_ref.view.data, lc, c_ref.view.data, lc, &res.algo, ws.data(),
                                  ws_bytes, s));
    });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  // Results checked after timing: ours against the reference.
  be.gemm(false, true, 1.f, a.view, b.view, 0.f, c.view);
  kernels::cuda::synchronize(0);
  const auto x = download(c.view), y = download(c_ref.view);
  double md = 0, mx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    md = std::max(md, double(std::fabs(x[i] - y[i])));
    mx = std::max(mx, double(std::fabs(y[i])));
  }
  GemmRow r{name, tf32 ? "tf32" : dtype_name(t), m, n, k, 0, 0, 0, md / std::max(mx, 1e-30)};
  const double t_ref = std::min(t_ex, t_lt);
  r.ours_tflops = flops / t_ours / 1e12;
  r.ref_tflops = flops / t_ref / 1e12;
  r.ratio = t_ref / t_ours;
  kernels::cuda::set_tf32(false);
  return r;
}

struct BandwidthRow {
  std::string what, dtype;
  double bytes, seconds, gbps, of_copy;
};

// Device-to-device copy of `bytes`: bytes read + written per second.
BandwidthRow bench_copy(cudaStream_t s, size_t bytes) {
  Buffer a(bytes, kGpu), b(bytes, kGpu);
  CHECK_CUDA(cudaMemsetAsync(a.data(), 1, bytes, s));
  const double t = time_it(s, 3, 20, [&] {
    CHECK_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double moved = 2.0 * double(bytes);
  return {"device-to-device copy", "-", moved, t, moved / t / 1e9, 1.0};
}

// The step's memory-bound tail over n parameters in `precision`, as bench_train runs it:
// unscale + non-finite check of the compute-dtype gradients into fp32 (in place for fp32),
// then AdamW on the fp32 masters and moments, writing the working copy (16-bit only).
BandwidthRow bench_optimizer(kernels::Backend& be, cudaStream_t s, int64_t n, DType precision) {
  const size_t e = dtype_size(precision);
  OwnedTensor grad, g32, master, m, v, work;
  grad.ensure({n}, precision, kGpu);
  fill_uniform(grad.view, 5);
  Tensor grad32 = grad.view;
  if (precision != DType::f32) grad32 = g32.ensure({n}, DType::f32, kGpu);
  fill_uniform(master.ensure({n}, DType::f32, kGpu), 6);
  CHECK_CUDA(cudaMemsetAsync(m.ensure({n}, DType::f32, kGpu).data, 0, size_t(n) * 4, s));
  CHECK_CUDA(cudaMemsetAsync(v.ensure({n}, DType::f32, kGpu).data, 0, size_t(n) * 4, s));
  Tensor* w = precision == DType::f32 ? nullptr : &work.ensure({n}, precision, kGpu);
  kernels::AdamWConfig cfg;
  bool nonfinite = false;
  const double t = time_it(s, 3, 20, [&] {
    // unscale by 1: the values stay put, every pass moves the same bytes
    nonfinite |= be.unscale_check(grad.view, 1.f, grad32);
    be.adamw_step(cfg, master.view, grad32, m.view, v.view, w);
    ++cfg.step;
  });
  RT_CHECK(!nonfinite, "unscale_check found non-finite values in finite gradients");
  // unscale: read e, write 4; AdamW: read master, g32, m, v, write master, m, v (+ work).
  const double per = double(e + 4) + 28.0 + (precision == DType::f32 ? 0.0 : double(e));
  const double moved = per * double(n);
  return {"unscale+check+AdamW", dtype_name(precision), moved, t, moved / t / 1e9, 0};
}

// A convolution's bias gradient (conv2d_backward_filter's db, our per-channel reduction)
// over dy [n, k, h, w], timed as the difference of the backward filter pass with and
// without db (the cuDNN part cancels): dy's bytes read once per second.
BandwidthRow bench_bias_grad(kernels::Backend& be, cudaStream_t s, DType t) {
  kernels::ConvShape cs;
  cs.n = 256, cs.c = 64, cs.h = 28, cs.w = 28, cs.k = 64, cs.r = 3, cs.s = 3;
  cs.stride = 1, cs.pad = 1;
  OwnedTensor x, dy, dw, db;
  fill_uniform(x.ensure({cs.n, cs.c, cs.h, cs.w}, t, kGpu), 7);
  fill_uniform(dy.ensure({cs.n, cs.k, cs.p(), cs.q()}, t, kGpu), 8);
  dw.ensure({cs.k, cs.c, cs.r, cs.s}, t, kGpu);
  db.ensure({cs.k}, DType::f32, kGpu);
  const double with =
      time_it(s, 3, 20, [&] { be.conv2d_backward_filter(cs, x.view, dy.view, dw.view, &db.view); });
  const double without =
      time_it(s, 3, 20, [&] { be.conv2d_backward_filter(cs, x.view, dy.view, dw.view, nullptr); });
  const double moved = double(dy.view.bytes());
  const double sec = std::max(with - without, 1e-9);
  return {"conv bias gradient [256,64,28,28]", dtype_name(t), moved, sec, moved / sec / 1e9, 0};
}

struct TrainRow {
  std::string model, dtype;
  int64_t batch, params;
  double step_ms, samples_per_s, opt_share, model_tflops;
};

// A built-in model for the data shape given, and its mlp widths (for the row's name).
struct ModelSpec {
  std::string name;
  Shape input;
  std::vector<int64_t> hidden;
  int64_t classes = 10;
};

std::unique_ptr<Model> build_model(const ModelSpec& s, DType precision) {
  std::string widths;
  for (int64_t h : s.hidden) widths += (widths.empty() ? "" : ",") + std::to_string(h);
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
  TrainRow r{
      spec.name + (spec.name == "mlp" && !spec.hidden.empty() ? "-" + std::to_string(spec.hidden[0])
                                                              : std::string()),
      dtype_name(precision),
      batch,
      model->num_params(),
      0,
      0,
      0,
      0};
  const double step_s = total / steps;
  r.step_ms = step_s * 1e3;
  r.samples_per_s = double(batch) / step_s;
  r.opt_share = opt_total / total;
  r.model_tflops = 6.0 * double(model->num_params()) * double(batch) / step_s / 1e12;
  return r;
}

struct GptRow {
  std::string dtype;
  int64_t batch, seq, params;
  double step_ms, tokens_per_s, model_tflops;
};

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
          flop_per_token * tokens_per_s / 1e12};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "gpu_bench.json";
  bool quick = false, gemm_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--gemm-only") {
      gemm_only = true;
    } else {
      std::printf(
          "usage: gpu_bench [--json FILE] [--quick] [--gemm-only]\n"
          "GEMM TFLOP/s (ours vs direct cuBLAS), memory-bound passes against a device copy,\n"
          "and training step times on cuda:0. --quick: fewer shapes and steps; --gemm-only:\n"
          "the GEMM table alone. Exit 0 with figures (goals missed are reported, not fatal),\n"
          "77 without a CUDA device, 2 on a CUDA error, 3 when an output check fails.\n");
      return a == "--help" || a == "-h" ? 0 : 1;
    }
  }
  std::string why;
  if (kernels::cuda::device_count(&why) == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  const auto info = kernels::cuda::device_info(0);
  auto be = kernels::cuda::make_cuda_backend(0);
  auto stream = static_cast<cudaStream_t>(kernels::cuda::compute_stream(0));
  cublasHandle_t h;
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasCreate(&h));
  CHECK_CUBLAS(cublasLtCreate(&lt));
  std::printf("gpu_bench on %s (cc %d.%d, %.0f GiB), %s\n", info.name.c_str(), info.cc_major,
              info.cc_minor, double(info.total_bytes) / double(1 << 30),
              kernels::cuda::library_versions().c_str());

  // (a) GEMM: a large square, the GEMM-bound model's layer and the MNIST MLP's first layer.
  struct Shape3 {
    const char* name;
    int64_t m, n, k;
  };
  std::vector<Shape3> shapes = {{"square-8192", 8192, 8192, 8192},
                                {"mlp4096-fc", 4096, 4096, 4096},
                                {"mnist-fc1", 256, 512, 784}};
  if (quick) shapes = {{"square-4096", 4096, 4096, 4096}, {"mnist-fc1", 256, 512, 784}};
  std::vector<GemmRow> gemm;
  for (const auto& sh : shapes)
    for (int variant = 0; variant < 4; ++variant) {
      const DType t = variant == 2 ? DType::f16 : variant == 3 ? DType::bf16 : DType::f32;
      gemm.push_back(bench_gemm(*be, h, lt, stream, sh.name, sh.m, sh.n, sh.k, t, variant == 1));
    }
  std::printf("\n%-12s %-5s %6s %6s %6s %12s %12s %7s %10s\n", "gemm", "type", "m", "n", "k",
              "ours TFLOP/s", "cuBLAS", "ratio", "max diff");
  for (const auto& r : gemm)
    std::printf("%-12s %-5s %6lld %6lld %6lld %12.1f %12.1f %7.3f %10.2e\n", r.name.c_str(),
                r.dtype.c_str(), (long long)r.m, (long long)r.n, (long long)r.k, r.ours_tflops,
                r.ref_tflops, r.ratio, r.max_rel_diff);

  // (b) memory-bound passes against a device copy; (c) training steps.
  std::vector<BandwidthRow> bw;
  std::vector<TrainRow> train;
  std::vector<std::string> errors;
  ModelSpec mlp;
  mlp.name = "mlp", mlp.input = {1, 28, 28}, mlp.hidden = {512, 256}, mlp.classes = 10;
  ModelSpec cnn;
  cnn.name = "cnn", cnn.input = {1, 28, 28}, cnn.classes = 10;
  ModelSpec big;
  big.name = "mlp", big.input = {4096}, big.hidden = {4096, 4096, 4096}, big.classes = 1024;
  if (!gemm_only) {
    const int64_t big_params = build_model(big, DType::f32)->num_params();
    bw.push_back(bench_copy(stream, size_t(1) << 30));
    for (DType t : {DType::f32, DType::bf16}) {
      try {
        bw.push_back(bench_optimizer(*be, stream, big_params, t));
        bw.push_back(bench_bias_grad(*be, stream, t));
      } catch (const Error& e) {
        errors.push_back(cat("memory-bound passes ", dtype_name(t), ": ", e.what()));
      }
    }
    for (auto& r : bw) r.of_copy = r.gbps / bw[0].gbps;
    std::printf("\n%-36s %-5s %10s %10s %10s %8s\n", "memory-bound pass", "type", "MB moved", "ms",
                "GB/s", "of copy");
    for (const auto& r : bw)
      std::printf("%-36s %-5s %10.1f %10.3f %10.0f %8.3f\n", r.what.c_str(), r.dtype.c_str(),
                  r.bytes / 1e6, r.seconds * 1e3, r.gbps, r.of_copy);

    const int steps = quick ? 5 : 20;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      for (const ModelSpec* spec : {&mlp, &cnn, &big}) {
        try {
          train.push_back(
              bench_train(*be, *spec, spec == &big ? (quick ? 1024 : 4096) : 256, t, steps));
        } catch (const Error& e) {
          errors.push_back(cat(spec->name, " ", dtype_name(t), ": ", e.what()));
        }
      }
    }
    std::printf("\n%-10s %-5s %6s %10s %10s %12s %10s %12s\n", "model", "type", "batch", "params",
                "step ms", "samples/s", "opt share", "TFLOP/s");
    for (const auto& r : train)
      std::printf("%-10s %-5s %6lld %10lld %10.3f %12.0f %9.1f%% %12.1f\n", r.model.c_str(),
                  r.dtype.c_str(), (long long)r.batch, (long long)r.params, r.step_ms,
                  r.samples_per_s, 100 * r.opt_share, r.model_tflops);
  }
  std::vector<GptRow> gpt;
  if (!gemm_only) {
    for (DType t : {DType::f32, DType::bf16}) {
      try {
        gpt.push_back(bench_gpt(*be, t, 8, quick ? 256 : 1024, quick ? 3 : 10));
      } catch (const Error& e) {
        errors.push_back(cat("gpt2-124m ", dtype_name(t), ": ", e.what()));
      }
    }
    std::printf("\n%-10s %-5s %6s %6s %10s %10s %12s %12s\n", "gpt", "type", "batch", "seq",
                "params", "step ms", "tokens/s", "TFLOP/s");
    for (const auto& r : gpt)
      std::printf("%-10s %-5s %6lld %6lld %10lld %10.2f %12.0f %12.1f\n", "gpt2-124m",
                  r.dtype.c_str(), (long long)r.batch, (long long)r.seq, (long long)r.params,
                  r.step_ms, r.tokens_per_s, r.model_tflops);
  }
  for (const auto& e : errors) std::printf("ERROR: %s\n", e.c_str());

  // Goals of the issue, computed from the rows above; a goal whose rows are missing (a
  // --gemm-only run, a failed model) is not judged.
  auto gemm_row = [&](const std::string& name, const std::string& dt) -> const GemmRow* {
    for (const auto& r : gemm)
      if (r.name == name && r.dtype == dt) return &r;
    return nullptr;
  };
  auto train_row = [&](const std::string& model, const std::string& dt) -> const TrainRow* {
    for (const auto& r : train)
      if (r.model == model && r.dtype == dt) return &r;
    return nullptr;
  };
  double min_ratio = 1e9;
  for (const auto& r : gemm) min_ratio = std::min(min_ratio, r.ratio);
  const std::string sq = quick ? "square-4096" : "square-8192";
  const TrainRow* b32 = train_row("mlp-4096", "fp32");
  const TrainRow* b16 = train_row("mlp-4096", "bf16");
  const TrainRow* f16 = train_row("mlp-4096", "fp16");
  const double nan = std::nan("");
  const double bf16_vs_large =
      b16 && gemm_row(sq, "bf16") ? b16->model_tflops / gemm_row(sq, "bf16")->ours_tflops : nan;
  const double speedup_bf16 = b32 && b16 ? b32->step_ms / b16->step_ms : nan;
  const double speedup_fp16 = b32 && f16 ? b32->step_ms / f16->step_ms : nan;
  const GptRow* g32 = nullptr;
  const GptRow* g16 = nullptr;
  for (const auto& r : gpt) (r.dtype == "fp32" ? g32 : g16) = &r;
  const double gpt_mfu =
      g16 && gemm_row(sq, "bf16") ? g16->model_tflops / gemm_row(sq, "bf16")->ours_tflops : nan;
  const double gpt_speedup = g32 && g16 ? g16->tokens_per_s / g32->tokens_per_s : nan;
  double worst_opt_bw = bw.size() > 1 ? 1e9 : nan;
  for (const auto& r : bw)
    if (r.what == "unscale+check+AdamW") worst_opt_bw = std::min(worst_opt_bw, r.of_copy);
  struct Goal {
    const char* what;
    double value, target;
    bool at_least;
  };
  const Goal goals[] = {
      {"GEMM ours / direct cuBLAS (worst row)", min_ratio, 0.95, true},
      {"GEMM-bound bf16 model TFLOP/s / large bf16 GEMM", bf16_vs_large, 0.6, true},
      {"GEMM-bound fp32 step / bf16 step", speedup_bf16, 2.5, true},
      {"GEMM-bound fp32 step / fp16 step", speedup_fp16, 2.5, true},
      {"unscale+check+AdamW bandwidth / copy bandwidth (worst)", worst_opt_bw, 0.8, true},
      {"gpt2-124m bf16 model FLOP/s / large bf16 GEMM (MFU)", gpt_mfu, 0.5, true},
      {"gpt2-124m bf16 tokens/s / fp32 tokens/s", gpt_speedup, 3.0, true}};
  auto verdict = [](const Goal& g) {
    if (std::isnan(g.value)) return "not measured";
    return (g.at_least ? g.value >= g.target : g.value <= g.target) ? "met" : "MISSED";
  };
  std::printf("\n%-58s %10s %8s %s\n", "goal", "value", "target", "");
  for (const auto& g : goals)
    std::printf("%-58s %10.3f %s%-7.3g %s\n", g.what, g.value, g.at_least ? ">=" : "<=", g.target,
                verdict(g));
  if (b16)
    std::printf(
        "(optimizer share of the bf16 GEMM-bound step at batch %lld: %.1f %%, reported; "
        "its floor at copy bandwidth is 36 B/param against 6 x batch FLOP/param)\n",
        (long long)b16->batch, 100 * b16->opt_share);

  // JSON numbers: NaN (not measured) is written as null.
  auto num = [](double v) {
    std::ostringstream o;
    if (std::isnan(v) || std::isinf(v))
      o << "null";
    else
      o << v;
    return o.str();
  };
  std::ofstream js(json_path);
  js << "{\"device\":\"" << info.name << "\",\"cc\":\"" << info.cc_major << "." << info.cc_minor
     << "\",\"libraries\":\"" << kernels::cuda::library_versions()
     << "\",\"quick\":" << (quick ? "true" : "false")
     << ",\"gemm_only\":" << (gemm_only ? "true" : "false") << ",\"gemm\":[";
  for (size_t i = 0; i < gemm.size(); ++i) {
    const auto& r = gemm[i];
    js << (i ? "," : "") << "{\"shape\":\"" << r.name << "\",\"dtype\":\"" << r.dtype
       << "\",\"m\":" << r.m << ",\"n\":" << r.n << ",\"k\":" << r.k
       << ",\"ours_tflops\":" << num(r.ours_tflops) << ",\"cublas_tflops\":" << num(r.ref_tflops)
       << ",\"ratio\":" << num(r.ratio) << ",\"max_rel_diff\":" << num(r.max_rel_diff) << "}";
  }
  js << "],\"bandwidth\":[";
  for (size_t i = 0; i < bw.size(); ++i) {
    const auto& r = bw[i];
    js << (i ? "," : "") << "{\"pass\":\"" << r.what << "\",\"dtype\":\"" << r.dtype
       << "\",\"bytes\":" << num(r.bytes) << ",\"ms\":" << num(r.seconds * 1e3)
       << ",\"gbps\":" << num(r.gbps) << ",\"of_copy\":" << num(r.of_copy) << "}";
  }
  js << "],\"train\":[";
  for (size_t i = 0; i < train.size(); ++i) {
    const auto& r = train[i];
    js << (i ? "," : "") << "{\"model\":\"" << r.model << "\",\"dtype\":\"" << r.dtype
       << "\",\"batch\":" << r.batch << ",\"params\":" << r.params
       << ",\"step_ms\":" << num(r.step_ms) << ",\"samples_per_sec\":" << num(r.samples_per_s)
       << ",\"opt_share\":" << num(r.opt_share) << ",\"model_tflops\":" << num(r.model_tflops)
       << "}";
  }
  js << "],\"gpt\":[";
  for (size_t i = 0; i < gpt.size(); ++i) {
    const auto& r = gpt[i];
    js << (i ? "," : "") << "{\"model\":\"gpt2-124m\",\"dtype\":\"" << r.dtype
       << "\",\"batch\":" << r.batch << ",\"seq\":" << r.seq << ",\"params\":" << r.params
       << ",\"step_ms\":" << num(r.step_ms) << ",\"tokens_per_sec\":" << num(r.tokens_per_s)
       << ",\"model_tflops\":" << num(r.model_tflops) << "}";
  }
  js << "],\"goals\":[";
  for (size_t i = 0; i < std::size(goals); ++i) {
    const auto& g = goals[i];
    js << (i ? "," : "") << "{\"goal\":\"" << g.what << "\",\"value\":" << num(g.value)
       << ",\"target\":" << g.target << ",\"at_least\":" << (g.at_least ? "true" : "false")
       << ",\"verdict\":\"" << verdict(g) << "\"}";
  }
  js << "],\"errors\":[";
  for (size_t i = 0; i < errors.size(); ++i) {
    std::string e;
    for (char ch : errors[i]) e += ch == '"' || ch == '\\' ? '\'' : ch == '\n' ? ' ' : ch;
    js << (i ? "," : "") << "\"" << e << "\"";
  }
  js << "]}\n";
  std::printf("\nwrote %s\n", json_path.c_str());
  cublasLtDestroy(lt);
  cublasDestroy(h);
  return errors.empty() ? 0 : 3;
}
