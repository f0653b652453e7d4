// The checkpoint schema's table and what is driven by it: writing, reading and checking the
// attributes, and the markdown of docs/formats.md (see checkpoint_schema.hpp).
#include "io/checkpoint_schema.hpp"

#include <cmath>
#include <sstream>

#include "io/hdf5.hpp"
#include "io/stats_check.hpp"

namespace ringtrain::io {

std::string CheckpointAttr::label() const {
  return *group ? cat("/", group, " ", name) : std::string(name);
}

const std::vector<CheckpointAttr>& checkpoint_attrs() {
  using M = CheckpointMeta;
  using T = AttrType;
  using R = AttrRule;
  // {group, name, type, required, write_empty, since, rule, value, same_length_as, member,
  //  meaning}
  static const std::vector<CheckpointAttr> table = {
      {"",
       "format",
       T::string,
       true,
       true,
       1,
       R::equals,
       kCheckpointFormat,
       "",
       {},
       "what the file is"},
      {"",
       "format_version",
       T::int64,
       true,
       true,
       1,
       R::equals,
       "1",
       "",
       {},
       "the layout version; a reader refuses another"},
      {"", "step", T::int64, true, true, 1, R::nonnegative, "", "", &M::step,
       "steps done, skipped steps included"},
      {"", "epoch", T::int64, true, true, 1, R::nonnegative, "", "", &M::epoch,
       "the epoch of the data position (as `/data` `epoch`)"},
      {"", "samples_seen", T::int64, true, true, 1, R::nonnegative, "", "", &M::samples_seen,
       "the global batch summed over all steps"},
      {"", "world_size", T::int64, true, true, 1, R::at_least_one, "", "", &M::world_size,
       "ranks of the run that saved it (information; any number may resume)"},
      {"", "precision", T::string, true, true, 1, R::one_of, "fp32|fp16|bf16", "", &M::precision,
       "what it was trained in; the loss scaler is restored only in the same precision"},
      {"", "model", T::string, true, true, 1, R::any, "", "", &M::model,
       "the normalised model file ([below](#the-model-attribute)); a resumed run must build the "
       "same network"},
      {"", "ringtrain_version", T::string, true, true, 1, R::any, "", "", &M::ringtrain_version,
       "the ringtrain that wrote it, e.g. `0.1.0`"},
      {"", "plugins", T::string, false, false, 1, R::any, "", "", &M::plugins,
       "only when the model uses ops of a plugin: one `OP=LIBRARY` line per such op "
       "([below](#plugins))"},
      {"", "input_mean", T::float64, true, true, 1, R::finite, "", "", &M::input_mean,
       "the input normalisation of the training data, used by `eval` and `predict` (and an "
       "exported ONNX model's metadata)"},
      {"", "input_std", T::float64, true, true, 1, R::finite_positive, "", "", &M::input_std,
       "its scale, as `input_mean`"},
      {"", "input_channel_mean", T::float64_list, false, false, 1, R::finite, "", "",
       &M::input_channel_mean,
       "the per-channel normalisation of the training data (its `/mean`), used by `eval` and "
       "`predict` instead of the scalars"},
      {"", "input_channel_std", T::float64_list, false, false, 1, R::finite_positive, "",
       "input_channel_mean", &M::input_channel_std, "its per-channel scale (its `/std`)"},
      {"", "grad_accum", T::int64, false, true, 1, R::at_least_one, "", "", &M::grad_accum,
       "micro-batches per step of the run that saved it; with `global_batch` and `world_size` "
       "it gives the micro-batch a resumed run keeps"},
      {"", "best_value", T::float64, false, true, 1, R::finite_if_best, "", "", &M::best_value,
       "`--keep-best`/`--early-stop`: the best evaluation so far"},
      {"", "best_step", T::int64, false, true, 1, R::best_step, "", "", &M::best_step,
       "the step of that evaluation (−1: none yet)"},
      {"", "evals_since_best", T::int64, false, true, 1, R::nonnegative, "", "",
       &M::evals_since_best, "evaluations since it, so that a resumed run keeps its patience"},
      {"", "global_batch", T::int64, false, true, 1, R::nonnegative, "", "", &M::global_batch,
       "the global batch G of the run that saved it, which a resumed run continues "
       "([restart.md](restart.md#on-another-number-of-ranks)); absent or 0: the G of the "
       "options"},
      {"", "best_metric", T::string, false, false, 1, R::one_of, "val_loss|val_accuracy", "",
       &M::best_metric, "only in `DIR/best.h5`: the metric that chose it"},
      {"", "tokenizer", T::string, false, false, 1, R::any, "", "", &M::tokenizer,
       "language models: the tokenizer of the training data (`bytes`, `sentencepiece`); a "
       "resumed run, `eval` and `sample` refuse data or a `--tokenizer` of another"},
      {"", "tokenizer_sha256", T::string, false, false, 1, R::any, "", "", &M::tokenizer_sha256,
       "`sentencepiece`: the SHA-256 of the model file (as the dataset's `tokenizer_sha256`)"},
      {"", "tokenizer_data", T::string, false, false, 1, R::any, "", "", &M::tokenizer_data,
       "`sentencepiece`: the absolute path of a training shard holding the model "
       "(`/tokenizer_model`), where `sample` reads it without `--tokenizer`"},
      {"optimizer", "name", T::string, true, true, 1, R::one_of, "sgd|adamw", "", &M::optimizer,
       "the optimizer; a resume must ask for the same `--optimizer`"},
      // One optimizer step per training step whatever --grad-accum is (the micro-batches of
      // a step are summed before the one update), so up_to_step holds with accumulation.
      {"optimizer", "step", T::int64, true, true, 1, R::up_to_step, "", "", &M::optimizer_step,
       "updates applied (skipped steps are not counted; AdamW's bias correction uses it)"},
      {"loss_scaler", "scale", T::float64, true, true, 1, R::finite_positive, "", "",
       &M::loss_scale,
       "the loss scale; 1 in fp32 runs unless `--loss-scale` gave a constant "
       "([usage.md](usage.md#loss-scaling))"},
      {"loss_scaler", "growth_tracker", T::int64, true, true, 1, R::nonnegative, "", "",
       &M::growth_tracker, "applied steps since the scale last grew or backed off"},
      {"data", "epoch", T::int64, true, true, 1, R::nonnegative, "", "", &M::data_epoch,
       "the epoch of the next batch"},
      {"data", "position", T::int64, true, true, 1, R::nonnegative, "", "", &M::data_position,
       "where the next batch starts in the epoch's permutation (a sample count, so the batch "
       "size may change on resume)"},
      {"rng", "seed", T::int64, true, true, 1, R::any, "", "", &M::seed,
       "every random stream derives from it (no generator state is stored); a resume must use "
       "the same `--seed`"},
  };
  return table;
}

const CheckpointAttr* find_checkpoint_attr(std::string_view group, std::string_view name) {
  for (const auto& a : checkpoint_attrs())
    if (group == a.group && name == a.name) return &a;
  return nullptr;
}

const std::vector<const char*>& checkpoint_required_groups() {
  static const std::vector<const char*> groups = {"params", "optimizer", "loss_scaler", "data",
                                                  "rng"};
  return groups;
}

const std::vector<CheckpointDatasetKind>& checkpoint_datasets() {
  static const std::vector<CheckpointDatasetKind> table = {
      {"/params/<layer>.<param>", "float32", "the parameter's, global (never a rank's part)",
       "one per parameter of the model", false, "", "the fp32 master weights ([below](#params))"},
      {"/buffers/<layer>.<name>", "float32", "the buffer's",
       "only when the model has non-trainable state", false, "",
       "e.g. BatchNorm's running averages ([below](#buffers))"},
      {"/buffers/<layer>.running_var", "float32", "the buffer's", "with BatchNorm", true,
       "running_var", "BatchNorm's running variance"},
      {"/optimizer/<layer>.<param>/<state>", "float32", "the parameter's",
       "one per parameter and state: adamw `exp_avg`, `exp_avg_sq`; sgd `momentum` (none when "
       "`--momentum 0`)",
       false, "", "the optimizer's state"},
      {"/optimizer/<layer>.<param>/exp_avg_sq", "float32", "the parameter's", "with adamw", true,
       "exp_avg_sq", "AdamW's second moment"},
      {"/rng/<name>", "any", "`[W, …]`, row r written by rank r", "reserved: none in this version",
       false, "", "state that differs between ranks"},
  };
  return table;
}

bool checkpoint_dataset_nonnegative(std::string_view name) {
  for (const auto& d : checkpoint_datasets()) {
    if (!d.nonnegative) continue;
    const std::string_view leaf = d.leaf;
    if (name.size() >= leaf.size() && name.substr(name.size() - leaf.size()) == leaf) return true;
  }
  return false;
}

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::string:
      return "string";
    case AttrType::int64:
      return "int64";
    case AttrType::float64:
      return "float64";
    case AttrType::float64_list:
      return "float64 [C]";
  }
  return "?";
}

