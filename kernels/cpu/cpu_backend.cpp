// CPU backend: GEMM through oneDNN or OpenBLAS (fp32 accumulation, one rounding of the
// result; 16-bit inputs native where oneDNN has kernels, else widened to fp32), the backend's
// environment settings, elementwise and reduction kernels as OpenMP loops.
#include "kernels/cpu/cpu_backend.hpp"
#include "core/env.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/families.hpp"

namespace ringtrain::kernels {

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

std::string describe_cpu_gemm() {
  using namespace cpu;
  const CpuFeatures& f = host_features();
  const std::string core = openblas_core();
  GemmChoice choice;
  Bf16Setting setting = Bf16Setting::automatic;
  try {
    choice = choose_gemm_provider(f, core, gemm_setting_from_env());
    setting = bf16_setting_from_env();
  } catch (const Error& e) {  // --version still answers; a run stops at the backend instead
    return cat("cpu isa ", isa_name(f), ", OpenBLAS core ", core, "; ", e.what());
  }
  std::string s = cat("cpu isa ", isa_name(f), ", GEMM ");
  if (choice.provider == GemmProvider::onednn) {
    OneDnnMatmul mm;
    const bool native = choose_native16(f, setting);
    auto path = [&](DType t) -> std::string {
      if (!mm.supports(t, t)) return "widened (no oneDNN kernels)";
      if (native) return "native";
      return setting == Bf16Setting::widen ? "widened (RINGTRAIN_CPU_BF16=widen)"
                                           : "widened (auto: no AMX)";
    };
    s += cat(onednn_description(), " (", choice.reason, "), bf16 ", path(DType::bf16), ", fp16 ",
             path(DType::f16));
  } else {
    s += cat("OpenBLAS (", choice.reason, "), bf16 and fp16 widened");
  }
  return cat(s, ", OpenBLAS core ", core,
             openblas_core_is_weak(f, core) ? cat(" (below ", isa_level_name(isa_level(f)), ")")
                                            : std::string());
}

std::string blas_version() {
  std::string cfg = openblas_get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  return cfg;
}

namespace cpu {

// The CPU backend's environment settings, read when a backend is made (so a bad value is a
// setup error, exit 1, before any step):
//   RINGTRAIN_GEMM  auto (default) | onednn | openblas: the GEMM provider; auto chooses by
//                   the CPU's features (choose_gemm_provider in cpu_features.cpp)
//   RINGTRAIN_CONV  onednn (default) | im2col: oneDNN's convolutions, or im2col + the BLAS
//   RINGTRAIN_CPU_BF16  auto (default) | native | widen: 16-bit GEMMs and convolutions on
//                   the 16-bit inputs, or widened to fp32 (choose_native16)
CpuOptions CpuOptions::from_env() {
  CpuOptions o;
  const CpuFeatures& f = host_features();
  const std::string core = openblas_core();
  o.gemm = choose_gemm_provider(f, core, gemm_setting_from_env()).provider;
  o.native16 = choose_native16(f, bf16_setting_from_env());
  o.conv_onednn = env::conv() == "onednn";
  o.blocked_layout = isa_level(f) == IsaLevel::avx512;
  // Once per process: OpenBLAS will run GEMMs with kernels below what this CPU has.
  if ((o.gemm == GemmProvider::openblas || !o.conv_onednn) && openblas_core_is_weak(f, core)) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr,
                   "ringtrain: warning: OpenBLAS runs its %s kernels on a CPU with %s (isa %s): "
                   "its GEMMs run at a fraction of this CPU's speed; RINGTRAIN_GEMM=auto and "
                   "RINGTRAIN_CONV=onednn use oneDNN instead\n",
                   core.c_str(), isa_level_name(isa_level(f)), isa_name(f).c_str());
    });
  }
  return o;
}

void CpuBackend::set_threads(int n) {
  RT_REQUIRE(n >= 1, "--threads ", n, " is not valid; expected a positive number of threads");
  threads_ = n;
  openblas_set_num_threads(n);  // the BLAS uses the same thread count as our own loops
  omp_set_num_threads(n);
}

