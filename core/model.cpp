// Model: flat parameter layout, init, forward/backward over the layers; ModelSpec JSON;
// build_model() for the models ringtrain knows.
#include "core/model.hpp"

#include <cctype>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace ringtrain {

namespace {

std::string json_ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// A reader for the flat JSON objects ModelSpec writes: string, integer and integer-array
// values. Anything else is an input error naming the text.
class SpecReader {
 public:
  explicit SpecReader(const std::string& s) : s_(s) {}
  ModelSpec read() {
    ModelSpec spec;
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

}  // namespace

std::string ModelSpec::to_json() const {
  return cat("{\"name\":\"", name, "\",\"input\":", json_ints(input),
             ",\"hidden\":", json_ints(hidden), ",\"classes\":", classes, "}");
}

ModelSpec ModelSpec::from_json(const std::string& json) { return SpecReader(json).read(); }

Model::Model(ModelSpec spec, std::vector<std::unique_ptr<Layer>> layers, DType compute)
    : spec_(std::move(spec)), layers_(std::move(layers)), compute_(compute) {
  struct Pending {
    Layer* layer;
    size_t first;
    size_t count;
  };
  std::vector<Pending> pending;
  for (auto& layer : layers_) {
    auto specs = layer->param_specs();
    pending.push_back({layer.get(), params_.size(), specs.size()});
    layer_params_.push_back({params_.size(), specs.size()});
    for (auto& ps : specs) {
      Param p;
      p.name = layer->name() + "." + ps.name;
      p.shape = ps.shape;
      p.fan_in = ps.fan_in;
      p.offset = num_params_;
      num_params_ += shape_numel(ps.shape);
      params_.push_back(std::move(p));
    }
  }
  master_ = Buffer(size_t(num_params_) * 4);
  if (compute_ != DType::f32) work_ = Buffer(size_t(num_params_) * dtype_size(compute_));
  grad_ = Buffer(size_t(num_params_) * dtype_size(compute_));
  const Tensor m = master(), w = work(), g = grad();
  for (auto& p : params_) {
    p.master = m.slice(p.offset, p.shape);
    p.work = w.slice(p.offset, p.shape);
    p.grad = g.slice(p.offset, p.shape);
  }
  for (auto& pd : pending) {
    std::vector<Param*> ps;
    for (size_t i = 0; i < pd.count; ++i) ps.push_back(&params_[pd.first + i]);
    pd.layer->bind(ps);
  }
  // Precision policy: the last layer's output (the logits) and the loss stay in fp32.
  if (!layers_.empty()) {
    layers_.back()->set_output_dtype(DType::f32);
    layers_.front()->set_needs_input_grad(false);
  }
}

void Model::init_parameters(uint64_t seed, kernels::Backend& backend) {
  for (Param& p : params_) {
    Rng rng(mix_seed(seed, hash_name(p.name)));
    const float bound = 1.f / std::sqrt(float(p.fan_in));
    float* v = p.master.as<float>();
    for (int64_t j = 0; j < p.master.numel(); ++j) v[j] = (2.f * rng.uniform() - 1.f) * bound;
  }
  refresh_working_copy(backend);
}

void Model::refresh_working_copy(kernels::Backend& backend) {
  if (compute_ != DType::f32) backend.cast(master(), work());
}

const Tensor& Model::forward(Context& ctx, const Tensor& x,
                             const std::function<void(size_t, const Tensor&)>& after_layer) {
  const Tensor* cur = &x;
  for (size_t l = 0; l < layers_.size(); ++l) {
    cur = &layers_[l]->forward(ctx, *cur);
    if (after_layer) after_layer(l, *cur);
  }
  return *cur;
}

void Model::backward(Context& ctx, const Tensor& dlogits,
                     const std::function<void(size_t)>& grad_ready) {
  const Tensor* cur = &dlogits;
  for (size_t l = layers_.size(); l-- > 0;) {
    cur = &layers_[l]->backward(ctx, *cur);
    if (backward_hook_) backward_hook_(l, *cur);
    if (!grad_ready) continue;
    const auto [first, count] = layer_params_[l];
    for (size_t i = first; i < first + count; ++i) grad_ready(i);
  }
}

std::unique_ptr<Model> build_model(const ModelSpec& spec, DType compute) {
  RT_REQUIRE(spec.name == "mlp", "--model '", spec.name, "' is not a known model; expected mlp");
  RT_REQUIRE(!spec.input.empty() && shape_numel(spec.input) > 0,
             "the model needs a non-empty input shape, got ", shape_str(spec.input));
  RT_REQUIRE(spec.classes >= 2, "the model needs at least 2 classes, got ", spec.classes);
  std::vector<std::unique_ptr<Layer>> layers;
  int64_t width = shape_numel(spec.input);
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    RT_REQUIRE(spec.hidden[i] > 0, "--hidden: layer width ", spec.hidden[i], " is not positive");
    layers.push_back(std::make_unique<Linear>(cat("fc", i + 1), width, spec.hidden[i]));
    layers.push_back(std::make_unique<ReLU>(cat("relu", i + 1)));
    width = spec.hidden[i];
  }
  layers.push_back(
      std::make_unique<Linear>(cat("fc", spec.hidden.size() + 1), width, spec.classes));
  return std::make_unique<Model>(spec, std::move(layers), compute);
}

}  // namespace ringtrain
