// Convolution through oneDNN: forward with fused bias + ReLU, backward data and backward
// weights, in fp32 or on 16-bit inputs with fp32 accumulation. oneDNN chooses its own
// (blocked) layouts (format_tag::any); our tensors (activations NCHW, nChw16c or NHWC per
// ConvShape's layouts; filters OIHW) are reordered into them and back around each call where
// they differ (the CPU backend's activation_layout() is what the kernels want: no reorder),
// and a reorder also converts between the tensor's dtype and the primitive's, so a 16-bit
// tensor on the fp32 path is widened (and an fp32 result rounded) in the pass that changes
// its layout, not in a pass of its own. Primitives and their internal buffers are cached per
// shape, layouts and dtypes, so a training step creates nothing new.
#include "kernels/cpu/onednn_conv.hpp"

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/onednn_util.hpp"

namespace ringtrain::kernels::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// Which primitive an entry holds.
enum Kind { kForward, kBackwardData, kBackwardWeights };

// The dtypes of one call: what the primitive computes on, and the caller's tensors
// (src / diff_src, weights, dst / diff_dst; the gradient of the weights is always fp32).
struct Dtypes {
  DType compute, src, wei, dst;
  auto operator<=>(const Dtypes&) const = default;
};

// Shape, layouts, kind, bias, relu and the dtypes.
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, Layout, Layout, int, bool, bool, Dtypes>;

Key key_of(const ConvShape& cs, Kind kind, bool bias, bool relu, Dtypes t) {
  return {cs.n,   cs.c,        cs.h,        cs.w, cs.k, cs.r, cs.s, cs.stride,
          cs.pad, cs.x_layout, cs.y_layout, kind, bias, relu, t};
}

// oneDNN's name of an activation layout.
memory::format_tag tag_of(Layout l) {
  return l == Layout::blocked ? tag::nChw16c : l == Layout::nhwc ? tag::nhwc : tag::nchw;
}

// The dtype a primitive writes its result in: the caller's when oneDNN can write it from
// `compute` (the same dtype, or fp32), else fp32, rounded by the reorder out.
DType result_dtype(DType compute, DType user) {
  return user == compute || user == DType::f32 ? user : DType::f32;
}

}  // namespace

