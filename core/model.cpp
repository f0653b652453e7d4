// Model: flat parameter layout, init, forward/backward over the layers; ModelSpec JSON;
// build_model() for the models ringtrain knows.
#include "core/model.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>

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

}  // namespace

std::string ModelSpec::to_json() const {
  // Only the options the named model uses, so that equal models give equal strings.
  std::string s = cat("{\"name\":\"", name, "\",\"input\":", json_ints(input));
  if (name == "mlp") s += cat(",\"hidden\":", json_ints(hidden));
  s += cat(",\"classes\":", classes);
  if (name == "cnn") {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", dropout);
    s += cat(",\"dropout\":", buf);
  }
  if (name == "resnet")
    s += cat(",\"depth\":", depth, ",\"width\":", width, ",\"activation\":\"", activation, "\"");
  if (!layer_precision.empty()) s += cat(",\"layer_precision\":\"", layer_precision, "\"");
  return s + "}";
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
      p.init = ps.init;
      p.decay = ps.decay;
      p.offset = num_params_;
      num_params_ += shape_numel(ps.shape);
      params_.push_back(std::move(p));
    }
  }
  for (auto& layer : layers_)
    for (auto& bs : layer->buffer_specs()) {
      StateBuffer b;
      b.name = layer->name() + "." + bs.name;
      b.shape = bs.shape;
      b.init = bs.init;
      b.offset = num_buffer_elems_;
      num_buffer_elems_ += shape_numel(bs.shape);
      buffers_.push_back(std::move(b));
    }
  state_ = Buffer(size_t(num_buffer_elems_) * 4);
  size_t next_buffer = 0;
  for (auto& layer : layers_) {
    std::vector<StateBuffer*> bs;
    for (size_t i = 0; i < layer->buffer_specs().size(); ++i) {
      StateBuffer& b = buffers_[next_buffer++];
      b.value = state().slice(b.offset, b.shape);
      bs.push_back(&b);
    }
    if (!bs.empty()) layer->bind_buffers(std::move(bs));
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

namespace {

void fill(const Tensor& t, Init init) {
  float* v = t.as<float>();
  std::fill(v, v + t.numel(), init == Init::ones ? 1.f : 0.f);
}

void collect(Layer* l, const std::string& prefix,
             std::vector<std::pair<std::string, Layer*>>& out) {
  const std::string name = prefix.empty() ? l->name() : prefix + "." + l->name();
  out.push_back({name, l});
  for (Layer* c : l->children()) collect(c, name, out);
}

}  // namespace

void Model::init_parameters(uint64_t seed, kernels::Backend& backend) {
  // The values are drawn on the host. Device buffers are filled through host staging
  // copies and uploaded whole; on the host, `m` and `s` are the buffers themselves.
  const bool on_host = master_.device().kind == Device::cpu;
  Buffer m_stage, s_stage;
  Tensor m = master(), s = state();
  if (!on_host) {
    m_stage = Buffer(master_.bytes(), Device{});
    s_stage = Buffer(state_.bytes(), Device{});
    m = Tensor(m_stage.data(), m.shape, DType::f32, Device{});
    s = Tensor(s_stage.data(), s.shape, DType::f32, Device{});
  }
  for (Param& p : params_) {
    const Tensor dst = m.slice(p.offset, p.shape);  // p.master on the host
    if (p.init != Init::fan_in_uniform) {
      fill(dst, p.init);
      continue;
    }
    Rng rng(mix_seed(seed, hash_name(p.name)));
    const float bound = 1.f / std::sqrt(float(p.fan_in));
    float* v = dst.as<float>();
    for (int64_t j = 0; j < dst.numel(); ++j) v[j] = (2.f * rng.uniform() - 1.f) * bound;
  }
  for (StateBuffer& b : buffers_) fill(s.slice(b.offset, b.shape), b.init);
  if (!on_host) {
    copy_bytes(master_.data(), master_.device(), m.data, Device{}, master_.bytes());
    copy_bytes(state_.data(), state_.device(), s.data, Device{}, state_.bytes());
  }
  refresh_working_copy(backend);
}

Layer* Model::find_layer(const std::string& name) const {
  std::vector<std::pair<std::string, Layer*>> all;
  for (auto& l : layers_) collect(l.get(), "", all);
  for (auto& [n, l] : all)
    if (n == name) return l;
  return nullptr;
}

std::vector<std::string> Model::layer_names() const {
  std::vector<std::pair<std::string, Layer*>> all;
  for (auto& l : layers_) collect(l.get(), "", all);
  std::vector<std::string> names;
  for (auto& [n, l] : all) names.push_back(n);
  return names;
}

void Model::refresh_working_copy(kernels::Backend& backend) {
  if (compute_ != DType::f32) backend.cast(master(), work());
}

const Tensor& Model::forward(Context& ctx, const Tensor& x,
                             const std::function<void(size_t, const Tensor&)>& after_layer) {
  const Tensor* cur = &x;
  const bool label = master_.device().kind != Device::cpu;  // the host path stays as it was
  for (size_t l = 0; l < layers_.size(); ++l) {
    std::optional<AllocScope> scope;
    if (label) scope.emplace(layers_[l]->name());
    cur = &layers_[l]->forward(ctx, *cur);
    if (after_layer) after_layer(l, *cur);
  }
  return *cur;
}

void Model::backward(Context& ctx, const Tensor& dlogits,
                     const std::function<void(size_t)>& grad_ready) {
  const Tensor* cur = &dlogits;
  const bool label = master_.device().kind != Device::cpu;
  for (size_t l = layers_.size(); l-- > 0;) {
    {
      std::optional<AllocScope> scope;
      if (label) scope.emplace(layers_[l]->name());
      cur = &layers_[l]->backward(ctx, *cur);
    }
    if (backward_hook_) backward_hook_(l, *cur);
    if (!grad_ready) continue;
    const auto [first, count] = layer_params_[l];
    for (size_t i = first; i < first + count; ++i) grad_ready(i);
  }
}

namespace {

using kernels::Activation;
using Layers = std::vector<std::unique_ptr<Layer>>;

template <typename L, typename... Args>
void add(Layers& layers, Args&&... args) {
  layers.push_back(std::make_unique<L>(std::forward<Args>(args)...));
}

Layers build_mlp(const ModelSpec& spec) {
  Layers layers;
  int64_t width = shape_numel(spec.input);
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    RT_REQUIRE(spec.hidden[i] > 0, "--hidden: layer width ", spec.hidden[i], " is not positive");
    add<Linear>(layers, cat("fc", i + 1), width, spec.hidden[i], Activation::relu);
    width = spec.hidden[i];
  }
  add<Linear>(layers, cat("fc", spec.hidden.size() + 1), width, spec.classes);
  return layers;
}

void require_image(const ModelSpec& spec, int64_t min_side) {
  RT_REQUIRE(spec.input.size() == 3 && spec.input[1] >= min_side && spec.input[2] >= min_side,
             "--model ", spec.name, " needs image samples [C, H, W] with H, W >= ", min_side,
             "; the data holds samples of shape ", shape_str(spec.input),
             " (convert the images with their [C, H, W] shape, or use --model mlp)");
}

Layers build_cnn(const ModelSpec& spec) {
  require_image(spec, 6);
  RT_REQUIRE(spec.dropout >= 0 && spec.dropout < 1, "--dropout ", spec.dropout,
             " is not a probability in [0, 1)");
  Layers layers;
  const int64_t c = spec.input[0], h = spec.input[1], w = spec.input[2];
  add<Conv2D>(layers, "conv1", Conv2D::Options{c, 32, 3, 1, 0, true, Activation::relu});
  auto conv2 =
      std::make_unique<Conv2D>("conv2", Conv2D::Options{32, 64, 3, 1, 0, true, Activation::relu});
  auto pool = std::make_unique<MaxPool2D>("pool", 2, 2);
  conv2->set_relu_grad_done_by_next(true);  // the pooling applies conv2's ReLU gradient
  pool->set_relu_input(true);
  layers.push_back(std::move(conv2));
  layers.push_back(std::move(pool));
  add<Dropout>(layers, "dropout", float(spec.dropout));
  add<Flatten>(layers, "flatten");
  const int64_t features = 64 * ((h - 4) / 2) * ((w - 4) / 2);
  add<Linear>(layers, "fc1", features, 128, Activation::relu);
  add<Linear>(layers, "fc2", 128, spec.classes);
  return layers;
}

std::unique_ptr<Layer> activation(const ModelSpec& spec, const std::string& name) {
  if (spec.activation == "gelu") return std::make_unique<GELU>(name);
  return std::make_unique<ReLU>(name);
}

Layers build_resnet(const ModelSpec& spec) {
  require_image(spec, 8);
  RT_REQUIRE(spec.depth >= 1 && spec.depth <= 64, "--depth ", spec.depth,
             " is not valid; expected 1 to 64 blocks per stage");
  RT_REQUIRE(spec.width >= 1 && spec.width <= 1024, "--width ", spec.width,
             " is not valid; expected 1 to 1024 channels");
  RT_REQUIRE(spec.activation == "relu" || spec.activation == "gelu", "--activation '",
             spec.activation, "' is not known; expected relu or gelu");
  auto conv = [](const std::string& name, int64_t in, int64_t out, int64_t k, int64_t stride) {
    return std::make_unique<Conv2D>(
        name, Conv2D::Options{in, out, k, stride, k / 2, false, Activation::none});
  };
  Layers layers;
  int64_t ch = spec.width;
  layers.push_back(conv("stem.conv", spec.input[0], ch, 3, 1));
  add<BatchNorm2D>(layers, "stem.bn", ch);
  layers.push_back(activation(spec, "stem.act"));
  for (int64_t stage = 0; stage < 3; ++stage) {
    const int64_t out = spec.width << stage;
    for (int64_t b = 0; b < spec.depth; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      Layers body, shortcut;
      body.push_back(conv("conv1", ch, out, 3, stride));
      add<BatchNorm2D>(body, "bn1", out);
      body.push_back(activation(spec, "act1"));
      body.push_back(conv("conv2", out, out, 3, 1));
      add<BatchNorm2D>(body, "bn2", out);
      if (stride != 1 || ch != out) {
        shortcut.push_back(conv("down.conv", ch, out, 1, stride));
        add<BatchNorm2D>(shortcut, "down.bn", out);
      }
      const std::string block = cat("stage", stage + 1, ".block", b + 1);
      add<Residual>(layers, block, std::move(body), std::move(shortcut));
      layers.push_back(activation(spec, block + ".act"));
      ch = out;
    }
  }
  add<GlobalAvgPool>(layers, "pool");
  add<Linear>(layers, "fc", ch, spec.classes);
  return layers;
}

DType parse_layer_dtype(const std::string& v, const std::string& item) {
  if (v == "fp32") return DType::f32;
  if (v == "fp16") return DType::f16;
  if (v == "bf16") return DType::bf16;
  throw_input(cat("--layer-precision '", item, "': '", v, "' is not fp32, fp16 or bf16"));
}

void apply_layer_precision(Model& model, const std::string& list) {
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    RT_REQUIRE(eq != std::string::npos && eq > 0, "--layer-precision '", item,
               "' is not LAYER=DTYPE (e.g. conv1=fp32)");
    const std::string name = item.substr(0, eq);
    Layer* layer = model.find_layer(name);
    if (!layer) {
      std::string names;
      for (const auto& n : model.layer_names()) names += (names.empty() ? "" : ", ") + n;
      throw_input(
          cat("--layer-precision: the model has no layer '", name, "'; its layers are ", names));
    }
    layer->set_dtype(parse_layer_dtype(item.substr(eq + 1), item));
  }
}

}  // namespace

