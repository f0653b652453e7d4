// Max pooling of activations with the channels innermost (kernels::Layout: blocked, 16
// channels a block, or nhwc, all channels one block) for the CPU backend. The input, its
// gradient and the argmax are in that layout, the output and its gradient plain: a
// convolution's output is pooled without a reorder of the large input, and what follows the
// pooling (dropout, flatten, a dense layer) sees NCHW; oneDNN's reorder turns the pooled
// (four times smaller) output into NCHW and its gradient back. The winners (the first of equal
// values; a nan wins), the argmax (h W + w in the plane) and the order of the gradient sums
// are those of the plain kernels in cpu_conv.cpp, so both layouts give bitwise equal results;
// the channels of a block are the vector lanes.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {

namespace {

// Work on one block (one sample, B channels), with B known at compile time (kB = 16, the
// blocked layout) or at run time (kB = 0, nhwc), so that the lane loops of the common layout
// are one vector each. Inlined into a baseline and an AVX-512 function (chosen at run time).
template <typename E, int64_t kB, typename S = typename E::storage>
struct Block {
  const PoolShape& ps;
  int64_t B;  // == kB when kB != 0

  // in [H W][B] -> y (the window maxima), arg [P Q][B]; yb: scratch [P Q][B].
  __attribute__((always_inline)) inline void forward(const S* in, float* yb, S* y,
                                                     int32_t* arg) const {
    const int64_t b = kB ? kB : B, P = ps.p(), Q = ps.q(), W = ps.w;
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t first = p * ps.stride * W + q * ps.stride;
        float* bv = yb + (p * Q + q) * b;
        int32_t* bi = arg + (p * Q + q) * b;
        const S* f = in + first * b;
#pragma omp simd
        for (int64_t j = 0; j < b; ++j) {
          bv[j] = E::load(f[j]);
          bi[j] = int32_t(first);
        }
        for (int64_t i = 0; i < ps.kernel; ++i)
          for (int64_t k = i == 0 ? 1 : 0; k < ps.kernel; ++k) {
            const int64_t at = first + i * W + k;
            const S* a = in + at * b;
#pragma omp simd
            for (int64_t j = 0; j < b; ++j) {
              const float v = E::load(a[j]);
              const bool t = v > bv[j] || (v != v && bv[j] == bv[j]);
              bv[j] = t ? v : bv[j];
              bi[j] = t ? int32_t(at) : bi[j];
            }
          }
        if (ps.relu_input) {
#pragma omp simd
          for (int64_t j = 0; j < b; ++j) bi[j] = bv[j] <= 0.f ? -1 : bi[j];
        }
      }
    const int64_t n = P * Q * b;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = E::store(yb[i]);
  }

  // dy, arg [P Q][B] -> dx [H W][B]; acc: scratch [H W][B]. Each window adds to each of its
  // positions, 0 where the position did not win: acc is never -0, so adding +0 changes
  // nothing, and the winners' sums run in the plain kernel's order (ascending window).
  __attribute__((always_inline)) inline void backward(const S* dy, const int32_t* arg, float* acc,
                                                      S* dx) const {
    const int64_t b = kB ? kB : B, P = ps.p(), Q = ps.q(), W = ps.w;
    const int64_t n = ps.h * W * b;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) acc[i] = 0.f;
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t o = (p * Q + q) * b, first = p * ps.stride * W + q * ps.stride;
        for (int64_t i = 0; i < ps.kernel; ++i)
          for (int64_t k = 0; k < ps.kernel; ++k) {
            const int64_t at = first + i * W + k;
            float* a = acc + at * b;
#pragma omp simd
            for (int64_t j = 0; j < b; ++j)
              a[j] += arg[o + j] == int32_t(at) ? E::load(dy[o + j]) : 0.f;
          }
      }
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = E::store(acc[i]);
  }
};

