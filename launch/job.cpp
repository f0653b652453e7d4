// MPI session, thread defaults and the agree()/abort_job() error policy.
#include "launch/job.hpp"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "comm/mpi/mpi_check.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "core/error.hpp"

namespace ringtrain::launch {

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // Errors come back as codes, which MPI_CHECK turns into messages with rank and host.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  world_ = std::make_unique<comm::MpiCommunicator>(MPI_COMM_WORLD);
}

MpiSession::~MpiSession() {
  world_.reset();
  MPI_Finalize();
}

std::string hostname() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

int threads_for_rank(int requested, const comm::Communicator& comm) {
  if (requested > 0) return requested;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // A rank bound to a CPU set (mpirun --bind-to, srun --cpu-bind, taskset) uses that set;
  // an unbound one shares the node's cores with the other ranks of its node.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int allowed = CPU_COUNT(&set);
    if (allowed > 0 && allowed < cores) return allowed;
  }
  return std::max(1, cores / std::max(1, comm.local_size()));
}

void agree(comm::Communicator& comm, const std::function<void()>& fn) {
  int code = 0;
  std::string message;
  try {
    fn();
  } catch (const Error& e) {
    code = e.exit_code();
    message = e.what();
  } catch (const std::exception& e) {
    code = 2;
    message = cat("unexpected failure: ", e.what());
  }
  // [highest code, size - lowest failing rank]: one max-allreduce answers both.
  int64_t v[2] = {code, code ? comm.size() - comm.rank() : 0};
  comm.allreduce(v, 2, DType::i64, comm::ReduceOp::max);
  if (v[0] == 0) return;
  if (code && comm.size() - comm.rank() == v[1]) {
    // One write per message: through mpirun, pieces of a line could interleave with stdout.
    std::cerr << cat("ringtrain: error: ", message,
                     comm.size() > 1 && code == 2
                         ? cat(" [rank ", comm.rank(), " on ", hostname(), "]")
                         : std::string(),
                     "\n")
              << std::flush;
  }
  throw JobExit{int(v[0])};
}

void abort_job(int code, const std::string& message) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::cerr << cat("ringtrain: error: ", message,
                   size > 1 ? cat(" [rank ", rank, " on ", hostname(), "]") : std::string(), "\n")
            << std::flush;
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace ringtrain::launch
