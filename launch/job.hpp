// What a launched process knows about its job (rank, node, host, threads), MPI start-up
// and shut-down, and the one error policy of launch/: setup phases run under agree(), so
// that when any rank fails, exactly one rank prints the message and every rank exits with
// the same code (never a hang, never four copies of the message).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace ringtrain::launch {

// Thrown on every rank after agree() found a failure; main() exits with `code`.
struct JobExit {
  int code;
};

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  comm::Communicator& world() { return *world_; }

 private:
  std::unique_ptr<comm::Communicator> world_;
};

std::string hostname();
// Threads for this rank: the requested number, or the node's cores divided among its ranks.
int threads_for_rank(int requested, const comm::Communicator& comm);

// Runs `fn` on every rank, then agrees on the outcome. On any failure the lowest failing
// rank prints "ringtrain: error: <message>" to stderr and all ranks throw JobExit with the
// highest exit code seen (1 = bad input, 2 = runtime failure).
void agree(comm::Communicator& comm, const std::function<void()>& fn);

// Prints an error raised outside agree() and ends the whole job (MPI_Abort with its code).
[[noreturn]] void abort_job(int code, const std::string& message);

}  // namespace ringtrain::launch
