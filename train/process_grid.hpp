// ProcessGrid: the ranks as a T x D grid for tensor parallelism (--tensor-parallel T). A
// tensor-parallel (TP) group is T consecutive ranks of one node (rank r is position r % T of
// group r / T); the data-parallel (DP) communicator of a position joins the D ranks that hold
// the same part of the model, one per group. Layers split across a group sum over its TP
// communicator; gradients are reduced over the DP communicator; the world communicator keeps
// the step's agreement, checkpoints and stall detection. Built from MPI sub-communicators of
// the world's (communicator-generic above that: the layers see a TensorParallelGroup).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/stall.hpp"
#include "nn/layers.hpp"

namespace ringtrain::launch {

class ProcessGrid {
 public:
  ProcessGrid() = default;
  // Collective over `world` (every rank's node, for the checks). T = 1: every rank is its
  // own group (no sub-communicators).
  ProcessGrid(comm::Communicator& world, int t);
  // Input error (every rank the same) when T does not divide the world or a node's ranks,
  // or a group would span nodes. Local.
  void require_placement() const;
  // The sub-communicators, after require_placement. Collective over the world. A wait in a
  // layer's sum over the group longer than `stall_timeout_s` (> 0) ends the job (exit 2,
  // comm/stall.hpp), as one in the gradient reduction does.
  void connect(double stall_timeout_s);
  // The step the layers' sums belong to (for the stall message).
  void set_step(int64_t step) {
    step_ = step;
    position_ = 0;
  }
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int tp_rank() const { return tp_rank_; }
  int dp_rank() const { return dp_rank_; }
  // The gradient reduction's communicator: the DP one, or the world when T = 1.
  comm::Communicator& dp_comm() const { return dp_comm_ ? *dp_comm_ : *world_; }
  // What the split layers use (size 1 when T = 1).
  const TensorParallelGroup* group() const { return &group_; }
  // For the start-up line: "tensor-parallel 2 x data-parallel 2 (groups of ranks 0-1, 2-3 on
  // one node each)".
  std::string describe() const;

 private:
  comm::Communicator* world_ = nullptr;
  int tp_ = 1, dp_ = 1, tp_rank_ = 0, dp_rank_ = 0;
  std::vector<int> nodes_, local_sizes_;  // of every rank
  std::unique_ptr<comm::Communicator> tp_comm_, dp_comm_;
  std::unique_ptr<comm::StallWatch> watch_;
  int64_t step_ = 0, position_ = 0;  // the step, and the sums over the group so far in it
  TensorParallelGroup group_;
};

}  // namespace ringtrain::launch
