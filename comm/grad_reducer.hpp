// GradReducer: sums the flat gradient buffer across ranks in buckets while backward still
// runs. Buckets hold whole parameters in reverse layer order (the first, smaller, so that
// communication starts early); when backward marks a bucket's last parameter ready, the
// communication thread casts it to the wire dtype (if that differs) and allreduces it,
// adding in fp32 and rounding once. finish() waits for what is still in flight. The same
// buckets are reduced in the same order with overlap on or off, so both give bitwise
// identical sums.
// With a ShardLayout (ZeRO-1) each bucket is reduce-scattered instead: rank r receives the
// sum of its shard's part of the bucket (the same bytes on the wire as the allreduce, half
// of them now and half in the all-gather). After the optimizer has updated a bucket's
// shard of the working weights, gather_ready() hands the bucket to the same communication
// thread, which all-gathers it while the optimizer goes on with the next bucket and while
// the next step's forward runs: wait_gathered(b) blocks only until bucket b is complete.
// The all-gather runs in reverse bucket order: the first layers' bucket (the one the next
// forward needs first) goes first.
// With transient buckets as well (ZeRO-2) there is no flat gradient buffer: backward writes
// each bucket into a buffer of the bucket's size that bucket_grad() allocates when backward
// reaches it (at most max_in_flight() of them exist at a time: backward waits for the
// communication thread beyond that), the bucket is cast and reduce-scattered in it, this
// rank's summed piece is converted to fp32 into the shard sums (written by a step's first
// reduction, added to by the later ones: one per micro-batch), and the buffer is freed.
// ZeRO-3 adds gather_params(): a node's parameters all-gathered between the reductions.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/shard_layout.hpp"
#include "comm/stall.hpp"
#include "core/fault_injection.hpp"
#include "core/tensor.hpp"

