// The RINGTRAIN_* environment settings, declared once in one table (core/env.cpp), as NCCL
// declares its NCCL_PARAMs: name, type, default, who reads it and one line of meaning. The
// programs read them only through value()/raw() here, never with getenv, so the table is
// the whole list; docs/usage.md's table is markdown_table() (a unit test checks that the two
// agree, and prints the table to paste when they do not). A RINGTRAIN_* variable in the environment
// that the table does not declare is most likely a typo: unknown_settings() names them for one
// warning.
#pragma once

#include <string>
#include <vector>

namespace ringtrain::env {

struct Setting {
  const char* name;           // "RINGTRAIN_GEMM"
  const char* type;           // the values it takes: "auto|onednn|openblas", "int", "RANK:..."
  const char* default_value;  // as a user would write it; "unset" where absence means off
  const char* read_by;        // "ringtrain", or the scripts that read it
  const char* description;    // one line
  const char* see;            // where the docs explain it ("usage.md#data-loading"), or ""
};

// Every setting, in the order the docs list them.
const std::vector<Setting>& settings();

// The environment's value of a declared setting, or nullptr when it is unset. A name the
// table does not declare is a programming error (a runtime error naming it).
const char* raw(const char* name);
// The environment's value, or the table's default when unset ("" for "unset").
std::string value(const char* name);

// RINGTRAIN_* variables in this process's environment that the table does not declare,
// sorted by name.
std::vector<std::string> unknown_settings();
// "RINGTRAIN_GMEM is not a ringtrain setting (did you mean RINGTRAIN_GEMM?); ..." for the
// names given, one sentence each; "" for none.
std::string unknown_settings_message(const std::vector<std::string>& names);

// The table in Markdown, as docs/usage.md carries it.
std::string markdown_table();

}  // namespace ringtrain::env
