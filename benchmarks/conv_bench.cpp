// conv_bench: the CPU backend's two convolutions, im2col + OpenBLAS SGEMM and oneDNN, on the
// convolutions of --model cnn (and one ResNet 3x3 shape) at a per-rank batch, forward (with
// fused bias + ReLU), backward data and backward weights, against a square SGEMM measured in
// the same run (the BLAS's practical limit). GFLOP/s = 2 * MACs / time. One row per shape,
// pass and implementation, and --json.
//   usage: conv_bench [--batch N] [--threads N] [--json]
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kernels/kernels.hpp"

namespace {

using namespace ringtrain;

std::vector<float> filled(size_t n, float v) { return std::vector<float>(n, v); }

}  // namespace

int main(int argc, char** argv) {
  bench::Args args;
  args.batch = 128;
  if (const int code = bench::parse_args(argc, argv, "conv_bench", args); code >= 0) return code;
  const int batch = args.batch, threads = args.threads;
  const bool json = args.json;
  struct Named {
    const char* name;
    kernels::ConvShape cs;
  };
  const std::vector<Named> shapes = {
      {"cnn.conv1", {batch, 1, 28, 28, 32, 3, 3, 1, 0}},
      {"cnn.conv2", {batch, 32, 26, 26, 64, 3, 3, 1, 0}},
      {"resnet.3x3x32@14", {batch, 32, 14, 14, 32, 3, 3, 1, 1}},
  };
  // The reference: a 2048^3 SGEMM on the same threads.
  openblas_set_num_threads(threads);
  const int sq = 2048;
  auto a = filled(size_t(sq) * sq, 0.5f), b = filled(size_t(sq) * sq, 0.25f),
       c = filled(size_t(sq) * sq, 0.f);
  const double t_sq = bench::time_per_call([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, sq, sq, sq, 1.f, a.data(), sq, b.data(),
                sq, 0.f, c.data(), sq);
  });
  const double gemm_gflops = 2.0 * sq * sq * double(sq) / t_sq * 1e-9;
  if (!json) {
    std::printf("# %d thread(s), batch %d; reference SGEMM %d^3: %.1f GFLOP/s\n", threads, batch,
                sq, gemm_gflops);
    std::printf("%-18s %-9s %-7s %10s %9s %8s\n", "shape", "pass", "impl", "ms", "GFLOP/s",
                "of GEMM");
  }
  std::string out = "[";
  for (const auto& [name, cs] : shapes) {
    const size_t nx = size_t(cs.n * cs.c * cs.h * cs.w), nw = size_t(cs.k * cs.c * cs.r * cs.s),
                 ny = size_t(cs.n * cs.k * cs.p() * cs.q());
    auto x = filled(nx, 0.1f), w = filled(nw, 0.01f), bias = filled(size_t(cs.k), 0.f),
         y = filled(ny, 0.f), dy = filled(ny, 0.01f), dx = filled(nx, 0.f), dw = filled(nw, 0.f),
         db = filled(size_t(cs.k), 0.f);
    const Tensor tx(x.data(), {cs.n, cs.c, cs.h, cs.w}, DType::f32),
        tw(w.data(), {cs.k, cs.c, cs.r, cs.s}, DType::f32), tb(bias.data(), {cs.k}, DType::f32),
        ty(y.data(), {cs.n, cs.k, cs.p(), cs.q()}, DType::f32),
        tdy(dy.data(), {cs.n, cs.k, cs.p(), cs.q()}, DType::f32),
        tdx(dx.data(), {cs.n, cs.c, cs.h, cs.w}, DType::f32),
        tdw(dw.data(), {cs.k, cs.c, cs.r, cs.s}, DType::f32), tdb(db.data(), {cs.k}, DType::f32);
    const double flops = 2.0 * double(ny) * double(cs.c * cs.r * cs.s);
    for (const char* impl : {"im2col", "onednn"}) {
      setenv("RINGTRAIN_CONV", impl, 1);  // read when a backend first convolves
      auto be = kernels::make_cpu_backend(threads);
      const double tf = bench::time_per_call(
          [&] { be->conv2d_forward(cs, tx, tw, &tb, kernels::Activation::relu, ty); });
      const double td = bench::time_per_call([&] { be->conv2d_backward_data(cs, tdy, tw, tdx); });
      const double tw_ =
          bench::time_per_call([&] { be->conv2d_backward_filter(cs, tx, tdy, tdw, &tdb); });
      for (auto [pass, t] : {std::pair{"forward", tf}, {"bwd_data", td}, {"bwd_wgt", tw_}}) {
        const double gf = flops / t * 1e-9;
        if (!json)
          std::printf("%-18s %-9s %-7s %10.2f %9.1f %8.2f\n", name, pass, impl, t * 1e3, gf,
                      gf / gemm_gflops);
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%s{\"shape\":\"%s\",\"pass\":\"%s\",\"impl\":\"%s\",\"ms\":%.3f,"
                      "\"gflops\":%.2f,\"gemm_gflops\":%.2f}",
                      out.size() > 1 ? "," : "", name, pass, impl, t * 1e3, gf, gemm_gflops);
        out += buf;
      }
    }
  }
  if (json) std::printf("%s]\n", out.c_str());
  return 0;
}
