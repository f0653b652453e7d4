// MPI session, the rank's placement on its node (local rank, GPU, CPUs: the rules of
// launch/ringrun), thread defaults and the run_and_agree()/fail_job() error policy.
#include "train/job.hpp"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>
#include <thread>
#include <vector>

#include "comm/mpi/mpi_check.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/fault_injection.hpp"

namespace ringtrain::launch {
namespace {

// Every RINGTRAIN_* value is checked on every rank before any is read: a bad value that
// only some ranks have (mpirun -x on one rank, a wrapper script) ends every rank with exit 1
// and the lowest such rank's message, before a collective could wait for a rank that left.
void check_settings_on_every_rank() {
  std::string why;
  try {
    env::check_all();
  } catch (const Error& e) {
    why = e.what();
  }
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  int first = why.empty() ? size : rank;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first == size) return;
  if (rank == first)  // which rank: the environment may differ between them
    std::cerr << cat("ringtrain: error: ", why,
                     size > 1 ? cat(" [rank ", rank, " on ", hostname(), "]") : std::string(), "\n")
              << std::flush;
  throw JobExit{1};
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  comm::prefer_yielding_mpi_waits();
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // Errors come back as codes, which MPI_CHECK turns into messages with rank and host.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_settings_on_every_rank();
  world_ = std::make_unique<comm::MpiCommunicator>(MPI_COMM_WORLD);
  control_ = std::make_unique<comm::ControlChannel>(MPI_COMM_WORLD);
  set_fault_rank(world_->rank());
  placement_ = find_placement(*world_);
  if (world_->rank() == 0) {  // a typo'd setting would otherwise be ignored silently
    if (const auto unknown = env::unknown_settings(); !unknown.empty())
      std::cerr << cat("ringtrain: warning: ", env::unknown_settings_message(unknown), "\n")
                << std::flush;
  }
  if (env::verbose()) {
    const Placement& p = placement_;
    // One write per line: through mpirun, pieces of lines from several ranks could interleave.
    std::cerr << cat("ringtrain: host=", hostname(), " rank=", world_->rank(),
                     " size=", world_->size(), " local_rank=", p.local_rank,
                     " local_size=", p.local_size, " source=", p.source, " gpu=", p.gpu,
                     " device=", p.device, " cpus=", p.cpus,
                     " threads=", threads_for_rank(0, *world_), "\n")
              << std::flush;
  }
}

MpiSession::~MpiSession() {
  control_.reset();
  world_.reset();
  MPI_Finalize();
}

std::string hostname() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

bool started_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

namespace {

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

bool parse_uint(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  out = std::stoi(s);
  return true;
}

// A CPU set as a list: 0-3,8.
std::string cpu_list(const cpu_set_t& set) {
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    out += cat(out.empty() ? "" : ",", c, last > c ? cat("-", last) : std::string());
    c = last;
  }
  return out;
}

}  // namespace

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  static const std::regex part(R"((\d+)(\(x(\d+)\))?)");
  int index = 0;
  size_t start = 0;
  while (start <= tasks_per_node.size()) {
    const size_t comma = std::min(tasks_per_node.find(',', start), tasks_per_node.size());
    std::smatch m;
    const std::string item = tasks_per_node.substr(start, comma - start);
    if (!std::regex_match(item, m, part)) return 0;
    const int times = m[3].matched ? std::stoi(m[3]) : 1;
    if (node < index + times) return std::stoi(m[1]);
    index += times;
    start = comma + 1;
  }
  return 0;
}

int choose_gpu(int local_rank, int visible, bool mapped_by_slurm) {
  if (visible <= 0) return -1;
  if (visible == 1 || mapped_by_slurm) return 0;
  return local_rank % visible;
}

