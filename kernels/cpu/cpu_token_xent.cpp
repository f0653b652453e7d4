// CPU token-level softmax cross-entropy over [B*T, V] fp32 logits, fused with the logits
// gradient (llm.c's fused classifier: the gradient may overwrite the logits, so the largest
// activation of a language model exists once). Rows in parallel; the loss is summed over rows
// in order in double, so it does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

// One row over its first v columns: returns the log-sum-exp; *arg = the first argmax.
RT_INLINE float row_lse_body(const float* x, int64_t v, int64_t* arg) {
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < v; ++j) mx = std::max(mx, x[j]);
  int64_t a = 0;
  while (x[a] != mx && a + 1 < v) ++a;
  *arg = a;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < v; ++j) sum += exp_fast(x[j] - mx);
  return mx + std::log(sum);
}

// d[j] = (softmax_j - onehot_j) * g over v columns, zero over the padding up to vp; d may be x.
RT_INLINE void row_grad_body(const float* x, int64_t v, int64_t vp, float lse, int32_t target,
                             float g, float* d) {
#pragma omp simd
  for (int64_t j = 0; j < v; ++j) d[j] = exp_fast(x[j] - lse) * g;
  d[target] -= g;
  for (int64_t j = v; j < vp; ++j) d[j] = 0.f;
}

float row_lse_base(const float* x, int64_t v, int64_t* arg) { return row_lse_body(x, v, arg); }
RT_AVX512_TARGET float row_lse_avx512(const float* x, int64_t v, int64_t* arg) {
  return row_lse_body(x, v, arg);
}
void row_grad_base(const float* x, int64_t v, int64_t vp, float lse, int32_t t, float g, float* d) {
  row_grad_body(x, v, vp, lse, t, g, d);
}
RT_AVX512_TARGET void row_grad_avx512(const float* x, int64_t v, int64_t vp, float lse, int32_t t,
                                      float g, float* d) {
  row_grad_body(x, v, vp, lse, t, g, d);
}

}  // namespace

XentResult CpuBackend::do_token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                     float grad_scale, const Tensor* dlogits) {
  const int64_t vp = logits.shape.back(), rows = logits.numel() / (vp ? vp : 1);
  const int32_t* tg = targets.as<int32_t>();
  for (int64_t r = 0; r < rows; ++r)
    RT_CHECK(tg[r] >= 0 && tg[r] < vocab, "target ", tg[r], " at row ", r,
             " is outside the vocabulary [0, ", vocab, ")");
  const float* pl = logits.as<float>();
  float* pd = dlogits ? dlogits->as<float>() : nullptr;
  const float g = grad_scale / float(rows);
  const bool avx512 = use_avx512();
  std::vector<double> loss(static_cast<size_t>(rows));
  std::vector<uint8_t> hit(static_cast<size_t>(rows));
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = pl + r * vp;
    int64_t arg = 0;
    const float lse = avx512 ? row_lse_avx512(x, vocab, &arg) : row_lse_base(x, vocab, &arg);
    loss[size_t(r)] = double(lse) - double(x[tg[r]]);
    hit[size_t(r)] = arg == tg[r];
    if (pd) {
      if (avx512)
        row_grad_avx512(x, vocab, vp, lse, tg[r], g, pd + r * vp);
      else
        row_grad_base(x, vocab, vp, lse, tg[r], g, pd + r * vp);
    }
  }
  XentResult res;
  for (int64_t r = 0; r < rows; ++r) {
    res.loss_sum += loss[size_t(r)];
    res.correct += hit[size_t(r)];
  }
  return res;
}

RT_KERNEL_FAMILY(cpu, token_xent) { table.declare(op_name(Op::token_xent), {DType::f32}); }
}  // namespace ringtrain::kernels::cpu
