// The layers of a GPT (nn/ops/transformer.cpp): token + learned positional embedding,
// layer normalisation over the last dimension, causal multi-head self-attention and the tanh
// GELU. With Linear over the last axis, Add and parameter sharing (the language-model head
// tied to the embedding) they make GPT-2 as llm.c computes it (models/gpt-*.pbtxt).
#pragma once

#include <string>
#include <vector>

#include "nn/layers.hpp"

namespace ringtrain {

// tokens i32 [B, T] -> [B, T, C]: wte[token] + wpe[position] (wpe optional). Parameters are
// not weight-decayed by default (the GPT recipes' decay groups).
class Embedding final : public Layer {
 public:
  Embedding(std::string name, int64_t vocab, int64_t width, int64_t context, bool positional)
      : Layer(std::move(name)),
        vocab_(vocab),
        width_(width),
        context_(context),
        positional_(positional) {}
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Param*> params) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&wte_c_, &wpe_c_, &y_, &dwte_, &dwpe_};
  }

 private:
  int64_t vocab_, width_, context_;
  bool positional_;
  Param* wte_ = nullptr;
  Param* wpe_ = nullptr;
  Tensor tokens_;
  Tensor none_;  // the (absent) gradient of the token ids
  OwnedTensor wte_c_, wpe_c_, y_, dwte_, dwpe_;
};

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension of x [..., C];
// statistics and the parameters in fp32.
class LayerNorm final : public Layer {
 public:
  LayerNorm(std::string name, int64_t width, float eps)
      : Layer(std::move(name)), c_(width), eps_(eps) {}
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Param*> params) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &y_, &mean_, &rstd_, &dyc_, &dx_, &dgamma_, &dbeta_};
  }

 private:
  int64_t c_;
  float eps_;
  Param* gamma_ = nullptr;
  Param* beta_ = nullptr;
  Tensor x_;
  OwnedTensor xin_, y_, mean_, rstd_, dyc_, dx_, dgamma_, dbeta_;
};

// Causal multi-head self-attention: qkv [B, T, 3C] (q, k, v side by side, as a Linear of
// width 3C produces them) -> [B, T, C], heads side by side. Blocked with an online softmax
// (kernels::Backend::attention_forward); backward recomputes the scores.
class CausalSelfAttention final : public Layer {
 public:
  CausalSelfAttention(std::string name, int64_t heads) : Layer(std::move(name)), heads_(heads) {}
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &y_, &yout_, &lse_, &dyc_, &dx_};
  }
  // heads: this rank's heads / T, read from a column-parallel qkv (q, k, v of its heads).
  std::string split_tensor_parallel(TensorSplitRole role, int64_t groups,
                                    const TensorParallelGroup* group) override;

 private:
  int64_t heads_;
  Tensor x_;
  OwnedTensor xin_, y_, yout_, lse_, dyc_, dx_;
};

// GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
class GeluTanh final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&xin_, &y_, &dx_}; }

 private:
  Tensor x_;
  OwnedTensor xin_, y_, dx_;
};

}  // namespace ringtrain