Placement find_placement(const comm::Communicator& comm) {
  Placement p;
  // Launcher-specific variables first: mpirun inside a Slurm allocation leaves the batch
  // step's SLURM_LOCALID=0 in every rank's environment. The order is launch/ringrun's.
  struct Vars {
    const char *source, *local_rank, *local_size;
  };
  static const Vars kVars[] = {
      {"ompi", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"mvapich", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"},
      {"mpich", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"pmi", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"},
      {"pals", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"},
      {"pmix", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"},
  };
  for (const Vars& v : kVars) {
    if (!parse_uint(env_or(v.local_rank), p.local_rank)) continue;
    p.source = v.source;
    if (!parse_uint(env_or(v.local_size), p.local_size)) p.local_size = 0;
    break;
  }
  if (p.source.empty() && parse_uint(env_or("SLURM_LOCALID"), p.local_rank)) {
    p.source = "slurm";
    int node = 0;
    parse_uint(env_or("SLURM_NODEID"), node);
    p.local_size = slurm_tasks_on_node(
        env_or("SLURM_STEP_TASKS_PER_NODE", env_or("SLURM_TASKS_PER_NODE")), node);
  }
  if (p.source.empty()) {
    p.source = "mpi";
    p.local_rank = comm.local_rank();
    p.local_size = comm.local_size();
  }
  if (p.local_size < 1) p.local_size = p.local_rank + 1;

  // The GPUs this rank sees: CUDA_VISIBLE_DEVICES if set, else the node's.
  std::vector<std::string> visible;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string list = cvd;
    size_t start = 0;
    while (list != "NoDevFiles" && start < list.size()) {
      const size_t comma = std::min(list.find(',', start), list.size());
      if (comma > start) visible.push_back(list.substr(start, comma - start));
      start = comma + 1;
    }
  } else {
    std::error_code ec;
    int n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
      ++n;
    for (int i = 0; i < n; ++i) visible.push_back(std::to_string(i));
  }
  const std::string per_task = env_or("SLURM_GPUS_PER_TASK", "0");
  const bool slurm_mapped = p.source == "slurm" && ((per_task != "0" && !per_task.empty()) ||
                                                    std::getenv("SLURM_GPU_BIND"));
  p.device = choose_gpu(p.local_rank, int(visible.size()), slurm_mapped);
  if (p.device >= 0) p.gpu = visible[size_t(p.device)];

  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) p.cpus = cpu_list(set);
  return p;
}

namespace {

// The thread count and the rule that gave it.
std::pair<int, const char*> threads_and_rule(int requested, const comm::Communicator& comm) {
  if (requested > 0) return {requested, "--threads"};
  int omp = 0;  // launch/ringrun's share of the cores, or the user's
  if (parse_uint(env_or("OMP_NUM_THREADS"), omp) && omp > 0) return {omp, "OMP_NUM_THREADS"};
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // A rank bound to a CPU set (mpirun --bind-to, which Open MPI does by default for up to 2
  // ranks; srun --cpu-bind; taskset) uses that set; an unbound one shares the node's cores
  // with the other ranks of its node.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int allowed = CPU_COUNT(&set);
    if (allowed > 0 && allowed < cores) return {allowed, "the CPU set this rank is bound to"};
  }
  return {std::max(1, cores / std::max(1, comm.local_size())), "the node's cores / its ranks"};
}

}  // namespace

int threads_for_rank(int requested, const comm::Communicator& comm) {
  return threads_and_rule(requested, comm).first;
}

std::string threads_rule(int requested, const comm::Communicator& comm) {
  return threads_and_rule(requested, comm).second;
}

std::string job_id() {
  for (const char* var : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return "local";
}

std::vector<std::string> rank_hosts(const comm::Communicator& comm) {
  const comm::ControlChannel* channel = comm::ControlChannel::instance();
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r)
    out.push_back(channel && channel->size() == comm.size() ? channel->host_of(r)
                  : r == comm.rank()                        ? hostname()
                                                            : "?");
  return out;
}

void run_and_agree(comm::Communicator& comm, const std::function<void()>& fn) {
  int code = 0;
  std::string message;
  try {
    comm::LocalPhase local;
    fn();
  } catch (const Error& e) {
    code = e.exit_code();
    message = e.what();
  } catch (const std::exception& e) {
    code = 2;
    message = cat("unexpected failure: ", e.what());
  }
  // One failure is reported: the highest exit code and, among the ranks that failed with
  // it, the lowest. One max-allreduce of code * (size + 1) + (size - rank) picks both, so
  // the message printed is always the one whose code is returned.
  const int64_t size = comm.size();
  int64_t v = code ? code * (size + 1) + (size - comm.rank()) : 0;
  comm.allreduce(&v, 1, DType::i64, comm::ReduceOp::max);
  if (v == 0) return;
  const int agreed = int(v / (size + 1));
  if (comm.rank() == size - v % (size + 1)) {
    // One write per message: through mpirun, pieces of a line could interleave with stdout.
    std::cerr << cat("ringtrain: error: ", message,
                     size > 1 && code == 2 ? cat(" [rank ", comm.rank(), " on ", hostname(), "]")
                                           : std::string(),
                     "\n")
              << std::flush;
  }
  throw JobExit{agreed};
}

void fail_job(int code, const std::string& message) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string line =
      cat(message, size > 1 ? cat(" [rank ", rank, " on ", hostname(), "]") : std::string());
  if (comm::ControlChannel* channel = comm::ControlChannel::instance()) channel->fail(code, line);
  std::cerr << cat("ringtrain: error: ", line, "\n") << std::flush;
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace ringtrain::launch
