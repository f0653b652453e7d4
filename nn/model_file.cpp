// ModelFile: parsing with locations (libprotobuf's TextFormat), built-in lookup, vars and
// their overrides, the data's shape, and the normalised text.
#include "nn/model_file.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <google/protobuf/io/tokenizer.h>
#include "core/edit_distance.hpp"
#include "core/error.hpp"
#include "core/files.hpp"

#include "ringtrain/model.pb.h"

namespace ringtrain {

namespace gp = google::protobuf;

// The shipped model files, compiled in (nn/builtin_models.cpp.in).
const std::vector<std::pair<std::string, std::string>>& builtin_model_texts();

namespace {

// Collects the parser's first error as ORIGIN:LINE:COLUMN: message (lines from 1).
class FirstError : public gp::io::ErrorCollector {
 public:
  explicit FirstError(const std::string& origin) : origin_(origin) {}
  void AddError(int line, gp::io::ColumnNumber column, const std::string& message) override {
    if (error_.empty()) error_ = cat(origin_, ":", line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int, gp::io::ColumnNumber, const std::string&) override {}
  const std::string& error() const { return error_; }

 private:
  const std::string& origin_;
  std::string error_;
};

std::string read_file(const std::string& path) {
  std::error_code ec;
  RT_REQUIRE(
      std::filesystem::exists(path, ec), "--model '", path, "' is neither a built-in model (",
      [] {
        std::string s;
        for (const auto& n : ModelFile::builtin_models()) s += (s.empty() ? "" : ", ") + n;
        return s;
      }(),
      ") nor a readable model file");
  // A FIFO or device would block or never end; a huge file is not a model.
  const uint64_t size = require_regular_file(path, "--model", "a model file (.pbtxt)");
  RT_REQUIRE(size <= kMaxModelFileBytes, "--model '", path, "' is ", size,
             " bytes; a model file may have at most ", kMaxModelFileBytes, " (the limit)");
  std::ifstream in(path, std::ios::binary);
  RT_REQUIRE(in, "--model '", path, "' cannot be opened");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ModelFile::ModelFile() : def_(std::make_unique<pb::Model>()) {}
ModelFile::ModelFile(ModelFile&&) noexcept = default;
ModelFile& ModelFile::operator=(ModelFile&&) noexcept = default;
ModelFile::~ModelFile() = default;

std::vector<std::string> ModelFile::builtin_models() {
  std::vector<std::string> names;
  for (const auto& [n, t] : builtin_model_texts()) names.push_back(n);
  return names;
}

bool ModelFile::is_builtin(const std::string& name) {
  for (const auto& [n, t] : builtin_model_texts())
    if (n == name) return true;
  return false;
}

ModelFile ModelFile::load(const std::string& name_or_path) {
  for (const auto& [n, t] : builtin_model_texts())
    if (n == name_or_path) {
      ModelFile f = parse(t, "models/" + n + ".pbtxt");
      f.builtin_ = n;
      return f;
    }
  return parse(read_file(name_or_path), name_or_path);
}

ModelFile ModelFile::parse(const std::string& text, const std::string& origin) {
  ModelFile f;
  f.origin_ = origin;
  f.tree_ = std::make_unique<gp::TextFormat::ParseInfoTree>();
  FirstError errors(f.origin_);
  gp::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(f.tree_.get());
  // Messages nest by recursion in the parser (and in everything that walks the model):
  // bounded, so that thousands of nested repeats are an error, not a stack overflow.
  parser.SetRecursionLimit(kMaxMessageNesting);
  if (!parser.ParseFromString(text, f.def_.get()))
    throw_input(errors.error().empty() ? cat(origin, ": not a valid model file") : errors.error());
  f.locs_[f.def_.get()] = {f.tree_.get(), 0, 0};
  f.index_locations(*f.def_, f.tree_.get());
  RT_REQUIRE(f.def_->format_version() == 0 || f.def_->format_version() == 1,
             f.where(*f.def_, "format_version"), ": format_version ", f.def_->format_version(),
             " is not known to this ringtrain (it reads version 1)");
  for (const auto& v : f.def_->var()) {
    RT_REQUIRE(!v.name().empty(), f.where(v), ": a var needs a name");
    RT_REQUIRE(v.name() != "classes", f.where(v, "name"),
               ": var 'classes' is reserved (it is the number of classes of the data)");
    RT_REQUIRE(v.value_case() != pb::Var::VALUE_NOT_SET, f.where(v), ": var '", v.name(),
               "' needs a value (int_value, float_value, string_value or int_list)");
    for (const auto& w : f.def_->var()) {
      if (&w == &v) break;
      RT_REQUIRE(w.name() != v.name(), f.where(v, "name"), ": var '", v.name(),
                 "' is defined twice");
    }
  }
  // Defaults must satisfy the file's own bounds: checked as an override of themselves.
  for (auto& v : *f.def_->mutable_var()) {
    const std::string loc = f.where(v);
    try {
      pb::Var copy = v;
      auto check = [&](double x) {
        RT_REQUIRE((!copy.has_min() || x >= copy.min()) && (!copy.has_max() || x <= copy.max()),
                   "value ", x, " is outside [", copy.has_min() ? cat(copy.min()) : "-inf", ", ",
                   copy.has_max() ? cat(copy.max()) : "inf", "]");
      };
      if (v.has_int_value()) check(double(v.int_value()));
      if (v.has_float_value()) check(v.float_value());
      if (v.has_int_list())
        for (auto x : v.int_list().value()) check(double(x));
      if (v.has_string_value() && v.choices_size())
        RT_REQUIRE(std::count(v.choices().begin(), v.choices().end(), v.string_value()), "value '",
                   v.string_value(), "' is not one of its choices");
    } catch (const Error& e) {
      throw_input(cat(loc, ": var '", v.name(), "': ", e.what()));
    }
  }
  return f;
}

void ModelFile::index_locations(const gp::Message& msg, const gp::TextFormat::ParseInfoTree* tree) {
  const gp::Reflection* r = msg.GetReflection();
  std::vector<const gp::FieldDescriptor*> fields;
  r->ListFields(msg, &fields);
  for (const gp::FieldDescriptor* fd : fields) {
    if (fd->cpp_type() != gp::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const int n = fd->is_repeated() ? r->FieldSize(msg, fd) : 1;
    for (int i = 0; i < n; ++i) {
      const gp::Message& sub =
          fd->is_repeated() ? r->GetRepeatedMessage(msg, fd, i) : r->GetMessage(msg, fd);
      const int idx = fd->is_repeated() ? i : -1;
      const auto loc = tree->GetLocation(fd, idx);
      const gp::TextFormat::ParseInfoTree* nested = tree->GetTreeForNested(fd, idx);
      if (!nested) continue;
      locs_[&sub] = {nested, loc.line, loc.column};
      index_locations(sub, nested);
    }
  }
}

std::string ModelFile::where(const gp::Message& msg, const std::string& field, int index) const {
  auto it = locs_.find(&msg);
  if (it == locs_.end()) return origin_;
  int line = it->second.line, column = it->second.column;
  if (!field.empty()) {
    const gp::FieldDescriptor* fd = msg.GetDescriptor()->FindFieldByName(field);
    if (fd) {
      const auto loc =
          it->second.tree->GetLocation(fd, fd->is_repeated() ? std::max(index, 0) : -1);
      if (loc.line >= 0) {
        line = loc.line;
        column = loc.column;
      }
    }
  }
  if (line < 0) return origin_;
  return cat(origin_, ":", line + 1, ":", column + 1);
}

std::string ModelFile::name() const {
  if (!def_->name().empty()) return def_->name();
  if (!builtin_.empty()) return builtin_;
  return std::filesystem::path(origin_).stem().string();
}

bool ModelFile::has_var(const std::string& var) const {
  for (const auto& v : def_->var())
    if (v.name() == var) return true;
  return false;
}

std::vector<std::string> ModelFile::var_names() const {
  std::vector<std::string> out;
  for (const auto& v : def_->var()) out.push_back(v.name());
  return out;
}

void ModelFile::override_var(const std::string& var, const std::string& value,
                             const std::string& option) {
  pb::Var* v = nullptr;
  for (auto& w : *def_->mutable_var())
    if (w.name() == var) v = &w;
  if (!v) {
    std::string names, nearest;
    size_t best = std::max<size_t>(2, var.size() / 3) + 1;  // at most this far away
    for (const auto& n : var_names()) {
      names += (names.empty() ? "" : ", ") + n;
      if (const size_t d = edit_distance(var, n); d < best) best = d, nearest = n;
    }
    throw_input(cat(option, ": model '", name(), "' (", origin_, ") has no parameter '", var, "'",
                    nearest.empty() ? "" : cat(" (did you mean ", nearest, "?)"),
                    "; its parameters are ", names.empty() ? "none" : names));
  }
  overrides_.push_back(option + " " + value);
  auto range = [&] {
    return cat(v->has_min() ? cat(v->min()) : "-inf", " to ", v->has_max() ? cat(v->max()) : "inf");
  };
  auto parse_int = [&](const std::string& s) {
    size_t used = 0;
    int64_t x = 0;
    try {
      x = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_REQUIRE(used == s.size() && !s.empty(), option, " '", value,
               "' is not valid; expected an integer");
    RT_REQUIRE((!v->has_min() || double(x) >= v->min()) && (!v->has_max() || double(x) <= v->max()),
               option, " ", x, " is not valid; expected ", range(), " (", v->doc(), ")");
    return x;
  };
  switch (v->value_case()) {
    case pb::Var::kIntValue:
      v->set_int_value(parse_int(value));
      break;
    case pb::Var::kFloatValue: {
      size_t used = 0;
      double x = 0;
      try {
        x = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      RT_REQUIRE(used == value.size() && !value.empty() && std::isfinite(x), option, " '", value,
                 "' is not valid; expected a number");
      RT_REQUIRE((!v->has_min() || x >= v->min()) && (!v->has_max() || x <= v->max()), option, " ",
                 value, " is not valid; expected ", range(), " (", v->doc(), ")");
      v->set_float_value(x);
      break;
    }
    case pb::Var::kStringValue: {
      if (v->choices_size()) {
        std::string choices;
        for (const auto& c : v->choices()) choices += (choices.empty() ? "" : ", ") + c;
        RT_REQUIRE(std::count(v->choices().begin(), v->choices().end(), value), option, " '", value,
                   "' is not known; expected one of ", choices);
      }
      v->set_string_value(value);
      break;
    }
    case pb::Var::kIntList: {
      pb::IntList list;
      size_t start = 0;
      while (start <= value.size() && !value.empty()) {
        size_t end = value.find(',', start);
        if (end == std::string::npos) end = value.size();
        list.add_value(parse_int(value.substr(start, end - start)));
        start = end + 1;
      }
      *v->mutable_int_list() = list;
      break;
    }
    default:
      break;
  }
}

ExprScope ModelFile::scope() const {
  ExprScope s;
  for (const auto& v : def_->var()) {
    switch (v.value_case()) {
      case pb::Var::kIntValue:
        s[v.name()] = ExprValue::of(v.int_value());
        break;
      case pb::Var::kFloatValue:
        s[v.name()] = ExprValue::of_real(v.float_value());
        break;
      case pb::Var::kStringValue:
        s[v.name()] = ExprValue::of(v.string_value());
        break;
      case pb::Var::kIntList:
        s[v.name()] = ExprValue::of(
            std::vector<int64_t>(v.int_list().value().begin(), v.int_list().value().end()));
        break;
      default:
        break;
    }
  }
  s["classes"] = ExprValue::of(def_->classes());
  return s;
}

void ModelFile::set_data_shape(const Shape& sample, int64_t classes, const std::string& data) {
  const Shape declared(def_->input_shape().begin(), def_->input_shape().end());
  RT_REQUIRE(declared.empty() || declared == sample, where(*def_, "input_shape"), ": model '",
             name(), "' takes samples of shape ", shape_str(declared), " but ", data, " has ",
             shape_str(sample));
  RT_REQUIRE(def_->classes() == 0 || def_->classes() == classes, where(*def_, "classes"),
             ": model '", name(), "' predicts ", def_->classes(), " classes but ", data, " has ",
             classes);
  def_->clear_input_shape();
  for (int64_t d : sample) def_->add_input_shape(d);
  def_->set_classes(classes);
}

Shape ModelFile::input_shape() const {
  return Shape(def_->input_shape().begin(), def_->input_shape().end());
}

int64_t ModelFile::classes() const { return def_->classes(); }

void ModelFile::set_target_shape(const Shape& target, const std::string& data) {
  const Shape declared = target_shape();
  RT_REQUIRE(declared.empty() || declared == target, where(*def_, "target_shape"), ": model '",
             name(), "' takes targets of shape ", shape_str(declared), " but ", data, " has ",
             shape_str(target));
  def_->clear_target_shape();
  for (int64_t d : target) def_->add_target_shape(d);
}

Shape ModelFile::target_shape() const {
  return Shape(def_->target_shape().begin(), def_->target_shape().end());
}

void ModelFile::add_layer_precision(const std::string& list) {
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    start = end + 1;
    if (!item.empty()) def_->add_layer_precision(item);
  }
}

std::string ModelFile::normalised() const {
  pb::Model m = *def_;
  if (m.format_version() == 0) m.set_format_version(1);
  if (m.name().empty()) m.set_name(name());
  std::string out;
  gp::TextFormat::Printer printer;
  printer.SetUseShortRepeatedPrimitives(true);
  RT_CHECK(printer.PrintToString(m, &out), "printing model '", name(), "' failed");
  return out;
}

}  // namespace ringtrain
