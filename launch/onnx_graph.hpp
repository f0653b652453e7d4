// The ONNX form of a model plan, for `ringtrain export` (launch/onnx_export.cpp): GraphWriter
// builds one onnx::GraphProto (nodes, initialisers once per name), and export_nodes() writes
// each planned node as ONNX opset-17 nodes through its op's ONNX hook (OpDef::onnx, beside
// the op in nn/ops/), which sees the graph as an OnnxWriter (nn/onnx_writer.hpp).
#pragma once

#include <onnx/onnx_pb.h>

#include <set>
#include <string>
#include <vector>

#include "nn/graph_builder.hpp"

namespace ringtrain::launch {

// One ONNX graph under construction: nodes, and initialisers added once per name.
class GraphWriter {
 public:
  explicit GraphWriter(onnx::GraphProto& g) : g_(g) {}

  // A node of type `op` named `name`, reading `in`, writing `out`.
  onnx::NodeProto& node(const std::string& op, const std::string& name,
                        const std::vector<std::string>& in, const std::vector<std::string>& out) {
    onnx::NodeProto* n = g_.add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : in) n->add_input(i);
    for (const auto& o : out) n->add_output(o);
    return *n;
  }
  // A one-output node whose output is named after the node; returns that name.
  std::string op(const std::string& op, const std::string& name,
                 const std::vector<std::string>& in) {
    node(op, name, in, {name});
    return name;
  }

  static void attr(onnx::NodeProto& n, const std::string& key, int64_t v) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(key);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr(onnx::NodeProto& n, const std::string& key, float v) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(key);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void attr(onnx::NodeProto& n, const std::string& key, const std::vector<int64_t>& v) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(key);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }

  // An fp32 initialiser (raw little-endian data, as the ONNX format stores it).
  std::string weight(const std::string& name, const Shape& shape, const float* data) {
    if (!inits_.insert(name).second) return name;
    onnx::TensorProto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : shape) t->add_dims(d);
    t->set_raw_data(data, size_t(shape_numel(shape)) * sizeof(float));
    return name;
  }
  std::string scalar(const std::string& name, float v) { return weight(name, {}, &v); }
  std::string ints(const std::string& name, const std::vector<int64_t>& v) {
    if (!inits_.insert(name).second) return name;
    onnx::TensorProto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(int64_t(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
    return name;
  }

 private:
  onnx::GraphProto& g_;
  std::set<std::string> inits_;
};

// Writes the nodes of `plan` (whose parameters and buffers `model` holds, fp32 on the host)
// into `w`, reading the graph input "input"; returns the value name of the last node's
// output. Input error naming the node and op for an op with no ONNX form.
std::string export_nodes(const ModelPlan& plan, Model& model, GraphWriter& w);

}  // namespace ringtrain::launch
