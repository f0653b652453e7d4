// The table of RINGTRAIN_* environment settings (core/env_table.inc) as data, its typed
// accessors and their validation, and the one place that reads them (see env.hpp).
#include "core/env.hpp"

#include <unistd.h>  // environ

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "core/edit_distance.hpp"
#include "core/error.hpp"

namespace ringtrain::env {
namespace {

std::vector<std::string> split_bar(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t bar; (bar = s.find('|', start)) != std::string::npos; start = bar + 1)
    out.push_back(s.substr(start, bar - start));
  out.push_back(s.substr(start));
  return out;
}

Setting choice(const char* name, const char* values, const char* def, const char* read_by,
               const char* description, const char* see) {
  return {name, Kind::choice, values, def, read_by, description, see, split_bar(values)};
}

Setting flag(const char* name, int def, const char* read_by, const char* description,
             const char* see) {
  return {name, Kind::flag, "0|1", def ? "1" : "0", read_by, description, see, {"0", "1"}};
}

Setting integer(const char* name, int64_t min, int64_t max, const char* unit, const char* def,
                const char* read_by, const char* description, const char* see) {
  const std::string range = max == INT64_MAX ? cat("int ≥ ", min) : cat("int ", min, "..", max);
  Setting s{name, Kind::integer, cat(range, " ", unit), def, read_by, description, see, {}};
  s.min = min;
  s.max = max;
  return s;
}

Setting text(const char* name, const char* form, const char* pattern, const char* read_by,
             const char* description, const char* see) {
  Setting s{name, Kind::text, form, "unset", read_by, description, see, {}};
  s.pattern = pattern;
  return s;
}

Setting script(const char* name, const char* form, const char* def, const char* read_by,
               const char* description, const char* see) {
  return {name, Kind::script, form, def, read_by, description, see, {}};
}

const Setting* find(const std::string& name) {
  for (const auto& s : settings())
    if (name == s.name) return &s;
  return nullptr;
}

const Setting& declared(const char* name) {
  const Setting* s = find(name);
  RT_CHECK(s, "environment setting ", name, " is not declared in core/env_table.inc");
  return *s;
}

// The value a typed accessor works on: the environment's, checked, else the default ("" for
// "unset").
std::string checked_value(const char* name) {
  const Setting& s = declared(name);
  const char* v = std::getenv(name);
  if (v && *v) {
    check(s, v);
    return v;
  }
  return std::strcmp(s.default_value, "unset") == 0 ? "" : s.default_value;
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
#define RT_ENV_CHOICE(fn, name, values, def, read_by, description, see) \
  choice(name, values, def, read_by, description, see),
#define RT_ENV_FLAG(fn, name, def, read_by, description, see) \
  flag(name, def, read_by, description, see),
#define RT_ENV_INT(fn, name, min, max, unit, def, read_by, description, see) \
  integer(name, min, max, unit, def, read_by, description, see),
#define RT_ENV_TEXT(fn, name, form, pattern, read_by, description, see) \
  text(name, form, pattern, read_by, description, see),
#define RT_ENV_SCRIPT(name, form, def, read_by, description, see) \
  script(name, form, def, read_by, description, see),
#include "core/env_table.inc"
#undef RT_ENV_CHOICE
#undef RT_ENV_FLAG
#undef RT_ENV_INT
#undef RT_ENV_TEXT
#undef RT_ENV_SCRIPT
  };
  return table;
}

// The typed accessors.
#define RT_ENV_CHOICE(fn, name, ...) \
  std::string fn() { return checked_value(name); }
#define RT_ENV_FLAG(fn, name, ...) \
  bool fn() { return checked_value(name) == "1"; }
#define RT_ENV_INT(fn, name, ...)              \
  int64_t fn() {                               \
    const std::string v = checked_value(name); \
    return v.empty() ? 0 : std::stoll(v);      \
  }
#define RT_ENV_TEXT(fn, name, ...) \
  std::string fn() { return checked_value(name); }
#define RT_ENV_SCRIPT(...)
#include "core/env_table.inc"
#undef RT_ENV_CHOICE
#undef RT_ENV_FLAG
#undef RT_ENV_INT
#undef RT_ENV_TEXT
#undef RT_ENV_SCRIPT

void check(const Setting& s, const std::string& value) {
  if (value.empty()) return;
  switch (s.kind) {
    case Kind::choice:
    case Kind::flag: {
      if (std::find(s.choices.begin(), s.choices.end(), value) != s.choices.end()) return;
      std::string list;
      for (size_t i = 0; i < s.choices.size(); ++i)
        list += cat(i == 0 ? "" : i + 1 == s.choices.size() ? " or " : ", ", s.choices[i]);
      throw_input(cat(s.name, "='", value, "' is not valid; expected ", list,
                      std::strcmp(s.default_value, "unset") == 0 ? " (or unset)" : ""));
    }
    case Kind::integer: {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == value.size() && value.find_first_not_of("0123456789") == std::string::npos &&
          v >= s.min && v <= s.max)
        return;
      throw_input(cat(s.name, "='", value, "' is not valid; expected an integer ",
                      s.max == INT64_MAX ? cat(">= ", s.min) : cat("from ", s.min, " to ", s.max),
                      " (", s.values.substr(s.values.rfind(' ') + 1), ")"));
    }
    case Kind::text:
      if (!*s.pattern || std::regex_match(value, std::regex(s.pattern))) return;
      throw_input(cat(s.name, "='", value, "' is not valid; expected ", s.values));
    case Kind::script:
      return;
  }
}

void check_all() {
  for (const auto& s : settings())
    if (const char* v = std::getenv(s.name)) check(s, v);
}

const char* raw(const char* name) {
  declared(name);
  return std::getenv(name);
}

std::string value(const char* name) {
  if (const char* v = raw(name)) return v;
  const std::string d = find(name)->default_value;
  return d == "unset" ? "" : d;
}

std::vector<std::string> unknown_settings() {
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "RINGTRAIN_", 10) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name(*e, eq ? size_t(eq - *e) : std::strlen(*e));
    if (!find(name)) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string unknown_settings_message(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    std::string best;
    size_t best_d = 4;  // a typo is a few edits away
    for (const auto& s : settings())
      if (const size_t d = edit_distance(n, s.name); d < best_d) best_d = d, best = s.name;
    out += cat(out.empty() ? "" : "; ", n, " is not a ringtrain setting",
               best.empty() ? "" : cat(" (did you mean ", best, "?)"));
  }
  return out;
}

std::string markdown_table() {
  std::string out = "| variable | values | default | read by | meaning |\n|---|---|---|---|---|\n";
  auto cell = [](std::string s) {  // a | inside a cell would end it
    std::string r;
    for (char c : s) r += c == '|' ? std::string("\\|") : std::string(1, c);
    return r;
  };
  for (const auto& s : settings()) {
    const std::string see = *s.see ? cat(" ([more](", s.see, "))") : "";
    out += cat("| `", s.name, "` | `", cell(s.values), "` | ", s.default_value, " | ", s.read_by,
               " | ", cell(s.description), see, " |\n");
  }
  return out;
}

}  // namespace ringtrain::env
