// The first stage of planning a model file (nn/graph_builder.cpp's plan_model): expansion of
// the file's nodes -- `when`, `set` expressions, name templates and `repeat` -- into a flat
// list of named nodes whose inputs are still references by name, resolved afterwards.
// Internal to nn/.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/model_file.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain::graph {

// A reference to a node's output, resolved once every node is named.
struct Ref {
  bool model_input = false;
  std::string text;                   // as written (templates expanded)
  std::vector<std::string> prefixes;  // scopes to look in, innermost last
  std::string exact;                  // a full name known at expansion
};

struct Raw {
  std::string name;
  std::shared_ptr<pb::Node> def;
  const pb::Node* source;
  std::vector<Ref> refs;
  // The repeat-body instance the node was expanded in (-1: none): one number per iteration
  // of the innermost repeat, and a new one for an outer body's nodes after an inner repeat,
  // so that each number names one contiguous run of the file's nodes.
  int repeat_body = -1;
};

// The node's op as the registry names it ("conv", or a plugin op's type); "" for none.
std::string op_name(const pb::Node& n);

// An input error "LOC: node 'NODE': WHY" ("LOC: WHY" without a node).
[[noreturn]] void fail_at(const std::string& loc, const std::string& node, const std::string& why);

struct Expansion {
  std::vector<Raw> raws;               // every node, in file order after expansion
  std::map<std::string, Ref> aliases;  // a named repeat: the reference to its last output
};
// Bounds on the work a model file can ask for, checked before the work is done
// (docs/models.md, "Limits"): repeats nested deeper than kMaxRepeatNesting, and more than
// kMaxExpandedNodes nodes visited while expanding (every iteration's body nodes, those a
// `when` drops included), are input errors naming the limit.
inline constexpr size_t kMaxRepeatNesting = 16;
inline constexpr int64_t kMaxExpandedNodes = 200000;

// Expands every node of the file; errors name FILE:LINE:COLUMN and the node.
Expansion expand_nodes(const ModelFile& file);

}  // namespace ringtrain::graph
