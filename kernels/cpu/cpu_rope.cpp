// CPU rotary pack of grouped-query attention (kernels.hpp: rope_pack): per token row, the query
// heads rotated, the key heads rotated and repeated for the query heads that share them, the
// value heads repeated, into the [B, T, 3 H d] input of the attention kernels; and its backward
// (the shared heads' gradients summed in head order). Rows are independent: one row per
// iteration over the threads, each output element written once (deterministic). 16-bit rows
// are widened to fp32 once and rounded once.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

// cos and sin of position t's angles t * theta^(-2i/d), i < d/2, computed in double.
struct RopeTable {
  int64_t half = 0;
  std::vector<float> cos, sin;  // [T, half]
  RopeTable(const RopeConfig& cfg, int64_t t) : half(cfg.head_dim / 2) {
    if (cfg.theta == 0) return;
    cos.resize(size_t(t * half));
    sin.resize(size_t(t * half));
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::pow(cfg.theta, -2.0 * double(i) / double(cfg.head_dim));
      for (int64_t p = 0; p < t; ++p) {
        cos[size_t(p * half + i)] = float(std::cos(double(p) * f));
        sin[size_t(p * half + i)] = float(std::sin(double(p) * f));
      }
    }
  }
};

// y = x rotated by the angles (c, s) (sign +1) or back (sign -1): HF's rotate_half pairing.
RT_INLINE void rotate_body(const float* x, const float* c, const float* s, int64_t half, float sign,
                           float* y) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half], sn = sign * s[i];
    y[i] = a * c[i] - b * sn;
    y[i + half] = b * c[i] + a * sn;
  }
}
void rotate_base(const float* x, const float* c, const float* s, int64_t half, float sign,
                 float* y) {
  rotate_body(x, c, s, half, sign, y);
}
RT_AVX512_TARGET void rotate_avx512(const float* x, const float* c, const float* s, int64_t half,
                                    float sign, float* y) {
  rotate_body(x, c, s, half, sign, y);
}

// y (+)= x over n elements.
RT_INLINE void accumulate_body(const float* x, int64_t n, bool add, float* y) {
  if (!add) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// Row r (of `width` elements) of t, widened to fp32 into buf; and back.
void load_row(const Tensor& t, int64_t r, int64_t width, float* buf) {
  to_f32(static_cast<const char*>(t.data) + r * width * int64_t(dtype_size(t.dtype)), t.dtype, buf,
         width, 1);
}
void store_row(const float* buf, const Tensor& t, int64_t r, int64_t width) {
  from_f32(buf, static_cast<char*>(t.data) + r * width * int64_t(dtype_size(t.dtype)), t.dtype,
           width, 1);
}

}  // namespace

void CpuBackend::do_rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& qkv) {
  const RopeDims dims = rope_dims(cfg, q, k, v, qkv);
  const int64_t d = cfg.head_dim, h = cfg.heads, kvh = cfg.kv_heads, group = h / kvh;
  const int64_t c = h * d, kvc = kvh * d, rows = dims.b * dims.t;
  const RopeTable tab(cfg, dims.t);
  const bool rotate = cfg.theta != 0;
  const auto rot = use_avx512() ? rotate_avx512 : rotate_base;
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && rows * 3 * c >= kParallelMin)
  {
    std::vector<float> qb(static_cast<size_t>(c)), kb(static_cast<size_t>(kvc)),
        vb(static_cast<size_t>(kvc)), ob(static_cast<size_t>(3 * c));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      load_row(q, r, c, qb.data());
      load_row(k, r, kvc, kb.data());
      load_row(v, r, kvc, vb.data());
      const int64_t p = r % dims.t;
      const float* cs = rotate ? tab.cos.data() + p * tab.half : nullptr;
      const float* sn = rotate ? tab.sin.data() + p * tab.half : nullptr;
      if (rotate) {
        for (int64_t i = 0; i < h; ++i)
          rot(qb.data() + i * d, cs, sn, tab.half, 1.f, ob.data() + i * d);
        for (int64_t g = 0; g < kvh; ++g)
          rot(kb.data() + g * d, cs, sn, tab.half, 1.f, kb.data() + g * d);
      } else {
        accumulate_body(qb.data(), c, false, ob.data());
      }
      for (int64_t i = 0; i < h; ++i) {
        accumulate_body(kb.data() + i / group * d, d, false, ob.data() + c + i * d);
        accumulate_body(vb.data() + i / group * d, d, false, ob.data() + 2 * c + i * d);
      }
      store_row(ob.data(), qkv, r, 3 * c);
    }
  }
}

void CpuBackend::do_rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                                       const Tensor& dk, const Tensor& dv) {
  const RopeDims dims = rope_dims(cfg, dq, dk, dv, dqkv);
  const int64_t d = cfg.head_dim, h = cfg.heads, kvh = cfg.kv_heads, group = h / kvh;
  const int64_t c = h * d, kvc = kvh * d, rows = dims.b * dims.t;
  const RopeTable tab(cfg, dims.t);
  const bool rotate = cfg.theta != 0;
  const auto rot = use_avx512() ? rotate_avx512 : rotate_base;
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && rows * 3 * c >= kParallelMin)
  {
    std::vector<float> gb(static_cast<size_t>(3 * c)), qb(static_cast<size_t>(c)),
        kb(static_cast<size_t>(kvc)), vb(static_cast<size_t>(kvc));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      load_row(dqkv, r, 3 * c, gb.data());
      // the shared heads' gradients summed (in head order), then rotated back once: linear
      for (int64_t i = 0; i < h; ++i) {
        accumulate_body(gb.data() + c + i * d, d, i % group != 0, kb.data() + i / group * d);
        accumulate_body(gb.data() + 2 * c + i * d, d, i % group != 0, vb.data() + i / group * d);
      }
      const int64_t p = r % dims.t;
      if (rotate) {
        const float* cs = tab.cos.data() + p * tab.half;
        const float* sn = tab.sin.data() + p * tab.half;
        for (int64_t i = 0; i < h; ++i)
          rot(gb.data() + i * d, cs, sn, tab.half, -1.f, qb.data() + i * d);
        for (int64_t g = 0; g < kvh; ++g)
          rot(kb.data() + g * d, cs, sn, tab.half, -1.f, kb.data() + g * d);
      } else {
        accumulate_body(gb.data(), c, false, qb.data());
      }
      store_row(qb.data(), dq, r, c);
      store_row(kb.data(), dk, r, kvc);
      store_row(vb.data(), dv, r, kvc);
    }
  }
}

RT_KERNEL_FAMILY(cpu, rope) { table.declare(op_name(Op::rope), kFloatDTypes); }
}  // namespace ringtrain::kernels::cpu
