// CPU feature detection (cpuid, XGETBV, arch_prctl) and the GEMM provider choice built on it.
#include "kernels/cpu/cpu_features.hpp"

#include <cblas.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/env.hpp"
#include "core/error.hpp"

namespace ringtrain::kernels::cpu {

namespace {

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux: the kernel supports the AMX tile data state (it is granted per process on request,
// which oneDNN makes itself before its first AMX kernel).
bool os_supports_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchGetXcompSupp = 0x1021;
  constexpr int kXfeatureXtiledata = 18;
  uint64_t mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompSupp, &mask) != 0) return false;
  return (mask >> kXfeatureXtiledata) & 1;
#else
  return false;
#endif
}

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
  return r;
}

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool cpu_avx = (c >> 28) & 1, cpu_fma = (c >> 12) & 1, cpu_f16c = (c >> 29) & 1;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;       // SSE + AVX state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000 && os_supports_amx();  // XTILECFG/XTILEDATA
  f.avx = cpu_avx && os_avx;
  f.fma = f.avx && cpu_fma;
  f.f16c = f.avx && cpu_f16c;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = f.avx && ((b >> 5) & 1);
  f.avx512f = os_avx512 && ((b >> 16) & 1);
  f.avx512dq = f.avx512f && ((b >> 17) & 1);
  f.avx512bw = f.avx512f && ((b >> 30) & 1);
  f.avx512vl = f.avx512f && ((b >> 31) & 1);
  f.avx512_fp16 = f.avx512f && ((d >> 23) & 1);
  f.amx_tile = os_amx && ((d >> 24) & 1);
  f.amx_bf16 = f.amx_tile && ((d >> 22) & 1);
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  return f;
}

const CpuFeatures& host_features() {
  static const CpuFeatures f = detect_cpu_features();
  return f;
}

IsaLevel isa_level(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl) return IsaLevel::avx512;
  if (f.avx2 && f.fma) return IsaLevel::avx2;
  if (f.avx) return IsaLevel::avx;
  return IsaLevel::sse;
}

const char* isa_level_name(IsaLevel l) {
  switch (l) {
    case IsaLevel::avx512:
      return "avx512";
    case IsaLevel::avx2:
      return "avx2";
    case IsaLevel::avx:
      return "avx";
    case IsaLevel::sse:
      break;
  }
  return "sse";
}

std::string isa_name(const CpuFeatures& f) {
  switch (isa_level(f)) {
    case IsaLevel::avx512:
      if (f.amx_tile && f.amx_bf16) return "avx512_core_amx";
      if (f.avx512_fp16) return "avx512_core_fp16";
      if (f.avx512_bf16) return "avx512_core_bf16";
      return "avx512_core";
    case IsaLevel::avx2:
      return "avx2";
    case IsaLevel::avx:
      return "avx";
    case IsaLevel::sse:
      break;
  }
  return "sse41";
}

std::string feature_list(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    s += s.empty() ? "" : " ";
    s += on ? name : cat("-", name);
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_tile && f.amx_bf16, "amx");
  return s;
}

IsaLevel openblas_core_level(std::string_view core) {
  const std::string c = lower(core);
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == n) return IsaLevel::avx512;
  for (const char* n : {"haswell", "zen", "excavator"})
    if (c == n) return IsaLevel::avx2;
  for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (c == n) return IsaLevel::avx;
  return IsaLevel::sse;  // Prescott, Core2, Nehalem, ... and names we do not know
}

std::string openblas_core() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

const char* provider_name(GemmProvider p) {
  return p == GemmProvider::onednn ? "oneDNN" : "OpenBLAS";
}

GemmSetting parse_gemm_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return GemmSetting::automatic;
  if (v == "onednn") return GemmSetting::onednn;
  if (v == "openblas") return GemmSetting::openblas;
  throw_input(cat("RINGTRAIN_GEMM='", v, "' is not valid; expected auto, onednn or openblas"));
}

GemmSetting gemm_setting_from_env() { return parse_gemm_setting(env::gemm().c_str()); }

Bf16Setting parse_bf16_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return Bf16Setting::automatic;
  if (v == "native") return Bf16Setting::native;
  if (v == "widen") return Bf16Setting::widen;
  throw_input(cat("RINGTRAIN_CPU_BF16='", v, "' is not valid; expected auto, native or widen"));
}

Bf16Setting bf16_setting_from_env() { return parse_bf16_setting(env::cpu_bf16().c_str()); }

bool choose_native16(const CpuFeatures& f, Bf16Setting setting) {
  if (setting != Bf16Setting::automatic) return setting == Bf16Setting::native;
  return f.amx_tile && f.amx_bf16;
}

bool openblas_core_is_weak(const CpuFeatures& f, std::string_view openblas_core) {
  return openblas_core_level(openblas_core) < isa_level(f);
}

GemmChoice choose_gemm_provider(const CpuFeatures& f, std::string_view openblas_core,
                                GemmSetting setting) {
  if (setting == GemmSetting::onednn) return {GemmProvider::onednn, "RINGTRAIN_GEMM=onednn"};
  if (setting == GemmSetting::openblas) return {GemmProvider::openblas, "RINGTRAIN_GEMM=openblas"};
  const IsaLevel cpu = isa_level(f);
  if (cpu < IsaLevel::avx2) return {GemmProvider::openblas, cat("auto: no avx2")};
  if (openblas_core_is_weak(f, openblas_core))
    return {GemmProvider::onednn,
            cat("auto: OpenBLAS core ", openblas_core, " is below ", isa_level_name(cpu))};
  return {GemmProvider::onednn, cat("auto: ", isa_level_name(cpu))};
}

}  // namespace ringtrain::kernels::cpu
