// The op registry's plugin path without a shared library: registrations held as while a
// plugin's static initialisers run, then applied or refused as a whole (no op, a taken
// name, a name twice, another ABI), each message naming the plugin; and the typed
// attributes of a plugin op, read with their defaults and checked by the graph builder at
// the attribute's FILE:LINE:COLUMN. Also the hooks of the built-in ops (ONNX form, input
// kind).
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model_file.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {
namespace {

// What the test op's infer() last read of its attributes.
struct Seen {
  double factor = 0;
  std::string tag;
  std::vector<int64_t> dims;
  int64_t count = 0;
};
Seen seen;

OpDef identity_op(const std::string& name) {
  return OpDef{.name = name,
               .infer = [](const OpNode& n) -> Shape {
                 seen = {attr_real(n, "factor", 1.5), attr_string(n, "tag", "none"),
                         attr_int_list(n, "dims", {7}), attr_int(n, "count", 3)};
                 return n.inputs[0];
               },
               .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                 return std::make_unique<Flatten>(n.name);
               },
               .flops = nullptr};
}

const std::vector<AttrSpec> kAttrs{{"factor", AttrKind::real},
                                   {"tag", AttrKind::string},
                                   {"dims", AttrKind::int_list},
                                   {"count", AttrKind::integer}};

// The input error of `f`, or "" when it throws none.
template <typename F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind() == ErrorKind::input ? e.what() : cat("(runtime) ", e.what());
  }
  return "";
}

TEST(OpRegistry, PluginRegistrationsApplyTogetherAndRecordThePlugin) {
  begin_plugin_registrations();
  register_op(identity_op("regtest_a"), kAttrs);
  register_op(identity_op("regtest_b"));
  EXPECT_EQ(find_op("regtest_a"), nullptr) << "held until register_plugin_ops";
  register_plugin_ops("/plugins/liba.so");
  ASSERT_NE(find_op("regtest_a"), nullptr);
  ASSERT_NE(find_op("regtest_b"), nullptr);
  EXPECT_EQ(op_plugin("regtest_a"), "/plugins/liba.so");
  EXPECT_EQ(op_plugin("linear"), "");
  EXPECT_EQ(op_attrs("regtest_a").size(), 4u);

  // Refused plugins add nothing, not even their ops that came before the bad one.
  struct Case {
    std::vector<std::pair<std::string, std::string>> ops;  // name, abi
    std::string says;
  };
  const std::vector<Case> cases{
      {{}, "--plugin '/plugins/bad.so' registers no op"},
      {{{"regtest_c", RINGTRAIN_OP_ABI}, {"regtest_a", RINGTRAIN_OP_ABI}},
       "--plugin '/plugins/bad.so' registers op 'regtest_a', which plugin '/plugins/liba.so' "
       "registered"},
      {{{"regtest_c", RINGTRAIN_OP_ABI}, {"conv", RINGTRAIN_OP_ABI}},
       "registers op 'conv', which ringtrain has built in"},
      {{{"regtest_c", RINGTRAIN_OP_ABI}, {"regtest_c", RINGTRAIN_OP_ABI}},
       "registers op 'regtest_c' twice"},
      {{{"regtest_c", "ringtrain 0.0.1, libstdc++ cxx11 abi 1"}},
       "--plugin '/plugins/bad.so' was built against ringtrain 0.0.1, libstdc++ cxx11 abi 1 but "
       "this is " RINGTRAIN_OP_ABI},
  };
  for (const auto& c : cases) {
    begin_plugin_registrations();
    for (const auto& [name, abi] : c.ops) register_op(identity_op(name), {}, abi);
    const std::string msg = input_error([] { register_plugin_ops("/plugins/bad.so"); });
    EXPECT_NE(msg.find(c.says), std::string::npos) << "got '" << msg << "'";
    EXPECT_EQ(find_op("regtest_c"), nullptr) << "after '" << c.says << "'";
  }
  // A failed dlopen drops what was held; registration is direct again afterwards.
  begin_plugin_registrations();
  register_op(identity_op("regtest_c"));
  cancel_plugin_registrations();
  EXPECT_EQ(find_op("regtest_c"), nullptr);
}

