// CPU convolution and pooling. Convolution is oneDNN's (onednn_conv.cpp, the default; 16-bit
// inputs native where oneDNN has kernels) or im2col + OpenBLAS SGEMM per sample: the
// columns of one sample ([C R S, P Q] in fp32) stay in cache while the GEMM consumes them,
// and bias + activation + the rounding to the output dtype run as the GEMM's epilogue
// while its result is still in cache. A 1x1, stride 1, unpadded convolution skips im2col.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/onednn_conv.hpp"

namespace ringtrain::kernels::cpu {

namespace {

bool is_pointwise(const ConvShape& cs) {
  return cs.r == 1 && cs.s == 1 && cs.stride == 1 && cs.pad == 0;
}

// col[(c R + r) S + s][p Q + q] = x[c][p stride - pad + r][q stride - pad + s], or 0 outside.
void im2col(const ConvShape& cs, const float* x, float* col, int threads) {
  const int64_t P = cs.p(), Q = cs.q(), H = cs.h, W = cs.w, rows = cs.c * cs.r * cs.s;
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows * P * Q >= kParallelMin)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t c = row / (cs.r * cs.s), r = row / cs.s % cs.r, s = row % cs.s;
    const float* plane = x + c * H * W;
    float* out = col + row * P * Q;
    // The q range whose input column lies inside [0, W).
    const int64_t q_lo = std::clamp<int64_t>((cs.pad - s + cs.stride - 1) / cs.stride, 0, Q);
    const int64_t q_hi = std::clamp<int64_t>((W - 1 + cs.pad - s) / cs.stride + 1, q_lo, Q);
    for (int64_t p = 0; p < P; ++p, out += Q) {
      const int64_t ih = p * cs.stride - cs.pad + r;
      if (ih < 0 || ih >= H) {
        std::fill(out, out + Q, 0.f);
        continue;
      }
      const float* in = plane + ih * W - cs.pad + s;
      std::fill(out, out + q_lo, 0.f);
      if (cs.stride == 1) {
        std::memcpy(out + q_lo, in + q_lo, size_t(q_hi - q_lo) * sizeof(float));
      } else {
        for (int64_t q = q_lo; q < q_hi; ++q) out[q] = in[q * cs.stride];
      }
      std::fill(out + q_hi, out + Q, 0.f);
    }
  }
}

// The adjoint of im2col: dx[c][ih][iw] += col[...] (dx zeroed by the caller). Rows that
// write the same plane run on one thread, so there are no races.
void col2im(const ConvShape& cs, const float* col, float* dx, int threads) {
  const int64_t P = cs.p(), Q = cs.q(), H = cs.h, W = cs.w;
#pragma omp parallel for num_threads(threads) if (threads > 1 && cs.c > 1)
  for (int64_t c = 0; c < cs.c; ++c) {
    float* plane = dx + c * H * W;
    for (int64_t r = 0; r < cs.r; ++r)
      for (int64_t s = 0; s < cs.s; ++s) {
        const float* in = col + ((c * cs.r + r) * cs.s + s) * P * Q;
        const int64_t q_lo = std::clamp<int64_t>((cs.pad - s + cs.stride - 1) / cs.stride, 0, Q);
        const int64_t q_hi = std::clamp<int64_t>((W - 1 + cs.pad - s) / cs.stride + 1, q_lo, Q);
        for (int64_t p = 0; p < P; ++p, in += Q) {
          const int64_t ih = p * cs.stride - cs.pad + r;
          if (ih < 0 || ih >= H) continue;
          float* out = plane + ih * W - cs.pad + s;
          for (int64_t q = q_lo; q < q_hi; ++q) out[q * cs.stride] += in[q];
        }
      }
  }
}

