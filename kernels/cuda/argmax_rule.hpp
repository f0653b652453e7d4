// The arg-max rule of softmax cross-entropy's "correct" count, as the CPU backend's scan
// defines it (arg = 0; for j >= 1: if x[j] > x[arg] then arg = j), in a form a warp can
// reduce in any tree: each lane folds its strided elements with argmax_visit, lanes merge
// with argmax_merge, argmax_result applies the first element's rule. Shared by the CUDA
// kernel (elementwise.cu) and the host test that checks it against the CPU backend, so it
// compiles for both.
//
// The scan, read closed-form: a NaN at x[0] is never replaced (nothing compares greater
// than NaN), so the answer is 0; otherwise NaNs are never taken (NaN > v is false) and the
// answer is the first index of the largest non-NaN value. That is a maximum under a total
// order (value descending, index ascending, NaNs excluded), so merging is associative and
// commutative and every lane of a butterfly reduction ends with the same answer.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RT_HOST_DEVICE __host__ __device__
#else
#define RT_HOST_DEVICE
#endif

namespace ringtrain::kernels::cuda {

struct ArgMax {
  float best = 0.f;
  int64_t arg = -1;  // -1: no non-NaN element seen
};

// Elements must be visited in increasing j (a lane's strided loop does).
RT_HOST_DEVICE inline void argmax_visit(ArgMax& m, float v, int64_t j) {
  if (v == v && (m.arg < 0 || v > m.best)) {  // v == v: not NaN
    m.best = v;
    m.arg = j;
  }
}

RT_HOST_DEVICE inline ArgMax argmax_merge(const ArgMax& a, const ArgMax& b) {
  if (b.arg < 0) return a;
  if (a.arg < 0) return b;
  return b.best > a.best || (b.best == a.best && b.arg < a.arg) ? b : a;
}

// x0: the row's first element.
RT_HOST_DEVICE inline int64_t argmax_result(const ArgMax& m, float x0) {
  return x0 != x0 || m.arg < 0 ? 0 : m.arg;
}

}  // namespace ringtrain::kernels::cuda
