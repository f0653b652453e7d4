// A recursive-descent evaluator for model-file expressions (grammar in nn/expr.hpp).
#include "nn/expr.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

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

// Parentheses, unary operators, conditionals and calls nest by recursion: a bound keeps a
// hostile file (200,000 '(') from overflowing the stack. Real expressions nest a few levels.
constexpr int kMaxDepth = 100;

// Integer arithmetic is checked: an int64 result that does not fit is an error, never a
// wrapped value (a layer of 16 units from `pow(2, 64) + 16`), and INT64_MIN / -1 is never
// executed (it raises SIGFPE).
bool checked(char op, int64_t a, int64_t b, int64_t& r) {
  switch (op) {
    case '+':
      return !__builtin_add_overflow(a, b, &r);
    case '-':
      return !__builtin_sub_overflow(a, b, &r);
    case '*':
      return !__builtin_mul_overflow(a, b, &r);
    case '/':
      if (a == std::numeric_limits<int64_t>::min() && b == -1) return false;
      r = a / b;
      return true;
    default:  // '%': x % -1 is 0 for every x (INT64_MIN % -1 would trap)
      r = b == -1 ? 0 : a % b;
      return true;
  }
}

class Parser {
 public:
  Parser(const std::string& t, const ExprScope& s) : t_(t), scope_(s) {}

  ExprValue run() {
    ExprValue v = ternary();
    skip();
    if (at_ < t_.size()) fail(cat("unexpected '", t_.substr(at_, 40), "'"));
    return v;
  }

 private:
  // The expression as messages quote it: a hostile one may be megabytes long.
  std::string shown() const {
    if (t_.size() <= 120) return t_;
    return cat(t_.substr(0, 100), "... (", t_.size(), " characters)");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw_input(cat("expression '", shown(), "': ", why));
  }
  // Counts one level of nesting for as long as it lives.
  struct Nest {
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth)
        p_.fail(cat("nested deeper than ", kMaxDepth, " levels (parentheses, unary operators, ",
                    "conditionals and calls); split it with vars"));
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };
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
    const Nest nest(*this);
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
      if (a.kind == ExprValue::Kind::integer && b.kind == ExprValue::Kind::integer)
        return ExprValue::of(int64_t(holds(o, a.i, b.i)));
      return ExprValue::of(int64_t(holds(o, num(a, op), num(b, op))));
    }
    return a;
  }
  // Integers compare exactly (as doubles, 2^53 + 1 == 2^53), mixed ones as doubles.
  template <typename T>
  static bool holds(const std::string& o, T x, T y) {
    if (o == "==") return x == y;
    if (o == "!=") return x != y;
    if (o == "<=") return x <= y;
    if (o == ">=") return x >= y;
    if (o == "<") return x < y;
    return x > y;
  }
  static ExprValue arith(const ExprValue& a, const ExprValue& b, char op, const Parser& p) {
    if (!a.is_number() || !b.is_number())
      p.fail(cat("'", op, "' needs numbers, got '", a.str(), "' and '", b.str(), "'"));
    if (a.kind == ExprValue::Kind::integer && b.kind == ExprValue::Kind::integer) {
      if ((op == '/' || op == '%') && b.i == 0) p.fail("division by zero");
      int64_t r = 0;
      if (!checked(op, a.i, b.i, r))
        p.fail(cat("integer overflow: ", a.i, " ", op, " ", b.i,
                   " is outside the 64-bit integer range; write a real (2.0, not 2) for a "
                   "large value"));
      return ExprValue::of(r);
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
    if (eat("-")) {
      const Nest nest(*this);
      const ExprValue v = unary();
      if (v.kind == ExprValue::Kind::real) return ExprValue::of_real(-v.d);
      return arith(ExprValue::of(int64_t(0)), v, '-', *this);
    }
    if (eat("!")) {
      const Nest nest(*this);
      return ExprValue::of(int64_t(!truth(unary())));
    }
    return primary();
  }
  // base^exp by squaring: log2(exp) steps, each multiplication checked.
  int64_t int_pow(const int64_t base, const int64_t exponent) const {
    int64_t r = 1, b = base, exp = exponent;
    const auto overflow = [&] {
      fail(cat("integer overflow: pow(", base, ", ", exponent,
               ") is outside the 64-bit integer range; write a real (pow(", base, ".0, ", exponent,
               ")) for a large value"));
    };
    while (true) {
      if ((exp & 1) && __builtin_mul_overflow(r, b, &r)) overflow();
      exp >>= 1;
      if (exp == 0) return r;
      // The result still takes a factor (b*b)^exp with exp >= 1: if b*b overflows, so does it.
      if (__builtin_mul_overflow(b, b, &b)) overflow();
    }
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
        return ExprValue::of(int_pow(args[0].i, args[1].i));
      }
      return ExprValue::of_real(std::pow(num(args[0], "pow"), num(args[1], "pow")));
    }
    if (f == "min" || f == "max") {
      need(2);
      const bool ints =
          args[0].kind == ExprValue::Kind::integer && args[1].kind == ExprValue::Kind::integer;
      const bool less =
          ints ? args[0].i < args[1].i : num(args[0], f.c_str()) < num(args[1], f.c_str());
      const bool first = less == (f == "min");
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
      // Parsed in place: copying the rest of the text per number is quadratic in its length.
      const char* first = t_.data() + at_;
      const char* last = t_.data() + t_.size();
      const size_t int_end = t_.find_first_not_of("0123456789", at_);
      const bool real = int_end != std::string::npos &&
                        (t_[int_end] == '.' || t_[int_end] == 'e' || t_[int_end] == 'E');
      const std::string text = t_.substr(at_, std::min<size_t>(32, t_.size() - at_));
      std::from_chars_result got;
      ExprValue v;
      if (real) {
        double d = 0;
        got = std::from_chars(first, last, d);
        v = ExprValue::of_real(d);
      } else {
        int64_t i = 0;
        got = std::from_chars(first, last, i);
        v = ExprValue::of(i);
      }
      if (got.ec == std::errc::result_out_of_range)
        fail(cat("the number at '", text, "' is out of range",
                 real ? "" : " (integers are 64-bit: at most 9223372036854775807)"));
      if (got.ec != std::errc() || got.ptr == first) fail(cat("bad number at '", text, "'"));
      at_ += size_t(got.ptr - first);
      return v;
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
    fail(cat("unexpected '", t_.substr(at_, 40), "'"));
  }

  const std::string& t_;
  const ExprScope& scope_;
  size_t at_ = 0;
  int depth_ = 0;
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
