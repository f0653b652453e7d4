// Hierarchical allreduce (see hierarchical.hpp).
#include "comm/hierarchical.hpp"

#include "core/error.hpp"

namespace ringtrain::comm {

HierarchicalCommunicator::HierarchicalCommunicator(MPI_Comm comm)
    : world_(std::make_unique<MpiCommunicator>(comm)) {
  node_ = std::make_unique<MpiCommunicator>(world_->node_comm(), false);
  cross_ = std::make_unique<MpiCommunicator>(world_->cross_comm(), false);
  int64_t sizes[2] = {world_->local_size(), -world_->local_size()};  // max, -min
  world_->allreduce(sizes, 2, DType::i64, ReduceOp::max);
  RT_REQUIRE(sizes[0] == -sizes[1],
             "--comm hierarchical needs the same number of ranks on every "
             "node, but nodes hold between ",
             -sizes[1], " and ", sizes[0],
             " ranks (RINGTRAIN_RANKS_PER_NODE, if set, must divide the number of ranks)");
}

void HierarchicalCommunicator::allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  const int l = node_->size();
  if (l == 1 || count < l) {  // nothing to split: node then cross-node allreduce
    node_->allreduce(buf, count, dtype, op);
    cross_->allreduce(buf, count, dtype, op);
    return;
  }
  // Segment r of the node gets count * r / l .. count * (r+1) / l.
  std::vector<int64_t> counts(static_cast<size_t>(l));
  int64_t mine_at = 0;
  for (int r = 0; r < l; ++r) {
    counts[size_t(r)] = count * (r + 1) / l - count * r / l;
    if (r < node_->rank()) mine_at += counts[size_t(r)];
  }
  node_->reduce_scatter(buf, counts, dtype, op);
  char* mine = static_cast<char*>(buf) + mine_at * int64_t(dtype_size(dtype));
  cross_->allreduce(mine, counts[size_t(node_->rank())], dtype, op);
  node_->allgatherv(buf, counts, dtype);
}

}  // namespace ringtrain::comm
