// The transformer ops: Embedding, LayerNorm, CausalSelfAttention and GeluTanh (declared in
// nn/transformer_layers.hpp) and the registration of `embedding`, `layer_norm` and
// `attention` (the tanh GELU is `activation { kind: GELU_TANH }`, nn/ops/activation.cpp).
#include <cmath>

#include "core/error.hpp"
#include "nn/op_registry.hpp"
#include "nn/transformer_layers.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

// ---- Embedding -------------------------------------------------------------------------

std::vector<ParamSpec> Embedding::param_specs() const {
  // GPT-2's initialisation: N(0, 0.02^2) tokens, N(0, 0.01^2) positions; no weight decay.
  std::vector<ParamSpec> s;
  ParamSpec wte{"wte", {vocab_, width_}, width_, Init::normal, vocab_};
  wte.std = 0.02;
  wte.decay = false;
  s.push_back(wte);
  if (positional_) {
    ParamSpec wpe{"wpe", {context_, width_}, width_, Init::normal, context_};
    wpe.std = 0.01;
    wpe.decay = false;
    s.push_back(wpe);
  }
  return s;
}

void Embedding::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == (positional_ ? 2u : 1u), "Embedding binds ", positional_ ? 2 : 1,
           " params, got ", params.size());
  wte_ = params[0];
  wpe_ = positional_ ? params[1] : nullptr;
}

const Tensor& Embedding::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.dtype == DType::i32 && x.shape.size() == 2, "layer ", name(),
             " takes token ids [batch, T] (int32, from a token dataset); got ", dtype_name(x.dtype),
             " ", shape_str(x.shape), " (an image dataset given to a language model?)");
  RT_REQUIRE(x.dim(1) <= context_, "layer ", name(), ": ", x.dim(1),
             " tokens per sample exceed the model's context of ", context_, "; use --seq-len ",
             context_, " or less");
  tokens_ = x;
  Tensor& y = y_.ensure({x.dim(0), x.dim(1), width_}, out_dtype(ctx));
  const Tensor wte = weights(ctx, *wte_, wte_c_);
  if (wpe_) {
    const Tensor wpe = weights(ctx, *wpe_, wpe_c_);
    ctx.backend.embedding_forward(x, wte, &wpe, y);
  } else {
    ctx.backend.embedding_forward(x, wte, nullptr, y);
  }
  return y;
}

const Tensor& Embedding::backward(Context& ctx, const Tensor& dy) {
  // Summed in fp32 (a token seen many times in a batch), then into the compute-dtype grads.
  Tensor& dwte = dwte_.ensure(wte_->shape, DType::f32);
  if (wpe_) {
    Tensor& dwpe = dwpe_.ensure(wpe_->shape, DType::f32);
    ctx.backend.embedding_backward(tokens_, dy, dwte, &dwpe);
    ctx.backend.cast(dwpe, wpe_->grad);
  } else {
    ctx.backend.embedding_backward(tokens_, dy, dwte, nullptr);
  }
  ctx.backend.cast(dwte, wte_->grad);
  return none_;
}

// ---- LayerNorm -------------------------------------------------------------------------

std::vector<ParamSpec> LayerNorm::param_specs() const {
  ParamSpec g{"weight", {c_}, 1, Init::ones};
  ParamSpec b{"bias", {c_}, 1, Init::zeros};
  g.decay = b.decay = false;
  g.reads_fp32 = b.reads_fp32 = true;
  return {g, b};
}

void LayerNorm::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == 2, "LayerNorm binds 2 params, got ", params.size());
  gamma_ = params[0];
  beta_ = params[1];
}

const Tensor& LayerNorm::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(!x.shape.empty() && x.shape.back() == c_, "layer ", name(), " normalises ", c_,
             " features, got input ", shape_str(x.shape));
  x_ = in_dtype(ctx, x, xin_);
  const int64_t rows = x.numel() / c_;
  Tensor& y = y_.ensure(x.shape, out_dtype(ctx));
  ctx.backend.layernorm_forward(x_, gamma_->master, beta_->master, eps_, y,
                                mean_.ensure({rows}, DType::f32), rstd_.ensure({rows}, DType::f32));
  return y;
}

const Tensor& LayerNorm::backward(Context& ctx, const Tensor& dy_in) {
  const DType d = dtype(ctx);
  Tensor dy = dy_in;
  if (dy.dtype != d) {  // a gradient arriving in fp32 from an fp32 layer
    dy = dyc_.ensure(dy_in.shape, d);
    ctx.backend.cast(dy_in, dy);
  }
  Tensor& dx = dx_.ensure(x_.shape, d);
  Tensor& dg = dgamma_.ensure({c_}, DType::f32);
  Tensor& db = dbeta_.ensure({c_}, DType::f32);
  ctx.backend.layernorm_backward(x_, dy, gamma_->master, mean_.view, rstd_.view, dx, dg, db);
  ctx.backend.cast(dg, gamma_->grad);
  ctx.backend.cast(db, beta_->grad);
  return dx;
}

