// The background checkpoint writer of --async-checkpoint (see async_checkpoint.hpp).
#include "train/async_checkpoint.hpp"

#include <omp.h>

#include <chrono>
#include <cstring>

#include "comm/mpi/mpi_check.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {

namespace {
using SteadyClock = std::chrono::steady_clock;

// Calls fn(view) for every tensor of a State, in one fixed order.
template <typename State, typename Fn>
void for_each_tensor(State& s, Fn&& fn) {
  for (auto& p : s.params) fn(p);
  for (auto& o : s.optimizer)
    for (auto& p : o.per_param) fn(p);
  for (auto& b : s.buffers) fn(b);
}

constexpr size_t kAlign = 64;  // each staged tensor starts on a cache line
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void AsyncCheckpointer::require_supported() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  RT_REQUIRE(level >= MPI_THREAD_MULTIPLE,
             "--async-checkpoint writes from a background thread and needs an MPI with "
             "MPI_THREAD_MULTIPLE, which this one does not provide; leave the option out");
}

AsyncCheckpointer::AsyncCheckpointer(io::CheckpointStore& store, MPI_Comm world,
                                     const State& shape_of)
    : store_(store) {
  require_supported();
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
  allocate(shape_of);
}

AsyncCheckpointer::~AsyncCheckpointer() {
  wait();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void AsyncCheckpointer::allocate(const State& state) {
  size_t total = 0;
  for_each_tensor(state, [&](const io::NamedTensor& t) { total += aligned(t.tensor.bytes()); });
  staging_.reset(new std::byte[std::max<size_t>(total, 1)]);
  // Touched in parallel now (first-touch pages), not during the first save's copy.
  const int64_t pages = int64_t((total + 4095) / 4096);
  std::byte* base = staging_.get();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pages; ++p)
    std::memset(base + p * 4096, 0, std::min<size_t>(4096, total - size_t(p) * 4096));
  staging_bytes_ = total;
  staged_ = state;
  size_t at = 0;
  for_each_tensor(staged_, [&](io::NamedTensor& t) {
    t.tensor.data = base + at;
    t.tensor.device = Device{};  // host memory, whatever the live state's device
    at += aligned(t.tensor.bytes());
  });
}

void AsyncCheckpointer::copy_in(const State& state) {
  // Same tensors as the staging was made for? (The layout never changes within a run; a
  // different one is reallocated rather than trusted.)
  std::vector<std::pair<const io::NamedTensor*, io::NamedTensor*>> pairs;
  bool same = true;
  {
    std::vector<const io::NamedTensor*> live;
    for_each_tensor(state, [&](const io::NamedTensor& t) { live.push_back(&t); });
    std::vector<io::NamedTensor*> staged;
    for_each_tensor(staged_, [&](io::NamedTensor& t) { staged.push_back(&t); });
    same = live.size() == staged.size();
    for (size_t i = 0; same && i < live.size(); ++i)
      same = live[i]->tensor.bytes() == staged[i]->tensor.bytes();
  }
  if (!same) allocate(state);
  // Names, shapes and parts from the live state; data pointers stay the staging's.
  std::vector<const io::NamedTensor*> live;
  for_each_tensor(state, [&](const io::NamedTensor& t) { live.push_back(&t); });
  size_t i = 0;
  for_each_tensor(staged_, [&](io::NamedTensor& t) {
    void* data = t.tensor.data;
    t = *live[i++];
    t.tensor.data = data;
    t.tensor.device = Device{};
  });
  for (size_t s = 0; s < state.optimizer.size(); ++s)
    staged_.optimizer[s].state = state.optimizer[s].state;
  // The copy in pieces of 4 MiB spread over the OpenMP threads (idle at a step boundary).
  struct Piece {
    std::byte* dst;
    const std::byte* src;
    size_t bytes;
  };
  std::vector<Piece> pieces;
  constexpr size_t kPiece = 4 << 20;
  i = 0;
  for_each_tensor(staged_, [&](io::NamedTensor& t) {
    const auto* src = static_cast<const std::byte*>(live[i++]->tensor.data);
    auto* dst = static_cast<std::byte*>(t.tensor.data);
    for (size_t off = 0, n = t.tensor.bytes(); off < n; off += kPiece)
      pieces.push_back({dst + off, src + off, std::min(kPiece, n - off)});
  });
#pragma omp parallel for schedule(dynamic)
  for (int64_t k = 0; k < int64_t(pieces.size()); ++k)
    std::memcpy(pieces[size_t(k)].dst, pieces[size_t(k)].src, pieces[size_t(k)].bytes);
}

double AsyncCheckpointer::wait() {
  if (!writer_.joinable()) return 0;
  const auto t0 = SteadyClock::now();
  writer_.join();
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

double AsyncCheckpointer::start(const io::CheckpointMeta& meta, const State& state) {
  const double waited = wait();
  copy_in(state);
  done_.store(false);
  reported_ = false;
  writer_ = std::thread([this, meta] { write(meta); });
  return waited;
}

std::optional<AsyncCheckpointer::Finished> AsyncCheckpointer::take_finished() {
  if (writer_.joinable()) {
    if (!done_.load()) return std::nullopt;
    writer_.join();
  }
  if (reported_) return std::nullopt;
  reported_ = true;
  return last_;
}

void AsyncCheckpointer::write(io::CheckpointMeta meta) {
  // Nothing may unwind out of this thread: an error ends the job here, as run_or_fail()
  // does for a synchronous save (the other ranks' writers meet the same agreed failure, or
  // are ended by the abort).
  try {
    const auto t0 = SteadyClock::now();
    const uint64_t bytes =
        store_.save(comm_, meta, staged_.params, staged_.optimizer, {}, staged_.buffers);
    last_ = {meta.step, bytes, std::chrono::duration<double>(SteadyClock::now() - t0).count()};
    done_.store(true);
  } catch (const Error& e) {
    fail_job(e.exit_code(), e.what());
  } catch (const std::exception& e) {
    fail_job(2, cat("unexpected failure: ", e.what()));
  }
}

}  // namespace ringtrain::launch
