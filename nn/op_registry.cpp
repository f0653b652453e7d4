// The op registry's table (filled by static registrars in nn/ops/ and plugins).
#include "nn/op_registry.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"

namespace ringtrain {

namespace {

// A function-local static: registrars of other files may run before this file's statics.
std::map<std::string, OpDef>& table() {
  static std::map<std::string, OpDef> t;
  return t;
}

}  // namespace

void register_op(OpDef def) {
  RT_REQUIRE(!def.name.empty() && def.infer && def.build,
             "an op registers a name, infer and build");
  RT_REQUIRE(!table().count(def.name), "op '", def.name,
             "' is registered twice (a plugin may not replace an op ringtrain has)");
  std::string name = def.name;
  table().emplace(std::move(name), std::move(def));
}

const OpDef* find_op(const std::string& name) {
  auto it = table().find(name);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> out;
  for (const auto& [n, d] : table()) out.push_back(n);
  return out;
}

}  // namespace ringtrain
