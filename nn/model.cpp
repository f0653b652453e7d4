// Model: the flat parameter layout (parameters, shared parameters, state buffers), the
// precision policy and fusions of a graph, and parameter initialisation.
#include "nn/model.hpp"

#include <algorithm>
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

Model::Model(std::vector<GraphNode> nodes, DType compute, std::string text, bool flat_buffers)
    : text_(std::move(text)), compute_(compute) {
  struct Pending {
    Layer* layer;
    std::vector<std::pair<bool, size_t>> binds;  // (shared, index into params_/shared_)
  };
  std::vector<Pending> pending;
  std::vector<int> repeat_body;
  for (size_t n = 0; n < nodes.size(); ++n) {
    GraphNode& node = nodes[n];
    repeat_body.push_back(node.repeat_body);
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
        s->param.reads_fp32 = ps.reads_fp32;
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
      p.reads_fp32 = ps.reads_fp32;
      p.split = layer->param_split(ps.name);
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
  state_ = Buffer(size_t(num_buffer_elems_) * 4, default_device(), MemCategory::masters);
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
  const Device dev = default_device();
  const int64_t flat = flat_buffers ? num_params_ : 0;
  master_ = Buffer(size_t(flat) * 4, dev, MemCategory::masters);
  master_count_ = num_params_;
  if (compute_ != DType::f32)
    work_ = Buffer(size_t(flat) * dtype_size(compute_), dev, MemCategory::working);
  grad_ = Buffer(size_t(flat) * dtype_size(compute_), dev, MemCategory::gradients);
  const Tensor m = master(), w = work(), g = grad();
  for (auto& p : params_) {
    p.master =
        flat_buffers ? m.slice(p.offset, p.shape) : Tensor(nullptr, p.shape, DType::f32, dev);
    p.work = flat_buffers ? w.slice(p.offset, p.shape) : Tensor(nullptr, p.shape, compute_, dev);
    p.grad = flat_buffers ? g.slice(p.offset, p.shape) : Tensor(nullptr, p.shape, compute_, dev);
  }
  for (auto& s : shared_) {
    const Param& owner = params_[s->owner];
    s->param.master = owner.master;
    s->param.work = owner.work;
    MemoryScope in(MemCategory::gradients);
    s->param.grad = s->grad.ensure(owner.shape, compute_);
  }
  for (auto& pd : pending) {
    binds_.push_back(pd.binds);
    std::vector<Param*> ps;
    for (auto [shared, i] : pd.binds) ps.push_back(shared ? &shared_[i]->param : &params_[i]);
    if (!ps.empty()) pd.layer->bind(ps);
  }
  apply_policy();
  find_segments(repeat_body);
}

void Model::find_segments(const std::vector<int>& repeat_body) {
  const size_t n = layers_.size();
  segment_of_.assign(n, -1);
  for (size_t l = 0; l < n; ++l) {
    if (repeat_body[l] < 0) continue;
    if (l == 0 || repeat_body[l - 1] != repeat_body[l]) segments_.push_back({l, l});
    segments_.back().end = l + 1;
    segment_of_[l] = int(segments_.size() - 1);
  }
  read_after_.assign(n, 0);
  if (n > 0) read_after_[n - 1] = 1;  // the logits, which the caller reads
  for (size_t l = 0; l < n; ++l)
    for (int in : inputs_[l])
      if (in >= 0 && segment_of_[size_t(in)] >= 0 && segment_of_[size_t(in)] != segment_of_[l])
        read_after_[size_t(in)] = 1;
  saved_.resize(n);
  moved_grads_.resize(n);
}

size_t Model::activation_bytes() {
  size_t bytes = 0;
  for (auto& layer : layers_) bytes += layer->activation_bytes();
  for (const auto* v : {&saved_, &moved_grads_, &grad_sums_})
    for (const OwnedTensor& t : *v) bytes += t.buffer.bytes();
  return bytes;
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
  // Each layer read by exactly one other may hand that reader work (Layer::fuse_with_reader):
  // a convolution read only by a max pooling or another convolution hands it two things.
  // Fusion: with a fused ReLU, the ReLU's gradient mask (the pooling routes no
  // gradient to a window whose maximum is 0; the convolution masks its dx in place), one pass
  // over the tensor saved. Layout: its output stays in the backend's activation layout (no
  // reorders between oneDNN's kernels) when its channels fill whole blocks; all other
  // tensors, the pooling's output among them, are NCHW.
  for (size_t n = 0; n < layers_.size(); ++n) {
    if (inputs_[n].size() != 1 || inputs_[n][0] < 0) continue;
    const auto src = size_t(inputs_[n][0]);
    if (consumers[src] == 1) layers_[src]->fuse_with_reader(*layers_[n]);
  }
}

namespace {

void fill(const Tensor& t, Init init) {
  float* v = t.as<float>();
  std::fill(v, v + t.numel(), init == Init::ones ? 1.f : 0.f);
}

// Draws `p`'s initial values into `dst` (fp32, on the host) from its own stream.
void draw_values(const Param& p, uint64_t seed, const Tensor& dst) {
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

// A tensor-parallel part: the whole tensor drawn (the same values as an unsplit run), this
// rank's ranges along the split axis copied out.
void draw_part(const Param& p, uint64_t seed, const Tensor& dst) {
  const TensorSplit& s = p.split;
  std::vector<float> whole(size_t(shape_numel(s.full)));
  draw_values(p, seed, Tensor(whole.data(), s.full, DType::f32));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < s.axis; ++d) outer *= s.full[size_t(d)];
  for (size_t d = size_t(s.axis) + 1; d < s.full.size(); ++d) inner *= s.full[d];
  const int64_t axis_len = s.full[size_t(s.axis)];
  float* out = dst.as<float>();
  for (int64_t o = 0; o < outer; ++o)
    for (const auto& [b, e] : s.ranges()) {
      const float* src = whole.data() + (o * axis_len + b) * inner;
      out = std::copy(src, src + (e - b) * inner, out);
    }
}

// draw_values, then refuses values that are not finite: an init that makes them (a huge
// NORMAL std, a degenerate fan) would train on NaN from the first step.
void draw(const Param& p, uint64_t seed, const Tensor& dst) {
  if (p.split.split())
    draw_part(p, seed, dst);
  else
    draw_values(p, seed, dst);
  const float* v = dst.as<float>();
  for (int64_t j = 0; j < dst.numel(); ++j)
    if (!std::isfinite(v[j]))
      throw_input(cat("the initial value of parameter '", p.name, "' at index ", j, " is ", v[j],
                      "; its init (",
                      p.init == Init::normal ? cat("NORMAL std ", p.std) : "the op's",
                      ") makes non-finite weights"));
}

}  // namespace

void Model::release_grad() {
  const Device d = grad_.device();
  grad_ = Buffer(0, d);
  for (auto& p : params_) p.grad = Tensor(nullptr, p.shape, compute_, d);
}

void Model::shard_masters(int64_t lo, int64_t hi) {
  RT_CHECK(compute_ != DType::f32 && !sharded_ && 0 <= lo && lo <= hi && hi <= num_params_,
           "sharding the masters of ", num_params_, " parameters in ", dtype_name(compute_),
           " to [", lo, ", ", hi, ")");
  // Which parameters a layer reads in fp32: its own declared so, or all of a layer whose
  // dtype is overridden (Layer::weights reads the masters for those); a shared parameter
  // counts for its owner.
  std::vector<char> needed(params_.size(), 0);
  for (size_t n = 0; n < layers_.size(); ++n) {
    const bool other_dtype = layers_[n]->has_dtype_override();
    const auto [first, count] = layer_params_[n];
    for (size_t i = first; i < first + count; ++i)
      needed[i] = needed[i] || params_[i].reads_fp32 || other_dtype;
  }
  for (const auto& s : shared_)
    needed[s->owner] =
        needed[s->owner] || s->param.reads_fp32 || layers_[s->node]->has_dtype_override();
  fp32_segments_.clear();
  fp32_count_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!needed[i]) continue;
    const int64_t n = shape_numel(params_[i].shape);
    fp32_segments_.push_back({params_[i].offset, n, fp32_count_});
    fp32_count_ += n;
  }
  // The values so far (zero or initialised) move into the shard and the region.
  const Device dev = master_.device();
  // (none when the flat buffers were not allocated: initialisation or a checkpoint fills them)
  const bool values = master_.data() != nullptr;
  Buffer shard(size_t(hi - lo) * 4, dev, MemCategory::masters);
  if (values)
    copy_bytes(shard.data(), dev, static_cast<float*>(master_.data()) + lo, dev,
               size_t(hi - lo) * 4);
  fp32_ = Buffer(size_t(fp32_count_) * 4, dev, MemCategory::working);
  for (const auto& s : fp32_segments_)
    if (values)
      copy_bytes(static_cast<float*>(fp32_.data()) + s.at, dev,
                 static_cast<float*>(master_.data()) + s.flat, dev, size_t(s.count) * 4);
  master_ = std::move(shard);
  master_lo_ = lo;
  master_count_ = hi - lo;
  sharded_ = true;
  size_t next = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].master =
        needed[i] ? fp32_copy().slice(fp32_segments_[next++].at, params_[i].shape) : Tensor();
  for (auto& s : shared_) s->param.master = params_[s->owner].master;
}

