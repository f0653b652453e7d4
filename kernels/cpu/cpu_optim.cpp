// Fused optimizer steps of the CPU backend over the flat fp32 master buffer: one pass over
// cache-sized chunks updates the parameters and the optimizer state (a loop the compiler
// vectorises: restrict pointers, no branches), then writes the chunk's compute-dtype
// working copy while it is still in cache. Semantics follow PyTorch's SGD (dampening 0)
// and AdamW (decoupled weight decay).
// The gradient is read in its own dtype (the allreduce's: fp32, bf16 or fp16) and multiplied
// by cfg.grad_scale as it is read, so the loss scaler's unscale costs no pass of its own.
// Each loop is compiled for baseline x86-64 and for AVX-512, chosen at run time; the AVX-512
// copy is built without FMA contraction, so both give the same bits (baseline x86-64 has no
// FMA): each operation is one correctly rounded IEEE operation, in the source's order.
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {
namespace {

#define RT_OPTIM_AVX512 RT_AVX512_TARGET __attribute__((optimize("fp-contract=off")))

constexpr int64_t kChunk = 1 << 12;  // 16 KiB of each fp32 stream: the working set fits L1/L2

// Runs body(lo, hi) over chunks (in parallel when large), then casts the chunk into the
// working copy.
template <typename Body>
void over_chunks(int64_t n, int threads, const float* p, const Tensor* work, Body body) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    body(lo, hi);
    if (work) {
      char* w = static_cast<char*>(work->data) + lo * int64_t(dtype_size(work->dtype));
      from_f32(p + lo, w, work->dtype, hi - lo, 1);
    }
  }
}

struct SgdArgs {
  float* p;
  const void* g;
  float* m;  // null: no momentum
  float lr, mu, wd, gs;
  bool nesterov;
};

template <DType G>
RT_INLINE void sgd_body(const SgdArgs& a, int64_t lo, int64_t hi) {
  using E = Elem<G>;
  float* __restrict p = a.p;
  const auto* __restrict g = static_cast<const typename E::storage*>(a.g);
  float* __restrict m = a.m;
  const float lr = a.lr, mu = a.mu, wd = a.wd, gs = a.gs;
  if (!m) {
    for (int64_t i = lo; i < hi; ++i) p[i] -= lr * (E::load(g[i]) * gs + wd * p[i]);
  } else if (a.nesterov) {
    for (int64_t i = lo; i < hi; ++i) {
      const float d = E::load(g[i]) * gs + wd * p[i];
      m[i] = mu * m[i] + d;
      p[i] -= lr * (d + mu * m[i]);
    }
  } else {
    for (int64_t i = lo; i < hi; ++i) {
      m[i] = mu * m[i] + (E::load(g[i]) * gs + wd * p[i]);
      p[i] -= lr * m[i];
    }
  }
}

template <DType G>
void sgd_base(const SgdArgs& a, int64_t lo, int64_t hi) {
  sgd_body<G>(a, lo, hi);
}
template <DType G>
RT_OPTIM_AVX512 void sgd_avx512(const SgdArgs& a, int64_t lo, int64_t hi) {
  sgd_body<G>(a, lo, hi);
}

struct AdamWArgs {
  float* p;
  const void* g;
  float *m, *v;
  float b1, b2, eps, step_size, bc2_sqrt, decay, gs;
};

template <DType G>
RT_INLINE void adamw_body(const AdamWArgs& a, int64_t lo, int64_t hi) {
  using E = Elem<G>;
  float* __restrict p = a.p;
  const auto* __restrict g = static_cast<const typename E::storage*>(a.g);
  float* __restrict m = a.m;
  float* __restrict v = a.v;
  const float b1 = a.b1, b2 = a.b2, eps = a.eps, step_size = a.step_size;
  const float bc2_sqrt = a.bc2_sqrt, decay = a.decay, gs = a.gs;
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = E::load(g[i]) * gs;
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

template <DType G>
void adamw_base(const AdamWArgs& a, int64_t lo, int64_t hi) {
  adamw_body<G>(a, lo, hi);
}
template <DType G>
RT_OPTIM_AVX512 void adamw_avx512(const AdamWArgs& a, int64_t lo, int64_t hi) {
  adamw_body<G>(a, lo, hi);
}

// The step over [0, n) with the loop for the gradient's dtype G and this CPU.
template <DType G, template <DType> class Loop, typename Args>
void run_loop(const Args& args, int64_t n, int threads, const Tensor* work) {
  const bool avx512 = use_avx512();
  over_chunks(n, threads, args.p, work, [&](int64_t lo, int64_t hi) {
    if (avx512)
      Loop<G>::avx512(args, lo, hi);
    else
      Loop<G>::base(args, lo, hi);
  });
}
template <template <DType> class Loop, typename Args>
void run_step(const Args& args, DType grad, int64_t n, int threads, const Tensor* work) {
  switch (grad) {
    case DType::f32:
      return run_loop<DType::f32, Loop>(args, n, threads, work);
    case DType::bf16:
      return run_loop<DType::bf16, Loop>(args, n, threads, work);
    case DType::f16:
      return run_loop<DType::f16, Loop>(args, n, threads, work);
    default:
      RT_CHECK(false, "optimizer step on a ", dtype_name(grad), " gradient");
  }
}

template <DType G>
struct SgdLoop {
  static void base(const SgdArgs& a, int64_t lo, int64_t hi) { sgd_base<G>(a, lo, hi); }
  static void avx512(const SgdArgs& a, int64_t lo, int64_t hi) { sgd_avx512<G>(a, lo, hi); }
};
template <DType G>
struct AdamWLoop {
  static void base(const AdamWArgs& a, int64_t lo, int64_t hi) { adamw_base<G>(a, lo, hi); }
  static void avx512(const AdamWArgs& a, int64_t lo, int64_t hi) { adamw_avx512<G>(a, lo, hi); }
};

}  // namespace

void CpuBackend::do_sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                             const Tensor* momentum, const Tensor* work) {
  const int64_t n = param.numel();
  const SgdArgs args{param.as<float>(),
                     grad.data,
                     momentum ? momentum->as<float>() : nullptr,
                     cfg.lr,
                     cfg.momentum,
                     cfg.weight_decay,
                     cfg.grad_scale,
                     cfg.nesterov};
  run_step<SgdLoop>(args, grad.dtype, n, threads_, work);
}

void CpuBackend::do_adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                               const Tensor& exp_avg, const Tensor& exp_avg_sq,
                               const Tensor* work) {
  const int64_t n = param.numel();
  const float b1 = cfg.beta1, b2 = cfg.beta2;
  const float bc1 = 1.f - float(std::pow(double(b1), double(cfg.step)));
  const float bc2 = 1.f - float(std::pow(double(b2), double(cfg.step)));
  const AdamWArgs args{param.as<float>(),
                       grad.data,
                       exp_avg.as<float>(),
                       exp_avg_sq.as<float>(),
                       b1,
                       b2,
                       cfg.eps,
                       cfg.lr / bc1,
                       std::sqrt(bc2),
                       1.f - cfg.lr * cfg.weight_decay,
                       cfg.grad_scale};
  run_step<AdamWLoop>(args, grad.dtype, n, threads_, work);
}

RT_KERNEL_FAMILY(cpu, optim) {
  table.declare(op_name(Op::sgd_step), {DType::f32});
  table.declare(op_name(Op::adamw_step), {DType::f32});
}
}  // namespace ringtrain::kernels::cpu