std::string plan_error(const std::string& attrs) {
  const std::string text = "node {\n  name: \"t\"\n  custom {\n    type: \"regtest_attrs\"\n" +
                           attrs + "  }\n}\nnode { name: \"out\" linear { out_features: 2 } }\n";
  return input_error([&] {
    ModelFile f = ModelFile::parse(text, "t.pbtxt");
    f.set_data_shape({4}, 2, "test");
    plan_model(f);
  });
}

TEST(OpRegistry, PluginOpAttributesAreReadWithDefaultsAndCheckedWithLocations) {
  if (!find_op("regtest_attrs")) register_op(identity_op("regtest_attrs"), kAttrs);
  // An integer where a real is expected is a real; what is not given reads as the default.
  EXPECT_EQ(plan_error("    attr { name: \"factor\" int_value: 2 }\n"
                       "    attr { name: \"dims\" int_list { value: [3, 4] } }\n"),
            "");
  EXPECT_EQ(seen.factor, 2.0);
  EXPECT_EQ(seen.tag, "none");
  EXPECT_EQ(seen.dims, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(seen.count, 3);
  EXPECT_EQ(plan_error("    attr { name: \"tag\" string_value: \"x\" }\n"
                       "    attr { name: \"count\" int_value: 9 }\n"),
            "");
  EXPECT_EQ(seen.tag, "x");
  EXPECT_EQ(seen.count, 9);
  EXPECT_EQ(seen.factor, 1.5);

  const std::string bad_kind = plan_error(
      "    attr { name: \"factor\" float_value: 1 }\n    attr { name: \"tag\" int_value: 1 }\n");
  EXPECT_EQ(bad_kind.rfind("t.pbtxt:6:5: node 't': attribute 'tag' of op 'regtest_attrs' needs "
                           "a string (string_value)",
                           0),
            0u)
      << bad_kind;
  const std::string unknown = plan_error("    attr { name: \"colour\" int_value: 1 }\n");
  EXPECT_EQ(unknown.rfind("t.pbtxt:5:5: node 't': op 'regtest_attrs' has no attribute 'colour' "
                          "(its attributes: factor, tag, dims, count)",
                          0),
            0u)
      << unknown;
  const std::string twice = plan_error(
      "    attr { name: \"count\" int_value: 1 }\n    attr { name: \"count\" int_value: 2 }\n");
  EXPECT_EQ(twice.rfind("t.pbtxt:6:5: node 't': attribute 'count' is given twice", 0), 0u) << twice;
}

// The hooks the commands ask an op for: every op built into ringtrain has an ONNX form
// (`export` refuses only plugin ops), and the model input's kind is the op's property, not
// its name: `embedding` reads token ids within its vocabulary and context (with or without
// positions), the others samples.
TEST(OpRegistry, BuiltInOpsCarryTheirOnnxFormAndInputKind) {
  int built_in = 0;
  for (const std::string& name : registered_ops()) {
    if (!op_plugin(name).empty() || name.rfind("regtest_", 0) == 0) continue;
    ++built_in;
    const OpDef* op = find_op(name);
    EXPECT_TRUE(op->onnx) << name << " has no ONNX form";
    EXPECT_EQ(op->input_kind == InputKind::tokens, name == "embedding") << name;
    EXPECT_EQ(bool(op->token_limits), op->input_kind == InputKind::tokens) << name;
  }
  EXPECT_GE(built_in, 14);
  pb::Node def;
  def.set_name("embed");
  def.mutable_embedding()->set_vocab_size(300);
  def.mutable_embedding()->set_context(64);
  const std::vector<Shape> in = {{16}};
  const OpNode node{def, def.name(), in};
  const TokenLimits l = find_op("embedding")->token_limits(node);
  EXPECT_EQ(l.vocab, 300);
  EXPECT_EQ(l.context, 64);
  def.mutable_embedding()->set_positional(false);
  // Without positions the context still bounds T: the layer checks it, and export sizes the
  // rotary tables and the causal mask of the model's attention by it.
  EXPECT_EQ(find_op("embedding")->token_limits(node).context, 64) << "no positions";
}

}  // namespace
}  // namespace ringtrain
