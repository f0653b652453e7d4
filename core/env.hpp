// The RINGTRAIN_* environment settings, declared once in one table (core/env_table.inc), as
// NCCL declares its NCCL_PARAMs: name, type, the values it takes, default, who reads it and
// one line of meaning. The program reads a setting only through its typed accessor below
// (env::direct_read(), env::cuda_gemm_workspace_mb(), ...), which returns the table's
// default when the variable is unset and refuses a value the table does not allow (an input
// error naming the variable, the value and what it takes), so no reader restates a default
// or a rule; a unit test checks that no source reads RINGTRAIN_* around them.
// check_all() validates the whole environment at start-up (launch/ agrees on it across
// ranks); docs/usage.md's table is markdown_table() (a unit test checks that the two agree,
// and prints the table to paste when they do not). A RINGTRAIN_* variable in the
// environment that the table does not declare is most likely a typo: unknown_settings()
// names them for one warning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringtrain::env {

// The typed accessors, one per setting the program reads (the table's first column).
#define RT_ENV_CHOICE(fn, ...) std::string fn();
#define RT_ENV_FLAG(fn, ...) bool fn();
#define RT_ENV_INT(fn, ...) int64_t fn();
#define RT_ENV_TEXT(fn, ...) std::string fn();
#define RT_ENV_SCRIPT(...)
#include "core/env_table.inc"
#undef RT_ENV_CHOICE
#undef RT_ENV_FLAG
#undef RT_ENV_INT
#undef RT_ENV_TEXT
#undef RT_ENV_SCRIPT

enum class Kind { choice, flag, integer, text, script };

struct Setting {
  const char* name;  // "RINGTRAIN_GEMM"
  Kind kind;
  std::string values;         // as the docs show them: "auto|onednn|openblas", "int 0..65536 MiB"
  const char* default_value;  // as a user would write it; "unset" where absence means off
  const char* read_by;        // "ringtrain", or the scripts that read it
  const char* description;    // one line
  const char* see;            // where the docs explain it ("usage.md#data-loading"), or ""
  // Validation: the allowed words (choice, flag), the range (integer), the form (text; a
  // regular expression over the whole value, "" for none).
  std::vector<std::string> choices;
  int64_t min = 0, max = 0;
  const char* pattern = "";
};

// Every setting, in the order the docs list them.
const std::vector<Setting>& settings();

// The environment's value of a declared setting, or nullptr when it is unset. A name the
// table does not declare is a programming error (a runtime error naming it). For the
// accessors and tests: readers call the typed accessor.
const char* raw(const char* name);
// The environment's value, or the table's default when unset ("" for "unset").
std::string value(const char* name);

// Input error unless `value` is one the setting takes ("" is unset and always taken):
// "RINGTRAIN_DIRECT_READ='2' is not valid; expected 0 or 1".
void check(const Setting& s, const std::string& value);
// check() for every declared setting set in this process's environment.
void check_all();

// RINGTRAIN_* variables in this process's environment that the table does not declare,
// sorted by name.
std::vector<std::string> unknown_settings();
// "RINGTRAIN_GMEM is not a ringtrain setting (did you mean RINGTRAIN_GEMM?); ..." for the
// names given, one sentence each; "" for none.
std::string unknown_settings_message(const std::vector<std::string>& names);

// The table in Markdown, as docs/usage.md carries it.
std::string markdown_table();

}  // namespace ringtrain::env
