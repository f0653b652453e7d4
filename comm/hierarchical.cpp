// Hierarchical allreduce (see hierarchical.hpp).
#include "comm/hierarchical.hpp"

#include "core/error.hpp"

namespace ringtrain::comm {

namespace {

HierarchicalCommunicator::Parts mpi_parts(MPI_Comm comm) {
  auto world = std::make_unique<MpiCommunicator>(comm);
  auto node = std::make_unique<MpiCommunicator>(world->node_comm(), false);
  auto cross = std::make_unique<MpiCommunicator>(world->cross_comm(), false);
  return {std::move(world), std::move(node), std::move(cross)};
}

}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(MPI_Comm comm)
    : HierarchicalCommunicator(mpi_parts(comm), "hierarchical") {}

HierarchicalCommunicator::HierarchicalCommunicator(Parts parts, std::string backend,
                                                   std::function<bool(const void*)> split)
    : world_(std::move(parts.world)),
      node_(std::move(parts.node)),
      cross_(std::move(parts.cross)),
      backend_(std::move(backend)),
      split_(std::move(split)) {
  int64_t sizes[2] = {world_->local_size(), -world_->local_size()};  // max, -min
  world_->allreduce(sizes, 2, DType::i64, ReduceOp::max);            // host memory: the flat path
  RT_REQUIRE(sizes[0] == -sizes[1],
             "--comm hierarchical needs the same number of ranks on every "
             "node, but nodes hold between ",
             -sizes[1], " and ", sizes[0],
             " ranks (RINGTRAIN_RANKS_PER_NODE, if set, must divide the number of ranks)");
}

void HierarchicalCommunicator::allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  if (split_ && !split_(buf)) return world_->allreduce(buf, count, dtype, op);
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
