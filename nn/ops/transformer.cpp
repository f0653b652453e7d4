// The transformer ops: Embedding, LayerNorm, CausalSelfAttention and GeluTanh (declared in
// nn/transformer_layers.hpp) and the registration of `embedding`, `layer_norm` and
// `attention` (the tanh GELU is `activation { kind: GELU_TANH }`, nn/ops/activation.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "nn/llama_layers.hpp"
#include "nn/onnx_writer.hpp"
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
  MemoryScope in(MemCategory::gradients);
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
  MemoryScope in(MemCategory::gradients);  // the parameters' fp32 gradients
  Tensor& dg = dgamma_.ensure({c_}, DType::f32);
  Tensor& db = dbeta_.ensure({c_}, DType::f32);
  ctx.backend.layernorm_backward(x_, dy, gamma_->master, mean_.view, rstd_.view, dx, dg, db);
  ctx.backend.cast(dg, gamma_->grad);
  ctx.backend.cast(db, beta_->grad);
  return dx;
}

// ---- CausalSelfAttention ---------------------------------------------------------------

std::string CausalSelfAttention::split_tensor_parallel(TensorSplitRole role, int64_t /*groups*/,
                                                       const TensorParallelGroup* group) {
  if (role != TensorSplitRole::heads) return "attention splits by heads";
  if (heads_ % group->size != 0)
    return cat("its ", heads_, " heads do not divide into ", group->size, " parts");
  heads_ /= group->size;
  return "";
}

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

bool positional(const pb::Embedding& o) { return !o.has_positional() || o.positional(); }

// The first `len` ([1], int64) of dimension 1 of value x: the sequence length T.
std::string onnx_seq_len(OnnxWriter& w, const std::string& x, const std::string& prefix) {
  const std::string shape = w.op("Shape", prefix + "/shape", {x});
  return w.op("Slice", prefix + "/seq_len",
              {shape, w.ints("const/i1", {1}), w.ints("const/i2", {2}), w.ints("const/i0", {0})});
}

// ids [N, T] -> rows of the token table (+ rows 0..T-1 of the position table).
std::string embedding_onnx(const OpNode& n, OnnxWriter& w) {
  const std::string x = w.input(0), v = w.output();
  const bool pos = positional(n.def.embedding());
  const std::string tok = pos ? v + "/tokens" : v;
  w.node("Gather", tok, {w.param("wte"), x}, {tok}, {{"axis", int64_t(0)}});
  if (!pos) return tok;
  const std::string p = w.op(
      "Slice", v + "/positions",
      {w.param("wpe"), w.ints("const/i0", {0}), onnx_seq_len(w, x, v), w.ints("const/i0", {0})});
  return w.op("Add", v, {tok, p});
}

// Causal multi-head self-attention as MatMul/Softmax: qkv [N, T, 3C] (q, k, v side by side,
// head h at columns h*hs of each) -> [N, T, C]; scores scaled by 1/sqrt(hs), the future
// masked by adding -inf from the top-left [T, T] of one constant mask (the model's longest
// sequence square, shared by every attention node).
std::string gqa_attention_onnx(const OpNode& n, OnnxWriter& w);

