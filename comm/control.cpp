// The control channel (see control.hpp).
#include "comm/control.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "comm/flight_recorder.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "core/error.hpp"

namespace ringtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTag = 7001;
constexpr int kMsgLen = 4;  // kind, a, b, c
// How long a failing rank listens for a lower rank's notice before it prints: notices cross
// a network in well under a millisecond; a second leaves room for a loaded node.
constexpr auto kGrace = std::chrono::milliseconds(1000);
// How long a rank that was told of a failure (or that is silent because a lower rank
// prints) waits for the failing rank's MPI_Abort before it aborts the job itself.
constexpr auto kFallback = std::chrono::seconds(10);
constexpr auto kPoll = std::chrono::milliseconds(5);
// How long the printing rank waits for the other ranks' flight-recorder dumps (each takes
// milliseconds; a dead rank never answers).
constexpr auto kDumpWait = std::chrono::seconds(3);

void dump_flight_recorder(const std::string& reason) {
  if (FlightRecorder* rec = FlightRecorder::instance()) rec->dump_final(reason);
}

std::atomic<ControlChannel*> g_instance{nullptr};

std::string local_hostname() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

[[noreturn]] void abort_world(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void print_error(const std::string& line) {
  // One write: through mpirun, pieces of lines from several ranks could interleave.
  const std::string out = "ringtrain: error: " + line + "\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, out.data(), out.size());
}

// The channel's own point-to-point calls run on its thread (and under post(), on any), where
// an exception cannot reach launch/: a failure of the mechanism that ends failed jobs ends
// the job at once, naming the call and MPI's error.
#define CONTROL_MPI(stmt)                                                             \
  do {                                                                                \
    const int rt_rc_ = (stmt);                                                        \
    if (rt_rc_ != MPI_SUCCESS) {                                                      \
      print_error("the control channel failed: " + mpi_error_context(rt_rc_, #stmt)); \
      abort_world(2);                                                                 \
    }                                                                                 \
  } while (0)

}  // namespace

ControlChannel::ControlChannel(MPI_Comm world) {
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Every rank's host name, so that messages can name where an unreachable rank runs.
  constexpr int kHost = 64;
  char mine[kHost] = {0};
  std::strncpy(mine, local_hostname().c_str(), kHost - 1);
  std::vector<char> all(size_t(size_) * kHost);
  MPI_CHECK(MPI_Allgather(mine, kHost, MPI_CHAR, all.data(), kHost, MPI_CHAR, comm_));
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(all.data() + size_t(r) * kHost);
  reply_seq_.assign(size_t(size_), -1);
  reply_step_.assign(size_t(size_), -1);
  reply_bucket_.assign(size_t(size_), -1);
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level >= MPI_THREAD_MULTIPLE && size_ > 1) thread_ = std::thread([this] { serve(); });
  g_instance.store(this);
}

ControlChannel::~ControlChannel() {
  ControlChannel* self = this;
  g_instance.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ControlChannel* ControlChannel::instance() { return g_instance.load(); }

void ControlChannel::arrive(int64_t step, int64_t bucket) {
  at_bucket_.store(bucket);
  at_step_.store(step);
}

void ControlChannel::post(int to, int64_t kind, int64_t a, int64_t b, int64_t c) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_sends();
  send_bufs_.push_back({kind, a, b, c});
  sends_.push_back(MPI_REQUEST_NULL);
  CONTROL_MPI(
      MPI_Isend(send_bufs_.back().data(), kMsgLen, MPI_INT64_T, to, kTag, comm_, &sends_.back()));
}

void ControlChannel::progress_sends() {
  for (size_t i = 0; i < sends_.size();) {
    int done = 0;
    CONTROL_MPI(MPI_Test(&sends_[i], &done, MPI_STATUS_IGNORE));
    if (done) {
      sends_.erase(sends_.begin() + ptrdiff_t(i));
      send_bufs_.erase(send_bufs_.begin() + ptrdiff_t(i));
    } else {
      ++i;
    }
  }
}

void ControlChannel::note_failed(int who) {
  int cur = lowest_failed_.load();
  while ((cur < 0 || who < cur) && !lowest_failed_.compare_exchange_weak(cur, who)) {
  }
}

void ControlChannel::handle(const int64_t* msg, int from) {
  switch (msg[0]) {
    case kFail: {
      note_failed(int(msg[2]));
      int none = 0;
      if (remote_code_.compare_exchange_strong(none, int(msg[1]))) notice_time_ = Clock::now();
      cv_.notify_all();
      dump_flight_recorder(cat("failure notice from rank ", msg[2], " (exit code ", msg[1], ")"));
      post(from, kDumped, 0, 0, 0);
      break;
    }
    case kDumped: {
      std::lock_guard<std::mutex> lock(mu_);
      dumped_.fetch_add(1);
      cv_.notify_all();
      break;
    }
    case kQuery:
      post(from, kReply, msg[1], at_step_.load(), at_bucket_.load());
      break;
    case kReply: {
      std::lock_guard<std::mutex> lock(mu_);
      reply_seq_[size_t(from)] = msg[1];
      reply_step_[size_t(from)] = msg[2];
      reply_bucket_[size_t(from)] = msg[3];
      cv_.notify_all();
      break;
    }
    default:
      break;
  }
}

void ControlChannel::serve() {
  int64_t buf[kMsgLen];
  MPI_Request req = MPI_REQUEST_NULL;
  CONTROL_MPI(MPI_Irecv(buf, kMsgLen, MPI_INT64_T, MPI_ANY_SOURCE, kTag, comm_, &req));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    progress_sends();
    lock.unlock();
    int got = 0;
    MPI_Status st;
    CONTROL_MPI(MPI_Test(&req, &got, &st));
    if (got) {
      handle(buf, st.MPI_SOURCE);
      CONTROL_MPI(MPI_Irecv(buf, kMsgLen, MPI_INT64_T, MPI_ANY_SOURCE, kTag, comm_, &req));
      lock.lock();
      continue;
    }
    const int code = remote_code_.load();
    if (code != 0 && !failing_.load() && Clock::now() - notice_time_ > kFallback) {
      // The failing rank's MPI_Abort should have ended this process long ago.
      const int who = lowest_failed_.load();
      print_error(cat("rank ", who, " on ", who >= 0 ? hosts_[size_t(who)] : "?",
                      " failed (exit code ", code, ") but the job did not end; rank ", rank_,
                      " on ", hosts_[size_t(rank_)], " aborts it"));
      abort_world(code);
    }
    lock.lock();
    cv_.wait_for(lock, kPoll);
  }
  lock.unlock();
  CONTROL_MPI(MPI_Cancel(&req));
  CONTROL_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
  lock.lock();
  progress_sends();
}

