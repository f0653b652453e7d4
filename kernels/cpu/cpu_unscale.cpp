// The loss scaler's gradient pass on the CPU: unscale_check, the summed gradients times the
// unscale factor tested for inf/nan, and (unless the optimizer applies the factor as it
// reads them, Op::fused_unscale) the products written as the fp32 gradient. With AVX-512,
// 16 lanes of any float dtype at a time (vec512.hpp); elsewhere loops that vectorise.
#include <bit>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec512.hpp"

namespace ringtrain::kernels::cpu {
namespace {

// Whether any of in[lo, hi) (dtype T) times factor is inf or nan; kWrite: the products
// stored to out[lo, hi).
template <DType T, bool kWrite>
RT_AVX512_TARGET bool unscale_check_avx512(const void* in, float factor, float* out, int64_t lo,
                                           int64_t hi) {
  const __m512 f = _mm512_set1_ps(factor);
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = v512::tail_mask(i, hi);
    const __m512 v = _mm512_mul_ps(v512::load(in, T, i, m), f);
    // inf or nan: every exponent bit set
    bad |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_castps_si512(v), exponent),
                                        exponent);
    if constexpr (kWrite) _mm512_mask_storeu_ps(out + i, m, v);
  }
  return bad != 0;
}

template <bool kWrite>
bool unscale_check_avx512(const Tensor& in, float factor, float* out, int64_t lo, int64_t hi) {
  switch (in.dtype) {
    case DType::f32:
      return unscale_check_avx512<DType::f32, kWrite>(in.data, factor, out, lo, hi);
    case DType::bf16:
      return unscale_check_avx512<DType::bf16, kWrite>(in.data, factor, out, lo, hi);
    case DType::f16:
      return unscale_check_avx512<DType::f16, kWrite>(in.data, factor, out, lo, hi);
    default:
      RT_CHECK(false, "unscale_check of ", dtype_name(in.dtype));
  }
}

}  // namespace

bool CpuBackend::do_unscale_check(const Tensor& in, float factor, const Tensor& out) {
  const bool check_only = out.data == nullptr;  // the optimizer applies the factor
  const int64_t n = in.numel();
  float* po = check_only ? nullptr : out.as<float>();
  int bad = 0;
  if (use_avx512()) {
    parallel_chunks(n, threads_, [&](int64_t lo, int64_t hi) {
      if (po ? unscale_check_avx512<true>(in, factor, po, lo, hi)
             : unscale_check_avx512<false>(in, factor, nullptr, lo, hi)) {
#pragma omp atomic write
        bad = 1;
      }
    });
    return bad != 0;
  }
  // fp32 and bf16 (which widens by a shift) in loops that vectorise; the test of
  // std::isfinite on the bits: inf or nan has all exponent bits set.
  const auto scale_and_check = [&](auto load) {
    parallel_chunks(n, threads_, [&](int64_t lo, int64_t hi) {
      uint32_t any = 0;
      if (po) {
#pragma omp simd reduction(| : any)
        for (int64_t i = lo; i < hi; ++i) {
          const float v = load(i) * factor;
          any |= uint32_t((std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u);
          po[i] = v;
        }
      } else {
#pragma omp simd reduction(| : any)
        for (int64_t i = lo; i < hi; ++i)
          any |= uint32_t((std::bit_cast<uint32_t>(load(i) * factor) & 0x7f800000u) == 0x7f800000u);
      }
      if (any) {
#pragma omp atomic write
        bad = 1;
      }
    });
    return bad != 0;
  };
  if (in.dtype == DType::bf16) {
    const auto* pi = in.as<uint16_t>();
    return scale_and_check([pi](int64_t i) { return std::bit_cast<float>(uint32_t(pi[i]) << 16); });
  }
  if (in.dtype == DType::f32) {
    const float* pi = in.as<float>();
    return scale_and_check([pi](int64_t i) { return pi[i]; });
  }
  dispatch_float(in.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* pi = in.as<typename E::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin) reduction(| : bad)
    for (int64_t i = 0; i < n; ++i) {
      const float v = E::load(pi[i]) * factor;
      bad |= !std::isfinite(v);
      if (po) po[i] = v;
    }
  });
  return bad != 0;
}

// unscale_check into an fp32 tensor, and its read-only form (an empty `out`) whose factor the
// optimizers then apply: fused_unscale.
RT_KERNEL_FAMILY(cpu, unscale) {
  table.declare(op_name(Op::unscale_check), kFloatDTypes);
  table.declare(op_name(Op::fused_unscale), kFloatDTypes);
}
}  // namespace ringtrain::kernels::cpu