struct OneDnnConv::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};

  // One primitive, the layouts it wants, and our layouts of the same tensors.
  struct Entry {
    dnnl::primitive prim;
    memory::desc src, wei, dst;        // wanted: src/diff_src, weights/diff_weights, dst/diff_dst
    memory::desc src_u, wei_u, dst_u;  // ours (ConvShape's layouts / OIHW, the tensors' dtypes)
    memory::desc bias_u;
  };
  std::map<Key, Entry> cache;
  std::map<DType, bool> supported;

  struct Descs {
    memory::dims src, wei, bias, dst, strides, pad;
  };
  static Descs dims_of(const ConvShape& cs) {
    return {{cs.n, cs.c, cs.h, cs.w},     {cs.k, cs.c, cs.r, cs.s}, {cs.k},
            {cs.n, cs.k, cs.p(), cs.q()}, {cs.stride, cs.stride},   {cs.pad, cs.pad}};
  }

  bool winograd = true;  // OneDnnConv's constructor

  // Winograd F(4x4, 3x3) (oneDNN's jit_wino_4x3, AVX-512, fp32) for 3x3 stride-1 convolutions
  // with at least 16 input and output channels: about half the multiplications of the direct
  // algorithm, in fp32 throughout (the transforms add rounding of the order of fp32's epsilon,
  // within the tolerance the unit tests hold it to against im2col). Thin layers (the cnn's
  // first) and other shapes stay direct; so does any shape oneDNN has no Winograd kernel for.
  dnnl::algorithm algorithm_of(const ConvShape& cs, DType in) const {
    const bool wino = winograd && in == DType::f32 && cs.r == 3 && cs.s == 3 && cs.stride == 1 &&
                      cs.c >= 16 && cs.k >= 16;
    return wino ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  }

  // The forward primitive descriptor (also the hint of the backward ones).
  dnnl::convolution_forward::primitive_desc forward_pd(const ConvShape& cs, bool bias, bool relu,
                                                       DType in, DType out, dnnl::algorithm alg) {
    const Descs d = dims_of(cs);
    const memory::desc none, bias_md(d.bias, dt::f32, tag::x);
    dnnl::convolution_forward::desc fd(
        dnnl::prop_kind::forward_training, alg,
        memory::desc(d.src, dnnl_type(in, "oneDNN convolution"), tag::any),
        memory::desc(d.wei, dnnl_type(in, "oneDNN convolution"), tag::any), bias ? bias_md : none,
        memory::desc(d.dst, dnnl_type(out, "oneDNN convolution"), tag::any), d.strides, d.pad,
        d.pad);
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    return dnnl::convolution_forward::primitive_desc(fd, attr, eng);
  }

  Entry& get(const ConvShape& cs, Kind kind, bool bias, bool relu, Dtypes t) {
    const Key key = key_of(cs, kind, bias, relu, t);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const dnnl::algorithm alg = algorithm_of(cs, t.compute);
    if (alg != dnnl::algorithm::convolution_direct) {
      try {
        return cache.emplace(key, make(cs, kind, bias, relu, t, alg)).first->second;
      } catch (const dnnl::error&) {  // no kernel for this shape or CPU: direct
      }
    }
    return cache.emplace(key, make(cs, kind, bias, relu, t, dnnl::algorithm::convolution_direct))
        .first->second;
  }

  Entry make(const ConvShape& cs, Kind kind, bool bias, bool relu, Dtypes t, dnnl::algorithm alg) {
    const Descs d = dims_of(cs);
    const DType in = t.compute;
    auto user = [](const memory::dims& dims, DType dt, tag layout) {
      return memory::desc(dims, dnnl_type(dt, "oneDNN convolution"), layout);
    };
    Entry e;
    e.bias_u = memory::desc(d.bias, dt::f32, tag::x);
    const memory::desc none;
    if (kind == kForward) {
      auto pd = forward_pd(cs, bias, relu, in, result_dtype(in, t.dst), alg);
      e.prim = dnnl::convolution_forward(pd);
      e.src = pd.src_desc(), e.wei = pd.weights_desc(), e.dst = pd.dst_desc();
    } else if (kind == kBackwardData) {
      const auto hint = forward_pd(cs, false, false, in, in, alg);
      dnnl::convolution_backward_data::desc bd(
          alg,
          memory::desc(d.src, dnnl_type(result_dtype(in, t.src), "oneDNN convolution"), tag::any),
          memory::desc(d.wei, dnnl_type(in, "oneDNN convolution"), tag::any),
          memory::desc(d.dst, dnnl_type(in, "oneDNN convolution"), tag::any), d.strides, d.pad,
          d.pad);
      dnnl::convolution_backward_data::primitive_desc pd(bd, eng, hint);
      e.prim = dnnl::convolution_backward_data(pd);
      e.src = pd.diff_src_desc(), e.wei = pd.weights_desc(), e.dst = pd.diff_dst_desc();
    } else {  // gradients of the filters (and bias) in fp32
      const auto hint = forward_pd(cs, bias, false, in, in, alg);
      dnnl::convolution_backward_weights::desc bd(
          alg, memory::desc(d.src, dnnl_type(in, "oneDNN convolution"), tag::any),
          memory::desc(d.wei, dt::f32, tag::any), bias ? e.bias_u : none,
          memory::desc(d.dst, dnnl_type(in, "oneDNN convolution"), tag::any), d.strides, d.pad,
          d.pad);
      dnnl::convolution_backward_weights::primitive_desc pd(bd, eng, hint);
      e.prim = dnnl::convolution_backward_weights(pd);
      e.src = pd.src_desc(), e.wei = pd.diff_weights_desc(), e.dst = pd.diff_dst_desc();
    }
    e.src_u = user(d.src, t.src, tag_of(cs.x_layout));
    e.wei_u = user(d.wei, kind == kBackwardWeights ? DType::f32 : t.wei, tag::oihw);
    e.dst_u = user(d.dst, t.dst, tag_of(cs.y_layout));
    return e;
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
  memory input(int role, const memory::desc& want, const memory::desc& have, const void* p) {
    memory user(have, eng, const_cast<void*>(p));
    if (want == have) return user;
    memory m = scratch_for(role, want);
    reorder_for(have, want).execute(strm, user, m);
    return m;
  }
  // Where the primitive writes an output: our buffer itself, or a scratch to reorder after.
  memory output(int role, const memory::desc& want, const memory::desc& have, void* p) {
    if (want == have) return memory(have, eng, p);
    return scratch_for(role, want);
  }
  void finish(memory out, const memory::desc& have, void* p) {
    memory user(have, eng, p);
    if (out.get_desc() == have) return;
    reorder_for(out.get_desc(), have).execute(strm, out, user);
  }

  // The backward passes on dy already in the primitive's layout (`ddst`).
  void run_backward_data(Entry& e, const memory& ddst, const void* w, void* dx) {
    memory wei = input(4, e.wei, e.wei_u, w);
    memory dsrc = output(5, e.src, e.src_u, dx);
    e.prim.execute(strm,
                   {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}});
    finish(dsrc, e.src_u, dx);
    strm.wait();
  }
  void run_backward_weights(Entry& e, const void* x, const memory& ddst, float* dw, float* db) {
    memory src = input(6, e.src, e.src_u, x);
    memory dwei = output(8, e.wei, e.wei_u, dw);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}};
    if (db) args[DNNL_ARG_DIFF_BIAS] = memory(e.bias_u, eng, db);
    e.prim.execute(strm, args);
    finish(dwei, e.wei_u, dw);
    strm.wait();
  }
};