namespace {

// Before any buffer is allocated: a lower bound of the memory the model needs against the
// machine's physical memory, so that `--hidden 100000,100000` or huge samples are an input
// error naming the values instead of "out of host memory" later. The bound counts 12 bytes
// per parameter (fp32 master, fp32-or-smaller gradient and working copy, no optimizer
// state) and one sample's fp32 input and first-layer output; the real need is larger.
void require_fits_in_memory(const ModelSpec& spec, const Layers& layers) {
  double params = 0;  // double: products of hostile sizes must not wrap
  for (const auto& layer : layers)
    for (const auto& ps : layer->param_specs()) {
      double n = 1;
      for (int64_t d : ps.shape) n *= double(d);
      params += n;
    }
  double input = 1;
  for (int64_t d : spec.input) input *= double(d);
  double first = 0;  // elements of the first layer's output for one sample
  if (spec.name == "mlp")
    first = double(spec.hidden.empty() ? spec.classes : spec.hidden[0]);
  else if (spec.name == "cnn")
    first = 32.0 * double(spec.input[1] - 2) * double(spec.input[2] - 2);
  else
    first = double(spec.width) * double(spec.input[1]) * double(spec.input[2]);
  const double need = 12 * params + 4 * (input + first);
  const double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (need <= memory) return;
  std::string hidden;
  for (int64_t h : spec.hidden) {
    if (!hidden.empty()) hidden += ',';
    hidden += std::to_string(h);
  }
  if (spec.name == "mlp")
    hidden.insert(0, " --hidden ");
  else
    hidden.clear();
  throw_input(cat("--model ", spec.name, hidden, " on samples of shape ", shape_str(spec.input),
                  " needs at least ", static_cast<long long>(std::min(need, 9.2e18)), " bytes (",
                  static_cast<long long>(std::min(params, 9.2e18)),
                  " parameters at 12 bytes each, plus one sample's input and first activation), "
                  "more than this machine's ",
                  static_cast<long long>(memory),
                  " bytes of memory; use smaller layers (--hidden, --width) or smaller samples"));
}

}  // namespace

std::unique_ptr<Model> build_model(const ModelSpec& spec, DType compute) {
  RT_REQUIRE(spec.name == "mlp" || spec.name == "cnn" || spec.name == "resnet", "--model '",
             spec.name, "' is not a known model; expected mlp, cnn or resnet");
  RT_REQUIRE(!spec.input.empty() && shape_numel(spec.input) > 0,
             "the model needs a non-empty input shape, got ", shape_str(spec.input));
  RT_REQUIRE(spec.classes >= 2, "the model needs at least 2 classes, got ", spec.classes);
  Layers layers = spec.name == "mlp"   ? build_mlp(spec)
                  : spec.name == "cnn" ? build_cnn(spec)
                                       : build_resnet(spec);
  require_fits_in_memory(spec, layers);
  auto model = std::make_unique<Model>(spec, std::move(layers), compute);
  apply_layer_precision(*model, spec.layer_precision);
  return model;
}

}  // namespace ringtrain
