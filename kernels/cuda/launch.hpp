// Host-side entry points of our own CUDA kernels (elementwise.cu, cnn.cu): raw device
// pointers, a runtime dtype, the stream. Each launches, then CUDA_CHECK_LAUNCH(). The
// backend (cuda_backend.cpp) validates shapes and dtypes before calling them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"

namespace ringtrain::kernels::cuda {

// ---- elementwise.cu -------------------------------------------------------------------
void launch_cast(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t s);
// y [rows, f, inner] = act(y + bias[f]) in place; act 0 none, 1 relu.
void launch_bias_act(void* y, DType yt, const void* bias, DType bt, int64_t rows, int64_t f,
                     int64_t inner, int act, cudaStream_t s);
// db[f] = sum over rows and inner of dy[rows, f, inner], in fp32, in a fixed order (two
// passes through `partial`, which holds kBiasGradSlices * f floats).
constexpr int kBiasGradSlices = 32;
void launch_bias_grad(const void* dy, DType t, int64_t rows, int64_t f, int64_t inner,
                      float* partial, void* db, DType dbt, cudaStream_t s);
void launch_relu(const void* x, void* y, DType t, int64_t n, cudaStream_t s);
void launch_relu_backward(const void* y, DType yt, const void* dy, void* dx, DType dt, int64_t n,
                          cudaStream_t s);
// Per row: loss (double) and correct (0/1); *bad_label set when a label is outside [0, c).
// smoothing: PyTorch's label_smoothing (0: plain cross-entropy).
void launch_softmax_xent(const float* logits, const int32_t* labels, int64_t rows, int64_t c,
                         float g, float smoothing, float* dlogits, double* row_loss,
                         int32_t* row_correct, int32_t* bad_label, cudaStream_t s);
// out = in * factor (fp32); *flag |= any non-finite. out may be null (check only).
void launch_unscale_check(const void* in, DType t, float factor, float* out, int64_t n,
                          int32_t* flag, cudaStream_t s);
// Sum of squares in double: partial[kSumSlices] then result[0], in a fixed order.
constexpr int kSumSlices = 1024;
void launch_sum_squares(const float* x, int64_t n, double* partial, double* result, cudaStream_t s);
void launch_scale(float* x, int64_t n, float factor, cudaStream_t s);
void launch_sgd(float* p, const float* g, float* m, int64_t n, float lr, float mu, float wd,
                bool nesterov, void* work, DType wt, cudaStream_t s);
void launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, float b1, float b2,
                  float eps, float step_size, float bc2_sqrt, float decay, void* work, DType wt,
                  cudaStream_t s);
void launch_add(const void* a, DType at, const void* b, DType bt, void* y, DType yt, int64_t n,
                cudaStream_t s);

// ---- cnn.cu ------------------------------------------------------------------------------
void launch_maxpool_fwd(const void* x, void* y, int32_t* argmax, DType t, int64_t planes, int64_t h,
                        int64_t w, int64_t p, int64_t q, int64_t k, int64_t stride, bool relu_input,
                        cudaStream_t s);
void launch_maxpool_bwd(const void* dy, const int32_t* argmax, void* dx, DType t, int64_t planes,
                        int64_t h, int64_t w, int64_t p, int64_t q, int64_t k, int64_t stride,
                        cudaStream_t s);
void launch_avgpool_fwd(const void* x, void* y, DType xt, DType yt, int64_t planes, int64_t hw,
                        cudaStream_t s);
void launch_avgpool_bwd(const void* dy, DType dt, void* dx, DType xt, int64_t planes, int64_t hw,
                        cudaStream_t s);
// Batch norm over x [n, c, hw], one block per channel.
void launch_bn_forward(const void* x, DType xt, void* y, DType yt, int64_t n, int64_t c, int64_t hw,
                       const float* gamma, const float* beta, float* running_mean,
                       float* running_var, float* mean, float* invstd, bool training,
                       float momentum, float eps, cudaStream_t s);
void launch_bn_backward(const void* x, const void* dy, void* dx, DType xt, DType dyt, DType dxt,
                        int64_t n, int64_t c, int64_t hw, const float* gamma, const float* mean,
                        const float* invstd, float* dgamma, float* dbeta, bool training,
                        cudaStream_t s);
void launch_dropout_fwd(const void* x, void* y, uint8_t* mask, DType t, int64_t n, float p,
                        uint64_t seed, cudaStream_t s);
void launch_dropout_bwd(const void* dy, const uint8_t* mask, void* dx, DType t, int64_t n, float p,
                        cudaStream_t s);

// ---- transformer.cu ------------------------------------------------------------------------
void launch_embedding_fwd(const int32_t* tok, const void* wte, const void* wpe, DType wt, void* y,
                          DType yt, int64_t n, int64_t t_len, int64_t c, cudaStream_t s);
