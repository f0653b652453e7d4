// ShardLayout: how ZeRO-1 partitions a flat buffer of N elements across W ranks, for the
// GradReducer (which bucket elements each rank receives summed, and gathers back) and for
// the sharded optimizer state in launch/. Rank r owns the contiguous range
// [begin(r), end(r)); every boundary but N is a multiple of the alignment (64 elements:
// 256 B of fp32, 128 B of fp16/bf16), so shards start on cache lines and vector
// boundaries; the last shards take what remains (any N, any W; a shard may be empty when
// N < W x alignment). A bucket [offset, offset + count) is split at the shard boundaries
// that fall inside it: counts_in() gives each rank's piece, the layout of an in-place
// reduce-scatter or all-gather over that bucket.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ringtrain::comm {

class ShardLayout {
 public:
  static constexpr int64_t kAlign = 64;

  ShardLayout() = default;
  ShardLayout(int64_t n, int world, int64_t align = kAlign) : bounds_(size_t(world) + 1, n) {
    const int64_t per_rank = (n + world - 1) / std::max(world, 1);
    const int64_t step = (per_rank + align - 1) / align * align;
    for (int r = 0; r <= world; ++r) bounds_[size_t(r)] = std::min(n, int64_t(r) * step);
  }

  bool empty() const { return bounds_.empty(); }
  int world() const { return int(bounds_.size()) - 1; }
  int64_t total() const { return bounds_.back(); }
  int64_t begin(int r) const { return bounds_[size_t(r)]; }
  int64_t end(int r) const { return bounds_[size_t(r) + 1]; }
  int64_t count(int r) const { return end(r) - begin(r); }
  // Each rank's number of elements of [offset, offset + n), in rank order.
  std::vector<int64_t> counts_in(int64_t offset, int64_t n) const {
    std::vector<int64_t> c(static_cast<size_t>(world()));
    for (int r = 0; r < world(); ++r)
      c[size_t(r)] =
          std::max<int64_t>(0, std::min(end(r), offset + n) - std::max(begin(r), offset));
    return c;
  }

 private:
  std::vector<int64_t> bounds_;  // W + 1 boundaries; empty: not sharded
};

}  // namespace ringtrain::comm
