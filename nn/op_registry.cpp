// The op registry's table (filled by static registrars in nn/ops/ and plugins), the held
// registrations of a plugin being loaded, and the attribute accessors of plugin ops.
#include "nn/op_registry.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "nn/graph_expand.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

namespace {

struct Entry {
  OpDef def;
  std::vector<AttrSpec> attrs;
  std::string abi, plugin;
};

// Function-local statics: registrars of other files may run before this file's statics.
std::map<std::string, Entry>& table() {
  static std::map<std::string, Entry> t;
  return t;
}
// Set while a plugin's static initialisers run (begin_plugin_registrations).
std::optional<std::vector<Entry>>& held() {
  static std::optional<std::vector<Entry>> h;
  return h;
}

const Entry& entry(const std::string& name) {
  auto it = table().find(name);
  RT_CHECK(it != table().end(), "op '", name, "' is not registered");
  return it->second;
}

const pb::Attr* find_attr(const OpNode& n, const std::string& name) {
  for (const pb::Attr& a : n.def.custom().attr())
    if (a.name() == name) return &a;
  return nullptr;
}

}  // namespace

void register_op(OpDef def, std::vector<AttrSpec> attrs, std::string abi) {
  Entry e{std::move(def), std::move(attrs), std::move(abi), {}};
  if (held()) {
    held()->push_back(std::move(e));
    return;
  }
  RT_REQUIRE(!e.def.name.empty() && e.def.infer && e.def.build,
             "an op registers a name, infer and build");
  RT_REQUIRE(!table().count(e.def.name), "op '", e.def.name,
             "' is registered twice (a plugin may not replace an op ringtrain has)");
  std::string name = e.def.name;
  table().emplace(std::move(name), std::move(e));
}

const OpDef* find_op(const std::string& name) {
  auto it = table().find(name);
  return it == table().end() ? nullptr : &it->second.def;
}

const OpDef* op_of(const pb::Node& node) { return find_op(graph::op_name(node)); }

std::vector<std::string> registered_ops() {
  std::vector<std::string> out;
  for (const auto& [n, e] : table()) out.push_back(n);
  return out;
}

const std::vector<AttrSpec>& op_attrs(const std::string& name) { return entry(name).attrs; }
const std::string& op_plugin(const std::string& name) { return entry(name).plugin; }

void begin_plugin_registrations() { held().emplace(); }

void cancel_plugin_registrations() { held().reset(); }

void register_plugin_ops(const std::string& plugin) {
  RT_CHECK(held(), "register_plugin_ops() without begin_plugin_registrations()");
  std::vector<Entry> ops = std::move(*held());
  held().reset();
  RT_REQUIRE(!ops.empty(), "--plugin '", plugin,
             "' registers no op (a plugin registers its ops with RINGTRAIN_REGISTER_OP from "
             "nn/op_registry.hpp; docs/models.md#extending-in-c)");
  // Every check before the first insertion: a refused plugin adds nothing.
  for (size_t i = 0; i < ops.size(); ++i) {
    const Entry& e = ops[i];
    RT_REQUIRE(e.abi == RINGTRAIN_OP_ABI, "--plugin '", plugin, "' was built against ", e.abi,
               " but this is ", RINGTRAIN_OP_ABI,
               "; rebuild it against this installation (find_package(ringtrain))");
    RT_REQUIRE(!e.def.name.empty() && e.def.infer && e.def.build, "--plugin '", plugin,
               "' registers an op without a name, infer or build");
    if (auto had = table().find(e.def.name); had != table().end())
      throw_input(cat("--plugin '", plugin, "' registers op '", e.def.name, "', which ",
                      had->second.plugin.empty()
                          ? std::string("ringtrain has built in")
                          : cat("plugin '", had->second.plugin, "' registered"),
                      "; give the op another name"));
    for (size_t j = 0; j < i; ++j)
      RT_REQUIRE(ops[j].def.name != e.def.name, "--plugin '", plugin, "' registers op '",
                 e.def.name, "' twice");
  }
  for (Entry& e : ops) {
    e.plugin = plugin;
    std::string name = e.def.name;
    table().emplace(std::move(name), std::move(e));
  }
}

int64_t attr_int(const OpNode& n, const std::string& name, int64_t fallback) {
  const pb::Attr* a = find_attr(n, name);
  return a ? a->int_value() : fallback;
}

double attr_real(const OpNode& n, const std::string& name, double fallback) {
  const pb::Attr* a = find_attr(n, name);
  if (!a) return fallback;
  return a->has_int_value() ? double(a->int_value()) : a->float_value();
}

std::string attr_string(const OpNode& n, const std::string& name, const std::string& fallback) {
  const pb::Attr* a = find_attr(n, name);
  return a ? a->string_value() : fallback;
}

std::vector<int64_t> attr_int_list(const OpNode& n, const std::string& name,
                                   const std::vector<int64_t>& fallback) {
  const pb::Attr* a = find_attr(n, name);
  if (!a) return fallback;
  return {a->int_list().value().begin(), a->int_list().value().end()};
}

}  // namespace ringtrain
