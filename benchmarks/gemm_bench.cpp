// gemm_bench: the CPU backend's GEMM (fp32, and fp16/bf16 inputs widened to fp32 with one
// rounding of the output) against raw OpenBLAS cblas_sgemm on the same shapes, in the same
// run. Shapes: the MLP's forward and backward GEMMs for a per-rank batch, plus one large
// square SGEMM (the practical limit of the BLAS). One row per shape and dtype, and --json.
//   usage: gemm_bench [--batch N] [--threads N] [--json]
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace {

using namespace ringtrain;

struct Shape3 {
  const char* name;
  bool ta, tb;
  int m, n, k;
};

// Seconds per call: warm-up, then as many iterations as fit in ~0.3 s (at least 5).

}  // namespace

int main(int argc, char** argv) {
  bench::Args args;
  args.batch = 64;
  if (const int code = bench::parse_args(argc, argv, "gemm_bench", args); code >= 0) return code;
  const int batch = args.batch, threads = args.threads;
  const bool json = args.json;
  auto backend = kernels::make_cpu_backend(threads);
  // y = x W^T (forward), dW = dy^T x, dx = dy W for 784-512-256-10.
  std::vector<Shape3> shapes = {
      {"fc1.fwd", false, true, batch, 512, 784}, {"fc1.dW", true, false, 512, 784, batch},
      {"fc2.fwd", false, true, batch, 256, 512}, {"fc2.dW", true, false, 256, 512, batch},
      {"fc2.dx", false, false, batch, 512, 256}, {"square2048", false, false, 2048, 2048, 2048}};
  if (!json) {
    std::printf("# CPU backend GEMM vs raw cblas_sgemm, %d thread(s), per-rank batch %d\n", threads,
                batch);
    std::printf("%-11s %5s %5s %5s %-5s %10s %10s %7s\n", "shape", "m", "n", "k", "dtype",
                "GFLOP/s", "sgemm", "ratio");
  } else {
    std::printf("[");
  }
  bool first = true;
  for (const auto& s : shapes) {
    const int64_t asz = int64_t(s.m) * s.k, bsz = int64_t(s.k) * s.n, csz = int64_t(s.m) * s.n;
    std::vector<float> a(static_cast<size_t>(asz)), b(static_cast<size_t>(bsz)),
        c(static_cast<size_t>(csz));
    Rng rng(1);
    for (auto& v : a) v = rng.uniform() - 0.5f;
    for (auto& v : b) v = rng.uniform() - 0.5f;
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const double flops = 2.0 * s.m * s.n * s.k;
    const double raw = bench::time_per_call([&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), s.n);
    });
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      if (std::string(s.name) == "square2048" && t != DType::f32) continue;
      std::vector<uint16_t> a16(static_cast<size_t>(asz)), b16(static_cast<size_t>(bsz)),
          c16(static_cast<size_t>(csz));
      Tensor ta(a.data(), {s.ta ? s.k : s.m, s.ta ? s.m : s.k}, DType::f32);
      Tensor tb(b.data(), {s.tb ? s.n : s.k, s.tb ? s.k : s.n}, DType::f32);
      Tensor tc(c.data(), {s.m, s.n}, DType::f32);
      if (t != DType::f32) {
        Tensor ta16(a16.data(), ta.shape, t), tb16(b16.data(), tb.shape, t);
        backend->cast(ta, ta16);
        backend->cast(tb, tb16);
        ta = ta16;
        tb = tb16;
        tc = Tensor(c16.data(), tc.shape, t);
      }
      const double ours =
          bench::time_per_call([&] { backend->gemm(s.ta, s.tb, 1.f, ta, tb, 0.f, tc); });
      const double g = flops / ours * 1e-9, gr = flops / raw * 1e-9;
      if (json) {
        std::printf(
            "%s{\"shape\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"dtype\":\"%s\",\"gflops\":%.2f,"
            "\"sgemm_gflops\":%.2f,\"ratio\":%.3f,\"threads\":%d}",
            first ? "" : ",", s.name, s.m, s.n, s.k, dtype_name(t), g, gr, g / gr, threads);
      } else {
        std::printf("%-11s %5d %5d %5d %-5s %10.2f %10.2f %7.3f\n", s.name, s.m, s.n, s.k,
                    dtype_name(t), g, gr, g / gr);
      }
      first = false;
    }
  }
  if (json) std::printf("]\n");
  return 0;
}
