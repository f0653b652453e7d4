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

// Where this rank runs on its node: the rules of launch/ringrun (docs/launching.md), so that
// a rank started without the wrapper uses the GPU the wrapper would have given it.
struct Placement {
  int local_rank = 0;
  int local_size = 1;
  std::string source;        // whose variables: ompi, mvapich, mpich, pmi, pals, pmix, slurm;
                             // mpi when none is set (the ranks sharing memory, from MPI)
  std::string gpu = "none";  // the GPU as CUDA_VISIBLE_DEVICES and nvidia-smi name it
  int device = -1;           // the CUDA ordinal to select among the visible GPUs; -1: none
  std::string cpus;          // the CPUs this process may run on, e.g. "0-3,8"
};

// Local rank and size from the launcher's environment, then the GPU among those visible
// (CUDA_VISIBLE_DEVICES, else /proc/driver/nvidia/gpus); `comm` answers when no launcher
// variable is set.
Placement find_placement(const comm::Communicator& comm);
// Which of `visible` GPUs local rank `local_rank` takes (an index, -1 for none): the only one,
// the first when Slurm mapped GPUs to tasks, else local_rank mod their number.
int choose_gpu(int local_rank, int visible, bool mapped_by_slurm);
// "4(x2),3" (SLURM_STEP_TASKS_PER_NODE) and a node index -> the tasks on that node; 0 if absent.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

class MpiSession {
 public:
  // With RINGTRAIN_VERBOSE=1 every rank prints its placement line on stderr.
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  comm::Communicator& world() { return *world_; }
  const Placement& placement() const { return placement_; }

 private:
  std::unique_ptr<comm::Communicator> world_;
  Placement placement_;
};

std::string hostname();
// Threads for this rank: the requested number, else OMP_NUM_THREADS if set (launch/ringrun
// sets it to the rank's share), else the rank's CPU set if bound, else the node's cores
// divided among its ranks.
int threads_for_rank(int requested, const comm::Communicator& comm);

// Runs `fn` on every rank, then agrees on the outcome. On any failure the lowest failing
// rank prints "ringtrain: error: <message>" to stderr and all ranks throw JobExit with the
// highest exit code seen (1 = bad input, 2 = runtime failure).
void agree(comm::Communicator& comm, const std::function<void()>& fn);

// Prints an error raised outside agree() and ends the whole job (MPI_Abort with its code).
[[noreturn]] void abort_job(int code, const std::string& message);

}  // namespace ringtrain::launch