namespace ringtrain::comm {

struct ReducerConfig {
  DType wire = DType::f32;
  int64_t bucket_bytes = 25 << 20;       // in the wire dtype
  int64_t first_bucket_bytes = 1 << 20;  // PyTorch DDP's first bucket
  bool overlap = true;
  double stall_timeout_s = 300;  // <= 0: no stall detection
  // The conversion of a bucket into the wire dtype (src and dst: same-numel slices of the
  // gradient and wire buffers), called on whichever thread reduces the bucket. Empty: the
  // host conversion helpers, which need host buffers; device buffers pass a device cast.
  std::function<void(const Tensor& src, const Tensor& dst)> cast;
  // ZeRO-1: the partition of the flat buffer into this communicator's ranks' shards; empty:
  // every bucket is allreduced.
  ShardLayout shards;
  // ZeRO-2 (needs `shards`; host buffers): the gradient exists bucket by bucket only (see
  // above); `shard_sums` is this rank's shard of the summed gradient, fp32.
  bool transient_buckets = false;
  Tensor shard_sums;
};

struct Bucket {
  int64_t offset = 0, count = 0;       // elements of the flat buffer
  size_t first_param = 0, params = 0;  // parameter indices (forward order) it holds
};

class GradReducer {
 public:
  // grad: the flat gradient buffer (any float dtype); params: (offset, count) of each
  // parameter in it, in forward order; groups: the group (layer) of each parameter, whose
  // gradients become ready together, so a bucket never splits one (empty: one group per
  // parameter). Not collective.
  GradReducer(Communicator& comm, const ReducerConfig& cfg, Tensor grad,
              const std::vector<std::pair<int64_t, int64_t>>& params,
              const std::vector<size_t>& groups = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // A step's reductions begin. `accumulate` (transient buckets: a later micro-batch of the
  // step): the reduced pieces are added to the shard sums, and the step's timings go on.
  void start_step(int64_t step, bool accumulate = false);
  // Transient buckets: bucket b's gradient buffer (compute dtype, the bucket's elements) for
  // this reduction, allocated by the first call; waits while max_in_flight() are allocated.
  Tensor bucket_grad(size_t b);
  bool transient() const { return cfg_.transient_buckets; }
  static constexpr int kMaxInFlight = 3;
  int max_in_flight() const { return cfg_.overlap ? kMaxInFlight : 1; }
  // The most bytes of bucket buffers that can exist at once: the max_in_flight() largest
  // buckets (compute dtype plus wire dtype where they differ); and the most that did since
  // construction.
  int64_t bucket_bytes_bound() const;
  int64_t peak_bucket_bytes() const { return peak_bytes_; }
  // Backward wrote parameter i's gradient (call in any order, each once per step).
  void mark_ready(size_t param);
  // Every bucket reduced: result() holds the sum over ranks (wire dtype); with shards, only
  // this rank's shard of it is the sum; with transient buckets result() has no data (its
  // dtype is the wire dtype) and the shard sums hold the sum. Returns the seconds this call waited
  // (the communication not hidden by compute).
  double finish();
  Tensor result() const { return wire_; }
  double comm_seconds() const { return comm_s_; }  // summed over the last step's buckets
  // ZeRO-1, after finish(): all-gathers `work` (the flat working weights, any dtype) bucket
  // by bucket, bucket b once gather_ready(b) was called (in reverse bucket order, from the
  // last bucket to bucket 0, after this rank updated its shard of the bucket). `extra`
  // (optional: the compact fp32 copy of the parameters layers read in fp32, in flat order)
  // is all-gathered with the buckets: extra_counts[b][r] of its elements lie in bucket b and
  // rank r's shard, so bucket b's part of it must be up to date when b is ready.
  // wait_gathered(b) waits until bucket b is gathered (the buckets after it are too);
  // finish_gather() until every bucket is. Both return the seconds they waited and rethrow
  // an error of the communication thread. Nothing else may use the communicator's
  // collectives between start_gather() and finish_gather() (the thread is in them).
  void start_gather(Tensor work, Tensor extra = {},
                    std::vector<std::vector<int64_t>> extra_counts = {});
  void gather_ready(size_t bucket);
  double wait_gathered(size_t bucket);
  double finish_gather();
  double gather_seconds() const { return gather_s_; }  // summed over the last step's buckets
  // ZeRO-3: all-gathers `dst` over the shard layout: the flat range [offset, offset +
  // dst.numel()) of the parameters (any dtype), this rank's piece of it already in place. It
  // runs on the calling thread once the communication thread has run every reduction handed
  // to it (mark_ready), so no other collective is in flight and every rank issues the same
  // collectives in the same order; backward's later buckets wait for it. `position` orders it
  // among the step's waits for the stall watch, `unit` names it (its gather unit). Returns
  // the seconds it took, the wait included; rethrows an error of the communication thread.
  double gather_params(const Tensor& dst, int64_t offset, int64_t step, int64_t position,
                       int64_t unit);
  bool sharded() const { return !cfg_.shards.empty(); }
  struct Span {
    size_t bucket;
    std::chrono::steady_clock::time_point begin, end;
    bool gather = false;  // an all-gather of the working weights, not a reduction
  };
  // The last step's bucket allreduces (cast included), then its bucket all-gathers, in
  // order; valid after finish() (and finish_gather()).
  const std::vector<Span>& spans() const { return spans_; }

 private:
  void reduce(size_t b);  // one bucket: cast to wire, allreduce (or reduce-scatter)
  void gather(size_t b);  // one bucket of the working weights: all-gather
  void run();             // the communication thread
  // Transient buckets: this rank's piece of reduced bucket b into the shard sums, and the
  // bucket's buffers freed.
  void keep_piece_and_free(size_t b, const Tensor& wire_bucket);

  Communicator& comm_;
  ReducerConfig cfg_;
  Tensor grad_, wire_;
  Buffer wire_storage_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  std::vector<size_t> pending_;    // parameters still to come, per bucket
  StallWatch watch_;
  StallHook hold_;  // test-only: RINGTRAIN_TEST_STALL's hold inside the reduction
  int64_t step_ = 0;
  double comm_s_ = 0, gather_s_ = 0;
  std::vector<Span> spans_;
  bool accumulate_ = false;                         // transient: add to the shard sums
  std::vector<Buffer> bucket_buf_, wire_buf_;       // transient: per bucket, while it exists
  int in_flight_ = 0;                               // transient: buckets allocated (under mu_)
  int64_t live_bytes_ = 0, peak_bytes_ = 0;         // transient: their bytes (under mu_)
  Tensor gather_;                                   // the working weights of the step's all-gather
  Tensor extra_;                                    // and the fp32 region gathered with them
  std::vector<std::vector<int64_t>> extra_counts_;  // per bucket, per rank
  std::vector<int64_t> extra_at_, extra_count_;     // per bucket: its part of extra_
  // Shared with the communication thread.
  std::mutex mu_;
  std::condition_variable cv_;
  size_t ready_ = 0;                        // buckets 0..ready_-1 may be reduced
  size_t done_ = 0;                         // buckets 0..done_-1 are reduced
  size_t gather_ready_ = 0, gathered_ = 0;  // the same for the all-gather
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ringtrain::comm
