// Expansion of a model file's nodes (see graph_expand.hpp): `when` conditions, `set`
// expressions written into the ops' fields, name templates and `repeat` blocks.
#include "nn/graph_expand.hpp"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>

#include "core/error.hpp"

namespace ringtrain::graph {

namespace gp = google::protobuf;

std::string op_name(const pb::Node& n) {
  const gp::OneofDescriptor* oneof = pb::Node::descriptor()->FindOneofByName("op");
  const gp::FieldDescriptor* fd = n.GetReflection()->GetOneofFieldDescriptor(n, oneof);
  if (!fd) return "";
  if (fd->name() == "custom") return n.custom().type();
  return fd->name();
}

void fail_at(const std::string& loc, const std::string& node, const std::string& why) {
  throw_input(node.empty() ? cat(loc, ": ", why) : cat(loc, ": node '", node, "': ", why));
}

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Sets field `set.field` of the node's op from the expression's value.
void apply_set(pb::Node& node, const pb::Set& set, const ExprScope& scope) {
  const gp::OneofDescriptor* oneof = pb::Node::descriptor()->FindOneofByName("op");
  const gp::FieldDescriptor* opf = node.GetReflection()->GetOneofFieldDescriptor(node, oneof);
  RT_REQUIRE(opf, "set: the node has no op to set '", set.field(), "' of");
  const ExprValue v = eval_expr(set.expr(), scope);
  if (opf->name() == "custom") {  // plugin ops: attributes by name
    pb::Attr* a = nullptr;
    for (auto& x : *node.mutable_custom()->mutable_attr())
      if (x.name() == set.field()) a = &x;
    if (!a) {
      a = node.mutable_custom()->add_attr();
      a->set_name(set.field());
    }
    switch (v.kind) {
      case ExprValue::Kind::integer:
        a->set_int_value(v.i);
        break;
      case ExprValue::Kind::real:
        a->set_float_value(v.d);
        break;
      case ExprValue::Kind::string:
        a->set_string_value(v.s);
        break;
      case ExprValue::Kind::list:
        a->mutable_int_list()->mutable_value()->Assign(v.list.begin(), v.list.end());
        break;
    }
    return;
  }
  gp::Message* op = node.GetReflection()->MutableMessage(&node, opf);
  const gp::FieldDescriptor* fd = op->GetDescriptor()->FindFieldByName(set.field());
  if (!fd) {
    std::string fields;
    for (int i = 0; i < op->GetDescriptor()->field_count(); ++i)
      fields += (i ? ", " : "") + op->GetDescriptor()->field(i)->name();
    throw_input(cat("set: op '", opf->name(), "' has no field '", set.field(),
                    "' (its fields: ", fields.empty() ? "none" : fields, ")"));
  }
  const gp::Reflection* r = op->GetReflection();
  // A real converts only when it is a whole number in range (casting 1e30 is undefined).
  auto integer = [&]() -> int64_t {
    if (v.kind == ExprValue::Kind::integer) return v.i;
    if (v.kind == ExprValue::Kind::real && v.d >= -0x1p63 && v.d < 0x1p63 && v.d == std::trunc(v.d))
      return int64_t(v.d);
    throw_input(cat("set: field '", set.field(), "' needs an integer, got '", v.str(), "'"));
  };
  auto int32 = [&]() -> int32_t {
    const int64_t x = integer();
    RT_REQUIRE(x >= INT32_MIN && x <= INT32_MAX, "set: field '", set.field(), "' is 32-bit; ", x,
               " does not fit");
    return int32_t(x);
  };
  auto number = [&]() -> double {
    RT_REQUIRE(v.is_number(), "set: field '", set.field(), "' needs a number, got '", v.str(), "'");
    return v.number();
  };
  if (fd->is_repeated()) {
    RT_REQUIRE(
        fd->cpp_type() == gp::FieldDescriptor::CPPTYPE_INT64 && v.kind == ExprValue::Kind::list,
        "set: field '", set.field(), "' needs a list of integers, got '", v.str(), "'");
    r->ClearField(op, fd);
    for (int64_t x : v.list) r->AddInt64(op, fd, x);
    return;
  }
  switch (fd->cpp_type()) {
    case gp::FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(op, fd, integer());
      break;
    case gp::FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(op, fd, int32());
      break;
    case gp::FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(op, fd, number());
      break;
    case gp::FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(op, fd, float(number()));
      break;
    case gp::FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(op, fd, number() != 0);
      break;
    case gp::FieldDescriptor::CPPTYPE_STRING:
      r->SetString(op, fd, v.str());
      break;
    case gp::FieldDescriptor::CPPTYPE_ENUM: {
      const gp::EnumValueDescriptor* e = v.kind == ExprValue::Kind::string
                                             ? fd->enum_type()->FindValueByName(upper(v.s))
                                             : fd->enum_type()->FindValueByNumber(int32());
      if (!e) {
        std::string names;
        for (int i = 0; i < fd->enum_type()->value_count(); ++i)
          names += (i ? ", " : "") + fd->enum_type()->value(i)->name();
        throw_input(cat("set: '", v.str(), "' is not a value of field '", set.field(),
                        "' (expected one of ", names, ")"));
      }
      r->SetEnum(op, fd, e);
      break;
    }
    default:
      throw_input(cat("set: field '", set.field(), "' cannot be set by an expression"));
  }
}

class Expander {
 public:
  explicit Expander(const ModelFile& f) : f_(f) {}

