// What the CPU can do (cpuid feature bits and the state the OS enables for them) and the
// choice of GEMM provider that follows from it. The choice is a pure function of the
// features, the core OpenBLAS picked and the RINGTRAIN_GEMM setting, so it is unit-tested
// with made-up CPUs; only detect_cpu_features() and openblas_core() look at this machine.
// Features, not CPU model numbers: a CPU newer than a distribution's OpenBLAS knows is
// still recognised by what it reports.
#pragma once

#include <string>
#include <string_view>

namespace ringtrain::kernels::cpu {

struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false;  // cpuid bits AND the OS enables the tile state
};

// The vector ISA levels the choice works with, in increasing order.
enum class IsaLevel { sse, avx, avx2, avx512 };

// cpuid + XGETBV (the OS must enable the AVX / AVX-512 / AMX register state) + for AMX the
// kernel's support of the tile data (arch_prctl ARCH_GET_XCOMP_SUPP).
CpuFeatures detect_cpu_features();
// The features of this machine, detected once.
const CpuFeatures& host_features();

IsaLevel isa_level(const CpuFeatures& f);  // avx512 needs F + BW + VL (oneDNN's avx512_core)
const char* isa_level_name(IsaLevel l);    // "sse", "avx", "avx2", "avx512"
// oneDNN-style name of the best ISA: "avx512_core_amx", "avx512_core_fp16",
// "avx512_core_bf16", "avx512_core", "avx2", "avx", "sse41".
std::string isa_name(const CpuFeatures& f);
// "avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 -amx": what the choice read.
std::string feature_list(const CpuFeatures& f);

// The ISA level of an OpenBLAS core name (openblas_get_corename(): "Prescott", "Haswell",
// "SkylakeX", ...), case-insensitive; unknown names count as sse (the weakest assumption).
IsaLevel openblas_core_level(std::string_view core);
std::string openblas_core();  // this process's OpenBLAS core name

enum class GemmProvider { onednn, openblas };
const char* provider_name(GemmProvider p);  // "oneDNN", "OpenBLAS"

// RINGTRAIN_GEMM: auto (default) chooses by features; onednn / openblas force one.
enum class GemmSetting { automatic, onednn, openblas };
// Parses RINGTRAIN_GEMM's value (null or empty = auto); an input error names the value.
GemmSetting parse_gemm_setting(const char* value);
GemmSetting gemm_setting_from_env();

struct GemmChoice {
  GemmProvider provider = GemmProvider::openblas;
  std::string reason;  // one phrase, for the start-up line
};
// The rule: without AVX2 OpenBLAS (its SSE/AVX kernels are as good as anything there);
// with AVX2 or better oneDNN, whose JIT kernels are generated for the ISA the CPU reports
// and measure at or above OpenBLAS's own matching kernels on the models' shapes
// (docs/benchmarks.md) — and far above an OpenBLAS that fell back to a weaker core.
GemmChoice choose_gemm_provider(const CpuFeatures& f, std::string_view openblas_core,
                                GemmSetting setting);

// RINGTRAIN_CPU_BF16: auto (default), native (bf16 GEMMs and convolutions on the bf16
// inputs wherever oneDNN has kernels) or widen (always widened to fp32 first).
enum class Bf16Setting { automatic, native, widen };
Bf16Setting parse_bf16_setting(const char* value);  // null or empty = auto; input error
Bf16Setting bf16_setting_from_env();
// Whether 16-bit GEMMs and convolutions run on their 16-bit inputs (where oneDNN has kernels)
// rather than widened to fp32. auto: only with AMX-BF16, whose tile kernels multiply bf16
// many times faster than fp32. AVX512-BF16 alone is not enough: VDPBF16PS does 32
// multiply-adds per instruction at one per cycle, the rate of two 16-lane fp32 FMAs, and
// oneDNN 2.6's bf16 kernels measure at 0.55-0.7x of its fp32 ones on such a CPU
// (docs/benchmarks.md), so widening to fp32 is faster there.
bool choose_native16(const CpuFeatures& f, Bf16Setting setting);

// True when OpenBLAS runs kernels for a lower ISA than the CPU has (e.g. Prescott on an
// AVX-512 CPU): its SGEMM then runs at a fraction of what the CPU can do.
bool openblas_core_is_weak(const CpuFeatures& f, std::string_view openblas_core);

}  // namespace ringtrain::kernels::cpu