std::string attention_onnx(const OpNode& n, OnnxWriter& w) {
  if (n.inputs.size() == 3) return gqa_attention_onnx(n, w);
  const std::string x = w.input(0), p = w.output();
  const int64_t heads = n.def.attention().heads(), c = n.inputs[0][1] / 3, hs = c / heads;
  const int64_t l = std::max(w.max_sequence(), n.inputs[0][0]);
  std::vector<float> mask(size_t(l * l), 0.f);
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = i + 1; j < l; ++j)
      mask[size_t(i * l + j)] = -std::numeric_limits<float>::infinity();
  const std::string m_all = w.weight("const/causal_mask", {l, l}, mask.data());
  w.node("Split", p + "/split", {x, w.ints(cat("const/split_", c), {c, c, c})},
         {p + "/q", p + "/k", p + "/v"}, {{"axis", int64_t(2)}});
  const std::string heads_shape = w.ints(cat("const/heads_", heads, "x", hs), {0, 0, heads, hs});
  auto split_heads = [&](const std::string& v, std::vector<int64_t> perm) {
    const std::string r = w.op("Reshape", v + "_heads", {v, heads_shape});
    return w.op("Transpose", v + "_t", {r}, {{"perm", std::move(perm)}});
  };
  const std::string q = split_heads(p + "/q", {0, 2, 1, 3});  // [N, H, T, hs]
  const std::string k = split_heads(p + "/k", {0, 2, 3, 1});  // [N, H, hs, T]
  const std::string v = split_heads(p + "/v", {0, 2, 1, 3});  // [N, H, T, hs]
  const std::string s = w.op("Mul", p + "/scores",
                             {w.op("MatMul", p + "/qk", {q, k}),
                              w.scalar(cat("const/inv_sqrt_", hs), 1.f / std::sqrt(float(hs)))});
  const std::string t = onnx_seq_len(w, x, p);
  const std::string ends = w.op("Concat", p + "/mask_ends", {t, t}, {{"axis", int64_t(0)}});
  const std::string m =
      w.op("Slice", p + "/mask",
           {m_all, w.ints("const/i00", {0, 0}), ends, w.ints("const/i01", {0, 1})});
  const std::string probs =
      w.op("Softmax", p + "/probs", {w.op("Add", p + "/masked", {s, m})}, {{"axis", int64_t(-1)}});
  const std::string o = w.op("Transpose", p + "/out_t", {w.op("MatMul", p + "/out", {probs, v})},
                             {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  return w.op("Reshape", p, {o, w.ints(cat("const/merge_", c), {0, 0, c})});
}

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
            RT_REQUIRE(o.context() >= n.inputs[0][0], "context ", o.context(),
                       " is shorter than the ", n.inputs[0][0], " tokens of a sample");
            return {n.inputs[0][0], o.width()};
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            const auto& o = n.def.embedding();
            return std::make_unique<Embedding>(n.name, o.vocab_size(), o.width(), o.context(),
                                               positional(o));
          },
          .flops = [](const OpNode&, const Shape& out) { return double(shape_numel(out)); },
          .input_kind = InputKind::tokens,
          .token_limits = [](const OpNode& n) -> TokenLimits {
            const auto& o = n.def.embedding();
            return {o.vocab_size(), o.context()};
          },
          .onnx = embedding_onnx});

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
          .flops = [](const OpNode&, const Shape& out) { return 5.0 * double(shape_numel(out)); },
          .onnx =
              [](const OpNode& n, OnnxWriter& w) {
                w.node("LayerNormalization", w.output(),
                       {w.input(0), w.param("weight"), w.param("bias")}, {w.output()},
                       {{"axis", int64_t(-1)}, {"epsilon", ln_eps(n.def.layer_norm())}});
                return w.output();
              }});

// Three inputs (q, k, v): grouped-query attention with optional rotary embeddings.
bool three_inputs(const OpNode& n) { return n.inputs.size() == 3; }

