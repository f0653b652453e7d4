// CPU token + positional embedding (GPT-2's encoder): the forward gather and the backward
// scatter-add. The backward pass splits the work by channels, not by tokens, so every
// gradient element is summed by one thread in token order: deterministic for any thread count.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {

namespace {

// RT_CHECK that every token indexes a row of the table (the loader validated the data, so an
// out-of-range token here is an internal error).
void check_tokens(const int32_t* tok, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    RT_CHECK(tok[i] >= 0 && tok[i] < vocab, "token ", tok[i], " at position ", i,
             " is outside the embedding's vocabulary [0, ", vocab, ")");
}

}  // namespace

void CpuBackend::do_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                                      const Tensor& y) {
  const int64_t n = tokens.numel(), t_len = tokens.dim(1), c = wte.dim(1);
  const int32_t* tok = tokens.as<int32_t>();
  check_tokens(tok, n, wte.dim(0));
  dispatch_float(wte.dtype, [&](auto W) {
    using EW = decltype(W);
    dispatch_float(wpe ? wpe->dtype : wte.dtype, [&](auto P) {
      using EP = decltype(P);
      dispatch_float(y.dtype, [&](auto Y) {
        using EY = decltype(Y);
        const auto* pw = wte.as<typename EW::storage>();
        const auto* pp = wpe ? wpe->as<typename EP::storage>() : nullptr;
        auto* py = y.as<typename EY::storage>();
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && n * c >= kParallelMin)
        for (int64_t i = 0; i < n; ++i) {
          const auto* w = pw + int64_t(tok[i]) * c;
          auto* out = py + i * c;
          if (pp) {
            const auto* p = pp + (i % t_len) * c;
            for (int64_t j = 0; j < c; ++j) out[j] = EY::store(EW::load(w[j]) + EP::load(p[j]));
          } else {
            for (int64_t j = 0; j < c; ++j) out[j] = EY::store(EW::load(w[j]));
          }
        }
      });
    });
  });
}

void CpuBackend::do_embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                                       const Tensor* dwpe) {
  const int64_t n = tokens.numel(), t_len = tokens.dim(1), c = dwte.dim(1);
  const int32_t* tok = tokens.as<int32_t>();
  check_tokens(tok, n, dwte.dim(0));
  float* gw = dwte.as<float>();
  float* gp = dwpe ? dwpe->as<float>() : nullptr;
  // Channel blocks of 64 floats (four cache lines): no two threads write one line.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (c + kBlock - 1) / kBlock;
  const int64_t vocab = dwte.dim(0), positions = dwpe ? dwpe->dim(0) : 0;
  dispatch_float(dy.dtype, [&](auto D) {
    using ED = decltype(D);
    const auto* pd = dy.as<typename ED::storage>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(c, lo + kBlock);
      for (int64_t v = 0; v < vocab; ++v) std::fill(gw + v * c + lo, gw + v * c + hi, 0.f);
      for (int64_t p = 0; p < positions; ++p) std::fill(gp + p * c + lo, gp + p * c + hi, 0.f);
      for (int64_t i = 0; i < n; ++i) {
        const auto* g = pd + i * c;
        float* w = gw + int64_t(tok[i]) * c;
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) w[j] += ED::load(g[j]);
        if (gp) {
          float* p = gp + (i % t_len) * c;
#pragma omp simd
          for (int64_t j = lo; j < hi; ++j) p[j] += ED::load(g[j]);
        }
      }
    }
  });
}

RT_KERNEL_FAMILY(cpu, embedding) { table.declare(op_name(Op::embedding), kFloatDTypes); }
}  // namespace ringtrain::kernels::cpu