namespace {

template <typename V>
const V& field(const CheckpointAttr& a, const CheckpointMeta& m) {
  return m.*std::get<V CheckpointMeta::*>(a.member);
}
template <typename V>
V& field(const CheckpointAttr& a, CheckpointMeta& m) {
  return m.*std::get<V CheckpointMeta::*>(a.member);
}

// Whether m's value of `a` is empty (a string or list the writer may leave out).
bool empty_in(const CheckpointAttr& a, const CheckpointMeta& m) {
  if (a.type == AttrType::string && a.rule != AttrRule::equals)
    return field<std::string>(a, m).empty();
  if (a.type == AttrType::float64_list) return field<std::vector<double>>(a, m).empty();
  return false;
}

// The '|'-separated words of `value` as the docs and messages list them ("a, b or c").
std::string words(const char* value, const char* quote) {
  std::vector<std::string> w;
  std::stringstream ss(value);
  for (std::string s; std::getline(ss, s, '|');) w.push_back(quote + s + quote);
  std::string out;
  for (size_t i = 0; i < w.size(); ++i)
    out += (i == 0 ? "" : i + 1 == w.size() ? " or " : ", ") + w[i];
  return out;
}

// What a stored attribute of another type than expected is, for the message.
std::string stored_kind(hid_t loc, const char* name) {
  H5Id attr(H5Aopen(loc, name, H5P_DEFAULT));
  H5Id type(attr.get() < 0 ? H5I_INVALID_HID : H5Aget_type(attr));
  switch (type.get() < 0 ? H5T_NO_CLASS : H5Tget_class(type)) {
    case H5T_STRING:
      return "a string";
    case H5T_INTEGER:
      return "an integer";
    case H5T_FLOAT:
      return "a float";
    default:
      return "of another type";
  }
}

}  // namespace

