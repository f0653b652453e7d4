// The op registry: each op family (nn/ops/<family>.cpp, or a plugin) registers what the
// graph builder needs of an op — its input count, shape inference, FLOPs and the builder
// of its Layer (whose param_specs() are the op's parameters) — under the name a model
// file uses (`linear { ... }`, or `custom { type: "NAME" }` for plugin ops).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.hpp"

namespace ringtrain::pb {
class Node;
}

namespace ringtrain {

// What an op's functions see of one node: its expanded definition (every `set` applied),
// its full name, and the shape of one sample of each input (no batch dimension).
struct OpNode {
  const pb::Node& def;
  const std::string& name;
  const std::vector<Shape>& inputs;
};

struct OpDef {
  std::string name;
  int min_inputs = 1, max_inputs = 1;  // max_inputs -1: any number
  // One sample's output shape. Throws an input error (RT_REQUIRE) for a bad parameter or
  // input shape; the builder adds the file, line and node to the message.
  std::function<Shape(const OpNode&)> infer;
  // The node's layer, for inputs that passed infer().
  std::function<std::unique_ptr<Layer>(const OpNode&)> build;
  // Forward FLOPs of one sample (a multiply-add counts 2); null: one per output element.
  std::function<double(const OpNode&, const Shape& out)> flops;
};

// Input error when the name is taken (a plugin may not replace a built-in op).
void register_op(OpDef def);
const OpDef* find_op(const std::string& name);  // null when unknown
std::vector<std::string> registered_ops();      // sorted

struct OpRegistrar {
  explicit OpRegistrar(OpDef def) { register_op(std::move(def)); }
};

}  // namespace ringtrain

// At namespace scope in the op's file: RINGTRAIN_REGISTER_OP(my_op, OpDef{...});
#define RINGTRAIN_REGISTER_OP(id, ...) \
  static const ::ringtrain::OpRegistrar rt_op_registrar_##id { __VA_ARGS__ }
