// A recursive-descent evaluator for model-file expressions (grammar in nn/expr.hpp).
#include "nn/expr.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/error.hpp"

namespace ringtrain {

std::string ExprValue::str() const {
  switch (kind) {
    case Kind::integer:
      return std::to_string(i);
    case Kind::real: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", d);
      return buf;
    }
    case Kind::string:
      return s;
    case Kind::list: {
      std::string out = "[";
      for (size_t k = 0; k < list.size(); ++k) out += (k ? ", " : "") + std::to_string(list[k]);
      return out + "]";
    }
  }
  return "";
}

namespace {

class Parser {
 public:
  Parser(const std::string& t, const ExprScope& s) : t_(t), scope_(s) {}

  ExprValue run() {
    ExprValue v = ternary();
    skip();
    if (at_ < t_.size()) fail(cat("unexpected '", t_.substr(at_), "'"));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw_input(cat("expression '", t_, "': ", why));
  }
  void skip() {
    while (at_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[at_]))) ++at_;
  }
  bool eat(const char* op) {
    skip();
    const size_t n = std::char_traits<char>::length(op);
    if (t_.compare(at_, n, op) != 0) return false;
    // "<" must not take the first half of "<=", nor "=" of "==", nor "!" of "!=".
    if (n == 1 && at_ + 1 < t_.size() && t_[at_ + 1] == '=' &&
        std::string("<>!=").find(op[0]) != std::string::npos)
      return false;
    at_ += n;
    return true;
  }
  static int64_t as_int(const ExprValue& v, const Parser& p, const char* what) {
    if (v.kind == ExprValue::Kind::integer) return v.i;
    p.fail(cat(what, " needs an integer, got '", v.str(), "'"));
  }
  double num(const ExprValue& v, const char* op) const {
    if (!v.is_number()) fail(cat("'", op, "' needs numbers, got '", v.str(), "'"));
    return v.number();
  }
  bool truth(const ExprValue& v) const {
    if (!v.is_number()) fail(cat("a condition needs a number, got '", v.str(), "'"));
    return v.number() != 0;
  }

  ExprValue ternary() {
    ExprValue c = logic_or();
    if (!eat("?")) return c;
    ExprValue a = ternary();
    if (!eat(":")) fail("expected ':' after '?'");
    ExprValue b = ternary();
    return truth(c) ? a : b;
  }
  ExprValue logic_or() {
    ExprValue v = logic_and();
    while (eat("||")) {
      ExprValue r = logic_and();
      v = ExprValue::of(int64_t(truth(v) || truth(r)));
    }
    return v;
  }
  ExprValue logic_and() {
    ExprValue v = compare();
    while (eat("&&")) {
      ExprValue r = compare();
      v = ExprValue::of(int64_t(truth(v) && truth(r)));
    }
    return v;
  }
  ExprValue compare() {
    ExprValue a = sum();
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (!eat(op)) continue;
      ExprValue b = sum();
      const std::string o = op;
      if (a.kind == ExprValue::Kind::string || b.kind == ExprValue::Kind::string) {
        if (o != "==" && o != "!=") fail("strings compare only with == and !=");
        return ExprValue::of(int64_t((a.str() == b.str()) == (o == "==")));
      }
      const double x = num(a, op), y = num(b, op);
      const bool r = o == "=="   ? x == y
                     : o == "!=" ? x != y
                     : o == "<=" ? x <= y
                     : o == ">=" ? x >= y
                     : o == "<"  ? x < y
                                 : x > y;
      return ExprValue::of(int64_t(r));
    }
    return a;
  }
  static ExprValue arith(const ExprValue& a, const ExprValue& b, char op, const Parser& p) {
    if (!a.is_number() || !b.is_number())
      p.fail(cat("'", op, "' needs numbers, got '", a.str(), "' and '", b.str(), "'"));
    if (a.kind == ExprValue::Kind::integer && b.kind == ExprValue::Kind::integer) {
      if ((op == '/' || op == '%') && b.i == 0) p.fail("division by zero");
      switch (op) {
        case '+':
          return ExprValue::of(a.i + b.i);
        case '-':
          return ExprValue::of(a.i - b.i);
        case '*':
          return ExprValue::of(a.i * b.i);
        case '/':
          return ExprValue::of(a.i / b.i);
        default:
          return ExprValue::of(a.i % b.i);
      }
    }
    const double x = a.number(), y = b.number();
    switch (op) {
      case '+':
        return ExprValue::of_real(x + y);
      case '-':
        return ExprValue::of_real(x - y);
      case '*':
        return ExprValue::of_real(x * y);
      case '/':
        return ExprValue::of_real(x / y);
      default:
        return ExprValue::of_real(std::fmod(x, y));
    }
  }
  ExprValue sum() {
    ExprValue v = product();
    while (true) {
      if (eat("+"))
        v = arith(v, product(), '+', *this);
      else if (eat("-"))
        v = arith(v, product(), '-', *this);
      else
        return v;
    }
  }
  ExprValue product() {
    ExprValue v = unary();
    while (true) {
      if (eat("*"))
        v = arith(v, unary(), '*', *this);
      else if (eat("/"))
        v = arith(v, unary(), '/', *this);
      else if (eat("%"))
        v = arith(v, unary(), '%', *this);
      else
        return v;
    }
  }
  ExprValue unary() {
    if (eat("-")) return arith(ExprValue::of(int64_t(0)), unary(), '-', *this);
    if (eat("!")) return ExprValue::of(int64_t(!truth(unary())));
    return primary();
  }
  ExprValue call(const std::string& f, const std::vector<ExprValue>& args) {
    auto need = [&](size_t n) {
      if (args.size() != n) fail(cat(f, "() takes ", n, " argument(s), got ", args.size()));
    };
    if (f == "len") {
      need(1);
      if (args[0].kind == ExprValue::Kind::list) return ExprValue::of(int64_t(args[0].list.size()));
      if (args[0].kind == ExprValue::Kind::string) return ExprValue::of(int64_t(args[0].s.size()));
      fail(cat("len() needs a list or a string, got '", args[0].str(), "'"));
    }
    if (f == "pow") {
      need(2);
      if (args[0].kind == ExprValue::Kind::integer && args[1].kind == ExprValue::Kind::integer &&
          args[1].i >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < args[1].i; ++k) r *= args[0].i;
        return ExprValue::of(r);
      }
      return ExprValue::of_real(std::pow(num(args[0], "pow"), num(args[1], "pow")));
    }
    if (f == "min" || f == "max") {
      need(2);
      const bool first = (num(args[0], f.c_str()) < num(args[1], f.c_str())) == (f == "min");
      return first ? args[0] : args[1];
    }
    fail(cat("unknown function '", f, "' (expected len, pow, min or max)"));
  }
  ExprValue primary() {
    skip();
    if (at_ >= t_.size()) fail("unexpected end");
    const char c = t_[at_];
    if (eat("(")) {
      ExprValue v = ternary();
      if (!eat(")")) fail("expected ')'");
      return v;
    }
    if (c == '\'' || c == '"') {
      const size_t end = t_.find(c, at_ + 1);
      if (end == std::string::npos) fail("unterminated string");
      std::string s = t_.substr(at_ + 1, end - at_ - 1);
      at_ = end + 1;
      return ExprValue::of(std::move(s));
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      size_t used = 0;
      const std::string rest = t_.substr(at_);
      const size_t int_len = rest.find_first_not_of("0123456789");
      const bool real = int_len != std::string::npos &&
                        (rest[int_len] == '.' || rest[int_len] == 'e' || rest[int_len] == 'E');
      try {
        if (real) {
          const double v = std::stod(rest, &used);
          at_ += used;
          return ExprValue::of_real(v);
        }
        const int64_t v = std::stoll(rest, &used);
        at_ += used;
        return ExprValue::of(v);
      } catch (const std::exception&) {
        fail(cat("bad number at '", rest, "'"));
      }
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = at_;
      while (end < t_.size() &&
             (std::isalnum(static_cast<unsigned char>(t_[end])) || t_[end] == '_'))
        ++end;
      const std::string id = t_.substr(at_, end - at_);
      at_ = end;
      if (eat("(")) {
        std::vector<ExprValue> args;
        if (!eat(")")) {
          do args.push_back(ternary());
          while (eat(","));
          if (!eat(")")) fail(cat("expected ')' after the arguments of ", id, "()"));
        }
        return call(id, args);
      }
      auto it = scope_.find(id);
      if (it == scope_.end()) {
        std::string names;
        for (const auto& [n, v] : scope_) names += (names.empty() ? "" : ", ") + n;
        fail(cat("unknown name '", id, "' (known here: ", names.empty() ? "none" : names, ")"));
      }
      return it->second;
    }
    fail(cat("unexpected '", t_.substr(at_), "'"));
  }

  const std::string& t_;
  const ExprScope& scope_;
  size_t at_ = 0;
};

}  // namespace

ExprValue eval_expr(const std::string& text, const ExprScope& scope) {
  return Parser(text, scope).run();
}

std::string expand_template(const std::string& text, const ExprScope& scope) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find('{', at);
    if (open == std::string::npos) {
      out += text.substr(at);
      break;
    }
    const size_t close = text.find('}', open);
    RT_REQUIRE(close != std::string::npos, "name template '", text, "' has an unclosed '{'");
    out += text.substr(at, open - at);
    out += eval_expr(text.substr(open + 1, close - open - 1), scope).str();
    at = close + 1;
  }
  return out;
}

}  // namespace ringtrain