  // Expands `nodes` in `scope` (a repeat sets its counter in it while its body expands);
  // returns the reference to the last output.
  Ref expand(const gp::RepeatedPtrField<pb::Node>& nodes, ExprScope& scope,
             const std::vector<std::string>& prefixes, const Ref& scope_in, Ref prev) {
    for (const pb::Node& node : nodes) {
      const std::string loc = f_.where(node);
      std::string shown = node.name();
      if (++visited_ > kMaxExpandedNodes)
        fail_at(loc, shown,
                cat("the model has more than ", kMaxExpandedNodes,
                    " nodes after expansion (the limit; nested repeats multiply their counts)"));
      try {
        if (!node.when().empty() && !truth(eval_expr(node.when(), scope))) continue;
        shown = prefixes.back() + expand_template(node.name(), scope);
      } catch (const Error& e) {
        fail_at(f_.where(node, node.when().empty() ? "name" : "when"), shown, e.what());
      }
      auto def = std::make_shared<pb::Node>(node.has_repeat() ? head_of(node) : node);
      for (int k = 0; k < node.set_size(); ++k) {
        try {
          apply_set(*def, node.set(k), scope);
        } catch (const Error& e) {
          fail_at(f_.where(node.set(k)), shown, e.what());
        }
      }
      if (def->has_repeat()) {
        prev = expand_repeat(node, *def, scope, prefixes, scope_in, prev, shown);
        continue;
      }
      if (node.name().empty()) fail_at(loc, "", "a node needs a name");
      if (shown == "input")
        fail_at(f_.where(node, "name"), shown,
                "'input' names the model input; choose another name");
      if (!names_.insert(shown).second)
        fail_at(f_.where(node, "name"), shown, "a node of this name exists already");
      if (op_name(*def).empty())
        fail_at(loc, shown,
                "the node has no op (linear, conv, batch_norm, activation, max_pool, "
                "global_avg_pool, dropout, add, concat, flatten, reshape, custom or repeat)");
      Raw raw{shown, def, &node, {}, body_};
      if (node.input_size() == 0) raw.refs.push_back(prev);
      for (int k = 0; k < node.input_size(); ++k) {
        const std::string t = expand_at(node.input(k), scope, f_.where(node, "input", k), shown);
        raw.refs.push_back(t == "input" ? scope_in : Ref{false, t, prefixes, ""});
      }
      def->clear_input();
      raws_.push_back(std::move(raw));
      prev = Ref{false, "", {}, shown};
    }
    return prev;
  }

  std::vector<Raw>& raws() { return raws_; }
  const std::map<std::string, Ref>& aliases() const { return aliases_; }

 private:
  static bool truth(const ExprValue& v) {
    RT_REQUIRE(v.is_number(), "when: needs a number, got '", v.str(), "'");
    return v.number() != 0;
  }

  // expand_template, its errors located at `loc` (the field the template is in).
  std::string expand_at(const std::string& text, const ExprScope& scope, const std::string& loc,
                        const std::string& shown) {
    try {
      return expand_template(text, scope);
    } catch (const Error& e) {
      fail_at(loc, shown, e.what());
    }
  }

  // A repeat node without its body, copied once per node of the file: the body is read
  // from the file's node, and copying it at every visit would cost its size each time.
  const pb::Node& head_of(const pb::Node& node) {
    std::unique_ptr<pb::Node>& h = heads_[&node];
    if (!h) {
      h = std::make_unique<pb::Node>(node);
      h->mutable_repeat()->clear_node();
    }
    return *h;
  }

