// Bucketed, overlapped gradient allreduce or reduce-scatter, and ZeRO's all-gather of the
// working weights (see grad_reducer.hpp).
#include "comm/grad_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "comm/control.hpp"
#include "comm/flight_recorder.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/memory_stats.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::comm {

using Clock = std::chrono::steady_clock;

GradReducer::GradReducer(Communicator& comm, const ReducerConfig& cfg, Tensor grad,
                         const std::vector<std::pair<int64_t, int64_t>>& params,
                         const std::vector<size_t>& groups)
    : comm_(comm),
      cfg_(cfg),
      grad_(grad),
      watch_(ControlChannel::instance(), cfg.stall_timeout_s),
      hold_(stall_hook()) {
  RT_REQUIRE(cfg.bucket_bytes > 0, "--bucket-mb must be positive");
  RT_CHECK(cfg.shards.empty() ||
               (cfg.shards.world() == comm.size() && cfg.shards.total() == grad.numel()),
           "shard layout of ", cfg.shards.total(), " elements over ", cfg.shards.world(),
           " ranks for a gradient of ", grad.numel(), " on ", comm.size(), " ranks");
  RT_CHECK(!cfg.transient_buckets || !cfg.shards.empty(), "transient buckets without shards");
  if (cfg.transient_buckets) {
    RT_CHECK(cfg.shard_sums.dtype == DType::f32 &&
                 cfg.shard_sums.numel() == cfg.shards.count(comm.rank()),
             "shard sums of ", cfg.shard_sums.numel(), " elements for a shard of ",
             cfg.shards.count(comm.rank()));
    RT_REQUIRE(grad.device.kind == Device::cpu,
               "--zero 2 keeps gradient buckets in host memory; this build has no device path "
               "for it (use --zero 1 on a GPU)");
    wire_ = Tensor(nullptr, grad.shape, cfg.wire, grad.device);  // the dtype only
  } else if (cfg.wire == grad.dtype) {
    wire_ = grad;  // reduce in place
  } else {
    wire_storage_ = Buffer(size_t(grad.numel()) * dtype_size(cfg.wire), grad.device);
    wire_ = Tensor(wire_storage_.data(), grad.shape, cfg.wire, grad.device);
  }
  // Buckets from the last group (layer) backwards. Like PyTorch DDP, a bucket is closed
  // before the group that would take it past its cap; a group larger than the cap gets a
  // bucket of its own, and no group is split (its gradients become ready together, so a
  // bucket holding part of it would wait for all of it anyway). For the MLP: fc3 and fc2
  // reduce while fc1's backward runs, then fc1.
  RT_CHECK(groups.empty() || groups.size() == params.size(), "groups for ", groups.size(), " of ",
           params.size(), " parameters");
  auto group = [&](size_t i) { return groups.empty() ? i : groups[i]; };
  const int64_t es = int64_t(dtype_size(cfg.wire));
  bucket_of_.resize(params.size());
  Bucket cur;
  for (size_t hi = params.size(); hi > 0;) {
    size_t lo = hi - 1;  // the group's parameters are [lo, hi)
    while (lo > 0 && group(lo - 1) == group(hi - 1)) --lo;
    int64_t count = 0;
    for (size_t i = lo; i < hi; ++i) count += params[i].second;
    const int64_t cap =
        buckets_.empty() ? std::min(cfg.first_bucket_bytes, cfg.bucket_bytes) : cfg.bucket_bytes;
    if (cur.params > 0 && (cur.count + count) * es > cap) {
      buckets_.push_back(cur);
      cur = Bucket{};
    }
    cur.offset = params[lo].first;
    cur.count += count;
    cur.first_param = lo;
    cur.params += hi - lo;
    for (size_t i = lo; i < hi; ++i) bucket_of_[i] = buckets_.size();
    hi = lo;
  }
  if (cur.params > 0) buckets_.push_back(cur);
  pending_.resize(buckets_.size());
  bucket_buf_.resize(buckets_.size());
  wire_buf_.resize(buckets_.size());
  if (cfg_.overlap) thread_ = std::thread([this] { run(); });
}

