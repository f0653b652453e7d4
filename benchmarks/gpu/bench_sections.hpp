// gpu_bench's sections (benchmarks/gpu/gpu_bench.cpp has the overview): their rows and the
// functions that measure them on cuda:0.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::gpubench {

// --- kernels: GEMM against direct cuBLAS, memory-bound passes against a copy
struct GemmRow {
  std::string name, dtype;
  int64_t m, n, k;
  double ours_tflops, ref_tflops, ratio, max_rel_diff;
};

// Our row-major C[m,n] = A[m,k] B[n,k]^T (Linear's forward) against cuBLAS directly.
GemmRow bench_gemm(kernels::Backend& be, cublasHandle_t h, cublasLtHandle_t lt, cudaStream_t s,
                   const std::string& name, int64_t m, int64_t n, int64_t k, DType t, bool tf32);

struct BandwidthRow {
  std::string what, dtype;
  double bytes, seconds, gbps, of_copy;
};

// Device-to-device copy of `bytes`: bytes read + written per second.
BandwidthRow bench_copy(cudaStream_t s, size_t bytes);
// The step's memory-bound tail over n parameters in `precision` (unscale + check + AdamW).
BandwidthRow bench_optimizer(kernels::Backend& be, cudaStream_t s, int64_t n, DType precision);
// A convolution's bias gradient over dy, its bytes read once per second.
BandwidthRow bench_bias_grad(kernels::Backend& be, cudaStream_t s, DType t);

// --- training: steps of the built-in models and of GPT-2 124M
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

TrainRow bench_train(kernels::Backend& be, const ModelSpec& spec, int64_t batch, DType precision,
                     int steps);
// Parameters of the model `spec` describes (for the memory-bound passes' size).
int64_t num_params(const ModelSpec& spec);

struct GptRow {
  std::string dtype;
  int64_t batch, seq, params;
  double step_ms, tokens_per_s, model_tflops;
  std::string attention;  // the attention path that ran: cudnn, kernel (cudnn_attention.hpp)
};

GptRow bench_gpt(kernels::Backend& be, DType precision, int64_t batch, int64_t seq, int steps);

// --- gpt2-124m ops: our transformer kernels alone at one step's shapes; attention under
// RINGTRAIN_CUDA_ATTENTION as set (auto: cuDNN for bf16 where built), and, when that ran
// cuDNN, our kernel too as the reference
struct OpRow {
  std::string op, dtype;
  double ms, calls_per_step, ms_per_step, rate;
  std::string unit;  // TFLOP/s or GB/s
  double of_ref;     // rate over the large bf16 GEMM's TFLOP/s or the device copy's GB/s
  std::string path;  // attention rows: the path that ran (cudnn, kernel); "" for the others
};
std::vector<OpRow> bench_gpt_ops(kernels::Backend& be, cudaStream_t s, DType t, int64_t batch,
                                 int64_t seq, double gemm_tflops, double copy_gbps);

// --- report: the goals from the rows, the table of them, and the JSON file
struct Results {
  std::vector<GemmRow> gemm;
  std::vector<BandwidthRow> bw;
  std::vector<TrainRow> train;
  std::vector<GptRow> gpt;
  std::vector<OpRow> gpt_ops;
  std::vector<std::string> errors;
};
// Prints the goals (a goal whose rows are missing is "not measured") and writes `path`.
void report(const Results& r, bool quick, bool gemm_only, const std::string& device,
            const std::string& cc, const std::string& libraries, const std::string& path);

}  // namespace ringtrain::gpubench
