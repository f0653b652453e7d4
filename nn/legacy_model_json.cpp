// The reader of old checkpoints' model JSON and its mapping onto the shipped model files.
#include "nn/legacy_model_json.hpp"

#include <cctype>
#include <cstdio>

#include "core/error.hpp"

namespace ringtrain {

namespace {

// The fields the JSON could hold (the old ModelSpec).
struct LegacySpec {
  std::string name;
  Shape input;
  std::vector<int64_t> hidden;
  int64_t classes = 10;
  double dropout = 0.25;
  int64_t depth = 1, width = 16;
  std::string activation = "relu";
  std::string layer_precision;
};

// A reader for the flat JSON objects old checkpoints hold: string, integer and integer-array
// values. Anything else is an input error naming the text.
class SpecReader {
 public:
  explicit SpecReader(const std::string& s) : s_(s) {}
  LegacySpec read() {
    LegacySpec spec;
    spec.hidden.clear();
    expect('{');
    while (true) {
      std::string key = str();
      expect(':');
      if (key == "name")
        spec.name = str();
      else if (key == "input")
        spec.input = ints();
      else if (key == "hidden")
        spec.hidden = ints();
      else if (key == "classes")
        spec.classes = integer();
      else if (key == "dropout")
        spec.dropout = number();
      else if (key == "depth")
        spec.depth = integer();
      else if (key == "width")
        spec.width = integer();
      else if (key == "activation")
        spec.activation = str();
      else if (key == "layer_precision")
        spec.layer_precision = str();
      else
        fail("unknown key '" + key + "'");
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      break;
    }
    return spec;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw_input(cat("model description '", s_, "' is not valid: ", why));
  }
  char peek() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(cat("expected '", c, "' at offset ", i_));
    ++i_;
  }
  std::string str() {
    expect('"');
    size_t end = s_.find('"', i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return out;
  }
  int64_t integer() {
    peek();
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s_.substr(i_), &used);
    } catch (const std::exception&) {
      fail(cat("expected an integer at offset ", i_));
    }
    i_ += used;
    return v;
  }
  double number() {
    peek();
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s_.substr(i_), &used);
    } catch (const std::exception&) {
      fail(cat("expected a number at offset ", i_));
    }
    i_ += used;
    return v;
  }
  std::vector<int64_t> ints() {
    std::vector<int64_t> v;
    expect('[');
    if (peek() == ']') {
      ++i_;
      return v;
    }
    while (true) {
      v.push_back(integer());
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']');
      return v;
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::string list_str(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

}  // namespace

bool is_legacy_model_json(const std::string& text) {
  const size_t at = text.find_first_not_of(" \t\r\n");
  return at != std::string::npos && text[at] == '{';
}

ModelFile model_file_from_legacy_json(const std::string& json, const std::string& origin) {
  LegacySpec spec;
  try {
    spec = SpecReader(json).read();
  } catch (const Error& e) {
    throw_input(cat(origin, ": ", e.what()));
  }
  RT_REQUIRE(ModelFile::is_builtin(spec.name), origin, ": the model '", spec.name,
             "' of this old checkpoint is not shipped with this ringtrain; convert it with a "
             "ringtrain that has it, or train anew with a model file");
  ModelFile f = ModelFile::load(spec.name);
  const std::string how = cat(origin, " (model JSON)");
  char dropout[32];
  std::snprintf(dropout, sizeof dropout, "%.9g", spec.dropout);
  if (spec.name == "mlp") f.override_var("hidden", list_str(spec.hidden), how);
  if (spec.name == "cnn") f.override_var("dropout", dropout, how);
  if (spec.name == "resnet") {
    f.override_var("depth", std::to_string(spec.depth), how);
    f.override_var("width", std::to_string(spec.width), how);
    f.override_var("activation", spec.activation, how);
  }
  f.set_data_shape(spec.input, spec.classes, how);
  f.add_layer_precision(spec.layer_precision);
  return f;
}

}  // namespace ringtrain