template <typename E, int64_t kB, typename S = typename E::storage>
void forward_base(const Block<E, kB>& blk, const S* in, float* yb, S* y, int32_t* arg) {
  blk.forward(in, yb, y, arg);
}
template <typename E, int64_t kB, typename S = typename E::storage>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void forward_avx512(const Block<E, kB>& blk,
                                                                         const S* in, float* yb,
                                                                         S* y, int32_t* arg) {
  blk.forward(in, yb, y, arg);
}
template <typename E, int64_t kB, typename S = typename E::storage>
void backward_base(const Block<E, kB>& blk, const S* dy, const int32_t* arg, float* acc, S* dx) {
  blk.backward(dy, arg, acc, dx);
}
template <typename E, int64_t kB, typename S = typename E::storage>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void backward_avx512(const Block<E, kB>& blk,
                                                                          const S* dy,
                                                                          const int32_t* arg,
                                                                          float* acc, S* dx) {
  blk.backward(dy, arg, acc, dx);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

// Calls f with the Block for ps's layout: B = 16 fixed, or B = C at run time.
template <typename E, typename F>
void with_block(const PoolShape& ps, F&& f) {
  const int64_t B = channel_block(ps.x_layout, ps.c);
  if (B == kChannelBlock)
    f(Block<E, kChannelBlock>{ps, B});
  else
    f(Block<E, 0>{ps, B});
}

// dst = src ([N, C, h, w] of 16-bit elements) from one layout into the other, moved as bits.
template <typename T>
void transpose_blocks(const PoolShape& ps, int64_t hw, const T* src, Layout from, T* dst, Layout to,
                      int threads) {
  const bool to_plain = to == Layout::plain;
  const int64_t B = channel_block(to_plain ? from : to, ps.c), blocks = ps.n * (ps.c / B);
#pragma omp parallel for num_threads(threads) if (threads > 1 && blocks > 1)
  for (int64_t nb = 0; nb < blocks; ++nb) {
    const int64_t blk = nb * hw * B;  // the block's first element, in either layout
    for (int64_t j = 0; j < B; ++j)
      for (int64_t s = 0; s < hw; ++s) {
        const int64_t b = blk + s * B + j, p = blk + j * hw + s;
        if (to_plain)
          dst[p] = src[b];
        else
          dst[b] = src[p];
      }
  }
}

// dst = src ([N, C, h, w] of dtype t) from one layout into the other. fp32 by oneDNN's
// reorder; 16-bit values by transpose_blocks: oneDNN 2.6 moves fp16 only in its reference
// reorder (about 100x slower), and on a CPU without AVX-512 its bf16 reorder turns -0 into
// +0 (it computes through fp32), which would make the pooling's result depend on the layout.
void relayout(OneDnnConv& dnn, const PoolShape& ps, int64_t h, int64_t w, DType t, const void* src,
              Layout from, void* dst, Layout to, int threads) {
  if (t == DType::f32) return dnn.reorder(ps.n, ps.c, h, w, t, src, from, dst, to);
  RT_CHECK(t == DType::bf16 || t == DType::f16, "pooling relayout of ", dtype_name(t));
  transpose_blocks(ps, h * w, static_cast<const uint16_t*>(src), from, static_cast<uint16_t*>(dst),
                   to, threads);
}

}  // namespace

void CpuBackend::maxpool2d_forward_blocked(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                           const Tensor& argmax) {
  OneDnnConv* dnn = onednn();
  RT_CHECK(dnn, "max pooling of a ", ps.x_layout == Layout::nhwc ? "nhwc" : "blocked",
           " input needs the oneDNN convolution (RINGTRAIN_CONV=onednn)");
  const int64_t B = channel_block(ps.x_layout, ps.c);
  const int64_t PQ = ps.p() * ps.q(), HW = ps.h * ps.w, blocks = ps.n * (ps.c / B);
  auto* pa = argmax.as<int32_t>();
  scratch_a_.resize(size_t(y.numel()));  // y in x's layout (fp32 or 16-bit, fits either)
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    using S = typename E::storage;
    const auto* px = x.as<S>();
    auto* ys = reinterpret_cast<S*>(scratch_a_.data());
    with_block<E>(ps, [&](const auto& blk) {
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && blocks > 1)
      {
        std::vector<float> yb(size_t(PQ * B));
#pragma omp for
        for (int64_t b = 0; b < blocks; ++b) {
          if (has_avx512())
            forward_avx512(blk, px + b * HW * B, yb.data(), ys + b * PQ * B, pa + b * PQ * B);
          else
            forward_base(blk, px + b * HW * B, yb.data(), ys + b * PQ * B, pa + b * PQ * B);
        }
      }
    });
  });
  relayout(*dnn, ps, ps.p(), ps.q(), y.dtype, scratch_a_.data(), ps.x_layout, y.data, Layout::plain,
           threads_);
}

void CpuBackend::maxpool2d_backward_blocked(const PoolShape& ps, const Tensor& dy,
                                            const Tensor& argmax, const Tensor& dx) {
  OneDnnConv* dnn = onednn();
  RT_CHECK(dnn, "max pooling of a ", ps.x_layout == Layout::nhwc ? "nhwc" : "blocked",
           " input needs the oneDNN convolution (RINGTRAIN_CONV=onednn)");
  const int64_t B = channel_block(ps.x_layout, ps.c);
  const int64_t PQ = ps.p() * ps.q(), HW = ps.h * ps.w, blocks = ps.n * (ps.c / B);
  const auto* pa = argmax.as<int32_t>();
  scratch_a_.resize(size_t(dy.numel()));  // dy in x's layout
  relayout(*dnn, ps, ps.p(), ps.q(), dy.dtype, dy.data, Layout::plain, scratch_a_.data(),
           ps.x_layout, threads_);
  dispatch_float(dy.dtype, [&](auto D) {
    using E = decltype(D);
    using S = typename E::storage;
    const auto* pd = reinterpret_cast<const S*>(scratch_a_.data());
    auto* px = dx.as<S>();
    with_block<E>(ps, [&](const auto& blk) {
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && blocks > 1)
      {
        std::vector<float> acc(size_t(HW * B));
#pragma omp for
        for (int64_t b = 0; b < blocks; ++b) {
          if (has_avx512())
            backward_avx512(blk, pd + b * PQ * B, pa + b * PQ * B, acc.data(), px + b * HW * B);
          else
            backward_base(blk, pd + b * PQ * B, pa + b * PQ * B, acc.data(), px + b * HW * B);
        }
      }
    });
  });
}

}  // namespace ringtrain::kernels::cpu