// One output row of 2x2, stride 2 max pooling: rows r0 and r0 + w of the input plane
// (`base` is r0's offset in the plane), elements stored as E (fp32, or 16-bit widened
// exactly to fp32 for the comparisons). The same winner rules as the generic loop, written
// without branches so that the loop vectorises; the maximum is one of the inputs, so storing
// it back as E is exact (a nan comes out quiet, as the conversions everywhere make it).
// The loop body, inlined into a baseline and an AVX-512 function (chosen at run time).
template <typename E, typename S = typename E::storage>
__attribute__((always_inline)) inline void maxpool2x2_row_body(const S* r0, int64_t w, int64_t base,
                                                               int64_t Q, bool relu_input, S* y,
                                                               int32_t* arg) {
  const S* r1 = r0 + w;
#pragma omp simd
  for (int64_t q = 0; q < Q; ++q) {
    const float a = E::load(r0[2 * q]), b = E::load(r0[2 * q + 1]), c = E::load(r1[2 * q]),
                d = E::load(r1[2 * q + 1]);
    const int32_t ia = int32_t(base + 2 * q);
    float bv = a;
    int32_t bi = ia;
    bool t = b > bv || (b != b && bv == bv);
    bv = t ? b : bv;
    bi = t ? ia + 1 : bi;
    t = c > bv || (c != c && bv == bv);
    bv = t ? c : bv;
    bi = t ? ia + int32_t(w) : bi;
    t = d > bv || (d != d && bv == bv);
    bv = t ? d : bv;
    bi = t ? ia + int32_t(w) + 1 : bi;
    y[q] = E::store(bv);
    arg[q] = relu_input && bv <= 0.f ? -1 : bi;
  }
}

template <typename E, typename S = typename E::storage>
void maxpool2x2_row_base(const S* r0, int64_t w, int64_t base, int64_t Q, bool relu_input, S* y,
                         int32_t* arg) {
  maxpool2x2_row_body<E>(r0, w, base, Q, relu_input, y, arg);
}

template <typename E, typename S = typename E::storage>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void maxpool2x2_row_avx512(
    const S* r0, int64_t w, int64_t base, int64_t Q, bool relu_input, S* y, int32_t* arg) {
  maxpool2x2_row_body<E>(r0, w, base, Q, relu_input, y, arg);
}

template <typename E, typename S = typename E::storage>
void maxpool2x2_row(const S* r0, int64_t w, int64_t base, int64_t Q, bool relu_input, S* y,
                    int32_t* arg) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  if (avx512)
    maxpool2x2_row_avx512<E>(r0, w, base, Q, relu_input, y, arg);
  else
    maxpool2x2_row_base<E>(r0, w, base, Q, relu_input, y, arg);
}

}  // namespace

Layout CpuBackend::activation_layout(DType compute) {
  OneDnnConv* dnn = onednn();
  if (!dnn || !opts_.blocked_layout) return Layout::plain;
  // oneDNN's AMX kernels (16-bit inputs, native) read and write channels last; its AVX-512
  // fp32 kernels (16-bit tensors widened to fp32 by the reorders) nChw16c.
  const bool half = compute == DType::bf16 || compute == DType::f16;
  return half && opts_.native16 && dnn->supports(compute) ? Layout::nhwc : Layout::blocked;
}

// oneDNN's engine and primitives are made at the first convolution, not for every backend.
OneDnnConv* CpuBackend::onednn() {
  if (opts_.conv_onednn && !onednn_) onednn_ = std::make_unique<OneDnnConv>(opts_.conv_winograd);
  return onednn_.get();
}

namespace {

// The dtype oneDNN computes a convolution on: the inputs' own 16-bit dtype when both have it
// and oneDNN has kernels for it, else fp32 (both widened).
DType conv_dtype(OneDnnConv& dnn, bool native16, const Tensor& a, const Tensor& b) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  return native16 && half && a.dtype == b.dtype && dnn.supports(a.dtype) ? a.dtype : DType::f32;
}

// Whether oneDNN's reorder converts a tensor of dtype t to or from `compute` at the speed of
// a copy. bf16 <-> fp32 runs in its JIT reorder; oneDNN 2.6 converts fp16 <-> fp32 only in
// its reference reorder (about 100x slower), so fp16 tensors on the fp32 path are widened
// and rounded by to_f32 / from_f32 instead.
bool reorder_converts(DType t, DType compute) {
  return t == compute || t == DType::f32 || t == DType::bf16;
}

// A tensor as oneDNN is handed it: itself, or (see reorder_converts) widened into scratch.
struct DnnArg {
  const void* data;
  DType dtype;
};
DnnArg dnn_arg(const Tensor& t, DType compute, std::vector<float>& scratch, int threads) {
  if (reorder_converts(t.dtype, compute)) return {t.data, t.dtype};
  scratch.resize(size_t(t.numel()));
  to_f32(t.data, t.dtype, scratch.data(), t.numel(), threads);
  return {scratch.data(), DType::f32};
}

// im2col reads and writes NCHW only (activation_layout() is plain without oneDNN).
void check_plain(const ConvShape& cs) {
  RT_CHECK(cs.x_layout == Layout::plain && cs.y_layout == Layout::plain,
           "the im2col convolution takes NCHW tensors only, got input layout ", int(cs.x_layout),
           " and output layout ", int(cs.y_layout));
}

}  // namespace

