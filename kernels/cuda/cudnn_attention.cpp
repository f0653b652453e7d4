// cuDNN's fused attention for the CUDA backend's fp16/bf16 causal self-attention: the
// graph API's scaled-dot-product attention (SDPA, FlashAttention-style tensor-core kernels)
// through cudnn-frontend's header-only C++ graph interface. Built only when CMake found
// cudnn-frontend (cudnn_attention_stub.cpp otherwise).
//
// Layout, as the rest of the backend has it: qkv [B, T, 3C] with the heads interleaved, so
// Q, K and V are [B, H, T, hs] views of it with strides {T*3C, hs, 3C, 1} at element offsets
// 0, C and 2C; out and dout [B, T, C] are [B, H, T, hs] with strides {T*C, hs, C, 1}; dqkv
// is written like qkv. cuDNN's "Stats" output is the natural-log log-sum-exp of each query's
// scaled scores, [B, H, T, 1] fp32 — the meaning and layout of our kernel's lse — and the
// backward graph reads it back. Softmax statistics and accumulation are fp32.
//
// Graphs are built once per (cuDNN handle, shape, dtype) and cached; the backward graph asks
// for cuDNN's deterministic algorithm first (bitwise-repeatable dQ) and takes the
// non-deterministic one, saying so once, only where cuDNN has no deterministic one.
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/error.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/runtime.hpp"

namespace ringtrain::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct SdpaGraphs {
  bool ok = false;
  std::string why_not;
  std::shared_ptr<Graph> fwd, bwd;
  int64_t fwd_workspace = 0, bwd_workspace = 0;
};

using Key = std::tuple<const void*, int64_t, int64_t, int64_t, int64_t, int>;

// Never destroyed: the graphs hold cuDNN descriptors of handles that the runtimes (statics
// of runtime.cpp) may destroy first at exit; the process's end frees them all.
std::mutex cache_mu;
std::map<Key, SdpaGraphs>& cache() {
  static auto* graphs = new std::map<Key, SdpaGraphs>();
  return *graphs;
}

Key key_of(cudnnHandle_t h, const SdpaShape& s) {
  return {static_cast<const void*>(h), s.b, s.t, s.heads, s.hs, int(s.dtype)};
}

std::vector<int64_t> head_dims(const SdpaShape& s) { return {s.b, s.heads, s.t, s.hs}; }
std::vector<int64_t> qkv_strides(const SdpaShape& s) {
  const int64_t c = s.heads * s.hs;
  return {s.t * 3 * c, s.hs, 3 * c, 1};
}
std::vector<int64_t> out_strides(const SdpaShape& s) {
  const int64_t c = s.heads * s.hs;
  return {s.t * c, s.hs, c, 1};
}
std::vector<int64_t> stats_dims(const SdpaShape& s) { return {s.b, s.heads, s.t, 1}; }
std::vector<int64_t> stats_strides(const SdpaShape& s) { return {s.heads * s.t, s.t, 1, 1}; }

std::shared_ptr<Graph> new_graph(DType t) {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

TensorAttr input(Graph& g, const char* name, int64_t uid, std::vector<int64_t> dims,
                 std::vector<int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(std::move(strides)));
}

// Validates, lowers, picks an engine and compiles its plan; "" or the failing step and
// cuDNN's message.
std::string finish(Graph& g, cudnnHandle_t h) {
  auto step = [](const char* what, fe::error_t e) -> std::string {
    return e.is_good() ? "" : cat(what, ": ", e);
  };
  std::string why = step("validate", g.validate());
  if (why.empty()) why = step("build_operation_graph", g.build_operation_graph(h));
  if (why.empty())
    why = step("create_execution_plans",
               g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  if (why.empty()) why = step("check_support", g.check_support(h));
  if (why.empty()) why = step("build_plans", g.build_plans(h));
  return why;
}

std::string build_forward(SdpaGraphs& sg, cudnnHandle_t h, const SdpaShape& s) {
  auto g = new_graph(s.dtype);
  auto q = input(*g, "Q", kQ, head_dims(s), qkv_strides(s));
  auto k = input(*g, "K", kK, head_dims(s), qkv_strides(s));
  auto v = input(*g, "V", kV, head_dims(s), qkv_strides(s));
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("attention")
                  .set_generate_stats(true)
                  .set_causal_mask(true)
                  .set_attn_scale(1.f / std::sqrt(float(s.hs)));
  auto [o, stats] = g->sdpa(q, k, v, opts);
  o->set_output(true).set_uid(kO).set_dim(head_dims(s)).set_stride(out_strides(s));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(s))
      .set_stride(stats_strides(s));
  std::string why = finish(*g, h);
  if (why.empty())
    why = [&] {
      auto e = g->get_workspace_size(sg.fwd_workspace);
      return e.is_good() ? std::string() : cat("get_workspace_size: ", e);
    }();
  if (why.empty()) sg.fwd = std::move(g);
  return why;
}