// ---- embedding_backward.cu -----------------------------------------------------------------
// dwte [vocab, c] and dwpe (may be null) must be zeroed first; each row summed in position
// order, as the CPU does. scratch: embedding_bwd_scratch_bytes(n, vocab) device bytes.
size_t embedding_bwd_scratch_bytes(int64_t n, int64_t vocab);
void launch_embedding_bwd(const int32_t* tok, const void* dy, DType dt, float* dwte, float* dwpe,
                          int64_t n, int64_t t_len, int64_t c, int64_t vocab, void* scratch,
                          cudaStream_t s);
void launch_layernorm_fwd(const void* x, DType xt, const float* g, const float* b, float eps,
                          void* y, DType yt, float* mean, float* rstd, int64_t rows, int64_t c,
                          cudaStream_t s);
// dx has dy's dtype; dgamma/dbeta through `partial` (2 * kLayerNormSlices * c floats).
constexpr int kLayerNormSlices = 64;
void launch_layernorm_bwd(const void* x, DType xt, const void* dy, void* dx, DType dt,
                          const float* g, const float* mean, const float* rstd, float* partial,
                          float* dg, float* db, int64_t rows, int64_t c, cudaStream_t s);
// qkv, out (and dout, dqkv) share dtype t; head size up to kMaxAttentionHeadSize. delta holds
// b * heads * t_len floats.
constexpr int64_t kMaxAttentionHeadSize = 256;
void launch_attention_fwd(const void* qkv, void* out, DType t, float* lse, int64_t b, int64_t t_len,
                          int64_t heads, int64_t hs, cudaStream_t s);
void launch_attention_bwd(const void* qkv, const void* out, const void* dout, DType t,
                          const float* lse, float* delta, void* dqkv, int64_t b, int64_t t_len,
                          int64_t heads, int64_t hs, cudaStream_t s);
// Per row: loss (double) and correct (0/1); *bad set when a target is outside [0, vocab).
void launch_token_xent(const float* logits, const int32_t* targets, int64_t rows, int64_t vp,
                       int64_t vocab, float g, float* dlogits, double* row_loss,
                       int32_t* row_correct, int32_t* bad, cudaStream_t s);

// ---- loss.cu ---------------------------------------------------------------------------
// Per element: loss (double) into loss[n], and dpred = dloss/dpred * g (+ dpred when
// accumulate); kind is kernels::PointwiseLoss as an int; pos_weight [k] or null.
void launch_pointwise_loss(int kind, const float* pred, const float* target, int64_t n, int64_t k,
                           double delta, const float* pos_weight, double g, float* dpred,
                           bool accumulate, double* loss, cudaStream_t s);
// *counted += the labels not equal to ignore_index; *bad = 1 when one is outside [0, c).
void launch_pixel_count(const int32_t* labels, int64_t n, int32_t ignore_index, int64_t c,
                        unsigned long long* counted, int32_t* bad, cudaStream_t s);
// Per position of logits [n, c, s]: loss (double, 0 where ignored) and correct (0/1).
void launch_pixel_xent(const float* logits, const int32_t* labels, int64_t n, int64_t c, int64_t s,
                       int32_t ignore_index, double g, float* dlogits, bool accumulate,
                       double* loss, int32_t* correct, cudaStream_t st);

// ---- llama.cu --------------------------------------------------------------------------
void launch_rmsnorm_fwd(const void* x, DType xt, const float* g, float eps, void* y, DType yt,
                        float* rstd, int64_t rows, int64_t c, cudaStream_t s);
// dx has dy's dtype; dweight through `partial` (kRmsNormSlices * c floats).
constexpr int kRmsNormSlices = 64;
void launch_rmsnorm_bwd(const void* x, DType xt, const void* dy, void* dx, DType dt, const float* g,
                        const float* rstd, float* partial, float* dw, int64_t rows, int64_t c,
                        cudaStream_t s);
// y = a * b (a and b of dtype t); da = dy * b, db = dy * a (all of dtype t).
void launch_mul(const void* a, const void* b, DType t, void* y, DType yt, int64_t n,
                cudaStream_t s);
void launch_mul_bwd(const void* a, const void* b, const void* dy, void* da, void* db, DType t,
                    int64_t n, cudaStream_t s);
// kernels.hpp's rope_pack over rows = B * T token rows of T positions, and its backward.
void launch_rope_pack(const void* q, const void* k, const void* v, DType t, void* qkv, DType ot,
                      int64_t rows, int64_t t_len, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, double theta, cudaStream_t s);
void launch_rope_pack_bwd(const void* dqkv, void* dq, void* dk, void* dv, DType t, int64_t rows,
                          int64_t t_len, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          double theta, cudaStream_t s);

}  // namespace ringtrain::kernels::cuda
