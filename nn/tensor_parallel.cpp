// The tensor-parallel plan of a model (see tensor_parallel.hpp): the GPT block's attention and
// MLP found by their shape in the graph, checked, and their layers split.
#include "nn/tensor_parallel.hpp"

#include "core/error.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {
namespace {

// The nodes that read each node's output.
std::vector<std::vector<size_t>> readers_of(const ModelPlan& plan) {
  std::vector<std::vector<size_t>> r(plan.nodes.size());
  for (size_t n = 0; n < plan.nodes.size(); ++n)
    for (int in : plan.nodes[n].inputs)
      if (in >= 0) r[size_t(in)].push_back(n);
  return r;
}

bool is_last_axis_linear(const PlannedNode& n) {
  return n.op == "linear" && n.def->has_linear() && n.def->linear().last_axis();
}

}  // namespace

const char* tensor_split_role_name(TensorSplitRole role) {
  switch (role) {
    case TensorSplitRole::column:
      return "column-parallel";
    case TensorSplitRole::row:
      return "row-parallel";
    case TensorSplitRole::heads:
      return "heads split";
  }
  return "?";
}

std::vector<TensorSplitNode> plan_tensor_parallel(const ModelPlan& plan, int t) {
  std::vector<TensorSplitNode> out;
  if (t <= 1) return out;
  const auto readers = readers_of(plan);
  std::vector<char> taken(plan.nodes.size(), 0);
  auto node_name = [&](size_t i) { return cat("node '", plan.nodes[i].name, "'"); };
  auto only_reader = [&](size_t i, const char* what) {
    RT_REQUIRE(readers[i].size() == 1, "--tensor-parallel ", t, ": ", node_name(i), " (", what,
               ") is read by ", readers[i].size(),
               " nodes; a split block needs exactly one reader of it (its output is a part)");
    return readers[i][0];
  };
  // Attention: qkv (column-parallel, q, k, v each by heads) -> attention (heads) -> proj (row).
  for (size_t a = 0; a < plan.nodes.size(); ++a) {
    if (plan.nodes[a].op != "attention") continue;
    const PlannedNode& attn = plan.nodes[a];
    RT_REQUIRE(attn.inputs.size() == 1 && attn.inputs[0] >= 0 &&
                   is_last_axis_linear(plan.nodes[size_t(attn.inputs[0])]),
               "--tensor-parallel ", t, ": ", node_name(a),
               " (attention) cannot be split: its input is not a linear layer over the last "
               "axis (the fused q, k, v projection a split attention reads its heads from)");
    const size_t qkv = size_t(attn.inputs[0]);
    only_reader(qkv, "the qkv projection");
    const int64_t heads = attn.def->attention().heads();
    RT_REQUIRE(heads % t == 0, "--tensor-parallel ", t, ": ", node_name(a), " (attention) has ",
               heads, " heads, which do not divide into ", t, " groups; use a T that divides ",
               heads);
    const size_t proj = only_reader(a, "attention");
    RT_REQUIRE(is_last_axis_linear(plan.nodes[proj]), "--tensor-parallel ", t, ": ",
               node_name(proj), " reads the split ", node_name(a),
               " but is not a linear layer over the last axis (the row-parallel output "
               "projection)");
    out.push_back({qkv, TensorSplitRole::column, 3});
    out.push_back({a, TensorSplitRole::heads, 1});
    out.push_back({proj, TensorSplitRole::row, 1});
    taken[qkv] = taken[a] = taken[proj] = 1;
  }
  // MLP: linear (column) -> activation (local) -> linear (row).
  for (size_t f = 0; f < plan.nodes.size(); ++f) {
    if (taken[f] || !is_last_axis_linear(plan.nodes[f]) || readers[f].size() != 1) continue;
    const size_t act = readers[f][0];
    if (plan.nodes[act].op != "activation" || readers[act].size() != 1) continue;
    const size_t proj = readers[act][0];
    if (taken[proj] || !is_last_axis_linear(plan.nodes[proj])) continue;
    if (plan.nodes[f].def->linear().activation() != pb::NONE) continue;
    out.push_back({f, TensorSplitRole::column, 1});
    out.push_back({proj, TensorSplitRole::row, 1});
    taken[f] = taken[proj] = 1;
  }
  RT_REQUIRE(!out.empty(), "--tensor-parallel ", t,
             ": the model has no transformer block to split (an attention fed by a linear qkv "
             "projection, or linear -> activation -> linear over the last axis); use "
             "--tensor-parallel 1");
  return out;
}

void apply_tensor_parallel(std::vector<GraphNode>& nodes, const ModelPlan& plan,
                           const std::vector<TensorSplitNode>& split,
                           const TensorParallelGroup* group) {
  RT_CHECK(nodes.size() == plan.nodes.size(), "tensor parallelism: ", nodes.size(), " layers for ",
           plan.nodes.size(), " planned nodes");
  for (const TensorSplitNode& s : split) {
    Layer& layer = *nodes[s.node].layer;
    const std::string why = layer.split_tensor_parallel(s.role, s.groups, group);
    RT_REQUIRE(why.empty(), "--tensor-parallel ", group->size, ": node '", plan.nodes[s.node].name,
               "' (", plan.nodes[s.node].op, ") cannot be ", tensor_split_role_name(s.role), ": ",
               why);
  }
}

}  // namespace ringtrain
