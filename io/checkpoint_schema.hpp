// The checkpoint format (version 1) described once: every root and group attribute and
// every kind of dataset, with its HDF5 type, shape, whether a file must hold it, the values
// that are possible and a line of meaning. The writer writes the attributes from this table,
// the reader reads them by it, the validator (impossible_meta) applies its rules,
// `ringtrain inspect` prints a checkpoint's attributes against it and `inspect --schema`
// prints it; docs/formats.md holds checkpoint_schema_markdown() (a unit test compares).
#pragma once

#include <hdf5.h>

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "io/checkpoint.hpp"

namespace ringtrain::io {

enum class AttrType { string, int64, float64, float64_list };

// What makes a value possible. Messages and the docs' wording come from the rule.
enum class AttrRule {
  any,
  equals,           // the constant `value` (format, format_version)
  one_of,           // one of the '|'-separated words of `value` (checked when present)
  nonnegative,      // >= 0
  at_least_one,     // >= 1
  up_to_step,       // >= 0 and not beyond the root `step`
  best_step,        // -1 (none) or 0 to the root `step`
  finite,           // every value finite
  finite_positive,  // every value finite and > 0
  finite_if_best,   // finite when best_step >= 0 (otherwise unused)
};

// Where a field lives in CheckpointMeta; monostate for the constants the writer supplies.
using MetaMember =
    std::variant<std::monostate, int64_t CheckpointMeta::*, double CheckpointMeta::*,
                 std::string CheckpointMeta::*, std::vector<double> CheckpointMeta::*>;

struct CheckpointAttr {
  const char* group;  // "" for the root, else the group's name ("optimizer", ...)
  const char* name;
  AttrType type;
  // A file without a required attribute is refused; an optional one absent reads as
  // CheckpointMeta's default.
  bool required;
  bool write_empty;   // false: the writer leaves out an empty string or list
  int since_version;  // the first format_version that has it
  AttrRule rule;
  const char* value;           // equals: the constant; one_of: "a|b|c"; else ""
  const char* same_length_as;  // a list that must have as many values as this one, or ""
  MetaMember member;
  const char* meaning;        // one line (markdown) for the docs and `inspect --schema`
  std::string label() const;  // "step", "/optimizer step": how messages name it
};

// Every attribute, groups' after the root's, each group's in the order the writer writes them
// (the order is part of the file's bytes).
const std::vector<CheckpointAttr>& checkpoint_attrs();
// The attribute `name` of `group` ("" for the root), or nullptr.
const CheckpointAttr* find_checkpoint_attr(std::string_view group, std::string_view name);

// The groups every checkpoint holds, in the order the writer creates them; `buffers` is
// created only when a model has buffers.
const std::vector<const char*>& checkpoint_required_groups();

struct CheckpointDatasetKind {
  const char* path;   // "/params/<layer>.<param>", placeholders in <>
  const char* type;   // "float32"
  const char* shape;  // its shape rule
  const char* presence;
  // The values must be finite, and also >= 0 when nonnegative (for datasets whose name ends
  // with `leaf`).
  bool nonnegative;
  const char* leaf;  // with nonnegative: the last name component it applies to
  const char* meaning;
};
const std::vector<CheckpointDatasetKind>& checkpoint_datasets();
// Whether only values >= 0 are possible in the float dataset `name` ("optimizer/x/exp_avg_sq").
bool checkpoint_dataset_nonnegative(std::string_view name);

const char* attr_type_name(AttrType t);  // "int64", "float64 [C]", ...

// Writes the attributes of `group` ("" for the root) from m, in table order.
void write_checkpoint_attrs(hid_t loc, std::string_view group, const CheckpointMeta& m);
// Writes one attribute of the table from m (e.g. best.h5's best_metric).
void write_checkpoint_attr(hid_t loc, const CheckpointAttr& a, const CheckpointMeta& m);
// Reads the attributes of `group` into m, except the constants (format, format_version),
// which the reader checks first. Input error naming `what` and the attribute when a required
// one is missing or one has another type.
void read_checkpoint_attrs(hid_t loc, std::string_view group, CheckpointMeta& m,
                           const std::string& what);
// Why the field's value in m is impossible under its rule, or "".
std::string checkpoint_attr_problem(const CheckpointAttr& a, const CheckpointMeta& m);

// The two tables (attributes, datasets) as markdown: docs/formats.md and `inspect --schema`.
std::string checkpoint_schema_markdown();

}  // namespace ringtrain::io
