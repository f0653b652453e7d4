// Unit tests of the CPU backend's GEMM provider and native 16-bit paths:
//  - the provider choice as a pure function (made-up CPUs and OpenBLAS cores in, provider
//    out), RINGTRAIN_GEMM parsing, and cpuid detection against the compiler's own;
//  - oneDNN's fp32 GEMM against OpenBLAS's, and native bf16 GEMMs and convolutions against
//    the widening path (the reference) on every GEMM and convolution shape of the shipped
//    models (mlp 784-512-256-10, cnn, resnet with its default width 16);
//  - the widening path's conversions inside oneDNN's reorders against widening first, and the
//    combined convolution backward against the two separate passes, bit for bit;
//  - the native fp32 -> bf16 conversion (VCVTNE2PS2BF16) and the kernels' bf16 store against
//    the scalar code, bit for bit,
//    and the 16-bit ReLU gradient and bf16 unscale on bit patterns against their definitions.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/elem.hpp"
#include "layer_test_util.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using kernels::ConvShape;
using kernels::cpu::CpuBackend;
using kernels::cpu::CpuFeatures;
using kernels::cpu::CpuOptions;
using kernels::cpu::GemmProvider;
using kernels::cpu::GemmSetting;
using test::copy_of;
using test::rel_err;
using test::throws_kind;

// ---- the provider choice ----------------------------------------------------------------

CpuFeatures sse_cpu() { return {}; }
CpuFeatures avx_cpu() {
  CpuFeatures f;
  f.avx = f.f16c = true;
  return f;
}
CpuFeatures avx2_cpu() {
  CpuFeatures f = avx_cpu();
  f.avx2 = f.fma = true;
  return f;
}
// The CPU of issue 18: AVX-512 with BF16 and FP16, no AMX.
CpuFeatures avx512_fp16_cpu() {
  CpuFeatures f = avx2_cpu();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512_bf16 = f.avx512_fp16 = true;
  return f;
}

using kernels::cpu::choose_gemm_provider;

TEST(GemmChoice, PrescottOpenBlasOnAvx512CpuChoosesOneDnn) {
  const auto c = choose_gemm_provider(avx512_fp16_cpu(), "Prescott", GemmSetting::automatic);
  EXPECT_EQ(c.provider, GemmProvider::onednn);
  EXPECT_NE(c.reason.find("Prescott"), std::string::npos) << c.reason;
  EXPECT_TRUE(kernels::cpu::openblas_core_is_weak(avx512_fp16_cpu(), "Prescott"));
}

TEST(GemmChoice, NoAvx2ChoosesOpenBlas) {
  for (const char* core : {"Prescott", "Sandybridge", "Nehalem"}) {
    EXPECT_EQ(choose_gemm_provider(sse_cpu(), core, GemmSetting::automatic).provider,
              GemmProvider::openblas)
        << core;
    EXPECT_EQ(choose_gemm_provider(avx_cpu(), core, GemmSetting::automatic).provider,
              GemmProvider::openblas)
        << core;
  }
  // AVX2 without FMA is not the avx2 level either (no CPU ships it, but a hypervisor may).
  CpuFeatures f = avx2_cpu();
  f.fma = false;
  EXPECT_EQ(choose_gemm_provider(f, "Sandybridge", GemmSetting::automatic).provider,
            GemmProvider::openblas);
}

TEST(GemmChoice, Avx2OrBetterChoosesOneDnnWhateverTheCore) {
  EXPECT_EQ(choose_gemm_provider(avx2_cpu(), "Haswell", GemmSetting::automatic).provider,
            GemmProvider::onednn);
  EXPECT_EQ(choose_gemm_provider(avx512_fp16_cpu(), "SkylakeX", GemmSetting::automatic).provider,
            GemmProvider::onednn);
  EXPECT_EQ(choose_gemm_provider(avx2_cpu(), "Core2", GemmSetting::automatic).provider,
            GemmProvider::onednn);
}

TEST(GemmChoice, SettingOverridesFeatures) {
  EXPECT_EQ(choose_gemm_provider(avx512_fp16_cpu(), "Prescott", GemmSetting::openblas).provider,
            GemmProvider::openblas);
  EXPECT_EQ(choose_gemm_provider(sse_cpu(), "Prescott", GemmSetting::onednn).provider,
            GemmProvider::onednn);
}