const float* CpuBackend::as_f32(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype == DType::f32) return t.as<float>();
  scratch.resize(size_t(t.numel()));
  to_f32(t.data, t.dtype, scratch.data(), t.numel(), threads_);
  return scratch.data();
}

OneDnnMatmul& CpuBackend::matmul() {
  if (!matmul_) matmul_ = std::make_unique<OneDnnMatmul>();
  return *matmul_;
}

bool CpuBackend::native(DType in) {
  return opts_.native16 && (in == DType::bf16 || in == DType::f16) && matmul().supports(in, in) &&
         matmul().supports(in, DType::f32);
}

DType CpuBackend::compute_dtype(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && native(a.dtype) ? a.dtype : DType::f32;
}

const void* CpuBackend::as_dtype(const Tensor& t, DType want, std::vector<float>& scratch) {
  if (t.dtype == want) return t.data;
  RT_CHECK(want == DType::f32, "no conversion of ", dtype_name(t.dtype), " to ", dtype_name(want));
  return as_f32(t, scratch);
}

void CpuBackend::do_gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                         float beta, const Tensor& c) {
  gemm_impl(trans_a, trans_b, alpha, a, b, beta, c, nullptr);
}

void CpuBackend::do_gemm_bias(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                              const Tensor& bias, const Tensor& c) {
  if (opts_.gemm != GemmProvider::onednn || bias.dtype != DType::f32)
    return Backend::do_gemm_bias(trans_a, trans_b, a, b, bias, c);
  gemm_impl(trans_a, trans_b, 1.f, a, b, 0.f, c, bias.as<float>());
}

void CpuBackend::gemm_impl(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                           const Tensor& b, float beta, const Tensor& c, const float* bias) {
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);  // shapes checked by Backend::gemm
  if (opts_.gemm == GemmProvider::onednn) {
    const DType in = compute_dtype(a, b);
    // The result straight into c when oneDNN writes c's dtype from these inputs (fp32 or the
    // inputs' own 16-bit dtype), else through an fp32 scratch rounded once afterwards.
    const bool direct = c.dtype == DType::f32 || (c.dtype == in && in != DType::f32);
    void* pc = c.data;
    if (!direct) {
      scratch_c_.resize(size_t(c.numel()));
      pc = scratch_c_.data();
      if (beta != 0.f) to_f32(c.data, c.dtype, scratch_c_.data(), c.numel(), threads_);
    }
    matmul().run(trans_a, trans_b, m, n, k, alpha, as_dtype(a, in, scratch_a_),
                 as_dtype(b, in, scratch_b_), in, beta, pc, direct ? c.dtype : DType::f32, bias);
    if (!direct) from_f32(scratch_c_.data(), c.data, c.dtype, c.numel(), threads_);
    return;
  }
  const float* pa = as_f32(a, scratch_a_);
  const float* pb = as_f32(b, scratch_b_);
  float* pc;
  if (c.dtype == DType::f32) {
    pc = c.as<float>();
  } else {
    scratch_c_.resize(size_t(c.numel()));
    pc = scratch_c_.data();
    if (beta != 0.f) to_f32(c.data, c.dtype, pc, c.numel(), threads_);
  }
  RT_CHECK(bias == nullptr, "gemm with a bias through the BLAS");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, pa, int(a.dim(1)),
              pb, int(b.dim(1)), beta, pc, int(n));
  if (c.dtype != DType::f32) from_f32(pc, c.data, c.dtype, c.numel(), threads_);
}

void CpuBackend::do_cast(const Tensor& src, const Tensor& dst) {
  if (src.dtype == dst.dtype) {
    std::copy_n(static_cast<const char*>(src.data), src.bytes(), static_cast<char*>(dst.data));
  } else if (src.dtype == DType::f32) {
    from_f32(src.as<float>(), dst.data, dst.dtype, src.numel(), threads_);
  } else if (dst.dtype == DType::f32) {
    to_f32(src.data, src.dtype, dst.as<float>(), src.numel(), threads_);
  } else {  // fp16 <-> bf16 through fp32
    std::vector<float> tmp(size_t(src.numel()));
    to_f32(src.data, src.dtype, tmp.data(), src.numel(), threads_);
    from_f32(tmp.data(), dst.data, dst.dtype, src.numel(), threads_);
  }
}