void Model::shard_parameters(int64_t lo, int64_t hi) {
  RT_CHECK(!params_sharded_ && 0 <= lo && lo <= hi && hi <= num_params_ &&
               (compute_ == DType::f32 ? !sharded_
                                       : sharded_ && master_lo_ == lo && master_count_ == hi - lo),
           "sharding the parameters of ", num_params_, " in ", dtype_name(compute_), " to [", lo,
           ", ", hi, ")");
  const Device dev = master_.device();
  if (compute_ == DType::f32) {
    Buffer shard(size_t(hi - lo) * 4, dev, MemCategory::masters);
    if (master_.data() != nullptr)
      copy_bytes(shard.data(), dev, static_cast<float*>(master_.data()) + lo, dev,
                 size_t(hi - lo) * 4);
    master_ = std::move(shard);
    master_lo_ = lo;
    master_count_ = hi - lo;
  } else {
    const size_t es = dtype_size(compute_);
    Buffer shard(size_t(hi - lo) * es, dev, MemCategory::working);
    if (work_.data() != nullptr)
      copy_bytes(shard.data(), dev, static_cast<char*>(work_.data()) + size_t(lo) * es, dev,
                 size_t(hi - lo) * es);
    work_ = std::move(shard);
  }
  params_sharded_ = true;
  auto unbind = [&](Param& p) {
    p.work = Tensor(nullptr, p.shape, compute_, dev);
    if (compute_ == DType::f32) p.master = p.work;
  };
  for (auto& p : params_) unbind(p);
  for (auto& s : shared_) unbind(s->param);
}