OneDnnConv::OneDnnConv(bool winograd) : impl_(std::make_unique<Impl>()) {
  impl_->winograd = winograd;
}
OneDnnConv::~OneDnnConv() = default;

bool OneDnnConv::supports(DType in) {
  if (in == DType::f32) return true;
  if (in != DType::bf16 && in != DType::f16) return false;
  auto& im = *impl_;
  auto it = im.supported.find(in);
  if (it != im.supported.end()) return it->second;
  bool ok = false;
  try {  // the CNN's second convolution as the probe
    const ConvShape cs{64, 32, 26, 26, 64, 3, 3, 1, 0};
    ok = !is_reference_impl(
        im.forward_pd(cs, true, true, in, in, dnnl::algorithm::convolution_direct).impl_info_str());
  } catch (const dnnl::error&) {  // unimplemented for this dtype on this CPU
  }
  return im.supported.emplace(in, ok).first->second;
}

void OneDnnConv::forward(const ConvShape& cs, DType compute, const void* x, DType xt, const void* w,
                         DType wt, const float* bias, bool relu, void* y, DType yt) {
  auto& im = *impl_;
  auto& e = im.get(cs, kForward, bias != nullptr, relu, {compute, xt, wt, yt});
  memory src = im.input(0, e.src, e.src_u, x);
  memory wei = im.input(1, e.wei, e.wei_u, w);
  memory dst = im.output(2, e.dst, e.dst_u, y);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (bias) args[DNNL_ARG_BIAS] = memory(e.bias_u, im.eng, const_cast<float*>(bias));
  e.prim.execute(im.strm, args);
  im.finish(dst, e.dst_u, y);
  im.strm.wait();
}

void OneDnnConv::backward_data(const ConvShape& cs, DType compute, const void* dy, DType dyt,
                               const void* w, DType wt, void* dx, DType dxt) {
  auto& im = *impl_;
  auto& e = im.get(cs, kBackwardData, false, false, {compute, dxt, wt, dyt});
  im.run_backward_data(e, im.input(3, e.dst, e.dst_u, dy), w, dx);
}

void OneDnnConv::backward_weights(const ConvShape& cs, DType compute, const void* x, DType xt,
                                  const void* dy, DType dyt, float* dw, float* db) {
  auto& im = *impl_;
  auto& e = im.get(cs, kBackwardWeights, db != nullptr, false, {compute, xt, DType::f32, dyt});
  im.run_backward_weights(e, x, im.input(7, e.dst, e.dst_u, dy), dw, db);
}

void OneDnnConv::backward(const ConvShape& cs, DType compute, const void* x, DType xt,
                          const void* dy, DType dyt, const void* w, DType wt, void* dx, DType dxt,
                          float* dw, float* db) {
  auto& im = *impl_;
  auto& ew = im.get(cs, kBackwardWeights, db != nullptr, false, {compute, xt, DType::f32, dyt});
  const memory ddst = im.input(7, ew.dst, ew.dst_u, dy);
  im.run_backward_weights(ew, x, ddst, dw, db);
  if (!dx) return;
  auto& ed = im.get(cs, kBackwardData, false, false, {compute, dxt, wt, dyt});
  im.run_backward_data(ed, ed.dst == ew.dst ? ddst : im.input(3, ed.dst, ed.dst_u, dy), w, dx);
}

void OneDnnConv::reorder(int64_t n, int64_t c, int64_t h, int64_t w, DType t, const void* src,
                         Layout from, void* dst, Layout to) {
  auto& im = *impl_;
  const memory::dims dims{n, c, h, w};
  const memory::desc a(dims, dnnl_type(t, "oneDNN reorder"), tag_of(from)),
      b(dims, dnnl_type(t, "oneDNN reorder"), tag_of(to));
  memory ma(a, im.eng, const_cast<void*>(src)), mb(b, im.eng, dst);
  im.reorder_for(a, b).execute(im.strm, ma, mb);
  im.strm.wait();
}

std::string OneDnnConv::version() {
  const dnnl_version_t* v = dnnl_version();
  return cat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
}

}  // namespace ringtrain::kernels::cpu