GradReducer::~GradReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradReducer::start_step(int64_t step, bool accumulate) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  ready_ = done_ = 0;
  gather_ready_ = gathered_ = 0;
  accumulate_ = accumulate;
  if (!accumulate) {
    comm_s_ = gather_s_ = 0;
    spans_.clear();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].params;
}

void GradReducer::mark_ready(size_t param) {
  const size_t b = bucket_of_.at(param);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_[b] != 0) return;
    // Buckets are reduced strictly in order (the same order on every rank).
    while (ready_ < buckets_.size() && pending_[ready_] == 0) ++ready_;
    cv_.notify_all();
    if (cfg_.overlap || !transient()) return;
  }
  // --no-overlap with transient buckets: each bucket is reduced (and freed) as it completes,
  // on this thread, so that one bucket buffer exists at a time.
  while (done_ < ready_) reduce(done_++);
}

Tensor GradReducer::bucket_grad(size_t b) {
  RT_CHECK(transient() && b < buckets_.size(), "bucket_grad(", b, ") of ", buckets_.size(),
           " buckets", transient() ? "" : " without transient buckets");
  const Bucket& k = buckets_[b];
  if (bucket_buf_[b].data() == nullptr) {
    const size_t gbytes = size_t(k.count) * dtype_size(grad_.dtype);
    const size_t wbytes = cfg_.wire == grad_.dtype ? 0 : size_t(k.count) * dtype_size(cfg_.wire);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return in_flight_ < max_in_flight() || error_; });
      if (error_) std::rethrow_exception(error_);
      ++in_flight_;
      live_bytes_ += int64_t(gbytes + wbytes);
      peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    }
    MemoryScope in(MemCategory::gradients);  // not the activations of the backward running
    bucket_buf_[b] = Buffer(gbytes, grad_.device);
    if (wbytes > 0) wire_buf_[b] = Buffer(wbytes, grad_.device);
  }
  return Tensor(bucket_buf_[b].data(), {k.count}, grad_.dtype, grad_.device);
}

int64_t GradReducer::bucket_bytes_bound() const {
  const int64_t es = int64_t(dtype_size(grad_.dtype)) +
                     (cfg_.wire == grad_.dtype ? 0 : int64_t(dtype_size(cfg_.wire)));
  std::vector<int64_t> counts;
  for (const auto& k : buckets_) counts.push_back(k.count);
  std::sort(counts.rbegin(), counts.rend());
  int64_t bound = 0;
  for (size_t i = 0; i < counts.size() && i < size_t(max_in_flight()); ++i) bound += counts[i];
  return bound * es;
}

void GradReducer::keep_piece_and_free(size_t b, const Tensor& wire_bucket) {
  const Bucket& k = buckets_[b];
  const int r = comm_.rank();
  const int64_t first = cfg_.shards.begin(r);
  const int64_t lo = std::max(k.offset, first);
  const int64_t hi = std::min(k.offset + k.count, cfg_.shards.end(r));
  if (lo < hi) {
    const int64_t n = hi - lo;
    const Tensor piece = wire_bucket.slice(lo - k.offset, {n});
    float* sums = cfg_.shard_sums.as<float>() + (lo - first);
    std::vector<float> converted;
    const float* src = piece.dtype == DType::f32 ? piece.as<float>() : nullptr;
    if (src == nullptr) {
      converted.resize(size_t(n));
      kernels::host_to_f32(piece.data, piece.dtype, converted.data(), n);
      src = converted.data();
    }
    if (accumulate_)
      for (int64_t i = 0; i < n; ++i) sums[i] += src[i];
    else
      std::copy(src, src + n, sums);
  }
  const int64_t bytes = int64_t(bucket_buf_[b].bytes() + wire_buf_[b].bytes());
  bucket_buf_[b] = Buffer();
  wire_buf_[b] = Buffer();
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_;
  live_bytes_ -= bytes;
  cv_.notify_all();
}