std::vector<std::pair<Param*, size_t>> Model::node_bindings(size_t node) {
  std::vector<std::pair<Param*, size_t>> out;
  for (auto [shared, i] : binds_.at(node))
    out.push_back(shared ? std::make_pair(&shared_[i]->param, shared_[i]->owner)
                         : std::make_pair(&params_[i], i));
  return out;
}

int64_t Model::fp32_count_in(int64_t lo, int64_t hi) const {
  int64_t n = 0;
  for (const auto& s : fp32_segments_)
    n += std::max<int64_t>(0, std::min(hi, s.flat + s.count) - std::max(lo, s.flat));
  return n;
}

void Model::copy_shard_to_fp32(int64_t from, int64_t to) {
  const int64_t lo = std::max(from, master_lo_), hi = std::min(to, master_lo_ + master_count_);
  const Device dev = master_.device();
  for (const auto& s : fp32_segments_) {
    const int64_t a = std::max(lo, s.flat), b = std::min(hi, s.flat + s.count);
    if (a < b)
      copy_bytes(static_cast<float*>(fp32_.data()) + s.at + (a - s.flat), dev,
                 static_cast<float*>(master_.data()) + (a - master_lo_), dev, size_t(b - a) * 4);
  }
}

void Model::init_sharded(uint64_t seed, kernels::Backend& backend) {
  // Every rank draws each parameter whole (the same values on every rank: one stream per
  // name) and keeps its shard of the masters, the working copy and the fp32 region, so no
  // broadcast is needed and no full fp32 buffer is ever held. The values are drawn on the
  // host; on a GPU each parameter passes through one device staging buffer for the cast
  // into the working copy.
  const Device dev = master_.device();
  const bool on_host = dev.kind == Device::cpu;
  const int64_t lo = master_lo_, hi = master_lo_ + master_count_;
  int64_t largest = 0;
  for (const Param& p : params_) largest = std::max(largest, shape_numel(p.shape));
  Buffer stage = on_host ? Buffer() : Buffer(size_t(largest) * 4, dev, MemCategory::workspace);
  std::vector<float> v;
  size_t next = 0;
  for (const Param& p : params_) {
    const int64_t n = shape_numel(p.shape);
    v.resize(size_t(n));
    const Tensor t(v.data(), p.shape, DType::f32, Device{});
    draw(p, seed, t);
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + n);
    // The working copy: the whole parameter, or with sharded parameters (ZeRO-3) the shard's
    // part of it (in fp32 the masters are the working copy).
    const Tensor src = on_host ? t : Tensor(stage.data(), p.shape, DType::f32, dev);
    if (!on_host) copy_bytes(stage.data(), dev, v.data(), Device{}, size_t(n) * 4);
    if (!params_sharded_)
      backend.cast(src, p.work);
    else if (a < b && compute_ != DType::f32)
      backend.cast(src.slice(a - p.offset, {b - a}), work().slice(a - lo, {b - a}));
    if (a < b)
      copy_bytes(static_cast<float*>(master_.data()) + (a - lo), dev, v.data() + (a - p.offset),
                 Device{}, size_t(b - a) * 4);
    if (next < fp32_segments_.size() && fp32_segments_[next].flat == p.offset)
      copy_bytes(static_cast<float*>(fp32_.data()) + fp32_segments_[next++].at, dev, v.data(),
                 Device{}, size_t(n) * 4);
  }
  if (on_host) {
    for (StateBuffer& b : buffers_) fill(b.value, b.init);
    return;
  }
  Buffer s_stage(state_.bytes(), Device{}, MemCategory::workspace);
  const Tensor s(s_stage.data(), state().shape, DType::f32, Device{});
  for (StateBuffer& b : buffers_) fill(s.slice(b.offset, b.shape), b.init);
  copy_bytes(state_.data(), dev, s.data, Device{}, state_.bytes());
}

void Model::init_parameters(uint64_t seed, kernels::Backend& backend) {
  if (sharded_ || params_sharded_) return init_sharded(seed, backend);
  // The values are drawn on the host. Device buffers are filled through host staging
  // copies and uploaded whole; on the host, `m` and `s` are the buffers themselves.
  const bool on_host = master_.device().kind == Device::cpu;
  Buffer m_stage, s_stage;
  Tensor m = master(), s = state();
  if (!on_host) {
    m_stage = Buffer(master_.bytes(), Device{}, MemCategory::workspace);
    s_stage = Buffer(state_.bytes(), Device{}, MemCategory::workspace);
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
  if (compute_ == DType::f32) return;
  backend.cast(master(), work_shard());
  copy_shard_to_fp32();
}

}  // namespace ringtrain