TEST(GemmChoice, OpenBlasCoreLevels) {
  using kernels::cpu::IsaLevel;
  using kernels::cpu::openblas_core_is_weak;
  using kernels::cpu::openblas_core_level;
  EXPECT_EQ(openblas_core_level("Prescott"), IsaLevel::sse);
  EXPECT_EQ(openblas_core_level("Sandybridge"), IsaLevel::avx);
  EXPECT_EQ(openblas_core_level("Haswell"), IsaLevel::avx2);
  EXPECT_EQ(openblas_core_level("Zen"), IsaLevel::avx2);
  EXPECT_EQ(openblas_core_level("SkylakeX"), IsaLevel::avx512);
  EXPECT_EQ(openblas_core_level("SKYLAKEX"), IsaLevel::avx512);  // case does not matter
  EXPECT_EQ(openblas_core_level("SapphireRapids"), IsaLevel::avx512);
  EXPECT_EQ(openblas_core_level("a core of 2030"), IsaLevel::sse);  // unknown: weakest
  EXPECT_FALSE(openblas_core_is_weak(avx2_cpu(), "Haswell"));
  EXPECT_TRUE(openblas_core_is_weak(avx512_fp16_cpu(), "Haswell"));
  EXPECT_FALSE(openblas_core_is_weak(avx512_fp16_cpu(), "SkylakeX"));
  EXPECT_FALSE(openblas_core_is_weak(sse_cpu(), "Prescott"));
}

TEST(GemmChoice, IsaNames) {
  using kernels::cpu::isa_name;
  EXPECT_EQ(isa_name(sse_cpu()), "sse41");
  EXPECT_EQ(isa_name(avx_cpu()), "avx");
  EXPECT_EQ(isa_name(avx2_cpu()), "avx2");
  EXPECT_EQ(isa_name(avx512_fp16_cpu()), "avx512_core_fp16");
  CpuFeatures f = avx512_fp16_cpu();
  f.avx512_fp16 = false;
  EXPECT_EQ(isa_name(f), "avx512_core_bf16");
  f.avx512_bf16 = false;
  EXPECT_EQ(isa_name(f), "avx512_core");
  f.amx_tile = f.amx_bf16 = true;
  EXPECT_EQ(isa_name(f), "avx512_core_amx");
  f = avx512_fp16_cpu();
  f.avx512bw = false;  // AVX-512F alone is not oneDNN's avx512_core
  EXPECT_EQ(isa_name(f), "avx2");
}

TEST(GemmChoice, ParsesTheSetting) {
  using kernels::cpu::parse_gemm_setting;
  EXPECT_EQ(parse_gemm_setting(nullptr), GemmSetting::automatic);
  EXPECT_EQ(parse_gemm_setting(""), GemmSetting::automatic);
  EXPECT_EQ(parse_gemm_setting("auto"), GemmSetting::automatic);
  EXPECT_EQ(parse_gemm_setting("onednn"), GemmSetting::onednn);
  EXPECT_EQ(parse_gemm_setting("openblas"), GemmSetting::openblas);
  EXPECT_TRUE(throws_kind([] { parse_gemm_setting("mkl"); }, ErrorKind::input));
  try {
    parse_gemm_setting("OneDNN");
    FAIL() << "no error for 'OneDNN'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RINGTRAIN_GEMM='OneDNN'"), std::string::npos) << e.what();
  }
}

TEST(Native16Choice, OnlyAmxMakesBf16NativeByDefault) {
  using kernels::cpu::Bf16Setting;
  using kernels::cpu::choose_native16;
  EXPECT_FALSE(choose_native16(avx512_fp16_cpu(), Bf16Setting::automatic));  // AVX512-BF16 alone
  EXPECT_FALSE(choose_native16(avx2_cpu(), Bf16Setting::automatic));
  CpuFeatures amx = avx512_fp16_cpu();
  amx.amx_tile = amx.amx_bf16 = true;
  EXPECT_TRUE(choose_native16(amx, Bf16Setting::automatic));
  EXPECT_TRUE(choose_native16(avx512_fp16_cpu(), Bf16Setting::native));
  EXPECT_FALSE(choose_native16(amx, Bf16Setting::widen));
  using kernels::cpu::parse_bf16_setting;
  EXPECT_EQ(parse_bf16_setting(nullptr), Bf16Setting::automatic);
  EXPECT_EQ(parse_bf16_setting("native"), Bf16Setting::native);
  EXPECT_EQ(parse_bf16_setting("widen"), Bf16Setting::widen);
  EXPECT_TRUE(throws_kind([] { parse_bf16_setting("fast"); }, ErrorKind::input));
}

