// How conv.cpp picks a cuDNN algorithm for one direction of one convolution, as a pure
// function of cuDNN's answers (no CUDA here, so tests on machines without a GPU check the
// rules). Algorithm and math-type numbers are cuDNN's enum values, passed through.
//
// Why a procedure and not "the heuristic's first result": the _v7 query can fail outright;
// its workspace sizes are for the math type each result names, and strict fp32 must run
// with CUDNN_FMA_MATH whatever the result says, so the size must be asked again for the
// math type actually set (else NOT_SUPPORTED or a too-small workspace at run time); and when
// nothing the heuristic offers fits, cuDNN's deterministic algorithms can still be tried one
// by one.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

namespace ringtrain::kernels::cuda {

struct ConvCandidate {  // one row of cudnnGetConvolution*Algorithm_v7's answer
  int algo = 0;
  bool ok = true;  // status == CUDNN_STATUS_SUCCESS
  bool deterministic = true;
  int math = 0;       // the math type the row was measured with
  size_t memory = 0;  // its workspace, for that math type
};

struct ConvChoice {
  bool found = false;
  int algo = 0, math = 0;
  size_t workspace = 0;  // asked again for (algo, math): what the call must be given
  bool from_fallback = false;
  // When none fits: the smallest workspace a deterministic algorithm asked for (0: none
  // is supported at all), for the message.
  size_t smallest_over_cap = 0;
};

struct ConvSelectRules {
  bool strict_fp32 = false;  // fp32 without TF32: run with `fma_math`, never tensor-op math
  int fma_math = 0;          // CUDNN_FMA_MATH
  int default_math = 0;      // CUDNN_DEFAULT_MATH (strict fp32 accepts it, then forces FMA)
  int fallback_math = 0;     // the math type the fallback algorithms are asked with
  size_t cap = 0;            // workspace cap (RINGTRAIN_CUDA_CONV_WORKSPACE_MB)
};

// workspace(algo, math): the size cuDNN asks for with that math type set, or nullopt when
// it refuses (NOT_SUPPORTED and the like).
using ConvWorkspaceQuery = std::function<std::optional<size_t>(int algo, int math)>;

// The heuristic's rows in order (deterministic, status ok; strict fp32: FMA or default math
// only, run as FMA), then `fallback` (deterministic algorithms of this direction) with
// fallback_math; the first whose re-asked workspace is known and within the cap.
inline ConvChoice choose_conv_algo(const std::vector<ConvCandidate>& heuristic,
                                   const std::vector<int>& fallback, const ConvSelectRules& r,
                                   const ConvWorkspaceQuery& workspace) {
  ConvChoice c;
  auto try_one = [&](int algo, int math, bool from_fallback) {
    const std::optional<size_t> ws = workspace(algo, math);
    if (!ws) return false;
    if (*ws > r.cap) {
      if (c.smallest_over_cap == 0 || *ws < c.smallest_over_cap) c.smallest_over_cap = *ws;
      return false;
    }
    c.found = true;
    c.algo = algo;
    c.math = math;
    c.workspace = *ws;
    c.from_fallback = from_fallback;
    return true;
  };
  for (const ConvCandidate& h : heuristic) {
    if (!h.ok || !h.deterministic) continue;
    if (r.strict_fp32 && h.math != r.fma_math && h.math != r.default_math) continue;
    if (try_one(h.algo, r.strict_fp32 ? r.fma_math : h.math, false)) return c;
  }
  for (int algo : fallback)
    if (try_one(algo, r.strict_fp32 ? r.fma_math : r.fallback_math, true)) return c;
  return c;
}

}  // namespace ringtrain::kernels::cuda