std::string ControlChannel::behind(int64_t step, int64_t bucket, double wait_s) {
  if (!thread_.joinable()) return "";
  int64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++query_seq_;
  }
  for (int r = 0; r < size_; ++r)
    if (r != rank_) post(r, kQuery, seq, 0, 0);
  const auto deadline = Clock::now() + std::chrono::duration<double>(wait_s);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && reply_seq_[size_t(r)] != seq) return false;
    return true;
  });
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto i = size_t(r);
    std::string line;
    if (reply_seq_[i] != seq) {
      line = cat("rank ", r, " on ", hosts_[i], " did not answer within ", wait_s,
                 " s (dead, stopped or unreachable)");
    } else if (reply_step_[i] < step || (reply_step_[i] == step && reply_bucket_[i] < bucket)) {
      line = cat("rank ", r, " on ", hosts_[i], " is at step ", reply_step_[i], " bucket ",
                 reply_bucket_[i]);
    }
    if (!line.empty()) out += (out.empty() ? "" : "; ") + line;
  }
  return out;
}

void ControlChannel::fail(int code, const std::string& message) {
  if (failing_.exchange(true)) {
    // Another thread of this rank is already ending the job.
    std::this_thread::sleep_for(kGrace + kFallback);
    abort_world(code);
  }
  dump_flight_recorder(message);
  if (!thread_.joinable()) {  // one rank, or no MPI_THREAD_MULTIPLE: nobody to arbitrate with
    print_error(message);
    abort_world(code);
  }
  note_failed(rank_);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) post(r, kFail, code, rank_, 0);
  // A lower rank that failed too prints instead; listen for its notice for a moment.
  std::unique_lock<std::mutex> lock(mu_);
  if (rank_ > 0) cv_.wait_for(lock, kGrace, [&] { return lowest_failed_.load() < rank_; });
  const bool printer = lowest_failed_.load() == rank_;
  // The other ranks' dumps before the abort ends them (each answers once it has written).
  if (printer) cv_.wait_for(lock, kDumpWait, [&] { return dumped_.load() >= size_ - 1; });
  lock.unlock();
  if (printer) {
    print_error(message);
  } else {
    // The printer aborts the job; wait for that (its message must not be cut short).
    std::this_thread::sleep_for(kFallback);
  }
  abort_world(code);
}

}  // namespace ringtrain::comm