void write_checkpoint_attr(hid_t loc, const CheckpointAttr& a, const CheckpointMeta& m) {
  if (a.rule == AttrRule::equals) {  // the constants: format, format_version
    if (a.type == AttrType::string)
      write_attr(loc, a.name, std::string(a.value));
    else
      write_attr(loc, a.name, int64_t(std::stoll(a.value)));
    return;
  }
  switch (a.type) {
    case AttrType::string:
      write_attr(loc, a.name, field<std::string>(a, m));
      break;
    case AttrType::int64:
      write_attr(loc, a.name, field<int64_t>(a, m));
      break;
    case AttrType::float64:
      write_attr(loc, a.name, field<double>(a, m));
      break;
    case AttrType::float64_list:
      write_attr(loc, a.name, field<std::vector<double>>(a, m));
      break;
  }
}

void write_checkpoint_attrs(hid_t loc, std::string_view group, const CheckpointMeta& m) {
  for (const auto& a : checkpoint_attrs()) {
    if (group != a.group) continue;
    // A list whose companion (same_length_as) is written is written with it, even empty.
    const bool with_companion =
        *a.same_length_as && !empty_in(*find_checkpoint_attr(a.group, a.same_length_as), m);
    if (!a.write_empty && empty_in(a, m) && !with_companion) continue;
    write_checkpoint_attr(loc, a, m);
  }
}

