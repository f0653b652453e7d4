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
//              of the large square measured in the first table; each row names the attention
//              path it ran (RINGTRAIN_CUDA_ATTENTION; auto: cuDNN for bf16 where built).
//   gpt ops    each of our transformer kernels alone at those shapes, its calls per step and
//              their sum against the step (where the non-GEMM time goes), each rate against
//              the large bf16 GEMM (attention) or the device copy (the memory-bound ops);
//              attention rows name the path that ran (cuDNN's fused attention or our
//              kernel), and our kernel is measured beside cuDNN's as the reference.
// --gemm-only runs the first table alone (check.sh --quick). Writes one JSON object (--json
// FILE) and prints a table.
// Sections: bench_kernels.cpp (gemm, bandwidth), bench_training.cpp (train, gpt),
// bench_gpt_ops.cpp (gpt ops), bench_report.cpp (goals, JSON).
#include <cstdio>
#include <string>

#include "benchmarks/gpu/bench_common.hpp"
#include "benchmarks/gpu/bench_sections.hpp"
#include "kernels/cuda/cuda_api.hpp"

using namespace ringtrain;
using namespace ringtrain::gpubench;

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
  Results res;
  auto& gemm = res.gemm;
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
  auto& bw = res.bw;
  auto& train = res.train;
  auto& errors = res.errors;
  ModelSpec mlp;
  mlp.name = "mlp", mlp.input = {1, 28, 28}, mlp.hidden = {512, 256}, mlp.classes = 10;
  ModelSpec cnn;
  cnn.name = "cnn", cnn.input = {1, 28, 28}, cnn.classes = 10;
  ModelSpec big;
  big.name = "mlp", big.input = {4096}, big.hidden = {4096, 4096, 4096}, big.classes = 1024;
  if (!gemm_only) {
    const int64_t big_params = num_params(big);
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
  auto& gpt = res.gpt;
  if (!gemm_only) {
    for (DType t : {DType::f32, DType::bf16}) {
      try {
        gpt.push_back(bench_gpt(*be, t, 8, quick ? 256 : 1024, quick ? 3 : 10));
      } catch (const Error& e) {
        errors.push_back(cat("gpt2-124m ", dtype_name(t), ": ", e.what()));
      }
    }
    std::printf("\n%-10s %-5s %6s %6s %10s %10s %12s %12s %-9s\n", "gpt", "type", "batch", "seq",
                "params", "step ms", "tokens/s", "TFLOP/s", "attention");
    for (const auto& r : gpt)
      std::printf("%-10s %-5s %6lld %6lld %10lld %10.2f %12.0f %12.1f %-9s\n", "gpt2-124m",
                  r.dtype.c_str(), (long long)r.batch, (long long)r.seq, (long long)r.params,
                  r.step_ms, r.tokens_per_s, r.model_tflops, r.attention.c_str());
    for (const auto& r : gpt)
      std::printf("attention path: gpt2-124m %s ran %s\n", r.dtype.c_str(), r.attention.c_str());
  }
  // (e) the transformer kernels alone at the gpt rows' shapes, and their sum per step.
  auto& ops = res.gpt_ops;
  if (!gemm_only) {
    const GemmRow* ref = nullptr;
    for (const auto& r : gemm)
      if (r.name == shapes[0].name && r.dtype == "bf16") ref = &r;
    const double copy_gbps = bw.empty() ? 0 : bw[0].gbps;
    for (DType t : {DType::f32, DType::bf16}) {
      try {
        for (auto& r : bench_gpt_ops(*be, stream, t, 8, quick ? 256 : 1024,
                                     ref ? ref->ours_tflops : 0, copy_gbps))
          ops.push_back(r);
      } catch (const Error& e) {
        errors.push_back(cat("gpt2-124m ops ", dtype_name(t), ": ", e.what()));
      }
    }
    std::printf("\n%-44s %-5s %10s %6s %11s %10s %-7s %7s %s\n", "gpt2-124m op", "type", "ms/call",
                "calls", "ms per step", "rate", "unit", "of ref", "path");
    for (const auto& r : ops)
      std::printf("%-44s %-5s %10.3f %6.0f %11.2f %10.1f %-7s %7.3f %s\n", r.op.c_str(),
                  r.dtype.c_str(), r.ms, r.calls_per_step, r.ms_per_step, r.rate, r.unit.c_str(),
                  r.of_ref, r.path.c_str());
    for (const auto& g : gpt) {
      double sum = 0;
      for (const auto& r : ops)
        if (r.dtype == g.dtype) sum += r.ms_per_step;
      std::printf(
          "gpt2-124m %s: these ops %.1f ms of the %.1f ms step (%.0f %%; the rest is "
          "cuBLAS, casts and the optimizer)\n",
          g.dtype.c_str(), sum, g.step_ms, 100 * sum / g.step_ms);
    }
  }
  for (const auto& e : errors) std::printf("ERROR: %s\n", e.c_str());

  report(res, quick, gemm_only, info.name, cat(info.cc_major, ".", info.cc_minor),
         kernels::cuda::library_versions(), json_path);
  std::printf("\nwrote %s\n", json_path.c_str());
  cublasLtDestroy(lt);
  cublasDestroy(h);
  return res.errors.empty() ? 0 : 3;
}