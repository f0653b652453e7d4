// The expressions of model files (`set { expr }`, `when`, name templates "block{i}."):
// integers, reals, strings and integer lists from the model's vars and the counters of
// enclosing repeats; + - * / % (integer division on integers), comparisons, && || !, c ? a : b,
// and len(list), pow(a, b), min(a, b), max(a, b). docs/models.md has the grammar.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ringtrain {

struct ExprValue {
  enum class Kind { integer, real, string, list } kind = Kind::integer;
  int64_t i = 0;
  double d = 0;
  std::string s;
  std::vector<int64_t> list;

  static ExprValue of(int64_t v) { return {Kind::integer, v, double(v), {}, {}}; }
  static ExprValue of_real(double v) { return {Kind::real, 0, v, {}, {}}; }
  static ExprValue of(std::string v) { return {Kind::string, 0, 0, std::move(v), {}}; }
  static ExprValue of(std::vector<int64_t> v) { return {Kind::list, 0, 0, {}, std::move(v)}; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::real; }
  double number() const { return kind == Kind::integer ? double(i) : d; }
  std::string str() const;  // as written in a name or message
};

using ExprScope = std::map<std::string, ExprValue>;

// Input error (without a location: the caller adds it) for a malformed expression, an
// unknown name or a type mismatch.
ExprValue eval_expr(const std::string& text, const ExprScope& scope);
// "fc{i + 1}" -> "fc3": each {expr} replaced by its value.
std::string expand_template(const std::string& text, const ExprScope& scope);

}  // namespace ringtrain