void CpuBackend::do_conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w,
                                   const Tensor* bias, Activation act, const Tensor& y) {
  const int64_t K = cs.k, PQ = cs.p() * cs.q(), CRS = cs.c * cs.r * cs.s;
  const int64_t in_n = cs.c * cs.h * cs.w, out_n = K * PQ;
  std::vector<float> b(size_t(K), 0.f);
  if (bias) {
    to_f32(bias->data, bias->dtype, b.data(), K, 1);
  }
  const bool relu = act == Activation::relu;
  if (OneDnnConv* dnn = onednn()) {
    const DType in = conv_dtype(*dnn, opts_.native16, x, w);
    const DnnArg ax = dnn_arg(x, in, scratch_a_, threads_),
                 aw = dnn_arg(w, in, scratch_b_, threads_);
    const bool direct = reorder_converts(y.dtype, in);
    void* out = direct ? y.data : (out32_.resize(size_t(y.numel())), out32_.data());
    dnn->forward(cs, in, ax.data, ax.dtype, aw.data, aw.dtype, bias ? b.data() : nullptr, relu, out,
                 direct ? y.dtype : DType::f32);
    if (!direct) from_f32(out32_.data(), y.data, y.dtype, y.numel(), threads_);
    return;
  }
  check_plain(cs);
  const float* px = as_f32(x, scratch_a_);
  const float* pw = as_f32(w, scratch_b_);
  const bool pointwise = is_pointwise(cs);
  if (!pointwise) col_.resize(size_t(CRS * PQ));
  if (y.dtype != DType::f32) out32_.resize(size_t(out_n));
  for (int64_t n = 0; n < cs.n; ++n) {
    const float* cols = px + n * in_n;
    if (!pointwise) {
      im2col(cs, cols, col_.data(), threads_);
      cols = col_.data();
    }
    float* out = y.dtype == DType::f32 ? y.as<float>() + n * out_n : out32_.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(K), int(PQ), int(CRS), 1.f, pw,
                int(CRS), cols, int(PQ), 0.f, out, int(PQ));
    // Epilogue: bias, activation, one rounding into y's dtype.
    dispatch_float(y.dtype, [&](auto Y) {
      using E = decltype(Y);
      auto* py = y.as<typename E::storage>() + n * out_n;
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && out_n >= kParallelMin)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t i = k * PQ; i < (k + 1) * PQ; ++i) {
          const float v = out[i] + b[size_t(k)];
          py[i] = E::store(relu && v < 0.f ? 0.f : v);
        }
    });
  }
}

void CpuBackend::do_conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                                         const Tensor& dx) {
  const int64_t K = cs.k, PQ = cs.p() * cs.q(), CRS = cs.c * cs.r * cs.s;
  const int64_t in_n = cs.c * cs.h * cs.w, out_n = K * PQ;
  if (OneDnnConv* dnn = onednn()) {
    const DType in = conv_dtype(*dnn, opts_.native16, dy, w);
    const DnnArg ady = dnn_arg(dy, in, scratch_a_, threads_),
                 aw = dnn_arg(w, in, scratch_b_, threads_);
    const bool direct = reorder_converts(dx.dtype, in);
    void* out = direct ? dx.data : (out32_.resize(size_t(dx.numel())), out32_.data());
    dnn->backward_data(cs, in, ady.data, ady.dtype, aw.data, aw.dtype, out,
                       direct ? dx.dtype : DType::f32);
    if (!direct) from_f32(out32_.data(), dx.data, dx.dtype, dx.numel(), threads_);
    return;
  }
  check_plain(cs);
  const float* pdy = as_f32(dy, scratch_a_);
  const float* pw = as_f32(w, scratch_b_);
  const bool pointwise = is_pointwise(cs);
  if (!pointwise) col_.resize(size_t(CRS * PQ));
  if (dx.dtype != DType::f32) out32_.resize(size_t(in_n));
  for (int64_t n = 0; n < cs.n; ++n) {
    float* out = dx.dtype == DType::f32 ? dx.as<float>() + n * in_n : out32_.data();
    // dcol[CRS, PQ] = W^T dy_n; for a pointwise convolution dcol is dx itself.
    float* dcol = pointwise ? out : col_.data();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(CRS), int(PQ), int(K), 1.f, pw,
                int(CRS), pdy + n * out_n, int(PQ), 0.f, dcol, int(PQ));
    if (!pointwise) {
      std::fill(out, out + in_n, 0.f);
      col2im(cs, dcol, out, threads_);
    }
    if (dx.dtype != DType::f32)
      from_f32(out, static_cast<char*>(dx.data) + n * in_n * int64_t(dtype_size(dx.dtype)),
               dx.dtype, in_n, threads_);
  }
}

