// ProgressBoard and StallWatch (see stall.hpp).
#include "comm/stall.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <vector>

#include "comm/mpi/mpi_check.hpp"
#include "core/error.hpp"

namespace ringtrain::comm {

ProgressBoard::ProgressBoard(MPI_Comm comm) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(
      MPI_Win_allocate(2 * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, comm_, &mine_, &win_));
  MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank_, 0, win_));
  mine_[0] = mine_[1] = -1;
  MPI_CHECK(MPI_Win_unlock(rank_, win_));
  MPI_CHECK(MPI_Barrier(comm_));
}

ProgressBoard::~ProgressBoard() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ProgressBoard::arrive(int64_t step, int64_t bucket) {
  MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank_, 0, win_));
  mine_[0] = step;
  mine_[1] = bucket;
  MPI_CHECK(MPI_Win_unlock(rank_, win_));
}

std::string ProgressBoard::behind(int64_t step, int64_t bucket) {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    int64_t at[2] = {-1, -1};
    MPI_Win_lock(MPI_LOCK_SHARED, r, 0, win_);
    MPI_Get(at, 2, MPI_INT64_T, r, 0, 2, MPI_INT64_T, win_);
    MPI_Win_unlock(r, win_);
    if (at[0] < step || (at[0] == step && at[1] < bucket))
      out += cat(out.empty() ? "" : "; ", "rank ", r, " is at step ", at[0], " bucket ", at[1]);
  }
  return out;
}

StallWatch::StallWatch(ProgressBoard& board, double timeout_s)
    : board_(board), timeout_s_(timeout_s) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

StallWatch::~StallWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StallWatch::enter(int64_t step, int64_t bucket) {
  board_.arrive(step, bucket);
  std::lock_guard<std::mutex> lock(mu_);
  inside_ = true;
  step_ = step;
  bucket_ = bucket;
  since_ = std::chrono::steady_clock::now();
  cv_.notify_all();
}

void StallWatch::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  inside_ = false;
}

void StallWatch::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (!inside_) continue;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    if (waited < timeout_s_) continue;
    const int64_t step = step_, bucket = bucket_;
    lock.unlock();
    // Reading the board is one-sided; should even that hang, report without it.
    auto who = std::async(std::launch::async, [&] { return board_.behind(step, bucket); });
    std::string behind = who.wait_for(std::chrono::seconds(10)) == std::future_status::ready
                             ? who.get()
                             : "(the other ranks' progress could not be read)";
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    std::fprintf(stderr,
                 "ringtrain: error: stall: rank %d on %s has waited %.0f s (--stall-timeout) in "
                 "the gradient allreduce of step %lld bucket %lld; not arrived: %s\n",
                 rank, host, waited, static_cast<long long>(step), static_cast<long long>(bucket),
                 behind.empty() ? "(none behind: a network or MPI problem)" : behind.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    std::_Exit(2);
  }
}

}  // namespace ringtrain::comm