// ---- CausalSelfAttention ---------------------------------------------------------------

const Tensor& CausalSelfAttention::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 3 && x.dim(2) % (3 * heads_) == 0, "layer ", name(),
             " takes qkv [batch, T, 3 * width] with the width a multiple of ", heads_,
             " heads; got ", shape_str(x.shape));
  x_ = in_dtype(ctx, x, xin_);
  const int64_t b = x.dim(0), t = x.dim(1), c = x.dim(2) / 3;
  Tensor& y = y_.ensure({b, t, c}, dtype(ctx));
  ctx.backend.attention_forward(heads_, x_, y, lse_.ensure({b, heads_, t}, DType::f32));
  if (out_dtype(ctx) == y.dtype) return y;
  Tensor& out = yout_.ensure(y.shape, out_dtype(ctx));
  ctx.backend.cast(y, out);
  return out;
}

const Tensor& CausalSelfAttention::backward(Context& ctx, const Tensor& dy_in) {
  const DType d = dtype(ctx);
  Tensor dy = dy_in;
  if (dy.dtype != d) {
    dy = dyc_.ensure(dy_in.shape, d);
    ctx.backend.cast(dy_in, dy);
  }
  Tensor& dx = dx_.ensure(x_.shape, d);
  ctx.backend.attention_backward(heads_, x_, y_.view, dy, lse_.view, dx);
  return dx;
}

// ---- GeluTanh --------------------------------------------------------------------------

const Tensor& GeluTanh::forward(Context& ctx, const Tensor& x) {
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(x_.shape, out_dtype(ctx));
  ctx.backend.gelu_tanh(x_, y);
  return y;
}

const Tensor& GeluTanh::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, dtype(ctx));
  ctx.backend.gelu_tanh_backward(x_, dy, dx);
  return dx;
}

// ---- registration ----------------------------------------------------------------------

namespace {

float ln_eps(const pb::LayerNorm& o) { return o.has_eps() ? float(o.eps()) : 1e-5f; }

RINGTRAIN_REGISTER_OP(
    embedding,
    OpDef{.name = "embedding",
          .infer = [](const OpNode& n) -> Shape {
            const auto& o = n.def.embedding();
            RT_REQUIRE(n.inputs[0].size() == 1, "embedding takes token ids [T] per sample, got ",
                       shape_str(n.inputs[0]));
            RT_REQUIRE(o.vocab_size() >= 1, "vocab_size ", o.vocab_size(),
                       " is not valid; expected a positive number");
            RT_REQUIRE(o.width() >= 1, "width ", o.width(),
                       " is not valid; expected a positive number");
            const bool pos = !o.has_positional() || o.positional();
            RT_REQUIRE(!pos || o.context() >= n.inputs[0][0], "context ", o.context(),
                       " is shorter than the ", n.inputs[0][0], " tokens of a sample");
            return {n.inputs[0][0], o.width()};
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            const auto& o = n.def.embedding();
            return std::make_unique<Embedding>(n.name, o.vocab_size(), o.width(), o.context(),
                                               !o.has_positional() || o.positional());
          },
          .flops = [](const OpNode&, const Shape& out) { return double(shape_numel(out)); }});

RINGTRAIN_REGISTER_OP(
    layer_norm,
    OpDef{.name = "layer_norm",
          .infer = [](const OpNode& n) -> Shape {
            RT_REQUIRE(!n.inputs[0].empty(), "layer_norm needs an input with features");
            RT_REQUIRE(ln_eps(n.def.layer_norm()) > 0, "eps ", n.def.layer_norm().eps(),
                       " is not positive");
            return n.inputs[0];
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<LayerNorm>(n.name, n.inputs[0].back(),
                                               ln_eps(n.def.layer_norm()));
          },
          .flops = [](const OpNode&, const Shape& out) { return 5.0 * double(shape_numel(out)); }});

RINGTRAIN_REGISTER_OP(
    attention,
    OpDef{.name = "attention",
          .infer = [](const OpNode& n) -> Shape {
            const Shape& x = n.inputs[0];
            const int64_t h = n.def.attention().heads();
            RT_REQUIRE(h >= 1, "heads ", h, " is not valid; expected a positive number");
            RT_REQUIRE(x.size() == 2 && x[1] % (3 * h) == 0,
                       "attention takes qkv [T, 3 * width] with the width a multiple of ", h,
                       " heads; got ", shape_str(x));
            return {x[0], x[1] / 3};
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<CausalSelfAttention>(n.name, n.def.attention().heads());
          },
          // Causal: q k^T and p v over T (T + 1) / 2 pairs, 2 FLOPs per multiply-add each.
          .flops =
              [](const OpNode& n, const Shape& out) {
                const double t = double(out[0]), c = double(out[1]);
                return 2.0 * 2.0 * c * t * (t + 1) / 2;
              }});

}  // namespace

}  // namespace ringtrain
