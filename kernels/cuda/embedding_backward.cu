// The token + positional embedding's backward pass on CUDA, in parallel and deterministic,
// with the CPU's bits (kernels/cpu/cpu_embedding.cpp sums each gradient row from 0 over its
// tokens in position order, in fp32):
//   1. the positions 0..n-1 sorted by token id (cub's radix sort of (token, position) pairs
//      is stable, so a token's positions stay in increasing order);
//   2. run-length encoding of the sorted tokens (distinct tokens, their counts) and an
//      exclusive scan of the counts (where each token's positions start);
//   3. a block per distinct token, a thread per channel, summing its dy rows in position
//      order (coalesced along the channels) and writing the token's dwte row once;
//   4. dwpe: a thread per (position, channel) summing over the batch in order.
// Rows of dwte for tokens that do not occur, and dwpe rows past T, are left as the caller
// zeroed them.
#include <algorithm>
#include <cub/cub.cuh>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {
namespace {

__global__ void iota_kernel(uint32_t* v, int64_t n) { RT_GRID_STRIDE(i, n) v[i] = uint32_t(i); }

// Block r: the r-th distinct token (runs past *num_runs leave at once).
template <typename D>
__global__ void token_rows_kernel(const uint32_t* token, const uint32_t* start,
                                  const uint32_t* count, const int32_t* num_runs,
                                  const uint32_t* position, const D* dy, float* dwte, int64_t c) {
  const int64_t r = blockIdx.x;
  if (r >= *num_runs) return;
  const int64_t lo = start[r], hi = lo + count[r], row = int64_t(token[r]) * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t k = lo; k < hi; ++k) acc += ld(dy, int64_t(position[k]) * c + j);
    dwte[row + j] = acc;
  }
}

template <typename D>
__global__ void position_rows_kernel(const D* dy, float* dwpe, int64_t batch, int64_t t_len,
                                     int64_t c) {
  RT_GRID_STRIDE(i, t_len * c) {
    const int64_t p = i / c, j = i % c;
    float acc = 0.f;
    for (int64_t b = 0; b < batch; ++b) acc += ld(dy, (b * t_len + p) * c + j);
    dwpe[i] = acc;
  }
}

// Bits that hold every token id below `vocab` (radix sort passes over those only).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t(1) << bits) < vocab) ++bits;
  return bits;
}

// The scratch's layout: six arrays of n uint32, the run count, then cub's temporary storage.
struct Layout {
  size_t arrays, cub_bytes, total;
};

Layout layout(int64_t n, int64_t vocab) {
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  const int nn = int(n);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const uint32_t*)nullptr,
                                             (uint32_t*)nullptr, (const uint32_t*)nullptr,
                                             (uint32_t*)nullptr, nn, 0, key_bits(vocab)));
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, (const uint32_t*)nullptr,
                                                (uint32_t*)nullptr, (uint32_t*)nullptr,
                                                (int32_t*)nullptr, nn));
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, (const uint32_t*)nullptr,
                                           (uint32_t*)nullptr, nn));
  Layout l;
  l.arrays = (size_t(6 * n) * 4 + 4 + 255) / 256 * 256;
  l.cub_bytes = std::max({sort_bytes, rle_bytes, scan_bytes});
  l.total = l.arrays + l.cub_bytes;
  return l;
}

}  // namespace

size_t embedding_bwd_scratch_bytes(int64_t n, int64_t vocab) {
  return n == 0 ? 0 : layout(n, vocab).total;
}

void launch_embedding_bwd(const int32_t* tok, const void* dy, DType dt, float* dwte, float* dwpe,
                          int64_t n, int64_t t_len, int64_t c, int64_t vocab, void* scratch,
                          cudaStream_t s) {
  if (n == 0 || c == 0) return;
  RT_CHECK(n < (int64_t(1) << 31), "embedding backward over ", n, " tokens (cub's int count)");
  const Layout l = layout(n, vocab);
  auto* u = static_cast<uint32_t*>(scratch);
  uint32_t *pos_in = u, *key_out = u + n, *pos_out = u + 2 * n, *token = u + 3 * n,
           *count = u + 4 * n, *start = u + 5 * n;
  auto* num_runs = reinterpret_cast<int32_t*>(u + 6 * n);
  void* tmp = static_cast<char*>(scratch) + l.arrays;
  size_t tmp_bytes = l.cub_bytes;
  const int nn = int(n);
  iota_kernel<<<blocks_for(n), kThreads, 0, s>>>(pos_in, n);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, reinterpret_cast<const uint32_t*>(tok),
                                             key_out, pos_in, pos_out, nn, 0, key_bits(vocab), s));
  tmp_bytes = l.cub_bytes;
  CUDA_CHECK(
      cub::DeviceRunLengthEncode::Encode(tmp, tmp_bytes, key_out, token, count, num_runs, nn, s));
  tmp_bytes = l.cub_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, count, start, nn, s));
  dispatch(dt, [&](auto D) {
    using TD = typename decltype(D)::type;
    const auto* g = static_cast<const TD*>(dy);
    const unsigned threads = c >= kThreads ? kThreads : unsigned((c + 31) / 32 * 32);
    token_rows_kernel<<<unsigned(n), threads, 0, s>>>(token, start, count, num_runs, pos_out, g,
                                                      dwte, c);
    CUDA_CHECK_LAUNCH();
    if (dwpe) {
      position_rows_kernel<<<blocks_for(t_len * c), kThreads, 0, s>>>(g, dwpe, n / t_len, t_len, c);
      CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ringtrain::kernels::cuda
