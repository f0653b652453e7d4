// What a launched process knows about its job (rank, node, host, threads), MPI start-up
// and shut-down, and the one error policy of launch/ and train/ (docs/architecture.md, "When a
// rank fails"): a phase without collectives runs under run_and_agree(), so that when any rank
// fails, one rank prints the message and every rank exits with the same code; an error anywhere
// else (inside the training loop, evaluation, a checkpoint save) goes to fail_job() on the rank
// that saw it, which tells the other ranks over the control channel and ends the job with
// MPI_Abort. Never a hang, never four copies of the message.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/control.hpp"
#include "core/error.hpp"

namespace ringtrain::launch {

// Thrown on every rank after run_and_agree() found a failure; main() exits with `code`.
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
  // With RINGTRAIN_VERBOSE=1 every rank prints its placement line on stderr. Checks every
  // RINGTRAIN_* setting on every rank first: a bad value anywhere throws JobExit{1} on every
  // rank after one rank printed the message (MPI is initialised; the caller finalises it).
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  comm::Communicator& world() { return *world_; }
  comm::ControlChannel& control() { return *control_; }
  const Placement& placement() const { return placement_; }

 private:
  std::unique_ptr<comm::Communicator> world_;
  std::unique_ptr<comm::ControlChannel> control_;
  Placement placement_;
};

std::string hostname();
// The batch system's job id (SLURM_JOB_ID, PBS_JOBID, LSB_JOBID, FLUX_JOB_ID), else "local".
std::string job_id();
// The host of every rank of `comm` (from the control channel; without one, this rank's).
std::vector<std::string> rank_hosts(const comm::Communicator& comm);
// Whether Open MPI's mpirun started this process (OMPI_COMM_WORLD_SIZE is set): it gives
// every rank a pseudo-terminal and forwards Ctrl-C as SIGTERM.
bool started_by_mpirun();
// Threads for this rank: the requested number, else OMP_NUM_THREADS if set (launch/ringrun
// sets it to the rank's share), else the rank's CPU set if bound, else the node's cores
// divided among its ranks.
int threads_for_rank(int requested, const comm::Communicator& comm);

// Threads for this rank and the rule that chose them, for the start-up line: "--threads",
// "OMP_NUM_THREADS", "the CPU set the launcher bound this rank to", "cores / ranks on node".
std::string threads_rule(int requested, const comm::Communicator& comm);

// Runs `fn` on every rank, then agrees on the outcome with one collective. On any failure
// all ranks throw JobExit with the highest exit code seen (1 = bad input, 2 = runtime
// failure), and the lowest rank that failed with that code prints its
// "ringtrain: error: <message>" to stderr: the message shown is the cause of the code. `fn` must
// not run collectives (a comm::LocalPhase is active; the MPI communicator refuses them):
// a rank that failed before one would pair its agreement with the others' collective.
void run_and_agree(comm::Communicator& comm, const std::function<void()>& fn);

// Ends the whole job because of an error on this rank: through the control channel (one
// rank prints, every rank ends within seconds, exit code `code`), else print + MPI_Abort.
[[noreturn]] void fail_job(int code, const std::string& message);

// Runs `fn` (a phase with collectives, e.g. the training loop) and turns any error it raises
// into fail_job() right where it is caught, so that nothing of the phase is unwound further
// (no destructor joins a thread blocked in a collective). JobExit (an agreed exit) passes.
template <typename Fn>
auto run_or_fail(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const JobExit&) {
    throw;
  } catch (const Error& e) {
    fail_job(e.exit_code(), e.what());
  } catch (const std::exception& e) {
    fail_job(2, cat("unexpected failure: ", e.what()));
  }
}

}  // namespace ringtrain::launch