std::string build_backward(SdpaGraphs& sg, cudnnHandle_t h, const SdpaShape& s,
                           bool deterministic) {
  auto g = new_graph(s.dtype);
  auto q = input(*g, "Q", kQ, head_dims(s), qkv_strides(s));
  auto k = input(*g, "K", kK, head_dims(s), qkv_strides(s));
  auto v = input(*g, "V", kV, head_dims(s), qkv_strides(s));
  auto o = input(*g, "O", kO, head_dims(s), out_strides(s));
  auto d_o = input(*g, "dO", kDO, head_dims(s), out_strides(s));
  auto stats = input(*g, "Stats", kStats, stats_dims(s), stats_strides(s));
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("attention_backward")
                  .set_causal_mask(true)
                  .set_attn_scale(1.f / std::sqrt(float(s.hs)))
                  .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
  dq->set_output(true).set_uid(kDQ).set_dim(head_dims(s)).set_stride(qkv_strides(s));
  dk->set_output(true).set_uid(kDK).set_dim(head_dims(s)).set_stride(qkv_strides(s));
  dv->set_output(true).set_uid(kDV).set_dim(head_dims(s)).set_stride(qkv_strides(s));
  std::string why = finish(*g, h);
  if (why.empty())
    why = [&] {
      auto e = g->get_workspace_size(sg.bwd_workspace);
      return e.is_good() ? std::string() : cat("get_workspace_size: ", e);
    }();
  if (why.empty()) sg.bwd = std::move(g);
  return why;
}

SdpaGraphs build(cudnnHandle_t h, const SdpaShape& s) {
  SdpaGraphs sg;
  if (s.dtype != DType::f16 && s.dtype != DType::bf16) {
    sg.why_not = cat("cuDNN's fused attention has no ", dtype_name(s.dtype));
    return sg;
  }
  if (std::string why = build_forward(sg, h, s); !why.empty()) {
    sg.why_not = cat("forward graph: ", why);
    return sg;
  }
  if (std::string why = build_backward(sg, h, s, true); !why.empty()) {
    if (std::string why2 = build_backward(sg, h, s, false); !why2.empty()) {
      sg.why_not = cat("backward graph: ", why2);
      return sg;
    }
    std::fprintf(stderr,
                 "ringtrain: cuDNN has no deterministic attention backward for T=%lld head "
                 "size=%lld %s (%s); its dQ may differ in the last bits from run to run\n",
                 static_cast<long long>(s.t), static_cast<long long>(s.hs), dtype_name(s.dtype),
                 why.c_str());
  }
  sg.ok = true;
  return sg;
}

const SdpaGraphs& prepared(DeviceRuntime& rt, const SdpaShape& s) {
  cudnnHandle_t h = rt.cudnn();
  std::lock_guard<std::mutex> lock(cache_mu);
  auto [it, fresh] = cache().try_emplace(key_of(h, s));
  if (fresh) it->second = build(h, s);
  return it->second;
}

const SdpaGraphs& ready(DeviceRuntime& rt, const SdpaShape& s) {
  const SdpaGraphs& sg = prepared(rt, s);
  RT_CHECK(sg.ok, "cuDNN attention run for a shape it refused: ", sg.why_not);
  return sg;
}

void execute(const Graph& g, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack,
             void* workspace, const char* what, const SdpaShape& s) {
  auto e = g.execute(h, pack, workspace);
  if (e.is_good()) return;
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  throw_runtime(
      __FILE__, __LINE__,
      cat("cuDNN attention ", what, " failed for B=", s.b, " T=", s.t, " heads=", s.heads,
          " head size=", s.hs, " ", dtype_name(s.dtype), ": ", e, " (cuDNN: ", last, ")"));
}

char* at(const void* p, int64_t elements) {
  return static_cast<char*>(const_cast<void*>(p)) + elements * 2;  // 16-bit elements
}

}  // namespace

bool cudnn_sdpa_built() { return true; }

bool cudnn_sdpa_prepare(DeviceRuntime& rt, const SdpaShape& s, std::string* why_not) {
  const SdpaGraphs& sg = prepared(rt, s);
  if (!sg.ok && why_not) *why_not = sg.why_not;
  return sg.ok;
}

size_t cudnn_sdpa_workspace(DeviceRuntime& rt, const SdpaShape& s, bool backward) {
  const SdpaGraphs& sg = ready(rt, s);
  return size_t(backward ? sg.bwd_workspace : sg.fwd_workspace);
}

void cudnn_sdpa_forward(DeviceRuntime& rt, const SdpaShape& s, const void* qkv, void* out,
                        float* lse, void* workspace) {
  const SdpaGraphs& sg = ready(rt, s);
  const int64_t c = s.heads * s.hs;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, at(qkv, 0)}, {kK, at(qkv, c)}, {kV, at(qkv, 2 * c)}, {kO, out}, {kStats, lse}};
  execute(*sg.fwd, rt.cudnn(), pack, workspace, "forward", s);
}

void cudnn_sdpa_backward(DeviceRuntime& rt, const SdpaShape& s, const void* qkv, const void* out,
                         const void* dout, const float* lse, void* dqkv, void* workspace) {
  const SdpaGraphs& sg = ready(rt, s);
  const int64_t c = s.heads * s.hs;
  std::unordered_map<int64_t, void*> pack = {{kQ, at(qkv, 0)},
                                             {kK, at(qkv, c)},
                                             {kV, at(qkv, 2 * c)},
                                             {kO, const_cast<void*>(out)},
                                             {kDO, const_cast<void*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, at(dqkv, 0)},
                                             {kDK, at(dqkv, c)},
                                             {kDV, at(dqkv, 2 * c)}};
  execute(*sg.bwd, rt.cudnn(), pack, workspace, "backward", s);
}

}  // namespace ringtrain::kernels::cuda