void read_checkpoint_attrs(hid_t loc, std::string_view group, CheckpointMeta& m,
                           const std::string& what) {
  for (const auto& a : checkpoint_attrs()) {
    if (group != a.group || a.rule == AttrRule::equals) continue;
    if (!has_attr(loc, a.name)) {
      RT_REQUIRE(!a.required, what, " lacks the ", attr_type_name(a.type), " attribute '",
                 a.label(), "'");
      continue;  // absent and optional: CheckpointMeta's default
    }
    bool read = false;
    switch (a.type) {
      case AttrType::string:
        if (auto v = read_attr_string(loc, a.name)) field<std::string>(a, m) = *v, read = true;
        break;
      case AttrType::int64:
        if (auto v = read_attr_int(loc, a.name)) field<int64_t>(a, m) = *v, read = true;
        break;
      case AttrType::float64:
        if (auto v = read_attr_double(loc, a.name)) field<double>(a, m) = *v, read = true;
        break;
      case AttrType::float64_list:
        if (auto v = read_attr_doubles(loc, a.name))
          field<std::vector<double>>(a, m) = *v, read = true;
        break;
    }
    RT_REQUIRE(read, what, ": attribute '", a.label(), "' is ", stored_kind(loc, a.name),
               "; expected ", attr_type_name(a.type));
  }
}

std::string checkpoint_attr_problem(const CheckpointAttr& a, const CheckpointMeta& m) {
  const std::string l = a.label();
  // Scalars by rule; lists element by element (finite and finite_positive only).
  auto real = [&](double v, const std::string& name) -> std::string {
    if (a.rule == AttrRule::finite && !std::isfinite(v))
      return cat(name, " is ", v, "; expected a finite value");
    if (a.rule == AttrRule::finite_positive && (!std::isfinite(v) || v <= 0))
      return cat(name, " is ", v, "; expected a finite value > 0");
    if (a.rule == AttrRule::finite_if_best && m.best_step >= 0 && !std::isfinite(v))
      return cat(name, " is ", v, "; expected a finite value");
    return "";
  };
  switch (a.type) {
    case AttrType::string: {
      if (a.rule != AttrRule::one_of) return "";
      const std::string& v = field<std::string>(a, m);
      if (v.empty() && !a.required) return "";  // absent
      std::stringstream ss(a.value);
      for (std::string w; std::getline(ss, w, '|');)
        if (v == w) return "";
      return cat(l, " is '", v, "'; expected ", words(a.value, ""));
    }
    case AttrType::int64: {
      if (a.rule == AttrRule::equals) return "";
      const int64_t v = field<int64_t>(a, m);
      switch (a.rule) {
        case AttrRule::nonnegative:
          return v < 0 ? cat(l, " is ", v, "; expected >= 0") : "";
        case AttrRule::at_least_one:
          return v < 1 ? cat(l, " is ", v, "; expected >= 1") : "";
        case AttrRule::up_to_step:
          if (v < 0) return cat(l, " is ", v, "; expected >= 0");
          return v > m.step ? cat(l, " ", v, " is beyond the training step ", m.step) : "";
        case AttrRule::best_step:
          return v < -1 || v > m.step
                     ? cat(l, " is ", v, "; expected -1 (none) or 0 to the step ", m.step)
                     : "";
        default:
          return "";
      }
    }
    case AttrType::float64:
      return real(field<double>(a, m), l);
    case AttrType::float64_list: {
      const auto& v = field<std::vector<double>>(a, m);
      if (*a.same_length_as) {
        const auto* other = find_checkpoint_attr(a.group, a.same_length_as);
        const size_t n = field<std::vector<double>>(*other, m).size();
        if (v.size() != n)
          return cat(l, " has ", v.size(), " values and ", other->label(), " ", n,
                     "; expected one per channel in each");
      }
      for (size_t c = 0; c < v.size(); ++c)
        if (auto bad = real(v[c], cat(l, "[", c, "]")); !bad.empty()) return bad;
      return "";
    }
  }
  return "";
}