TEST(CpuFeaturesDetect, AgreesWithTheCompiler) {
  const CpuFeatures f = kernels::cpu::detect_cpu_features();
  EXPECT_EQ(f.avx2, bool(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.fma, bool(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.avx512f, bool(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw, bool(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(f.avx512vl, bool(__builtin_cpu_supports("avx512vl")));
  EXPECT_EQ(f.avx512_bf16, bool(__builtin_cpu_supports("avx512bf16")));
  EXPECT_EQ(f.avx512_fp16, bool(__builtin_cpu_supports("avx512fp16")));
  EXPECT_EQ(f.amx_tile && f.amx_bf16, f.amx_tile && bool(__builtin_cpu_supports("amx-bf16")));
}

// ---- native 16-bit against the widening path --------------------------------------------

CpuBackend backend(GemmProvider gemm, bool native16) {
  CpuOptions o;
  o.gemm = gemm;
  o.conv_onednn = true;
  o.native16 = native16;
  return CpuBackend(1, o);
}

// Values of dtype t (uniform in [-1, 1)), and the same values as fp32.
struct Values {
  std::vector<uint16_t> h;
  std::vector<float> f;
  Values(size_t n, DType t, uint32_t seed) : f(test::uniform_floats(n, -1.f, 1.f, seed)) {
    for (float& v : f) {
      h.push_back(t == DType::bf16 ? float_to_bf16(v) : float_to_half(v));
      v = t == DType::bf16 ? bf16_to_float(h.back()) : half_to_float(h.back());
    }
  }
  Tensor tensor(Shape s, DType t) { return Tensor(h.data(), std::move(s), t); }
};

// Native 16-bit results differ from the widened ones only in the order of the fp32 sums and
// so in the last bit of a rounding: fp32 results within 1e-4 of the largest magnitude (sums
// of up to 9,216 products), 16-bit results within one unit of their format's last place
// (bf16: 2^-7 relative) of the largest magnitude.
double tolerance(DType out) { return out == DType::f32 ? 1e-4 : 1.0 / 128; }

struct Linear {
  const char* model;
  int64_t in, out;
};
// Every Linear of the shipped models: mlp 784-512-256-10, cnn's fc1/fc2 (Fashion-MNIST),
// resnet's fc (width 16: 64 features).
const std::vector<Linear> kLinears = {{"mlp.fc1", 784, 512}, {"mlp.fc2", 512, 256},
                                      {"mlp.fc3", 256, 10},  {"cnn.fc1", 9216, 128},
                                      {"cnn.fc2", 128, 10},  {"resnet.fc", 64, 10}};
constexpr int64_t kBatch = 64;

class NativeGemm : public ::testing::TestWithParam<DType> {};

TEST_P(NativeGemm, MatchesWideningOnEveryModelShape) {
  const DType out = GetParam();
  auto native = backend(GemmProvider::onednn, true);
  auto widen = backend(GemmProvider::onednn, false);
  if (!kernels::cpu::host_features().avx512_bf16)
    GTEST_SKIP() << "this CPU has no AVX512-BF16: bf16 GEMMs take the widening path only";
  ASSERT_TRUE(native.native(DType::bf16)) << "oneDNN has no native bf16 GEMM on an AVX512-BF16 CPU";
  ASSERT_FALSE(widen.native(DType::bf16));
  const DType bf = DType::bf16;
  for (const auto& l : kLinears) {
    SCOPED_TRACE(l.model);
    Values x(size_t(kBatch * l.in), bf, 1), w(size_t(l.out * l.in), bf, 2),
        dy(size_t(kBatch * l.out), bf, 3);
    struct Call {
      const char* name;
      bool ta, tb;
      Tensor a, b;
      Shape c;
    };
    const std::vector<Call> calls = {{"forward y = x W^T",
                                      false,
                                      true,
                                      x.tensor({kBatch, l.in}, bf),
                                      w.tensor({l.out, l.in}, bf),
                                      {kBatch, l.out}},
                                     {"dW = dy^T x",
                                      true,
                                      false,
                                      dy.tensor({kBatch, l.out}, bf),
                                      x.tensor({kBatch, l.in}, bf),
                                      {l.out, l.in}},
                                     {"dx = dy W",
                                      false,
                                      false,
                                      dy.tensor({kBatch, l.out}, bf),
                                      w.tensor({l.out, l.in}, bf),
                                      {kBatch, l.in}}};
    for (const auto& c : calls) {
      SCOPED_TRACE(c.name);
      const size_t n = size_t(c.c[0] * c.c[1]);
      std::vector<uint16_t> got16(n), want16(n);
      std::vector<float> got32(n), want32(n);
      const bool f32 = out == DType::f32;
      const Tensor got(f32 ? static_cast<void*>(got32.data()) : got16.data(), c.c, out);
      const Tensor want(f32 ? static_cast<void*>(want32.data()) : want16.data(), c.c, out);
      native.gemm(c.ta, c.tb, 1.f, c.a, c.b, 0.f, got);
      widen.gemm(c.ta, c.tb, 1.f, c.a, c.b, 0.f, want);
      EXPECT_LE(rel_err(copy_of(got), copy_of(want)), tolerance(out));
      // Not vacuous: the results are not all zero.
      double mx = 0;
      for (float v : copy_of(want)) mx = std::max(mx, std::fabs(double(v)));
      EXPECT_GT(mx, 0.1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OutputDtype, NativeGemm, ::testing::Values(DType::bf16, DType::f32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(OneDnnGemm, Fp32MatchesOpenBlasOnEveryModelShape) {
  auto dnn = backend(GemmProvider::onednn, true);
  auto blas = backend(GemmProvider::openblas, true);
  for (const auto& l : kLinears) {
    SCOPED_TRACE(l.model);
    auto x = test::uniform_floats(size_t(kBatch * l.in), -1.f, 1.f, 4);
    auto w = test::uniform_floats(size_t(l.out * l.in), -1.f, 1.f, 5);
    std::vector<float> got(size_t(kBatch * l.out)), want(got.size());
    const Tensor tx(x.data(), {kBatch, l.in}, DType::f32), tw(w.data(), {l.out, l.in}, DType::f32);
    // alpha and beta too: oneDNN's output scale and sum post-op.
    for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.5f, 0.25f}}) {
      std::fill(got.begin(), got.end(), 1.f);
      std::fill(want.begin(), want.end(), 1.f);
      dnn.gemm(false, true, alpha, tx, tw, beta, Tensor(got.data(), {kBatch, l.out}, DType::f32));
      blas.gemm(false, true, alpha, tx, tw, beta, Tensor(want.data(), {kBatch, l.out}, DType::f32));
      EXPECT_LE(rel_err(got, want), 1e-5) << "alpha " << alpha << " beta " << beta;
    }
  }
}

// Linear's bias inside oneDNN's matmul (gemm_bias): in fp32 the same bits as the GEMM
// followed by bias_add; in bf16 the product plus bias rounded once (the fp32-output GEMM plus
// the bias, rounded to bf16), where the two passes round twice and so differ somewhere.
TEST(OneDnnGemm, BiasIsAddedBeforeTheOneRounding) {
  auto dnn = backend(GemmProvider::onednn, true);
  std::vector<Linear> shapes = kLinears;
  shapes.push_back({"gpt-tiny.fc", 128, 512});
  shapes.push_back({"mid-gpt.qkv", 384, 1152});
  for (const auto& l : shapes) {
    SCOPED_TRACE(l.model);
    auto x = test::uniform_floats(size_t(kBatch * l.in), -1.f, 1.f, 6);
    auto w = test::uniform_floats(size_t(l.out * l.in), -1.f, 1.f, 7);
    auto bias = test::uniform_floats(size_t(l.out), -4.f, 4.f, 8);
    const Tensor tb(bias.data(), {l.out}, DType::f32);
    std::vector<float> got(size_t(kBatch * l.out)), want(got.size());
    const Tensor tx(x.data(), {kBatch, l.in}, DType::f32), tw(w.data(), {l.out, l.in}, DType::f32);
    dnn.gemm_bias(false, true, tx, tw, tb, Tensor(got.data(), {kBatch, l.out}, DType::f32));
    const Tensor tw32(want.data(), {kBatch, l.out}, DType::f32);
    dnn.gemm(false, true, 1.f, tx, tw, 0.f, tw32);
    dnn.bias_add(tw32, tb, kernels::Activation::none);
    EXPECT_EQ(got, want) << "fp32";

    if (!dnn.native(DType::bf16)) continue;  // bf16 widened to fp32: the case above
    const DType bf = DType::bf16;
    Values xb(size_t(kBatch * l.in), bf, 9), wb(size_t(l.out * l.in), bf, 10);
    const Tensor a = xb.tensor({kBatch, l.in}, bf), b = wb.tensor({l.out, l.in}, bf);
    std::vector<uint16_t> fused(got.size()), twice(got.size());
    dnn.gemm_bias(false, true, a, b, tb, Tensor(fused.data(), {kBatch, l.out}, bf));
    const Tensor t2(twice.data(), {kBatch, l.out}, bf);
    dnn.Backend::gemm_bias(false, true, a, b, tb, t2);  // the GEMM, then bias_add
    std::vector<float> acc(got.size());
    dnn.gemm(false, true, 1.f, a, b, 0.f, Tensor(acc.data(), {kBatch, l.out}, DType::f32));
    size_t once = 0, differ = 0;
    for (size_t i = 0; i < acc.size(); ++i) {
      const uint16_t r = float_to_bf16(acc[i] + bias[i % size_t(l.out)]);
      once += fused[i] == r;
      differ += twice[i] != r;
    }
    EXPECT_EQ(once, acc.size()) << "bf16: results not the once-rounded sum";
    EXPECT_GT(differ, 0u) << "bf16: the two-pass path never differs, so the check above is vacuous";
  }
}

// Every convolution of the shipped models: the cnn's two (Fashion-MNIST 28x28, bias + ReLU
// fused), resnet's (CIFAR 32x32, width 16: the stem, each stage's 3x3 convolutions, the
// strided ones into stages 2 and 3 and their 1x1 shortcuts; no bias).
struct Conv {
  const char* name;
  ConvShape cs;
  bool bias_relu;
};
constexpr int64_t kConvBatch = 8;
const std::vector<Conv> kConvs = {
    {"cnn.conv1", {kConvBatch, 1, 28, 28, 32, 3, 3, 1, 0}, true},
    {"cnn.conv2", {kConvBatch, 32, 26, 26, 64, 3, 3, 1, 0}, true},
    {"resnet.stem", {kConvBatch, 3, 32, 32, 16, 3, 3, 1, 1}, false},
    {"resnet.stage1.conv", {kConvBatch, 16, 32, 32, 16, 3, 3, 1, 1}, false},
    {"resnet.stage2.conv1", {kConvBatch, 16, 32, 32, 32, 3, 3, 2, 1}, false},
    {"resnet.stage2.conv2", {kConvBatch, 32, 16, 16, 32, 3, 3, 1, 1}, false},
    {"resnet.stage2.down", {kConvBatch, 16, 32, 32, 32, 1, 1, 2, 0}, false},
    {"resnet.stage3.conv1", {kConvBatch, 32, 16, 16, 64, 3, 3, 2, 1}, false},
    {"resnet.stage3.conv2", {kConvBatch, 64, 8, 8, 64, 3, 3, 1, 1}, false},
    {"resnet.stage3.down", {kConvBatch, 32, 16, 16, 64, 1, 1, 2, 0}, false}};

TEST(NativeConv, MatchesWideningOnEveryModelShape) {
  auto native = backend(GemmProvider::onednn, true);
  auto widen = backend(GemmProvider::onednn, false);
  if (!kernels::cpu::host_features().avx512_bf16)
    GTEST_SKIP() << "this CPU has no AVX512-BF16: bf16 convolutions take the widening path only";
  ASSERT_TRUE(kernels::cpu::OneDnnConv().supports(DType::bf16))
      << "oneDNN has no native bf16 convolution on an AVX512-BF16 CPU";
  const DType bf = DType::bf16;
  for (const auto& c : kConvs) {
    SCOPED_TRACE(c.name);
    const ConvShape& cs = c.cs;
    const Shape xs{cs.n, cs.c, cs.h, cs.w}, ws{cs.k, cs.c, cs.r, cs.s},
        ys{cs.n, cs.k, cs.p(), cs.q()};
    Values x(size_t(shape_numel(xs)), bf, 11), w(size_t(shape_numel(ws)), bf, 12),
        dy(size_t(shape_numel(ys)), bf, 13);
    auto bias = test::uniform_floats(size_t(cs.k), -0.5f, 0.5f, 14);
    const Tensor tb(bias.data(), {cs.k}, DType::f32);
    const auto act = c.bias_relu ? kernels::Activation::relu : kernels::Activation::none;
    for (DType out : {bf, DType::f32}) {
      SCOPED_TRACE(dtype_name(out));
      OwnedTensor y1, y2, dx1, dx2, dw1, dw2, db1, db2;
      y1.ensure(ys, out), y2.ensure(ys, out), dx1.ensure(xs, out), dx2.ensure(xs, out);
      dw1.ensure(ws, out), dw2.ensure(ws, out);
      db1.ensure({cs.k}, DType::f32), db2.ensure({cs.k}, DType::f32);
      native.conv2d_forward(cs, x.tensor(xs, bf), w.tensor(ws, bf), c.bias_relu ? &tb : nullptr,
                            act, y1.view);
      widen.conv2d_forward(cs, x.tensor(xs, bf), w.tensor(ws, bf), c.bias_relu ? &tb : nullptr, act,
                           y2.view);
      EXPECT_LE(rel_err(copy_of(y1.view), copy_of(y2.view)), tolerance(out)) << "forward";
      native.conv2d_backward_data(cs, dy.tensor(ys, bf), w.tensor(ws, bf), dx1.view);
      widen.conv2d_backward_data(cs, dy.tensor(ys, bf), w.tensor(ws, bf), dx2.view);
      EXPECT_LE(rel_err(copy_of(dx1.view), copy_of(dx2.view)), tolerance(out)) << "dx";
      native.conv2d_backward_filter(cs, x.tensor(xs, bf), dy.tensor(ys, bf), dw1.view,
                                    c.bias_relu ? &db1.view : nullptr);
      widen.conv2d_backward_filter(cs, x.tensor(xs, bf), dy.tensor(ys, bf), dw2.view,
                                   c.bias_relu ? &db2.view : nullptr);
      EXPECT_LE(rel_err(copy_of(dw1.view), copy_of(dw2.view)), tolerance(out)) << "dW";
      if (c.bias_relu) {
        EXPECT_LE(rel_err(copy_of(db1.view), copy_of(db2.view)), tolerance(DType::f32)) << "db";
      }
    }
  }
}

// ---- the widening path converts in oneDNN's reorders --------------------------------------

// bf16 tensors on the fp32 path are widened by the reorder into oneDNN's layout and results
// rounded by the reorder out of it (fp16 ones by to_f32 / from_f32): bit for bit what
// widening first (the tensors' exact fp32 values) and rounding the fp32 result once
// (nearest, ties to even) gives.
TEST(WidenedConv, ConversionInTheReorderEqualsWideningFirst) {
  auto be = backend(GemmProvider::onednn, false);
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    auto round16 = [t](const std::vector<float>& v) {
      std::vector<float> r;
      for (float f : v)
        r.push_back(t == DType::bf16 ? bf16_to_float(float_to_bf16(f))
                                     : half_to_float(float_to_half(f)));
      return r;
    };
    for (const auto& c : kConvs) {
      SCOPED_TRACE(c.name);
      const ConvShape& cs = c.cs;
      const Shape xs{cs.n, cs.c, cs.h, cs.w}, ws{cs.k, cs.c, cs.r, cs.s},
          ys{cs.n, cs.k, cs.p(), cs.q()};
      Values x(size_t(shape_numel(xs)), t, 21), w(size_t(shape_numel(ws)), t, 22),
          dy(size_t(shape_numel(ys)), t, 23);
      auto bias = test::uniform_floats(size_t(cs.k), -0.5f, 0.5f, 24);
      const Tensor tb(bias.data(), {cs.k}, DType::f32);
      const auto act = c.bias_relu ? kernels::Activation::relu : kernels::Activation::none;
      const Tensor* b = c.bias_relu ? &tb : nullptr;
      OwnedTensor y16, y32, dx16, dx32, dw16, dw32, db16, db32;
      y16.ensure(ys, t), y32.ensure(ys, DType::f32), dx16.ensure(xs, t),
          dx32.ensure(xs, DType::f32);
      dw16.ensure(ws, DType::f32), dw32.ensure(ws, DType::f32);
      db16.ensure({cs.k}, DType::f32), db32.ensure({cs.k}, DType::f32);
      const Tensor x32(x.f.data(), xs, DType::f32), w32(w.f.data(), ws, DType::f32),
          dy32(dy.f.data(), ys, DType::f32);
      be.conv2d_forward(cs, x.tensor(xs, t), w.tensor(ws, t), b, act, y16.view);
      be.conv2d_forward(cs, x32, w32, b, act, y32.view);
      EXPECT_EQ(copy_of(y16.view), round16(copy_of(y32.view))) << "forward";
      be.conv2d_backward_data(cs, dy.tensor(ys, t), w.tensor(ws, t), dx16.view);
      be.conv2d_backward_data(cs, dy32, w32, dx32.view);
      EXPECT_EQ(copy_of(dx16.view), round16(copy_of(dx32.view))) << "dx";
      be.conv2d_backward_filter(cs, x.tensor(xs, t), dy.tensor(ys, t), dw16.view,
                                c.bias_relu ? &db16.view : nullptr);
      be.conv2d_backward_filter(cs, x32, dy32, dw32.view, c.bias_relu ? &db32.view : nullptr);
      EXPECT_EQ(copy_of(dw16.view), copy_of(dw32.view)) << "dW";
      if (c.bias_relu) {
        EXPECT_EQ(copy_of(db16.view), copy_of(db32.view)) << "db";
      }
    }
  }
}

// conv2d_backward (both passes, dy put into oneDNN's layout once) gives bit for bit what
// conv2d_backward_filter and conv2d_backward_data give, in fp32 and bf16, widened and native.
TEST(CombinedConvBackward, EqualsTheSeparatePasses) {
  const bool has_bf16 = kernels::cpu::host_features().avx512_bf16;
  for (bool native16 : {false, true}) {
    if (native16 && !has_bf16) continue;  // the widened run above still ran
    auto be = backend(GemmProvider::onednn, native16);
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << (native16 ? " native" : " widened"));
      for (const auto& c : kConvs) {
        SCOPED_TRACE(c.name);
        const ConvShape& cs = c.cs;
        const Shape xs{cs.n, cs.c, cs.h, cs.w}, ws{cs.k, cs.c, cs.r, cs.s},
            ys{cs.n, cs.k, cs.p(), cs.q()};
        Values x(size_t(shape_numel(xs)), DType::bf16, 31),
            w(size_t(shape_numel(ws)), DType::bf16, 32),
            dy(size_t(shape_numel(ys)), DType::bf16, 33);
        auto in = [t](Values& v, const Shape& s) {
          return t == DType::f32 ? Tensor(v.f.data(), s, DType::f32) : v.tensor(s, t);
        };
        OwnedTensor dx1, dx2, dw1, dw2, db1, db2;
        dx1.ensure(xs, t), dx2.ensure(xs, t), dw1.ensure(ws, t), dw2.ensure(ws, t);
        db1.ensure({cs.k}, DType::f32), db2.ensure({cs.k}, DType::f32);
        be.conv2d_backward(cs, in(x, xs), in(dy, ys), in(w, ws), &dx1.view, dw1.view,
                           c.bias_relu ? &db1.view : nullptr);
        be.conv2d_backward_filter(cs, in(x, xs), in(dy, ys), dw2.view,
                                  c.bias_relu ? &db2.view : nullptr);
        be.conv2d_backward_data(cs, in(dy, ys), in(w, ws), dx2.view);
        EXPECT_EQ(copy_of(dx1.view), copy_of(dx2.view)) << "dx";
        EXPECT_EQ(copy_of(dw1.view), copy_of(dw2.view)) << "dW";
        if (c.bias_relu) {
          EXPECT_EQ(copy_of(db1.view), copy_of(db2.view)) << "db";
        }
      }
    }
  }
}

// ---- native fp32 -> bf16 conversion ------------------------------------------------------

TEST(Bf16Conversion, NativeInstructionMatchesScalarBitForBit) {
  const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  EXPECT_EQ(std::string(kernels::cpu::bf16_conversion_path()),
            has ? "avx512_bf16" : (__builtin_cpu_supports("avx512f") ? "avx512f" : "scalar"));
  // Blocks of 32 (the native instruction's width): some all normal, some with one denormal
  // (the integer fallback), and specials: ties in both directions, nan, inf, overflow to inf.
  std::vector<uint32_t> pats;
  std::mt19937 gen(7);
  for (int block = 0; block < 64; ++block)
    for (int i = 0; i < 32; ++i) {
      uint32_t v = 0x3f800000u + (gen() & 0x7fffffu);                         // [1, 2)
      if (block % 4 == 1 && i == 5) v = 0x00012345u;                          // denormal
      if (block % 4 == 2) v = (gen() & 0x80000000u) | (gen() & 0x7fffffffu);  // anything
      if (block % 4 == 3 && i < 8)
        v = std::vector<uint32_t>{0x3f808000u, 0x3f818000u, 0x7fc00001u, 0x7f800001u,
                                  0xff800000u, 0x7f7fffffu, 0x80000000u, 0x807fffffu}[size_t(i)];
      pats.push_back(v);
    }
  pats.resize(pats.size() - 7);  // a tail shorter than a block
  std::vector<float> src;
  for (uint32_t p : pats) src.push_back(std::bit_cast<float>(p));
  std::vector<uint16_t> dst(src.size(), 0xdeadu);
  kernels::cpu::from_f32(src.data(), dst.data(), DType::bf16, int64_t(src.size()), 1);
  for (size_t i = 0; i < src.size(); ++i)
    ASSERT_EQ(test::hex(float_to_bf16(src[i]), 4), test::hex(dst[i], 4))
        << "at index " << i << ", fp32 " << test::hex(pats[i]);
}

// The 16-bit relu_backward works on bit patterns; it must equal the definition (dy where
// float(y) > 0, else +0) for every pattern of y: zeros, denormals, inf and nan included.
// The kernels' vectorisable bf16 store is float_to_bf16 on every fp32 pattern's class:
// each exponent with mantissas around the rounding points, both signs, nans and infinities.
TEST(Bf16Conversion, ElementStoreMatchesScalarOnEveryExponent) {
  using E = kernels::cpu::Elem<DType::bf16>;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t m : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u, 0x17fffu, 0x400000u,
                         0x400001u, 0x7f8000u, 0x7fffffu}) {
        const uint32_t bits = sign | (e << 23) | m;
        const float f = std::bit_cast<float>(bits);
        ASSERT_EQ(E::store(f), float_to_bf16(f)) << "bits 0x" << std::hex << bits;
      }
}

TEST(Relu16, BackwardMatchesDefinitionOnEveryPattern) {
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = 65536;
    std::vector<uint16_t> y(n), dy(n), dx(n, 0xdeadu);
    for (int64_t i = 0; i < n; ++i) y[size_t(i)] = uint16_t(i), dy[size_t(i)] = uint16_t(i * 7 + 3);
    auto be = backend(GemmProvider::onednn, false);
    be.relu_backward(Tensor(y.data(), {n}, t), Tensor(dy.data(), {n}, t),
                     Tensor(dx.data(), {n}, t));
    for (int64_t i = 0; i < n; ++i) {
      const float v = t == DType::bf16 ? bf16_to_float(y[size_t(i)]) : half_to_float(y[size_t(i)]);
      ASSERT_EQ(test::hex(v > 0.f ? dy[size_t(i)] : 0u, 4), test::hex(dx[size_t(i)], 4))
          << "y pattern " << test::hex(y[size_t(i)], 4);
    }
  }
}

// The bf16 unscale_check works on bit patterns too: every pattern times a factor, against
// the definition; the flag is set by any inf or nan (including one the product creates)
// and only then.
TEST(Unscale16, Bf16MatchesDefinitionOnEveryPattern) {
  auto be = backend(GemmProvider::onednn, false);
  const int64_t n = 65536;
  std::vector<uint16_t> in(n);
  for (int64_t i = 0; i < n; ++i) in[size_t(i)] = uint16_t(i);
  for (float factor : {1.f / 65536, 3.f, 1e30f}) {
    SCOPED_TRACE(factor);
    std::vector<float> out(n);
    const bool bad = be.unscale_check(Tensor(in.data(), {n}, DType::bf16), factor,
                                      Tensor(out.data(), {n}, DType::f32));
    EXPECT_TRUE(bad);  // the patterns include inf and nan
    for (int64_t i = 0; i < n; ++i) {
      const float want = bf16_to_float(in[size_t(i)]) * factor;
      ASSERT_EQ(test::hex(std::bit_cast<uint32_t>(want)),
                test::hex(std::bit_cast<uint32_t>(out[i])))
          << "pattern " << test::hex(in[size_t(i)], 4);
    }
  }
  // Finite values only: no flag unless the factor overflows one of them.
  std::vector<uint16_t> fin;
  for (int64_t i = 0; i < n; ++i)
    if ((i & 0x7f80) != 0x7f80) fin.push_back(uint16_t(i));
  const int64_t m = int64_t(fin.size());
  std::vector<float> out(static_cast<size_t>(m));
  EXPECT_FALSE(be.unscale_check(Tensor(fin.data(), {m}, DType::bf16), 0.5f,
                                Tensor(out.data(), {m}, DType::f32)));
  EXPECT_TRUE(be.unscale_check(Tensor(fin.data(), {m}, DType::bf16), 1e30f,
                               Tensor(out.data(), {m}, DType::f32)));
}

}  // namespace
}  // namespace ringtrain
