// export_nodes(): each ringtrain node of a model plan as ONNX opset-17 nodes (see
// onnx_graph.hpp), written by its op's ONNX hook through an OnnxWriter on the GraphWriter.
// Weights are the checkpoint's tensors under their names; a node's output is the ONNX value
// of its name.
#include "launch/onnx_graph.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain::launch {
namespace {

// The OnnxWriter of the plan's nodes, one after the other (at(n) selects the node).
class PlanWriter final : public OnnxWriter {
 public:
  PlanWriter(const ModelPlan& plan, Model& model, GraphWriter& w) : writer_(w) {
    for (Param& p : model.params()) params_[p.name] = &p;
    for (StateBuffer& b : model.buffers()) buffers_[b.name] = &b;
    for (const PlannedNode& n : plan.nodes) {
      const OpDef* op = find_op(n.op);
      if (op && op->token_limits)
        max_sequence_ = std::max(max_sequence_, op->token_limits(op_node(n)).context);
    }
  }

  static OpNode op_node(const PlannedNode& n) { return {*n.def, n.name, n.input_shapes}; }

  // Node n's ONNX form; its output value is what later nodes read.
  void write(const PlannedNode& n) {
    const OpDef* op = find_op(n.op);
    if (!op || !op->onnx) {
      std::string ops;
      for (const std::string& o : registered_ops())
        if (find_op(o)->onnx) ops += cat(ops.empty() ? "" : ", ", o);
      throw_input(cat("node '", n.name, "' (op ", n.op,
                      ") cannot be exported to ONNX; exportable ops: ", ops));
    }
    node_ = &n;
    outs_.push_back(op->onnx(op_node(n), *this));
  }
  const std::string& last() const { return outs_.back(); }

  std::string input(size_t k) const override {
    const int i = node_->inputs.at(k);
    return i < 0 ? std::string("input") : outs_[size_t(i)];
  }
  // Its name, unless that is the graph's input or output name.
  std::string output() const override {
    const std::string& n = node_->name;
    return n == "input" || n == "logits" ? n + "/out" : n;
  }
  std::string param(const std::string& p) override {
    const std::string name = owner(p);
    const auto it = params_.find(name);
    RT_CHECK(it != params_.end(), "node '", node_->name, "': no parameter '", name,
             "' in the model");
    return weight(name, it->second->shape, it->second->master.as<float>());
  }
  bool has_param(const std::string& p) const override { return params_.count(owner(p)) > 0; }
  std::string buffer(const std::string& b) override {
    const std::string name = node_->name + "." + b;
    const auto it = buffers_.find(name);
    RT_CHECK(it != buffers_.end(), "node '", node_->name, "': no buffer '", name, "' in the model");
    return weight(name, it->second->shape, it->second->value.as<float>());
  }
  int64_t max_sequence() const override { return max_sequence_; }

  void node(const std::string& op, const std::string& name, const std::vector<std::string>& in,
            const std::vector<std::string>& out, const std::vector<OnnxAttr>& attrs) override {
    onnx::NodeProto& n = writer_.node(op, name, in, out);
    for (const OnnxAttr& a : attrs)
      std::visit([&](const auto& v) { GraphWriter::attr(n, a.name, v); }, a.value);
  }
  std::string weight(const std::string& name, const Shape& shape, const float* data) override {
    return writer_.weight(name, shape, data);
  }
  std::string ints(const std::string& name, const std::vector<int64_t>& v) override {
    return writer_.ints(name, v);
  }

 private:
  // The checkpoint name of the node's parameter p: its own, or the earlier node's it shares.
  std::string owner(const std::string& p) const {
    for (const pb::Share& s : node_->def->share())
      if (s.param() == p) return s.from();
    return node_->name + "." + p;
  }

  GraphWriter& writer_;
  std::map<std::string, Param*> params_;
  std::map<std::string, StateBuffer*> buffers_;
  int64_t max_sequence_ = 0;
  const PlannedNode* node_ = nullptr;
  std::vector<std::string> outs_;
};

}  // namespace

std::string export_nodes(const ModelPlan& plan, Model& model, GraphWriter& w) {
  PlanWriter writer(plan, model, w);
  for (const PlannedNode& n : plan.nodes) writer.write(n);
  return writer.last();
}

}  // namespace ringtrain::launch
