// The job's control channel: small point-to-point messages between ranks on a duplicate of
// MPI_COMM_WORLD, served by one thread per rank, so that ranks can tell each other about a
// failure, and ask where the others are, while their main and communication threads are
// blocked in collectives. It uses only MPI_Isend, MPI_Irecv and MPI_Test: it works over every
// MPI transport (TCP between hosts included), unlike one-sided windows, which Open MPI's TCP
// path cannot allocate under MPI_THREAD_MULTIPLE.
//
// Failure protocol (docs/architecture.md, "When a rank fails"): the failing rank sends a
// notice to every rank, waits a short grace period for notices from lower ranks, prints its
// message only if no lower rank failed too (so one rank prints), and ends the job with
// MPI_Abort. A rank that only received a notice stays silent and is ended by that abort; if
// it is still alive well after the grace period, it aborts the job itself. Every rank writes
// its flight recorder (comm/flight_recorder.hpp) as it fails or receives a notice and says so
// to the failing rank, which waits up to kDumpWait for those answers before the abort.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ringtrain::comm {

class ControlChannel {
 public:
  // Collective over `world`: duplicates it and gathers every rank's host name. The service
  // thread runs only when the MPI provides MPI_THREAD_MULTIPLE; without it, fail() prints
  // and aborts at once and behind() cannot ask the other ranks.
  explicit ControlChannel(MPI_Comm world);
  // Stops the service thread. Not collective (safe on any path).
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // The process's channel, or nullptr when none was made (unit tests without MpiSession).
  static ControlChannel* instance();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& host_of(int rank) const { return hosts_.at(size_t(rank)); }

  // This rank reached (step, bucket) of the gradient path. Local: two atomic stores.
  void arrive(int64_t step, int64_t bucket);
  // Asks every other rank where it is and waits up to wait_s for the answers. Returns
  // "rank 1 on node1 is at step 4 bucket 0; rank 2 on node2 did not answer within 5 s" for
  // each rank behind (step, bucket) or silent; empty when all answered from at or past it.
  std::string behind(int64_t step, int64_t bucket, double wait_s);

  // Ends the whole job because of an error on this rank (see the protocol above). `message`
  // is printed as "ringtrain: error: <message>" by exactly one failing rank.
  [[noreturn]] void fail(int code, const std::string& message);
  // A failure notice from another rank has arrived (its code, or 0 for none).
  int failure_elsewhere() const { return remote_code_.load(); }

 private:
  enum Kind : int64_t { kFail = 1, kQuery = 2, kReply = 3, kDumped = 4 };
  void serve();  // the service thread
  void post(int to, int64_t kind, int64_t a, int64_t b, int64_t c);
  void progress_sends();  // completes finished sends (lock held)
  void handle(const int64_t* msg, int from);
  void note_failed(int who);  // lowest_failed_ = min(lowest_failed_, who)

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;
  std::atomic<int64_t> at_step_{-1}, at_bucket_{-1};
  std::atomic<int> remote_code_{0};
  std::atomic<int> lowest_failed_{-1};  // lowest rank known to have failed, -1 for none
  std::atomic<bool> failing_{false};
  std::atomic<int> dumped_{0};  // ranks that answered a failure notice with their dump
  std::chrono::steady_clock::time_point notice_time_;

  std::mutex mu_;  // the fields below
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t query_seq_ = 0;
  std::vector<int64_t> reply_seq_;  // per rank: the query its last reply answers
  std::vector<int64_t> reply_step_, reply_bucket_;
  std::vector<MPI_Request> sends_;
  std::vector<std::vector<int64_t>> send_bufs_;
  std::thread thread_;
};

}  // namespace ringtrain::comm