void GradReducer::reduce(size_t b) {
  const Bucket& k = buckets_[b];
  const auto t0 = Clock::now();
  Tensor grad, wire;  // the bucket's part of the gradient and of the wire buffer
  if (transient()) {
    RT_CHECK(bucket_buf_[b].data() != nullptr, "bucket ", b, " reduced before backward wrote it");
    grad = Tensor(bucket_buf_[b].data(), {k.count}, grad_.dtype, grad_.device);
    wire = wire_buf_[b].data() != nullptr
               ? Tensor(wire_buf_[b].data(), {k.count}, cfg_.wire, grad_.device)
               : grad;
  } else {
    grad = grad_.slice(k.offset, {k.count});
    wire = wire_.slice(k.offset, {k.count});
  }
  if (wire.data != grad.data) {
    const Tensor src = grad, dst = wire;
    if (cfg_.cast) {
      cfg_.cast(src, dst);
    } else if (grad_.dtype == DType::f32) {
      kernels::host_from_f32(src.as<float>(), dst.data, dst.dtype, k.count);
    } else if (dst.dtype == DType::f32) {
      kernels::host_to_f32(src.data, src.dtype, dst.as<float>(), k.count);
    } else {  // fp16 <-> bf16 through fp32
      std::vector<float> tmp(static_cast<size_t>(k.count));
      kernels::host_to_f32(src.data, src.dtype, tmp.data(), k.count);
      kernels::host_from_f32(tmp.data(), dst.data, dst.dtype, k.count);
    }
  }
  maybe_inject_fault("reduce", step_);
  if (hold_.reduce && hold_.rank == comm_.rank() && hold_.step == step_ && b == 0) {  // test-only
    std::fprintf(stderr,
                 "ringtrain: test: rank %d held in the gradient reduction of step %lld for %g s\n",
                 comm_.rank(), static_cast<long long>(step_), hold_.seconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(hold_.seconds));
  }
  const FlightBucket in_bucket{int64_t(b)};
  watch_.enter(step_, int64_t(b));
  if (cfg_.shards.empty())
    comm_.allreduce(wire.data, k.count, wire.dtype, ReduceOp::sum);
  else
    comm_.reduce_scatter(wire.data, cfg_.shards.counts_in(k.offset, k.count), wire.dtype,
                         ReduceOp::sum);
  watch_.leave();
  if (transient()) keep_piece_and_free(b, wire);
  const auto t1 = Clock::now();
  comm_s_ += std::chrono::duration<double>(t1 - t0).count();
  spans_.push_back({b, t0, t1});
}

void GradReducer::gather(size_t b) {
  const Bucket& k = buckets_[b];
  const auto t0 = Clock::now();
  maybe_inject_fault("gather", step_);
  // After every reduction of the step in the stall watch's order of positions, so that a
  // rank still reducing counts as behind one that gathers (buckets gather last to first).
  const FlightBucket in_bucket{int64_t(b)};
  watch_.enter(step_, int64_t(2 * buckets_.size() - 1 - b), "weight all-gather", int64_t(b));
  comm_.allgatherv(gather_.slice(k.offset, {k.count}).data,
                   cfg_.shards.counts_in(k.offset, k.count), gather_.dtype);
  if (extra_.data != nullptr && extra_count_[b] > 0)
    comm_.allgatherv(extra_.slice(extra_at_[b], {extra_count_[b]}).data, extra_counts_[b],
                     extra_.dtype);
  watch_.leave();
  const auto t1 = Clock::now();
  gather_s_ += std::chrono::duration<double>(t1 - t0).count();
  spans_.push_back({b, t0, t1, true});
}

