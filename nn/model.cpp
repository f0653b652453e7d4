// Model: the flat parameter layout (parameters, shared parameters, state buffers), the
// precision policy and fusions of a graph, and parameter initialisation.
#include "nn/model.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace ringtrain {

Model::Model(std::vector<std::unique_ptr<Layer>> layers, DType compute)
    : Model(
          [&] {
            std::vector<GraphNode> nodes;
            for (size_t i = 0; i < layers.size(); ++i) {
              GraphNode g;
              g.layer = std::move(layers[i]);
              g.inputs = {int(i) - 1};
              nodes.push_back(std::move(g));
            }
            return nodes;
          }(),
          compute) {}

Model::Model(std::vector<GraphNode> nodes, DType compute, std::string text)
    : text_(std::move(text)), compute_(compute) {
  struct Pending {
    Layer* layer;
    std::vector<std::pair<bool, size_t>> binds;  // (shared, index into params_/shared_)
  };
  std::vector<Pending> pending;
  for (size_t n = 0; n < nodes.size(); ++n) {
    GraphNode& node = nodes[n];
    Layer* layer = node.layer.get();
    layers_.push_back(std::move(node.layer));
    inputs_.push_back(node.inputs);
    Pending pd{layer, {}};
    const size_t first = params_.size();
    for (auto& ps : layer->param_specs()) {
      const std::string name = layer->name() + "." + ps.name;
      if (auto it = node.shared.find(ps.name); it != node.shared.end()) {
        size_t owner = params_.size();
        for (size_t i = 0; i < params_.size(); ++i)
          if (params_[i].name == it->second) owner = i;
        RT_REQUIRE(owner < params_.size(), "node ", layer->name(), ": parameter '", ps.name,
                   "' is shared with '", it->second, "', which no earlier node has");
        RT_REQUIRE(params_[owner].shape == ps.shape, "node ", layer->name(), ": parameter '",
                   ps.name, "' of shape ", shape_str(ps.shape), " cannot share '", it->second,
                   "' of shape ", shape_str(params_[owner].shape));
        auto s = std::make_unique<Shared>();
        s->owner = owner;
        s->node = n;
        s->param.name = name;
        s->param.shape = ps.shape;
        pd.binds.push_back({true, shared_.size()});
        shared_.push_back(std::move(s));
        continue;
      }
      Param p;
      p.name = name;
      p.shape = ps.shape;
      p.fan_in = ps.fan_in;
      p.fan_out = ps.fan_out;
      p.init = ps.init;
      p.std = ps.std;
      for (const auto& o : node.init)
        if (o.param.empty() || o.param == ps.name) {
          p.init = o.init;
          p.std = o.std;
        }
      p.decay = node.decay.value_or(ps.decay);
      p.offset = num_params_;
      num_params_ += shape_numel(ps.shape);
      pd.binds.push_back({false, params_.size()});
      params_.push_back(std::move(p));
    }
    layer_params_.push_back({first, params_.size() - first});
    pending.push_back(std::move(pd));
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
  for (auto& s : shared_) {
    const Param& owner = params_[s->owner];
    s->param.master = owner.master;
    s->param.work = owner.work;
    s->param.grad = s->grad.ensure(owner.shape, compute_);
  }
  for (auto& pd : pending) {
    std::vector<Param*> ps;
    for (auto [shared, i] : pd.binds) ps.push_back(shared ? &shared_[i]->param : &params_[i]);
    if (!ps.empty()) pd.layer->bind(ps);
  }
  apply_policy();
}

void Model::apply_policy() {
  if (layers_.empty()) return;
  // Precision policy: the last node's output (the logits) and the loss stay in fp32; a node
  // that reads only the model input computes no input gradient.
  layers_.back()->set_output_dtype(DType::f32);
  std::vector<int> consumers(layers_.size(), 0);
  for (size_t n = 0; n < layers_.size(); ++n) {
    bool from_input_only = true;
    for (int in : inputs_[n]) {
      if (in >= 0) ++consumers[size_t(in)];
      from_input_only = from_input_only && in < 0;
    }
    if (from_input_only) layers_[n]->set_needs_input_grad(false);
  }
  // Fusion: a convolution with a fused ReLU read only by a max pooling leaves the ReLU's
  // gradient mask to the pooling (one pass over the larger tensor saved).
  for (size_t n = 0; n < layers_.size(); ++n) {
    auto* pool = dynamic_cast<MaxPool2D*>(layers_[n].get());
    if (!pool || inputs_[n].size() != 1 || inputs_[n][0] < 0) continue;
    const auto src = size_t(inputs_[n][0]);
    auto* conv = dynamic_cast<Conv2D*>(layers_[src].get());
    if (!conv || consumers[src] != 1 || conv->activation() != kernels::Activation::relu) continue;
    conv->set_relu_grad_done_by_next(true);
    pool->set_relu_input(true);
  }
}

namespace {

void fill(const Tensor& t, Init init) {
  float* v = t.as<float>();
  std::fill(v, v + t.numel(), init == Init::ones ? 1.f : 0.f);
}

// Draws `p`'s initial values into `dst` (fp32, on the host) from its own stream.
void draw(const Param& p, uint64_t seed, const Tensor& dst) {
  if (p.init == Init::zeros || p.init == Init::ones) return fill(dst, p.init);
  Rng rng(mix_seed(seed, hash_name(p.name)));
  float* v = dst.as<float>();
  const int64_t n = dst.numel();
  const double fan_in = double(p.fan_in), fan_sum = double(p.fan_in + p.fan_out);
  auto uniform = [&](float bound) {
    for (int64_t j = 0; j < n; ++j) v[j] = (2.f * rng.uniform() - 1.f) * bound;
  };
  auto normal = [&](double std) {  // Box-Muller on the stream's uniforms
    for (int64_t j = 0; j < n; ++j) {
      const double u1 = 1.0 - double(rng.uniform()), u2 = double(rng.uniform());
      v[j] = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  };
  switch (p.init) {
    case Init::fan_in_uniform:
      return uniform(1.f / std::sqrt(float(p.fan_in)));
    case Init::kaiming_uniform:
      return uniform(float(std::sqrt(6.0 / fan_in)));
    case Init::kaiming_normal:
      return normal(std::sqrt(2.0 / fan_in));
    case Init::xavier_uniform:
      return uniform(float(std::sqrt(6.0 / fan_sum)));
    case Init::xavier_normal:
      return normal(std::sqrt(2.0 / fan_sum));
    case Init::normal:
      return normal(p.std);
    default:
      return;
  }
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
  for (Param& p : params_) draw(p, seed, m.slice(p.offset, p.shape));  // p.master on the host
  for (StateBuffer& b : buffers_) fill(s.slice(b.offset, b.shape), b.init);
  if (!on_host) {
    copy_bytes(master_.data(), master_.device(), m.data, Device{}, master_.bytes());
    copy_bytes(state_.data(), state_.device(), s.data, Device{}, state_.bytes());
  }
  refresh_working_copy(backend);
}

Layer* Model::find_layer(const std::string& name) const {
  for (auto& l : layers_)
    if (l->name() == name) return l.get();
  return nullptr;
}

std::vector<std::string> Model::layer_names() const {
  std::vector<std::string> names;
  for (auto& l : layers_) names.push_back(l->name());
  return names;
}

void Model::refresh_working_copy(kernels::Backend& backend) {
  if (compute_ != DType::f32) backend.cast(master(), work());
}

}  // namespace ringtrain