void CpuBackend::do_conv2d_backward(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                    const Tensor& w, const Tensor* dx, const Tensor& dw,
                                    const Tensor* db) {
  OneDnnConv* dnn = onednn();
  const DType in = dnn ? conv_dtype(*dnn, opts_.native16, x, dy) : DType::f32;
  // The separate passes where a tensor is widened first (they have the scratch for it).
  if (!dnn || !dx || conv_dtype(*dnn, opts_.native16, dy, w) != in ||
      !reorder_converts(x.dtype, in) || !reorder_converts(dy.dtype, in) ||
      !reorder_converts(w.dtype, in) || !reorder_converts(dx->dtype, in)) {
    Backend::do_conv2d_backward(cs, x, dy, w, dx, dw, db);
    return;
  }
  const int64_t K = cs.k, CRS = cs.c * cs.r * cs.s;
  float* acc = dw.dtype == DType::f32 ? dw.as<float>()
                                      : (scratch_c_.resize(size_t(K * CRS)), scratch_c_.data());
  std::vector<float> sum(size_t(K), 0.f);
  dnn->backward(cs, in, x.data, x.dtype, dy.data, dy.dtype, w.data, w.dtype, dx->data, dx->dtype,
                acc, db ? sum.data() : nullptr);
  if (dw.dtype != DType::f32) from_f32(acc, dw.data, dw.dtype, K * CRS, threads_);
  if (db) from_f32(sum.data(), db->data, db->dtype, K, 1);
}

void CpuBackend::do_conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                           const Tensor& dw, const Tensor* db) {
  const int64_t K = cs.k, PQ = cs.p() * cs.q(), CRS = cs.c * cs.r * cs.s;
  const int64_t in_n = cs.c * cs.h * cs.w, out_n = K * PQ;
  float* acc = dw.dtype == DType::f32 ? dw.as<float>()
                                      : (scratch_c_.resize(size_t(K * CRS)), scratch_c_.data());
  std::vector<float> sum(size_t(K), 0.f);
  if (OneDnnConv* dnn = onednn()) {
    const DType in = conv_dtype(*dnn, opts_.native16, x, dy);
    const DnnArg ax = dnn_arg(x, in, scratch_a_, threads_),
                 ady = dnn_arg(dy, in, scratch_b_, threads_);
    dnn->backward_weights(cs, in, ax.data, ax.dtype, ady.data, ady.dtype, acc,
                          db ? sum.data() : nullptr);
    if (dw.dtype != DType::f32) from_f32(acc, dw.data, dw.dtype, K * CRS, threads_);
    if (db) from_f32(sum.data(), db->data, db->dtype, K, 1);
    return;
  }
  check_plain(cs);
  const float* px = as_f32(x, scratch_a_);
  const float* pdy = as_f32(dy, scratch_b_);
  const bool pointwise = is_pointwise(cs);
  if (!pointwise) col_.resize(size_t(CRS * PQ));
  for (int64_t n = 0; n < cs.n; ++n) {
    const float* cols = px + n * in_n;
    if (!pointwise) {
      im2col(cs, cols, col_.data(), threads_);
      cols = col_.data();
    }
    // dW[K, CRS] (+)= dy_n[K, PQ] col_n^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(K), int(CRS), int(PQ), 1.f,
                pdy + n * out_n, int(PQ), cols, int(PQ), n ? 1.f : 0.f, acc, int(CRS));
  }
  if (dw.dtype != DType::f32) from_f32(acc, dw.data, dw.dtype, K * CRS, threads_);
  if (db) {
    for (int64_t n = 0; n < cs.n; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float* row = pdy + n * out_n + k * PQ;
        float s = 0.f;
        for (int64_t i = 0; i < PQ; ++i) s += row[i];
        sum[size_t(k)] += s;
      }
    from_f32(sum.data(), db->data, db->dtype, K, 1);
  }
}

