// Max pooling of activations with the channels innermost (kernels::Layout: blocked, 16
// channels a block, or nhwc, all channels one block) for the CPU backend. The input and its
// gradient are in that layout, the output, argmax and output gradient plain: a convolution's
// blocked output is pooled without a reorder, and what follows the pooling (dropout, flatten, a
// dense layer) sees NCHW. The winners (the first of equal values; a nan wins), the argmax (h W + w
// in the plane) and the order of the gradient sums are those of the plain kernels in cpu_conv.cpp,
// so both layouts give bitwise equal results; the channels of a block are the vector lanes.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {

namespace {

// One block (one sample, B channels): in [H W][B] -> window maxima yb and argmax ab,
// [P Q][B]. Inlined into a baseline and an AVX-512 function (chosen at run time).
template <typename E, typename S = typename E::storage>
__attribute__((always_inline)) inline void forward_block_body(const PoolShape& ps, int64_t B,
                                                              const S* in, float* yb, int32_t* ab) {
  const int64_t P = ps.p(), Q = ps.q(), W = ps.w;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t first = p * ps.stride * W + q * ps.stride;
      float* bv = yb + (p * Q + q) * B;
      int32_t* bi = ab + (p * Q + q) * B;
      const S* f = in + first * B;
#pragma omp simd
      for (int64_t j = 0; j < B; ++j) {
        bv[j] = E::load(f[j]);
        bi[j] = int32_t(first);
      }
      for (int64_t i = 0; i < ps.kernel; ++i)
        for (int64_t k = i == 0 ? 1 : 0; k < ps.kernel; ++k) {
          const int64_t at = first + i * W + k;
          const S* a = in + at * B;
#pragma omp simd
          for (int64_t j = 0; j < B; ++j) {
            const float v = E::load(a[j]);
            const bool t = v > bv[j] || (v != v && bv[j] == bv[j]);
            bv[j] = t ? v : bv[j];
            bi[j] = t ? int32_t(at) : bi[j];
          }
        }
      if (ps.relu_input) {
#pragma omp simd
        for (int64_t j = 0; j < B; ++j) bi[j] = bv[j] <= 0.f ? -1 : bi[j];
      }
    }
}

// One block of the gradient: acc [H W][B] (zeroed by the caller) receives dy (db [P Q][B])
// at the argmax positions (ab). Each window adds to each of its positions, 0 where the
// position did not win: acc is never -0, so adding +0 changes nothing, and the winners' sums
// run in the plain kernel's order (ascending window).
__attribute__((always_inline)) inline void backward_block_body(const PoolShape& ps, int64_t B,
                                                               const float* db, const int32_t* ab,
                                                               float* acc) {
  const int64_t P = ps.p(), Q = ps.q(), W = ps.w;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t o = (p * Q + q) * B, first = p * ps.stride * W + q * ps.stride;
      for (int64_t i = 0; i < ps.kernel; ++i)
        for (int64_t k = 0; k < ps.kernel; ++k) {
          const int64_t at = first + i * W + k;
          float* a = acc + at * B;
#pragma omp simd
          for (int64_t j = 0; j < B; ++j) a[j] += ab[o + j] == int32_t(at) ? db[o + j] : 0.f;
        }
    }
}

template <typename E, typename S = typename E::storage>
void forward_block_base(const PoolShape& ps, int64_t B, const S* in, float* yb, int32_t* ab) {
  forward_block_body<E>(ps, B, in, yb, ab);
}
template <typename E, typename S = typename E::storage>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void forward_block_avx512(
    const PoolShape& ps, int64_t B, const S* in, float* yb, int32_t* ab) {
  forward_block_body<E>(ps, B, in, yb, ab);
}
void backward_block_base(const PoolShape& ps, int64_t B, const float* db, const int32_t* ab,
                         float* acc) {
  backward_block_body(ps, B, db, ab, acc);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) void backward_block_avx512(
    const PoolShape& ps, int64_t B, const float* db, const int32_t* ab, float* acc) {
  backward_block_body(ps, B, db, ab, acc);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

}  // namespace

void CpuBackend::maxpool2d_forward_blocked(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                           const Tensor& argmax) {
  const int64_t B = channel_block(ps.x_layout, ps.c);
  const int64_t PQ = ps.p() * ps.q(), HW = ps.h * ps.w, blocks = ps.n * (ps.c / B);
  auto* pa = argmax.as<int32_t>();
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* px = x.as<typename E::storage>();
    auto* py = y.as<typename E::storage>();
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && blocks > 1)
    {
      std::vector<float> yb(size_t(PQ * B));
      std::vector<int32_t> ab(size_t(PQ * B));
#pragma omp for
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const auto* in = px + blk * HW * B;
        if (has_avx512())
          forward_block_avx512<E>(ps, B, in, yb.data(), ab.data());
        else
          forward_block_base<E>(ps, B, in, yb.data(), ab.data());
        // Block blk holds channels B (blk % (C/B)) .. of sample blk / (C/B): planes
        // B blk .. B blk + B - 1 of the plain output.
        for (int64_t j = 0; j < B; ++j) {
          auto* yo = py + (blk * B + j) * PQ;
          int32_t* ao = pa + (blk * B + j) * PQ;
          for (int64_t o = 0; o < PQ; ++o) {
            yo[o] = E::store(yb[size_t(o * B + j)]);
            ao[o] = ab[size_t(o * B + j)];
          }
        }
      }
    }
  });
}

void CpuBackend::maxpool2d_backward_blocked(const PoolShape& ps, const Tensor& dy,
                                            const Tensor& argmax, const Tensor& dx) {
  const int64_t B = channel_block(ps.x_layout, ps.c);
  const int64_t PQ = ps.p() * ps.q(), HW = ps.h * ps.w, blocks = ps.n * (ps.c / B);
  const auto* pa = argmax.as<int32_t>();
  dispatch_float(dy.dtype, [&](auto D) {
    using E = decltype(D);
    const auto* pd = dy.as<typename E::storage>();
    auto* px = dx.as<typename E::storage>();
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && blocks > 1)
    {
      std::vector<float> db(size_t(PQ * B)), acc(size_t(HW * B));
      std::vector<int32_t> ab(size_t(PQ * B));
#pragma omp for
      for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t j = 0; j < B; ++j) {
          const auto* di = pd + (blk * B + j) * PQ;
          const int32_t* ai = pa + (blk * B + j) * PQ;
          for (int64_t o = 0; o < PQ; ++o) {
            db[size_t(o * B + j)] = E::load(di[o]);
            ab[size_t(o * B + j)] = ai[o];
          }
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        if (has_avx512())
          backward_block_avx512(ps, B, db.data(), ab.data(), acc.data());
        else
          backward_block_base(ps, B, db.data(), ab.data(), acc.data());
        auto* out = px + blk * HW * B;
        for (int64_t i = 0; i < HW * B; ++i) out[i] = E::store(acc[size_t(i)]);
      }
    }
  });
}

}  // namespace ringtrain::kernels::cpu
