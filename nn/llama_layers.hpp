// The layers of a Llama (nn/ops/llama.cpp): RMS normalisation, the elementwise product of a
// gated MLP, and causal grouped-query attention with rotary position embeddings on separate
// q, k, v inputs. With Linear over the last axis (no bias), the SILU activation, Add and an
// Embedding without positions they make Llama 2/3 as Hugging Face computes it
// (models/llama-*.pbtxt).
#pragma once

#include <string>
#include <vector>

#include "nn/layers.hpp"

namespace ringtrain {

// y = x / sqrt(mean(x^2) + eps) * weight over the last dimension of x [..., C]; the statistic
// and the weight in fp32. The weight is not weight-decayed by default.
class RmsNorm final : public Layer {
 public:
  RmsNorm(std::string name, int64_t width, float eps)
      : Layer(std::move(name)), c_(width), eps_(eps) {}
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Param*> params) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &y_, &rstd_, &dyc_, &dx_, &dweight_};
  }

 private:
  int64_t c_;
  float eps_;
  Param* weight_ = nullptr;
  Tensor x_;
  OwnedTensor xin_, y_, rstd_, dyc_, dx_, dweight_;
};

// y = a * b, two inputs of one shape (SwiGLU's silu(x W1) * (x W3)).
class Mul final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  const Tensor& forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) override;
  void backward_inputs(Context& ctx, const Tensor& dy, std::vector<Tensor>& dxs) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&ain_, &bin_, &y_, &dyc_, &da_, &db_};
  }

 private:
  Tensor a_, b_;
  OwnedTensor ain_, bin_, y_, dyc_, da_, db_;
};

// Causal grouped-query self-attention of q [B, T, H d], k and v [B, T, KV d] -> [B, T, H d]:
// rope_pack (rotary embeddings, the key/value heads repeated for their query heads) into the
// [B, T, 3 H d] input of the attention kernels, whose backward the pack's backward then sums
// back onto the shared heads.
class GroupedQueryAttention final : public Layer {
 public:
  GroupedQueryAttention(std::string name, const kernels::RopeConfig& cfg)
      : Layer(std::move(name)), cfg_(cfg) {}
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  const Tensor& forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) override;
  void backward_inputs(Context& ctx, const Tensor& dy, std::vector<Tensor>& dxs) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&qin_, &kin_, &vin_, &qkv_, &y_, &yout_, &lse_, &dyc_, &dqkv_, &dq_, &dk_, &dv_};
  }

 private:
  kernels::RopeConfig cfg_;
  Shape kv_shape_;
  OwnedTensor qin_, kin_, vin_, qkv_, y_, yout_, lse_, dyc_, dqkv_, dq_, dk_, dv_;
};

}  // namespace ringtrain