void CpuBackend::do_bias_add(const Tensor& y, const Tensor& bias, Activation act) {
  const int64_t rows = y.dim(0), f = y.numel() / rows;
  const float* pb = as_f32(bias, scratch_b_);
  const bool relu = act == Activation::relu;
  if (y.dtype != DType::f32) {  // 16-bit rows widened, added and rounded by the vector casts
#pragma omp parallel num_threads(threads_) if (y.numel() >= kParallelMin)
    {
      std::vector<float> row(static_cast<size_t>(f));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        char* py = static_cast<char*>(y.data) + r * f * int64_t(dtype_size(y.dtype));
        to_f32(py, y.dtype, row.data(), f, 1);
#pragma omp simd
        for (int64_t j = 0; j < f; ++j) {
          const float v = row[size_t(j)] + pb[j];
          row[size_t(j)] = relu && v < 0.f ? 0.f : v;  // nan stays nan
        }
        from_f32(row.data(), py, y.dtype, f, 1);
      }
    }
    return;
  }
  dispatch_float(y.dtype, [&](auto Y) {
    using E = decltype(Y);
    auto* py = y.as<typename E::storage>();
#pragma omp parallel for num_threads(threads_) if (y.numel() >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < f; ++j) {
        const float v = E::load(py[r * f + j]) + pb[j];
        py[r * f + j] = E::store(relu && v < 0.f ? 0.f : v);  // nan stays nan
      }
  });
}

void CpuBackend::do_bias_grad(const Tensor& dy, const Tensor& db) {
  const int64_t rows = dy.dim(0), f = dy.numel() / rows;
  std::vector<float> acc(static_cast<size_t>(f), 0.f);
  if (dy.dtype != DType::f32) {  // 16-bit rows widened by the vector casts, summed in order
    std::vector<float> row(static_cast<size_t>(f));
    for (int64_t r = 0; r < rows; ++r) {
      to_f32(static_cast<const char*>(dy.data) + r * f * int64_t(dtype_size(dy.dtype)), dy.dtype,
             row.data(), f, 1);
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) acc[size_t(j)] += row[size_t(j)];
    }
    from_f32(acc.data(), db.data, db.dtype, f, 1);
    return;
  }
  dispatch_float(dy.dtype, [&](auto Y) {
    using E = decltype(Y);
    const auto* p = dy.as<typename E::storage>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < f; ++j) acc[j] += E::load(p[r * f + j]);
  });
  from_f32(acc.data(), db.data, db.dtype, f, 1);
}

void CpuBackend::do_relu(const Tensor& x, const Tensor& y) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* px = x.as<typename E::storage>();
    auto* py = y.as<typename E::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      // nan stays nan, so a bad activation is not hidden from the non-finite check.
      float v = E::load(px[i]);
      py[i] = v > 0.f || std::isnan(v) ? px[i] : E::store(0.f);
    }
  });
}

void CpuBackend::do_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const int64_t n = y.numel();
  if (y.dtype == DType::f32 && dy.dtype == DType::f32) {  // the common case, vectorised
    const float* py = y.as<float>();
    const float* pd = dy.as<float>();
    float* px = dx.as<float>();
#pragma omp parallel for simd num_threads(threads_) if (threads_ > 1 && n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) px[i] = py[i] > 0.f ? pd[i] : 0.f;
    return;
  }
  if (y.dtype == dy.dtype && (y.dtype == DType::bf16 || y.dtype == DType::f16)) {
    // 16-bit, on the bit patterns (a loop that vectorises): y > 0 exactly when the pattern
    // is in [1, +inf] (sign clear, not zero, not nan).
    const uint16_t pos_inf = y.dtype == DType::bf16 ? 0x7f80u : 0x7c00u;
    const auto* py = y.as<uint16_t>();
    const auto* pd = dy.as<uint16_t>();
    auto* px = dx.as<uint16_t>();
    parallel_chunks(n, threads_, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const uint16_t keep = uint16_t(0) - uint16_t(uint16_t(py[i] - 1u) < pos_inf);  // all ones
        px[i] = pd[i] & keep;
      }
    });
    return;
  }
  dispatch_float(y.dtype, [&](auto Y) {
    using EY = decltype(Y);
    dispatch_float(dy.dtype, [&](auto D) {
      using ED = decltype(D);
      const auto* py = y.as<typename EY::storage>();
      const auto* pd = dy.as<typename ED::storage>();
      auto* px = dx.as<typename ED::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) px[i] = EY::load(py[i]) > 0.f ? pd[i] : ED::store(0.f);
    });
  });
}