  Ref expand_repeat(const pb::Node& node, const pb::Node& def, ExprScope& scope,
                    const std::vector<std::string>& prefixes, const Ref& scope_in, Ref prev,
                    const std::string& shown) {
    const pb::Repeat& r = def.repeat();
    if (prefixes.size() > kMaxRepeatNesting)
      fail_at(f_.where(node), shown,
              cat("repeat: nested ", prefixes.size(), " deep; at most ", kMaxRepeatNesting,
                  " repeats may nest (the limit)"));
    std::vector<int64_t> items;
    int64_t count = r.count();
    if (!r.over().empty()) {
      auto it = scope.find(r.over());
      if (it == scope.end() || it->second.kind != ExprValue::Kind::list)
        fail_at(f_.where(node.repeat(), "over"), shown,
                cat("repeat: over '", r.over(), "' is not an int_list var of this model"));
      count = int64_t(it->second.list.size());
      if (count <= 100000) items = it->second.list;
    }
    if (count < 0 || count > 100000)
      fail_at(f_.where(node), shown,
              cat("repeat: count ", count, " is not valid; expected 0 to 100000"));
    const int64_t body = node.repeat().node_size();
    if (body > 0 && visited_ + count * body > kMaxExpandedNodes)
      fail_at(f_.where(node), shown,
              cat("repeat: ", count, " iterations of ", body, " node(s) would take the model past ",
                  kMaxExpandedNodes,
                  " nodes after expansion (the limit; nested repeats multiply their counts)"));
    int64_t last = 0;
    if (count > 0 && __builtin_add_overflow(r.start(), count - 1, &last))
      fail_at(f_.where(node), shown,
              cat("repeat: start ", r.start(), " + count ", count, " overflows a 64-bit integer"));
    if (node.input_size() > 1)
      fail_at(f_.where(node, "input", 1), shown, "a repeat takes one input");
    Ref in = prev;
    if (node.input_size() == 1) {
      const std::string t = expand_at(node.input(0), scope, f_.where(node, "input", 0), shown);
      in = t == "input" ? scope_in : Ref{false, t, prefixes, ""};
    }
    const std::string index = r.index().empty() ? "i" : r.index();
    // The counter (and `item`) shadow any outer value while the body expands; restored after.
    std::map<std::string, std::optional<ExprValue>> saved;
    for (const std::string& name : {index, std::string("item")}) {
      auto it = scope.find(name);
      saved[name] = it == scope.end() ? std::nullopt : std::optional<ExprValue>(it->second);
    }
    const int outer_body = body_;
    for (int64_t k = 0; k < count; ++k) {
      body_ = next_body_++;
      scope[index] = ExprValue::of(r.start() + k);
      if (!items.empty()) scope["item"] = ExprValue::of(items[size_t(k)]);
      const std::string p =
          prefixes.back() + expand_at(r.prefix(), scope, f_.where(node.repeat(), "prefix"), shown);
      std::vector<std::string> inner = prefixes;
      inner.push_back(p);
      Ref out = expand(node.repeat().node(), scope, inner, in, in);
      if (!r.output().empty())
        out = Ref{false,
                  "",
                  {},
                  p + expand_at(r.output(), scope, f_.where(node.repeat(), "output"), shown)};
      in = out;
    }
    body_ = outer_body < 0 ? -1 : next_body_++;  // the rest of an outer body: a new run
    for (auto& [name, value] : saved) {
      if (value)
        scope[name] = *value;
      else
        scope.erase(name);
    }
    if (!node.name().empty()) aliases_[shown] = in;
    return in;
  }

  const ModelFile& f_;
  std::vector<Raw> raws_;
  std::set<std::string> names_;
  std::map<std::string, Ref> aliases_;
  std::map<const pb::Node*, std::unique_ptr<pb::Node>> heads_;
  int64_t visited_ = 0;
  int body_ = -1, next_body_ = 0;  // Raw::repeat_body of the nodes being expanded; the next
};

}  // namespace

Expansion expand_nodes(const ModelFile& file) {
  Expander ex(file);
  const Ref input{true, "input", {}, ""};
  ExprScope scope = file.scope();
  ex.expand(file.def().node(), scope, {""}, input, input);
  return Expansion{std::move(ex.raws()), ex.aliases()};
}

}  // namespace ringtrain::graph
