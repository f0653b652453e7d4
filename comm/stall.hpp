// Stall detection: never a silent hang. Every rank publishes how far it got (step, bucket)
// on a ProgressBoard (an MPI window each rank writes locally and others read one-sidedly).
// A StallWatch thread watches this rank's collectives: one that waits longer than the
// timeout makes it read the board, print which ranks have not arrived at which step and
// bucket, and end the job with exit code 2.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace ringtrain::comm {

class ProgressBoard {
 public:
  explicit ProgressBoard(MPI_Comm comm);  // collective
  ~ProgressBoard();                       // collective (MPI_Win_free)
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;
  void arrive(int64_t step, int64_t bucket);  // this rank reached (step, bucket)
  // "rank 1 is at step 4 bucket 0; ..." for every rank behind (step, bucket).
  std::string behind(int64_t step, int64_t bucket);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int64_t* mine_ = nullptr;  // [step, bucket]
  int rank_ = 0, size_ = 1;
};

class StallWatch {
 public:
  // timeout_s <= 0 disables the watch.
  StallWatch(ProgressBoard& board, double timeout_s);
  ~StallWatch();
  // Around every wait in a collective of the gradient path.
  void enter(int64_t step, int64_t bucket);
  void leave();

 private:
  void watch();
  ProgressBoard& board_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool inside_ = false, stop_ = false;
  int64_t step_ = 0, bucket_ = 0;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

}  // namespace ringtrain::comm
