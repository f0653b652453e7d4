// Convolution through oneDNN (fp32): forward with fused bias + ReLU, backward data and
// backward weights. oneDNN chooses its own (blocked) layouts (format_tag::any); our NCHW /
// OIHW tensors are reordered into them and back around each call. Primitives and their
// internal buffers are cached per shape, so a training step creates nothing new.
#include "kernels/cpu/onednn_conv.hpp"

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"

namespace ringtrain::kernels::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, bool, bool>;

Key key_of(const ConvShape& cs, bool bias, bool relu) {
  return {cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.s, cs.stride, cs.pad, bias, relu};
}

}  // namespace

struct OneDnnConv::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};

  // One shape's primitives and the buffers in oneDNN's layouts (allocated once).
  struct Entry {
    dnnl::convolution_forward::primitive_desc fwd_pd;
    dnnl::convolution_forward fwd;
    dnnl::convolution_backward_data::primitive_desc bwd_d_pd;
    dnnl::convolution_backward_data bwd_d;
    dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
    dnnl::convolution_backward_weights bwd_w;
    memory::desc src_u, wei_u, dst_u, bias_u;  // our layouts
  };
  std::map<Key, Entry> cache;

  Entry& get(const ConvShape& cs, bool bias, bool relu) {
    const Key key = key_of(cs, bias, relu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const memory::dims src{cs.n, cs.c, cs.h, cs.w}, wei{cs.k, cs.c, cs.r, cs.s}, b{cs.k},
        dst{cs.n, cs.k, cs.p(), cs.q()}, strides{cs.stride, cs.stride}, pad{cs.pad, cs.pad};
    const memory::desc src_any(src, dt::f32, tag::any), wei_any(wei, dt::f32, tag::any),
        dst_any(dst, dt::f32, tag::any), bias_md(b, dt::f32, tag::x);
    const memory::desc none;
    dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training,
                                       dnnl::algorithm::convolution_direct, src_any, wei_any,
                                       bias ? bias_md : none, dst_any, strides, pad, pad);
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    Entry e;
    e.fwd_pd = dnnl::convolution_forward::primitive_desc(fd, attr, eng);
    e.fwd = dnnl::convolution_forward(e.fwd_pd);
    dnnl::convolution_backward_data::desc bdd(dnnl::algorithm::convolution_direct, src_any, wei_any,
                                              dst_any, strides, pad, pad);
    e.bwd_d_pd = dnnl::convolution_backward_data::primitive_desc(bdd, eng, e.fwd_pd);
    e.bwd_d = dnnl::convolution_backward_data(e.bwd_d_pd);
    dnnl::convolution_backward_weights::desc bwd(dnnl::algorithm::convolution_direct, src_any,
                                                 wei_any, bias ? bias_md : none, dst_any, strides,
                                                 pad, pad);
    e.bwd_w_pd = dnnl::convolution_backward_weights::primitive_desc(bwd, eng, e.fwd_pd);
    e.bwd_w = dnnl::convolution_backward_weights(e.bwd_w_pd);
    e.src_u = memory::desc(src, dt::f32, tag::nchw);
    e.wei_u = memory::desc(wei, dt::f32, tag::oihw);
    e.dst_u = memory::desc(dst, dt::f32, tag::nchw);
    e.bias_u = bias_md;
    return cache.emplace(key, std::move(e)).first->second;
  }

  // Scratch memories in oneDNN's layouts, one per (descriptor, role), reused.
  std::vector<std::tuple<int, memory::desc, memory>> scratch;
  memory scratch_for(int role, const memory::desc& md) {
    for (auto& [r, d, m] : scratch)
      if (r == role && d == md) return m;
    scratch.emplace_back(role, md, memory(md, eng));
    return std::get<2>(scratch.back());
  }

  // Reorder primitives between two layouts, created once (creating one costs more than a
  // small reorder itself).
  std::vector<std::tuple<memory::desc, memory::desc, dnnl::reorder>> reorders;
  dnnl::reorder& reorder_for(const memory::desc& from, const memory::desc& to) {
    for (auto& [f, t, r] : reorders)
      if (f == from && t == to) return r;
    reorders.emplace_back(from, to,
                          dnnl::reorder(dnnl::reorder::primitive_desc(eng, from, eng, to)));
    return std::get<2>(reorders.back());
  }

  // `user` (our layout) as the primitive wants it: itself, or a reordered copy.
  memory input(int role, const memory::desc& want, const memory::desc& have, const float* p) {
    memory user(have, eng, const_cast<float*>(p));
    if (want == have) return user;
    memory m = scratch_for(role, want);
    reorder_for(have, want).execute(strm, user, m);
    return m;
  }
  // Where the primitive writes an output: our buffer itself, or a scratch to reorder after.
  memory output(int role, const memory::desc& want, const memory::desc& have, float* p) {
    if (want == have) return memory(have, eng, p);
    return scratch_for(role, want);
  }
  void finish(memory out, const memory::desc& have, float* p) {
    memory user(have, eng, p);
    if (out.get_desc() == have) return;
    reorder_for(out.get_desc(), have).execute(strm, out, user);
  }
};

OneDnnConv::OneDnnConv() : impl_(std::make_unique<Impl>()) {}
OneDnnConv::~OneDnnConv() = default;

void OneDnnConv::forward(const ConvShape& cs, const float* x, const float* w, const float* bias,
                         bool relu, float* y) {
  auto& im = *impl_;
  auto& e = im.get(cs, bias != nullptr, relu);
  memory src = im.input(0, e.fwd_pd.src_desc(), e.src_u, x);
  memory wei = im.input(1, e.fwd_pd.weights_desc(), e.wei_u, w);
  memory dst = im.output(2, e.fwd_pd.dst_desc(), e.dst_u, y);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (bias) args[DNNL_ARG_BIAS] = memory(e.bias_u, im.eng, const_cast<float*>(bias));
  e.fwd.execute(im.strm, args);
  im.finish(dst, e.dst_u, y);
  im.strm.wait();
}

void OneDnnConv::backward_data(const ConvShape& cs, const float* dy, const float* w, float* dx) {
  auto& im = *impl_;
  auto& e = im.get(cs, false, false);
  memory ddst = im.input(3, e.bwd_d_pd.diff_dst_desc(), e.dst_u, dy);
  memory wei = im.input(4, e.bwd_d_pd.weights_desc(), e.wei_u, w);
  memory dsrc = im.output(5, e.bwd_d_pd.diff_src_desc(), e.src_u, dx);
  e.bwd_d.execute(im.strm,
                  {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}});
  im.finish(dsrc, e.src_u, dx);
  im.strm.wait();
}

void OneDnnConv::backward_weights(const ConvShape& cs, const float* x, const float* dy, float* dw,
                                  float* db) {
  auto& im = *impl_;
  auto& e = im.get(cs, db != nullptr, false);
  memory src = im.input(6, e.bwd_w_pd.src_desc(), e.src_u, x);
  memory ddst = im.input(7, e.bwd_w_pd.diff_dst_desc(), e.dst_u, dy);
  memory dwei = im.output(8, e.bwd_w_pd.diff_weights_desc(), e.wei_u, dw);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}};
  if (db) args[DNNL_ARG_DIFF_BIAS] = memory(e.bias_u, im.eng, db);
  e.bwd_w.execute(im.strm, args);
  im.finish(dwei, e.wei_u, dw);
  im.strm.wait();
}

std::string OneDnnConv::version() {
  const dnnl_version_t* v = dnnl_version();
  return cat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
}

}  // namespace ringtrain::kernels::cpu
