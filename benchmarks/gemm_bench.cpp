// gemm_bench: the CPU backend's GEMM on each provider (oneDNN, OpenBLAS) and, for 16-bit
// inputs, on the native path and the widening path, against raw OpenBLAS cblas_sgemm on the
// same shape in the same run. Shapes: the MLP's (784-512-256-10) forward and backward GEMMs
// for a per-rank batch, the cnn's fc1, plus one large square SGEMM (the practical limit of
// the BLAS). One row per shape, dtype, provider and path; --json for scripts. The first
// line names the CPU and the provider `auto` chooses (kernels::describe_cpu_gemm()).
//   usage: gemm_bench [--batch N] [--threads N] [--json]
#include <cblas.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/kernels.hpp"

namespace {

using namespace ringtrain;
using kernels::cpu::CpuBackend;
using kernels::cpu::CpuOptions;
using kernels::cpu::GemmProvider;

struct Shape3 {
  const char* name;
  bool ta, tb;
  int m, n, k;
};

struct Variant {
  GemmProvider provider;
  bool native16;
  const char* path;
};

}  // namespace

int main(int argc, char** argv) {
  bench::Args args;
  args.batch = 64;
  if (const int code = bench::parse_args(argc, argv, "gemm_bench", args); code >= 0) return code;
  const int batch = args.batch, threads = args.threads;
  const bool json = args.json;
  const std::string cpu = kernels::describe_cpu_gemm();
  // y = x W^T (forward), dW = dy^T x, dx = dy W for 784-512-256-10 and the cnn's fc1.
  std::vector<Shape3> shapes = {{"fc1.fwd", false, true, batch, 512, 784},
                                {"fc1.dW", true, false, 512, 784, batch},
                                {"fc2.fwd", false, true, batch, 256, 512},
                                {"fc2.dW", true, false, 256, 512, batch},
                                {"fc2.dx", false, false, batch, 512, 256},
                                {"cnn.fc1.fwd", false, true, batch, 128, 9216},
                                {"cnn.fc1.dW", true, false, 128, 9216, batch},
                                {"square2048", false, false, 2048, 2048, 2048}};
  const std::vector<Variant> variants = {{GemmProvider::openblas, false, "widen"},
                                         {GemmProvider::onednn, false, "widen"},
                                         {GemmProvider::onednn, true, "native"}};
  std::vector<std::unique_ptr<CpuBackend>> backends;
  for (const auto& v : variants) {
    CpuOptions o;
    o.gemm = v.provider;
    o.native16 = v.native16;
    backends.push_back(std::make_unique<CpuBackend>(threads, o));
  }
  if (!json) {
    std::printf("# CPU backend GEMM vs raw cblas_sgemm, %d thread(s), per-rank batch %d\n# %s\n",
                threads, batch, cpu.c_str());
    std::printf("%-11s %5s %5s %5s %-5s %-8s %-6s %10s %10s %7s\n", "shape", "m", "n", "k", "dtype",
                "provider", "path", "GFLOP/s", "sgemm", "ratio");
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
    const bool square = std::string(s.name) == "square2048";
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      if (square && t != DType::f32) continue;
      std::vector<uint16_t> a16(static_cast<size_t>(asz)), b16(static_cast<size_t>(bsz)),
          c16(static_cast<size_t>(csz));
      Tensor ta(a.data(), {s.ta ? s.k : s.m, s.ta ? s.m : s.k}, DType::f32);
      Tensor tb(b.data(), {s.tb ? s.n : s.k, s.tb ? s.k : s.n}, DType::f32);
      Tensor tc(c.data(), {s.m, s.n}, DType::f32);
      if (t != DType::f32) {
        Tensor ta16(a16.data(), ta.shape, t), tb16(b16.data(), tb.shape, t);
        backends[0]->cast(ta, ta16);
        backends[0]->cast(tb, tb16);
        ta = ta16;
        tb = tb16;
        tc = Tensor(c16.data(), tc.shape, t);
      }
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        const Variant& v = variants[vi];
        CpuBackend& be = *backends[vi];
        // fp32 has one path; a 16-bit dtype without native kernels has only the widening one.
        if (v.native16 && (t == DType::f32 || !be.native(t))) continue;
        const double ours =
            bench::time_per_call([&] { be.gemm(s.ta, s.tb, 1.f, ta, tb, 0.f, tc); });
        const double g = flops / ours * 1e-9, gr = flops / raw * 1e-9;
        const char* prov = kernels::cpu::provider_name(v.provider);
        const char* path = t == DType::f32 ? "fp32" : v.path;
        if (json) {
          std::printf(
              "%s{\"shape\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"dtype\":\"%s\",\"provider\":\"%s\","
              "\"path\":\"%s\",\"gflops\":%.2f,\"sgemm_gflops\":%.2f,\"ratio\":%.3f,\"threads\":%"
              "d}",
              first ? "" : ",", s.name, s.m, s.n, s.k, dtype_name(t), prov, path, g, gr, g / gr,
              threads);
        } else {
          std::printf("%-11s %5d %5d %5d %-5s %-8s %-6s %10.2f %10.2f %7.3f\n", s.name, s.m, s.n,
                      s.k, dtype_name(t), prov, path, g, gr, g / gr);
        }
        first = false;
      }
    }
  }
  if (json) std::printf("]\n");
  return 0;
}