double GradReducer::gather_params(const Tensor& dst, int64_t offset, int64_t step, int64_t position,
                                  int64_t unit) {
  RT_CHECK(sharded() && offset >= 0 && offset + dst.numel() <= cfg_.shards.total(),
           "parameter all-gather of [", offset, ", ", offset + dst.numel(), ") over ",
           cfg_.shards.total(), " sharded elements");
  const auto t0 = Clock::now();
  if (cfg_.overlap) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= ready_ || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  maybe_inject_fault("paramgather", step);
  const FlightBucket in_unit{unit};
  watch_.enter(step, position, "parameter all-gather", unit);
  comm_.allgatherv(dst.data, cfg_.shards.counts_in(offset, dst.numel()), dst.dtype);
  watch_.leave();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void GradReducer::run() {
  set_flight_thread_name("comm");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || done_ < ready_ || gathered_ < gather_ready_; });
    if (stop_) return;
    // Reductions first: the all-gather of a step starts only after finish().
    const bool reducing = done_ < ready_;
    const size_t b = reducing ? done_ : buckets_.size() - 1 - gathered_;
    lock.unlock();
    try {
      reducing ? reduce(b) : gather(b);
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      done_ = gathered_ = buckets_.size();
      cv_.notify_all();
      return;
    }
    lock.lock();
    ++(reducing ? done_ : gathered_);
    cv_.notify_all();
  }
}

void GradReducer::start_gather(Tensor work, Tensor extra,
                               std::vector<std::vector<int64_t>> extra_counts) {
  RT_CHECK(sharded(), "all-gather of the working weights without a shard layout");
  RT_CHECK(work.numel() == grad_.numel(), "all-gather of ", work.numel(), " elements over ",
           grad_.numel());
  if (extra.data != nullptr && extra.numel() == 0) extra = Tensor();  // nothing to gather
  // Bucket b's part of `extra` follows the parts of the buckets after it (lower flat
  // offsets): the last bucket's part starts at element 0.
  const size_t nb = buckets_.size();
  std::vector<int64_t> at(nb, 0), count(nb, 0);
  if (extra.data != nullptr) {
    RT_CHECK(extra_counts.size() == nb, "all-gather of fp32 parts of ", extra_counts.size(),
             " buckets over ", nb);
    int64_t total = 0;
    for (size_t b = nb; b-- > 0;) {
      RT_CHECK(int(extra_counts[b].size()) == comm_.size(), "fp32 parts of bucket ", b, " for ",
               extra_counts[b].size(), " ranks");
      at[b] = total;
      for (int64_t c : extra_counts[b]) count[b] += c;
      total += count[b];
    }
    RT_CHECK(total == extra.numel(), "all-gather of ", extra.numel(), " extra elements as ", total);
  }
  std::lock_guard<std::mutex> lock(mu_);
  gather_ = work;
  extra_ = extra;
  extra_counts_ = std::move(extra_counts);
  extra_at_ = std::move(at);
  extra_count_ = std::move(count);
  gather_ready_ = gathered_ = 0;
}

void GradReducer::gather_ready(size_t bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  RT_CHECK(bucket == buckets_.size() - 1 - gather_ready_, "bucket ", bucket,
           " ready to gather before bucket ", buckets_.size() - 1 - gather_ready_);
  ++gather_ready_;
  cv_.notify_all();
}

double GradReducer::wait_gathered(size_t bucket) {
  RT_CHECK(bucket < buckets_.size(), "bucket ", bucket, " of ", buckets_.size());
  const size_t needed = buckets_.size() - bucket;  // buckets gathered from the last one
  const auto t0 = Clock::now();
  if (!cfg_.overlap) {  // the same buckets in the same order, on this thread
    while (gathered_ < needed) gather(buckets_.size() - 1 - gathered_++);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (gathered_ >= needed && !error_) return 0;
  cv_.wait(lock, [&] { return gathered_ >= needed; });
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double GradReducer::finish_gather() { return wait_gathered(0); }

double GradReducer::finish() {
  const auto t0 = Clock::now();
  if (!cfg_.overlap) {  // the same buckets in the same order, after backward
    for (size_t b = done_; b < buckets_.size(); ++b) reduce(b);
    done_ = buckets_.size();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::unique_lock<std::mutex> lock(mu_);
  ready_ = buckets_.size();  // also buckets whose parameters were never marked
  cv_.notify_all();
  cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace ringtrain::comm
