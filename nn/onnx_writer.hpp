// OnnxWriter: what an op's ONNX hook (OpDef::onnx, nn/op_registry.hpp) writes its ONNX
// (opset 17) form through, without nn/ depending on the ONNX library: the node's inputs,
// parameters and output name, and the graph's nodes and initialisers. `ringtrain export`
// (launch/onnx_graph.cpp) implements it on onnx::GraphProto; a test may record the calls.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

// An attribute of an ONNX node: an integer, a float or a list of integers.
struct OnnxAttr {
  std::string name;
  std::variant<int64_t, float, std::vector<int64_t>> value;
};

class OnnxWriter {
 public:
  virtual ~OnnxWriter() = default;

  // The node being written: the ONNX value of its k-th input, and the name its output value
  // must have (an op's helper values are named OUTPUT/what).
  virtual std::string input(size_t k) const = 0;
  virtual std::string output() const = 0;
  // The initialiser of the node's parameter `p` (the owner's, for a shared one), whether the
  // node has it; the initialiser of its non-trainable buffer `b`.
  virtual std::string param(const std::string& p) = 0;
  virtual bool has_param(const std::string& p) const = 0;
  virtual std::string buffer(const std::string& b) = 0;
  // The longest token sequence the model takes (the largest context of its token ops, 0
  // when it has none).
  virtual int64_t max_sequence() const = 0;

  // A node of type `op` named `name`, reading `in`, writing `out`.
  virtual void node(const std::string& op, const std::string& name,
                    const std::vector<std::string>& in, const std::vector<std::string>& out,
                    const std::vector<OnnxAttr>& attrs = {}) = 0;
  // A one-output node whose output is named after the node; returns that name.
  std::string op(const std::string& op, const std::string& name, const std::vector<std::string>& in,
                 const std::vector<OnnxAttr>& attrs = {}) {
    node(op, name, in, {name}, attrs);
    return name;
  }
  // An fp32 initialiser, or an int64 vector, added once per name; returns the name.
  virtual std::string weight(const std::string& name, const Shape& shape, const float* data) = 0;
  std::string scalar(const std::string& name, float v) { return weight(name, {}, &v); }
  virtual std::string ints(const std::string& name, const std::vector<int64_t>& v) = 0;
};

// y = act(x) under the name `out` (x itself for NONE): the activation op's ONNX form, also
// written by linear and conv for their fused activation (nn/ops/activation.cpp). Input
// error for a kind with no ONNX form.
std::string write_onnx_activation(OnnxWriter& w, pb::Activation kind, const std::string& x,
                                  const std::string& out);

}  // namespace ringtrain