XentResult CpuBackend::do_softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                                       const Tensor* dlogits, float label_smoothing) {
  const int64_t rows = logits.dim(0), c = logits.dim(1);
  const float* pl = logits.as<float>();
  const int32_t* py = labels.as<int32_t>();
  float* pd = dlogits ? dlogits->as<float>() : nullptr;
  const float g = grad_scale / float(rows);
  // The target is (1 - e) on the label plus e / C everywhere.
  const double e = label_smoothing, on = 1 - e, off = e / double(c);
  XentResult res;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = pl + r * c;
    const int32_t label = py[r];
    RT_CHECK(label >= 0 && label < c, "label ", label, " outside [0, ", c, ")");
    int64_t arg = 0;
    for (int64_t j = 1; j < c; ++j)
      if (x[j] > x[arg]) arg = j;
    const float mx = x[arg];
    double sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(double(x[j] - mx));
    const double lse = double(mx) + std::log(sum);
    double mean_term = 0;  // sum over j of x_j, only when smoothing
    if (e != 0)
      for (int64_t j = 0; j < c; ++j) mean_term += double(x[j]);
    res.loss_sum += lse - on * double(x[label]) - off * mean_term;
    res.correct += arg == label;
    if (pd) {
      for (int64_t j = 0; j < c; ++j) {
        const float p = float(std::exp(double(x[j]) - lse));
        pd[r * c + j] = (p - float((j == label ? on : 0.0) + off)) * g;
      }
    }
  }
  return res;
}

bool CpuBackend::do_any_nonfinite(const Tensor& x) {
  const int64_t n = x.numel();
  int bad = 0;
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* p = x.as<typename E::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin) reduction(| : bad)
    for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(E::load(p[i]));
  });
  return bad != 0;
}

double CpuBackend::do_sum_squares(const Tensor& x) {
  const float* p = x.as<float>();
  const int64_t n = x.numel();
  // Fixed chunks summed in a fixed order: the same result for any thread count, so ranks
  // that clip by the global norm stay bitwise identical.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) s += double(p[i]) * p[i];
    part[size_t(c)] = s;
  }
  double s = 0;
  for (double v : part) s += v;
  return s;
}

void CpuBackend::do_scale(const Tensor& x, float factor) {
  float* p = x.as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] *= factor;
}

RT_KERNEL_FAMILY(cpu, core) {
  table.declare(op_name(Op::gemm), kFloatDTypes);
  table.declare(op_name(Op::cast), kFloatDTypes);
  table.declare(op_name(Op::bias_add), kFloatDTypes);
  table.declare(op_name(Op::bias_grad), kFloatDTypes);
  table.declare(op_name(Op::relu), kFloatDTypes);
  table.declare(op_name(Op::relu_backward), kFloatDTypes);
  table.declare(op_name(Op::softmax_xent), {DType::f32});
  table.declare(op_name(Op::any_nonfinite), kFloatDTypes);
  table.declare(op_name(Op::sum_squares), {DType::f32});
  table.declare(op_name(Op::scale), {DType::f32});
}

#define RT_DECLARE_FAMILY(f) RT_KERNEL_FAMILY(cpu, f);
RT_CPU_KERNEL_FAMILIES(RT_DECLARE_FAMILY)
#undef RT_DECLARE_FAMILY

const KernelTable& CpuBackend::kernel_table() const {
  static const KernelTable table = [] {
    KernelTable t;
#define RT_REGISTER_FAMILY(f) rt_kernel_family_cpu_##f(t);
    RT_CPU_KERNEL_FAMILIES(RT_REGISTER_FAMILY)
#undef RT_REGISTER_FAMILY
    return t;
  }();
  return table;
}
}  // namespace cpu
}  // namespace ringtrain::kernels
