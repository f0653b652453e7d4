// The op registry: each op family (nn/ops/<family>.cpp, or a plugin) registers what the
// graph builder and the commands need of an op — its input count, shape inference, FLOPs,
// the builder of its Layer (whose param_specs() are the op's parameters), the kind of model
// input it reads, its ONNX form and, for plugin ops, the attributes it takes — under the
// name a model file uses (`linear { ... }`, or
// `custom { type: "NAME" attr { ... } }` for plugin ops). Plugins (--plugin LIB.so) use
// this header as installed (include/ringtrain/nn/op_registry.hpp); docs/models.md has the
// rules they follow.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.hpp"
#include "ringtrain/config.hpp"

namespace ringtrain {
namespace pb {
class Node;
}
class OnnxWriter;  // nn/onnx_writer.hpp

// What an op's functions see of one node: its expanded definition (every `set` applied),
// its full name, and the shape of one sample of each input (no batch dimension).
struct OpNode {
  const pb::Node& def;
  const std::string& name;
  const std::vector<Shape>& inputs;
};

// The attributes of a plugin op (`custom { attr { name: "beta" float_value: 0.5 } }`). The
// graph builder checks a node's attributes against the op's list before infer() runs, so an
// unknown name or a value of the wrong kind is an error at the attribute's FILE:LINE:COLUMN.
enum class AttrKind { integer, real, string, int_list };  // a real also accepts an integer
struct AttrSpec {
  std::string name;
  AttrKind kind = AttrKind::integer;
};

// What a plugin compiles into its registrations, so that a library built against another
// ringtrain (or another C++ library ABI) is refused by name instead of misbehaving.
#define RINGTRAIN_OP_ABI_STR2(x) #x
#define RINGTRAIN_OP_ABI_STR(x) RINGTRAIN_OP_ABI_STR2(x)
#define RINGTRAIN_OP_ABI         \
  "ringtrain " RINGTRAIN_VERSION \
  ", libstdc++ cxx11 abi " RINGTRAIN_OP_ABI_STR(_GLIBCXX_USE_CXX11_ABI)

// What an op reads when the model input feeds it: samples (images or feature vectors, float)
// or token ids (int32 [T] per sample). A token op states its limits: ids below `vocab`, at
// most `context` positions (0: any length).
enum class InputKind { samples, tokens };
struct TokenLimits {
  int64_t vocab = 0, context = 0;
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
  // The model input this op takes when it reads it (a model of token ops is a language
  // model: `train` wants token data, `export` an int32 input), and a token op's limits.
  InputKind input_kind = InputKind::samples;
  std::function<TokenLimits(const OpNode&)> token_limits = nullptr;
  // The op's ONNX (opset 17) form for `ringtrain export`: writes the node through `w` and
  // returns the ONNX value of its output (w.output(), or an input for an identity in
  // inference). Null: the op cannot be exported.
  std::function<std::string(const OpNode&, OnnxWriter& w)> onnx = nullptr;
};

// Registers `def`; `attrs` are the attributes a plugin op reads (each may be omitted: the
// op has a default), `abi` what the registering code was compiled against. Input error
// when the name is taken (a plugin may not replace a built-in op). While a plugin loads,
// registrations are held for register_plugin_ops() instead.
void register_op(OpDef def, std::vector<AttrSpec> attrs = {}, std::string abi = RINGTRAIN_OP_ABI);
const OpDef* find_op(const std::string& name);  // null when unknown
const OpDef* op_of(const pb::Node& node);       // the op of a model file's node; null: none
std::vector<std::string> registered_ops();      // sorted
// What a registered op took: its attributes, and the plugin library it came from ("" for
// an op built into ringtrain).
const std::vector<AttrSpec>& op_attrs(const std::string& name);
const std::string& op_plugin(const std::string& name);

// Plugin loading (train/model_source.cpp): from begin_plugin_registrations() on, around
// dlopen() (whose static initialisers register the plugin's ops), registrations are held,
// so that no error unwinds through the dynamic loader. register_plugin_ops() then registers
// them, each recording `plugin`: input error naming the plugin when it registers no op, an
// op whose name is taken, or was built against another ringtrain (nothing is registered
// then). cancel_plugin_registrations() drops them (dlopen failed).
void begin_plugin_registrations();
void register_plugin_ops(const std::string& plugin);
void cancel_plugin_registrations();

// A plugin op's attribute `name`, or `fallback` when the node does not give it (the builder
// has checked the kinds against the op's AttrSpecs).
int64_t attr_int(const OpNode& n, const std::string& name, int64_t fallback);
double attr_real(const OpNode& n, const std::string& name, double fallback);
std::string attr_string(const OpNode& n, const std::string& name, const std::string& fallback);
std::vector<int64_t> attr_int_list(const OpNode& n, const std::string& name,
                                   const std::vector<int64_t>& fallback);

// The registrar of RINGTRAIN_REGISTER_OP; inline, so RINGTRAIN_OP_ABI is the one of the
// library the op is compiled into.
struct OpRegistrar {
  explicit OpRegistrar(OpDef def, std::vector<AttrSpec> attrs = {}) {
    register_op(std::move(def), std::move(attrs), RINGTRAIN_OP_ABI);
  }
};

}  // namespace ringtrain

// At namespace scope in the op's file: RINGTRAIN_REGISTER_OP(my_op, OpDef{...}); a plugin op
// adds its attributes: RINGTRAIN_REGISTER_OP(my_op, OpDef{...}, {{"beta", AttrKind::real}}).
#define RINGTRAIN_REGISTER_OP(id, ...) \
  static const ::ringtrain::OpRegistrar rt_op_registrar_##id { __VA_ARGS__ }
