// ProcessGrid (see process_grid.hpp): the placement checks and the MPI sub-communicators.
#include "train/process_grid.hpp"

#include "comm/mpi/mpi_check.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "core/error.hpp"

namespace ringtrain::launch {
namespace {

std::unique_ptr<comm::Communicator> split(MPI_Comm world, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(world, color, key, &c));
  auto out = std::make_unique<comm::MpiCommunicator>(c, false);  // duplicates c
  MPI_CHECK(MPI_Comm_free(&c));
  return out;
}

}  // namespace

ProcessGrid::ProcessGrid(comm::Communicator& world, int t) : world_(&world), tp_(t) {
  const int w = world.size();
  nodes_.assign(size_t(w), 0);
  local_sizes_.assign(size_t(w), 0);
  const int node = world.node(), ls = world.local_size();
  world.allgather(&node, nodes_.data(), 1, DType::i32);
  world.allgather(&ls, local_sizes_.data(), 1, DType::i32);
  if (t < 1 || w % t != 0) return;  // require_placement says so
  dp_ = w / t;
  tp_rank_ = world.rank() % t;
  dp_rank_ = world.rank() / t;
  group_.rank = tp_rank_;
  group_.size = t;
}

void ProcessGrid::require_placement() const {
  const int w = int(nodes_.size()), t = tp_;
  RT_REQUIRE(t >= 1 && w % t == 0, "--tensor-parallel ", t, " does not divide the ", w,
             " ranks; use a T that divides the rank count (ranks = T x data-parallel groups)");
  for (int q = 0; q < w; ++q)
    RT_REQUIRE(local_sizes_[size_t(q)] % t == 0, "--tensor-parallel ", t, " does not divide the ",
               local_sizes_[size_t(q)], " ranks of node ", nodes_[size_t(q)], " (rank ", q,
               "'s); a tensor-parallel group must be on one node: start a multiple of ", t,
               " ranks per node");
  for (int q = 0; q < w; ++q)
    RT_REQUIRE(nodes_[size_t(q)] == nodes_[size_t(q - q % t)], "--tensor-parallel ", t,
               ": tensor-parallel group ", q / t, " (ranks ", q - q % t, "-", q - q % t + t - 1,
               ") would span nodes ", nodes_[size_t(q - q % t)], " and ", nodes_[size_t(q)],
               " (rank ", q,
               "); place consecutive ranks on one node (mpirun --map-by slot or ppr:N:node, "
               "srun --distribution=block)");
}

void ProcessGrid::connect(double stall_timeout_s) {
  if (tp_ == 1) return;
  tp_comm_ = split(world_->mpi(), dp_rank_, tp_rank_);
  dp_comm_ = split(world_->mpi(), tp_rank_, dp_rank_);
  // No control channel: the positions of these waits are not the gradient reduction's that
  // the channel compares, so a stall here ends the job without asking the others.
  watch_ = std::make_unique<comm::StallWatch>(nullptr, stall_timeout_s);
  group_.allreduce_sum = [this](const Tensor& x) {
    watch_->enter(step_, ++position_, "tensor-parallel allreduce (a split layer's sum)");
    tp_comm_->allreduce(x.data, x.numel(), x.dtype, comm::ReduceOp::sum);
    watch_->leave();
  };
}

std::string ProcessGrid::describe() const {
  if (tp_ == 1) return "";
  std::string groups;
  for (int g = 0; g < dp_; ++g) {
    if (g == 3 && dp_ > 4) {
      groups += ", ...";
      break;
    }
    groups +=
        cat(g ? ", " : "", g * tp_, "-", g * tp_ + tp_ - 1, " on node ", nodes_[size_t(g * tp_)]);
  }
  return cat("tensor-parallel ", tp_, " x data-parallel ", dp_, " (groups of ranks ", groups, ")");
}

}  // namespace ringtrain::launch