std::string impossible_meta(const CheckpointMeta& m) {
  for (const auto& a : checkpoint_attrs())
    if (auto bad = checkpoint_attr_problem(a, m); !bad.empty()) return bad;
  // Beyond finite and positive: statistics a dataset can have (io/stats_check.hpp).
  if (auto bad = normalisation_problem("input_mean", m.input_mean, "input_std", m.input_std);
      !bad.empty())
    return bad;
  for (size_t c = 0; c < m.input_channel_mean.size() && c < m.input_channel_std.size(); ++c)
    if (auto bad =
            normalisation_problem(cat("input_channel_mean[", c, "]"), m.input_channel_mean[c],
                                  cat("input_channel_std[", c, "]"), m.input_channel_std[c]);
        !bad.empty())
      return bad;
  return "";
}

namespace {

std::string rule_text(const CheckpointAttr& a) {
  std::string t;
  switch (a.rule) {
    case AttrRule::any:
      t = "any";
      break;
    case AttrRule::equals:
      t = a.type == AttrType::string ? cat("`\"", a.value, "\"`") : cat("`", a.value, "`");
      break;
    case AttrRule::one_of:
      t = words(a.value, "`");
      break;
    case AttrRule::nonnegative:
      t = "≥ 0";
      break;
    case AttrRule::at_least_one:
      t = "≥ 1";
      break;
    case AttrRule::up_to_step:
      t = "0 to `step`";
      break;
    case AttrRule::best_step:
      t = "−1 or 0 to `step`";
      break;
    case AttrRule::finite:
      t = a.type == AttrType::float64_list ? "each finite" : "finite";
      break;
    case AttrRule::finite_positive:
      t = a.type == AttrType::float64_list ? "each finite, > 0" : "finite, > 0";
      break;
    case AttrRule::finite_if_best:
      t = "finite when `best_step` ≥ 0";
      break;
  }
  if (*a.same_length_as) t += cat("; as many as `", a.same_length_as, "`");
  return t;
}

std::string presence_text(const CheckpointAttr& a) {
  if (a.required) return cat("required (v", a.since_version, ")");
  if (!a.write_empty) return cat("optional (v", a.since_version, "), written when set");
  const CheckpointMeta defaults;
  std::string d;
  switch (a.type) {
    case AttrType::int64:
      d = std::to_string(field<int64_t>(a, defaults));
      break;
    case AttrType::float64:
      d = cat(field<double>(a, defaults));
      break;
    default:
      d = "empty";
  }
  if (d.front() == '-') d = "−" + d.substr(1);
  return cat("optional (v", a.since_version, "; absent: ", d, ")");
}

}  // namespace

std::string checkpoint_schema_markdown() {
  std::string out =
      "| attribute | type | presence | possible values | meaning |\n"
      "|---|---|---|---|---|\n";
  for (const auto& a : checkpoint_attrs())
    out += cat("| ", *a.group ? cat("`/", a.group, "` ") : std::string(), "`", a.name, "` | ",
               attr_type_name(a.type), " | ", presence_text(a), " | ", rule_text(a), " | ",
               a.meaning, " |\n");
  out +=
      "\n| dataset | type | shape | presence | possible values | meaning |\n"
      "|---|---|---|---|---|---|\n";
  for (const auto& d : checkpoint_datasets())
    out +=
        cat("| `", d.path, "` | ", d.type, " | ", d.shape, " | ", d.presence, " | ",
            std::string_view(d.type) == "float32" ? (d.nonnegative ? "finite, ≥ 0" : "finite") : "",
            " | ", d.meaning, " |\n");
  return out;
}

}  // namespace ringtrain::io
