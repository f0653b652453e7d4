// Tensor parallelism's plan of a model (Megatron-LM's split of a transformer block), for the
// graph builder and `model show`: which nodes are split and how. In each GPT block the fused
// qkv projection is column-parallel (q, k and v each by heads), the attention runs this
// rank's heads, its output projection is row-parallel (one sum over the group in forward);
// the MLP's first linear layer is column-parallel, its activation local, its second linear
// row-parallel. A column-parallel layer sums its input gradient over the group in backward.
// Every other node (embedding, norms, residual adds, the head) runs whole on every rank:
// its input is the same on every rank of the group, and so are its parameters' gradients.
#pragma once

#include <string>
#include <vector>

#include "nn/graph_builder.hpp"

namespace ringtrain {

struct TensorSplitNode {
  size_t node = 0;  // index into ModelPlan::nodes
  TensorSplitRole role = TensorSplitRole::column;
  int64_t groups = 1;  // equal blocks of the outputs split separately (qkv: 3)
};

// The split nodes of `plan` under `t` ranks per group. Input error naming the node when a
// block's node cannot be split so (heads or widths that do not divide by t, a consumer that
// would read a partial tensor), or when the model has nothing to split.
std::vector<TensorSplitNode> plan_tensor_parallel(const ModelPlan& plan, int t);

// Splits the layers of `nodes` (make_graph_nodes of `plan`, before the Model is built) as
// `split` says, for this rank's place in `group` (which outlives the model).
void apply_tensor_parallel(std::vector<GraphNode>& nodes, const ModelPlan& plan,
                           const std::vector<TensorSplitNode>& split,
                           const TensorParallelGroup* group);

const char* tensor_split_role_name(TensorSplitRole role);

}  // namespace ringtrain