// The three-input form: q [N, T, H d], k and v [N, T, KV d] -> [N, T, H d]. Rotary embeddings
// as HF writes them, x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1) and cos,
// sin [L, d] constants (each half repeated) sliced to T rows; the key/value heads repeated
// for their query heads (Unsqueeze, Concat of heads / kv_heads copies, Reshape); then the
// scores, causal mask and softmax as the one-input form.
std::string gqa_attention_onnx(const OpNode& n, OnnxWriter& w) {
  const std::string p = w.output();
  const auto& o = n.def.attention();
  const int64_t h = o.heads(), kv = o.kv_heads() == 0 ? h : o.kv_heads();
  const int64_t c = n.inputs[0][1], d = c / h, half = d / 2, group = h / kv;
  const int64_t l = std::max(w.max_sequence(), n.inputs[0][0]);
  const std::string t = onnx_seq_len(w, w.input(0), p);
  // [N, T, heads * d] -> [N, heads, T, d]
  auto split_heads = [&](const std::string& x, int64_t heads, const std::string& name) {
    const std::string r = w.op("Reshape", name + "_heads",
                               {x, w.ints(cat("const/heads_", heads, "x", d), {0, 0, heads, d})});
    return w.op("Transpose", name + "_t", {r}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  };
  std::string q = split_heads(w.input(0), h, p + "/q");
  std::string k = split_heads(w.input(1), kv, p + "/k");
  std::string v = split_heads(w.input(2), kv, p + "/v");
  if (o.rope_theta() > 0) {
    std::vector<float> cs(size_t(l * d)), sn(size_t(l * d));
    for (int64_t pos = 0; pos < l; ++pos)
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(pos) * std::pow(o.rope_theta(), -2.0 * double(i) / double(d));
        cs[size_t(pos * d + i)] = cs[size_t(pos * d + i + half)] = float(std::cos(a));
        sn[size_t(pos * d + i)] = sn[size_t(pos * d + i + half)] = float(std::sin(a));
      }
    const std::string key = cat("const/rope_", d, "_", o.rope_theta(), "_", l);
    const std::string cos_all = w.weight(key + "/cos", {l, d}, cs.data());
    const std::string sin_all = w.weight(key + "/sin", {l, d}, sn.data());
    const std::string cos_t =
        w.op("Slice", p + "/cos", {cos_all, w.ints("const/i0", {0}), t, w.ints("const/i0", {0})});
    const std::string sin_t =
        w.op("Slice", p + "/sin", {sin_all, w.ints("const/i0", {0}), t, w.ints("const/i0", {0})});
    auto rotate = [&](const std::string& x) {
      w.node("Split", x + "/halves",
             {x, w.ints(cat("const/split_", half, "_", half), {half, half})},
             {x + "/x1", x + "/x2"}, {{"axis", int64_t(-1)}});
      const std::string rh =
          w.op("Concat", x + "/rotate_half", {w.op("Neg", x + "/neg_x2", {x + "/x2"}), x + "/x1"},
               {{"axis", int64_t(-1)}});
      return w.op("Add", x + "/rope",
                  {w.op("Mul", x + "/xcos", {x, cos_t}), w.op("Mul", x + "/rsin", {rh, sin_t})});
    };
    q = rotate(q);
    k = rotate(k);
  }
  if (group > 1) {
    auto repeat = [&](const std::string& x) {
      const std::string u = w.op("Unsqueeze", x + "/unsq", {x, w.ints("const/i2", {2})});
      const std::string r =
          w.op("Concat", x + "/repeat", std::vector<std::string>(size_t(group), u),
               {{"axis", int64_t(2)}});
      return w.op("Reshape", x + "/grouped",
                  {r, w.ints(cat("const/gqa_", h, "x", d), {0, h, -1, d})});
    };
    k = repeat(k);
    v = repeat(v);
  }
  const std::string kt =
      w.op("Transpose", p + "/k_tt", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  std::vector<float> mask(size_t(l * l), 0.f);
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = i + 1; j < l; ++j)
      mask[size_t(i * l + j)] = -std::numeric_limits<float>::infinity();
  const std::string m_all = w.weight("const/causal_mask", {l, l}, mask.data());
  const std::string s = w.op("Mul", p + "/scores",
                             {w.op("MatMul", p + "/qk", {q, kt}),
                              w.scalar(cat("const/inv_sqrt_", d), 1.f / std::sqrt(float(d)))});
  const std::string ends = w.op("Concat", p + "/mask_ends", {t, t}, {{"axis", int64_t(0)}});
  const std::string m =
      w.op("Slice", p + "/mask",
           {m_all, w.ints("const/i00", {0, 0}), ends, w.ints("const/i01", {0, 1})});
  const std::string probs =
      w.op("Softmax", p + "/probs", {w.op("Add", p + "/masked", {s, m})}, {{"axis", int64_t(-1)}});
  const std::string out = w.op("Transpose", p + "/out_t", {w.op("MatMul", p + "/out", {probs, v})},
                               {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  return w.op("Reshape", p, {out, w.ints(cat("const/merge_", c), {0, 0, c})});
}

kernels::RopeConfig rope_config(const OpNode& n) {
  const auto& o = n.def.attention();
  kernels::RopeConfig cfg;
  cfg.heads = o.heads();
  cfg.kv_heads = o.kv_heads() == 0 ? o.heads() : o.kv_heads();
  cfg.head_dim = cfg.heads > 0 ? n.inputs[0][1] / cfg.heads : 0;
  cfg.theta = o.rope_theta();
  return cfg;
}

Shape attention_infer(const OpNode& n) {
  const auto& o = n.def.attention();
  const Shape& x = n.inputs[0];
  const int64_t h = o.heads();
  RT_REQUIRE(h >= 1, "heads ", h, " is not valid; expected a positive number");
  RT_REQUIRE(o.kv_heads() >= 0, "kv_heads ", o.kv_heads(),
             " is not valid; expected a positive number (0: heads)");
  RT_REQUIRE(o.rope_theta() >= 0 && std::isfinite(o.rope_theta()), "rope_theta ", o.rope_theta(),
             " is not valid; expected a positive number (0: no rotary embedding)");
  if (!three_inputs(n)) {
    RT_REQUIRE(n.inputs.size() == 1, "attention takes one input (qkv) or three (q, k, v); got ",
               n.inputs.size());
    RT_REQUIRE((o.kv_heads() == 0 || o.kv_heads() == h) && o.rope_theta() == 0,
               "kv_heads and rope_theta need q, k and v as three inputs (input: \"q\" input: "
               "\"k\" input: \"v\"); this node has one");
    RT_REQUIRE(x.size() == 2 && x[1] % (3 * h) == 0,
               "attention takes qkv [T, 3 * width] with the width a multiple of ", h,
               " heads; got ", shape_str(x));
    return {x[0], x[1] / 3};
  }
  const kernels::RopeConfig cfg = rope_config(n);
  RT_REQUIRE(h % cfg.kv_heads == 0, "heads ", h, " is not a multiple of kv_heads ", cfg.kv_heads);
  RT_REQUIRE(x.size() == 2 && x[1] % h == 0 && x[1] > 0,
             "attention takes q [T, heads * head_dim] with heads ", h, "; got ", shape_str(x));
  RT_REQUIRE(cfg.theta == 0 || cfg.head_dim % 2 == 0, "rotary embeddings need an even head_dim; ",
             "q ", shape_str(x), " over ", h, " heads gives ", cfg.head_dim);
  const Shape kv{x[0], cfg.kv_heads * cfg.head_dim};
  RT_REQUIRE(n.inputs[1] == kv && n.inputs[2] == kv, "attention with ", h, " heads of ",
             cfg.head_dim, " and kv_heads ", cfg.kv_heads, " takes k and v ", shape_str(kv),
             "; got ", shape_str(n.inputs[1]), " and ", shape_str(n.inputs[2]));
  return x;
}

RINGTRAIN_REGISTER_OP(
    attention,
    OpDef{.name = "attention",
          .max_inputs = 3,
          .infer = attention_infer,
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            if (three_inputs(n))
              return std::make_unique<GroupedQueryAttention>(n.name, rope_config(n));
            return std::make_unique<CausalSelfAttention>(n.name, n.def.attention().heads());
          },
          // Causal: q k^T and p v over T (T + 1) / 2 pairs, 2 FLOPs per multiply-add each, for
          // an output of C = heads * head_dim; plus the rotation's 6 per pair of q and k elements.
          .flops =
              [](const OpNode& n, const Shape& out) {
                const double t = double(out[0]), c = double(out[1]);
                double f = 2.0 * 2.0 * c * t * (t + 1) / 2;
                if (three_inputs(n) && n.def.attention().rope_theta() > 0)
                  f += 3.0 * t * (c + double(n.inputs[1][1]));
                return f;
              },
          .onnx = attention_onnx});

}  // namespace

}  // namespace ringtrain