void CpuBackend::do_maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                      const Tensor& argmax) {
  const int64_t P = ps.p(), Q = ps.q(), planes = ps.n * ps.c;
  if (ps.x_layout != Layout::plain) return maxpool2d_forward_blocked(ps, x, y, argmax);
  auto* pa = argmax.as<int32_t>();
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* px = x.as<typename E::storage>();
    auto* py = y.as<typename E::storage>();
    // A candidate wins when larger, or when it is a nan and the best is not (a nan is not
    // hidden); the first of equal values wins.
    auto better = [](float v, float best) { return v > best || (v != v && best == best); };
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && planes > 1)
    for (int64_t pl = 0; pl < planes; ++pl) {
      const auto* in = px + pl * ps.h * ps.w;
      if (ps.kernel == 2 && ps.stride == 2) {  // the common window: the vectorised row kernel
        for (int64_t p = 0; p < P; ++p)
          maxpool2x2_row<E>(in + 2 * p * ps.w, ps.w, 2 * p * ps.w, Q, ps.relu_input,
                            py + pl * P * Q + p * Q, pa + pl * P * Q + p * Q);
        continue;
      }
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          int64_t best = p * ps.stride * ps.w + q * ps.stride;
          float bv = E::load(in[best]);
          for (int64_t i = 0; i < ps.kernel; ++i)
            for (int64_t j = 0; j < ps.kernel; ++j) {
              const int64_t at = (p * ps.stride + i) * ps.w + q * ps.stride + j;
              const float v = E::load(in[at]);
              if (better(v, bv)) {
                bv = v;
                best = at;
              }
            }
          const int64_t o = pl * P * Q + p * Q + q;
          py[o] = in[best];
          pa[o] = ps.relu_input && bv <= 0.f ? -1 : int32_t(best);
        }
    }
  });
}

void CpuBackend::do_maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                                       const Tensor& dx) {
  const int64_t PQ = ps.p() * ps.q(), HW = ps.h * ps.w, planes = ps.n * ps.c;
  if (ps.x_layout != Layout::plain) return maxpool2d_backward_blocked(ps, dy, argmax, dx);
  const auto* pa = argmax.as<int32_t>();
  dispatch_float(dy.dtype, [&](auto D) {
    using E = decltype(D);
    const auto* pd = dy.as<typename E::storage>();
    auto* px = dx.as<typename E::storage>();
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && planes > 1)
    {
      std::vector<float> acc(static_cast<size_t>(HW));
#pragma omp for
      for (int64_t pl = 0; pl < planes; ++pl) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t o = pl * PQ; o < (pl + 1) * PQ; ++o)
          if (pa[o] >= 0) acc[size_t(pa[o])] += E::load(pd[o]);
        for (int64_t i = 0; i < HW; ++i) px[pl * HW + i] = E::store(acc[size_t(i)]);
      }
    }
  });
}

void CpuBackend::do_avgpool_global_forward(const Tensor& x, const Tensor& y) {
  const int64_t planes = x.dim(0) * x.dim(1), HW = x.dim(2) * x.dim(3);
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(y.dtype, [&](auto Y) {
      using EY = decltype(Y);
      const auto* px = x.as<typename EX::storage>();
      auto* py = y.as<typename EY::storage>();
      for (int64_t pl = 0; pl < planes; ++pl) {
        float s = 0.f;
        for (int64_t i = 0; i < HW; ++i) s += EX::load(px[pl * HW + i]);
        py[pl] = EY::store(s / float(HW));
      }
    });
  });
}

void CpuBackend::do_avgpool_global_backward(const Tensor& dy, const Tensor& dx) {
  const int64_t planes = dx.dim(0) * dx.dim(1), HW = dx.dim(2) * dx.dim(3);
  dispatch_float(dy.dtype, [&](auto D) {
    using ED = decltype(D);
    dispatch_float(dx.dtype, [&](auto X) {
      using EX = decltype(X);
      const auto* pd = dy.as<typename ED::storage>();
      auto* px = dx.as<typename EX::storage>();
      for (int64_t pl = 0; pl < planes; ++pl) {
        const auto v = EX::store(ED::load(pd[pl]) / float(HW));
        std::fill(px + pl * HW, px + (pl + 1) * HW, v);
      }
    });
  });
}

RT_KERNEL_FAMILY(cpu, conv) {
  table.declare(op_name(Op::conv2d), kFloatDTypes);
  table.declare(op_name(Op::maxpool2d), kFloatDTypes);
  table.declare(op_name(Op::avgpool_global), kFloatDTypes);
}
}  // namespace ringtrain::kernels::cpu
