// Unit tests of the channels-innermost activation layouts (kernels::Layout: blocked, nhwc) on
// the CPU backend, in fp32 and bf16 (the pooling in fp16 too):
//  - oneDNN convolution (forward with bias + ReLU, both backward passes) with inputs and/or
//    outputs in either layout equals the plain layout bitwise, and im2col + OpenBLAS within
//    fp32 rounding, on every convolution shape of the shipped models;
//  - max pooling of an input in either layout equals the plain kernel bitwise (values,
//    argmax, the gradient; argmax in the input's layout), with ties, nans, overlapping windows and
//    the fused ReLU gradient;
//  - the cnn trained one step with the backend's activation layout equals the plain run
//    bitwise, and its first convolution's output really is in that layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "layer_test_util.hpp"
#include "nn/graph_builder.hpp"
#include "nn/layers.hpp"
#include "nn/model.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using kernels::Activation;
using kernels::ConvShape;
using kernels::kChannelBlock;
using kernels::Layout;
using kernels::PoolShape;
using kernels::cpu::CpuBackend;
using kernels::cpu::CpuOptions;
using test::copy_of;
using test::rel_err;
using test::uniform_floats;

// A tensor's bytes in a dtype, built from and read back as floats.
struct Raw {
  std::vector<char> bytes;
  DType dtype;
  Raw(const std::vector<float>& v, DType t) : bytes(v.size() * dtype_size(t)), dtype(t) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == DType::f32) {
        std::memcpy(bytes.data() + 4 * i, &v[i], 4);
      } else {
        const uint16_t h = t == DType::bf16 ? float_to_bf16(v[i]) : float_to_half(v[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
  }
  Tensor view(Shape s) { return Tensor(bytes.data(), std::move(s), dtype); }
};

// The plain [N, C, HW] tensor's elements at their places in layout l (to_blocked) or back:
// the layouts as kernels.hpp defines them, written out independently.
std::vector<char> reblock(const std::vector<char>& v, size_t elem, Layout l, int64_t n, int64_t c,
                          int64_t hw, bool to_blocked) {
  if (l == Layout::plain) return v;
  const int64_t bs = l == Layout::blocked ? 16 : c;
  std::vector<char> out(v.size());
  for (int64_t a = 0; a < n; ++a)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < hw; ++i) {
        const int64_t plain = (a * c + ch) * hw + i;
        const int64_t blocked = ((a * (c / bs) + ch / bs) * hw + i) * bs + ch % bs;
        const int64_t from = to_blocked ? plain : blocked, to = to_blocked ? blocked : plain;
        std::memcpy(out.data() + to * int64_t(elem), v.data() + from * int64_t(elem), elem);
      }
  return out;
}

// The oneDNN convolution, with or without blocked activations.
CpuOptions options(bool blocked) {
  CpuOptions o = CpuOptions::from_env();
  o.conv_onednn = true;
  o.blocked_layout = blocked;
  return o;
}

// ---- convolution ------------------------------------------------------------------------

struct ConvOut {
  std::vector<float> y, dx, dw, db;
};

ConvOut run_conv(CpuBackend& be, ConvShape cs, DType t, Layout xl, Layout yl) {
  cs.x_layout = xl;
  cs.y_layout = yl;
  const int64_t hw = cs.h * cs.w, pq = cs.p() * cs.q();
  const Shape xs{cs.n, cs.c, cs.h, cs.w}, ws{cs.k, cs.c, cs.r, cs.s},
      ys{cs.n, cs.k, cs.p(), cs.q()};
  Raw x(uniform_floats(size_t(shape_numel(xs)), -1.f, 1.f, 1), t);
  Raw w(uniform_floats(size_t(shape_numel(ws)), -0.5f, 0.5f, 2), t);
  Raw dy(uniform_floats(size_t(shape_numel(ys)), -1.f, 1.f, 4), t);
  auto b = uniform_floats(size_t(cs.k), -0.2f, 0.2f, 3);
  x.bytes = reblock(x.bytes, dtype_size(t), xl, cs.n, cs.c, hw, true);
  dy.bytes = reblock(dy.bytes, dtype_size(t), yl, cs.n, cs.k, pq, true);
  Raw y(std::vector<float>(size_t(shape_numel(ys))), t),
      dx(std::vector<float>(x.bytes.size() / dtype_size(t)), t);
  ConvOut o;
  o.dw.resize(size_t(shape_numel(ws)));
  o.db.resize(size_t(cs.k));
  const Tensor tb(b.data(), {cs.k}, DType::f32), tdb(o.db.data(), {cs.k}, DType::f32);
  const Tensor tdx = dx.view(xs);
  be.conv2d_forward(cs, x.view(xs), w.view(ws), &tb, Activation::relu, y.view(ys));
  be.conv2d_backward(cs, x.view(xs), dy.view(ys), w.view(ws), &tdx,
                     Tensor(o.dw.data(), ws, DType::f32), &tdb);
  y.bytes = reblock(y.bytes, dtype_size(t), yl, cs.n, cs.k, pq, false);
  dx.bytes = reblock(dx.bytes, dtype_size(t), xl, cs.n, cs.c, hw, false);
  o.y = copy_of(y.view(ys));
  o.dx = copy_of(dx.view(xs));
  return o;
}

// Every convolution of the shipped models at batch 4: cnn (28x28 input), resnet (its
// default width 16 on 28x28) and examples/lenet_bn (width 28: nhwc only, 28 channels do not
// make blocks of 16).
const std::vector<ConvShape> kModelConvs = {
    {4, 1, 28, 28, 32, 3, 3, 1, 0},   // cnn.conv1
    {4, 32, 26, 26, 64, 3, 3, 1, 0},  // cnn.conv2
    {4, 1, 28, 28, 16, 3, 3, 1, 1},   // resnet stem
    {4, 16, 28, 28, 16, 3, 3, 1, 1},  // resnet stage1
    {4, 16, 28, 28, 32, 3, 3, 2, 1},  // resnet stage2.block1.conv1
    {4, 32, 14, 14, 32, 3, 3, 1, 1},  // resnet stage2
    {4, 16, 28, 28, 32, 1, 1, 2, 0},  // resnet stage2 shortcut
    {4, 32, 14, 14, 64, 3, 3, 2, 1},  // resnet stage3.block1.conv1
    {4, 64, 7, 7, 64, 3, 3, 1, 1},    // resnet stage3
    {4, 32, 14, 14, 64, 1, 1, 2, 0},  // resnet stage3 shortcut
    {4, 1, 28, 28, 28, 5, 5, 1, 2},   // lenet_bn.c1
    {4, 28, 14, 14, 28, 3, 3, 1, 1},  // lenet_bn.res.c1, res.c2
    {4, 28, 7, 7, 56, 3, 3, 1, 1},    // lenet_bn.c3
};

class BlockedConv : public ::testing::TestWithParam<DType> {};

TEST_P(BlockedConv, EqualsPlainOnEveryModelShape) {
  const DType t = GetParam();
  CpuBackend be(1, options(true));
  CpuOptions im2col_opts = options(false);
  im2col_opts.conv_onednn = false;
  CpuBackend ref(1, im2col_opts);
  int blocked_cases = 0;
  for (const ConvShape& cs : kModelConvs) {
    SCOPED_TRACE(testing::Message()
                 << "C " << cs.c << " " << cs.h << "x" << cs.w << " K " << cs.k << " " << cs.r
                 << "x" << cs.s << " stride " << cs.stride << " pad " << cs.pad);
    const ConvOut plain = run_conv(be, cs, t, Layout::plain, Layout::plain);
    if (t == DType::f32) {  // the plain oneDNN path against im2col (summation order differs)
      const ConvOut r = run_conv(ref, cs, t, Layout::plain, Layout::plain);
      EXPECT_LE(rel_err(plain.y, r.y), 1e-5) << "forward";
      EXPECT_LE(rel_err(plain.dx, r.dx), 1e-5) << "backward data";
      EXPECT_LE(rel_err(plain.dw, r.dw), 1e-5) << "backward weights";
      EXPECT_LE(rel_err(plain.db, r.db), 1e-5) << "backward bias";
    }
    for (Layout xl : {Layout::plain, Layout::blocked, Layout::nhwc})
      for (Layout yl : {Layout::plain, Layout::blocked, Layout::nhwc}) {
        if (xl == Layout::plain && yl == Layout::plain) continue;
        if ((xl == Layout::blocked && cs.c % kChannelBlock) ||
            (yl == Layout::blocked && cs.k % kChannelBlock))
          continue;
        SCOPED_TRACE(testing::Message() << "x " << (xl == Layout::blocked ? "blocked" : "plain")
                                        << ", y " << (yl == Layout::blocked ? "blocked" : "plain"));
        ++blocked_cases;
        const ConvOut b = run_conv(be, cs, t, xl, yl);
        EXPECT_EQ(b.y, plain.y) << "forward";
        EXPECT_EQ(b.dx, plain.dx) << "backward data";
        EXPECT_EQ(b.dw, plain.dw) << "backward weights";
        EXPECT_EQ(b.db, plain.db) << "backward bias";
      }
  }
  // x and y in 2 or 3 layouts each (blocked where the channels allow), less plain-plain:
  // cnn 2 x 3 - 1 and 3 x 3 - 1, resnet 2 x 3 - 1 and 7 x (3 x 3 - 1), lenet_bn 3 x (2 x 2 - 1).
  EXPECT_EQ(blocked_cases, 5 + 8 + 5 + 7 * 8 + 3 * 3);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BlockedConv, ::testing::Values(DType::f32, DType::bf16));

// The im2col convolution refuses a blocked tensor (it would read it as NCHW), and its backend
// keeps activations plain.
TEST(BlockedConvIm2col, RefusesBlockedTensors) {
  CpuOptions o = options(true);
  o.conv_onednn = false;
  CpuBackend be(1, o);
  EXPECT_EQ(be.activation_layout(DType::f32), Layout::plain);
  ConvShape cs{1, 16, 4, 4, 16, 3, 3, 1, 1};
  cs.y_layout = Layout::blocked;
  std::vector<float> x(256), w(16 * 16 * 9), y(256);
  EXPECT_TRUE(test::throws_kind(
      [&] {
        be.conv2d_forward(cs, Tensor(x.data(), {1, 16, 4, 4}, DType::f32),
                          Tensor(w.data(), {16, 16, 3, 3}, DType::f32), nullptr, Activation::none,
                          Tensor(y.data(), {1, 16, 4, 4}, DType::f32));
      },
      ErrorKind::runtime));
}

// ---- max pooling ------------------------------------------------------------------------

class BlockedPool : public ::testing::TestWithParam<DType> {};

TEST_P(BlockedPool, EqualsPlainBitwise) {
  const DType t = GetParam();
  CpuBackend be(1, options(true));
  const std::vector<PoolShape> shapes = {{2, 64, 24, 24, 2, 2},  // the cnn's
                                         {2, 16, 7, 9, 3, 2},    // overlapping, odd sizes
                                         {1, 32, 6, 6, 2, 1},    // overlapping, stride 1
                                         {3, 16, 5, 5, 2, 2}};   // a row and a column unread
  for (PoolShape ps : shapes)
    for (bool relu : {false, true})
      for (Layout layout : {Layout::blocked, Layout::nhwc}) {
        SCOPED_TRACE(testing::Message()
                     << "C " << ps.c << " " << ps.h << "x" << ps.w << " kernel " << ps.kernel
                     << " stride " << ps.stride << " relu " << relu << " layout " << int(layout));
        ps.relu_input = relu;
        const int64_t hw = ps.h * ps.w;
        const Shape xs{ps.n, ps.c, ps.h, ps.w}, ys{ps.n, ps.c, ps.p(), ps.q()};
        // Four levels make ties; the ReLU's output has zeros and all-zero windows; a nan wins.
        auto xv = uniform_floats(size_t(shape_numel(xs)), -1.f, 1.f, 21);
        for (float& v : xv) v = std::round(v * 2) / 2;
        if (relu)
          for (float& v : xv) v = std::max(v, 0.f);
        xv[size_t(3 * hw + 5)] = std::numeric_limits<float>::quiet_NaN();
        const auto dyv = uniform_floats(size_t(shape_numel(ys)), -1.f, 1.f, 22);
        struct Out {
          std::vector<char> y, dx;
          std::vector<int32_t> arg;
        };
        auto run = [&](Layout l) {
          ps.x_layout = l;
          Raw x(xv, t), dy(dyv, t), y(std::vector<float>(dyv.size()), t),
              dx(std::vector<float>(xv.size()), t);
          x.bytes = reblock(x.bytes, dtype_size(t), l, ps.n, ps.c, hw, true);
          Out o;
          o.arg.resize(dyv.size());
          const Tensor arg(o.arg.data(), ys, DType::i32);
          be.maxpool2d_forward(ps, x.view(xs), y.view(ys), arg);
          be.maxpool2d_backward(ps, dy.view(ys), arg, dx.view(xs));
          dx.bytes = reblock(dx.bytes, dtype_size(t), l, ps.n, ps.c, hw, false);
          // argmax is in x's layout (only the backward pass reads it).
          std::vector<char> raw(o.arg.size() * 4);
          std::memcpy(raw.data(), o.arg.data(), raw.size());
          raw = reblock(raw, 4, l, ps.n, ps.c, ps.p() * ps.q(), false);
          std::memcpy(o.arg.data(), raw.data(), raw.size());
          o.y = y.bytes;
          o.dx = dx.bytes;
          return o;
        };
        const Out plain = run(Layout::plain), blocked = run(layout);
        EXPECT_EQ(blocked.arg, plain.arg) << "argmax";
        EXPECT_TRUE(blocked.y == plain.y) << "the maxima differ";
        EXPECT_TRUE(blocked.dx == plain.dx) << "the input gradients differ";
        if (relu) {
          EXPECT_NE(std::count(plain.arg.begin(), plain.arg.end(), -1), 0);
        }
      }
}

// fp16 too: its layout changes go through fp32 (oneDNN 2.6 moves fp16 only in its reference
// reorder).
INSTANTIATE_TEST_SUITE_P(Dtypes, BlockedPool,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16));

// ---- the cnn ------------------------------------------------------------------------------

class BlockedCnn : public ::testing::TestWithParam<DType> {};

// One forward and backward of the shipped cnn on a backend that keeps activations in its
// layout (fp32: blocked; bf16: nhwc where the bf16 convolutions run natively, else blocked)
// and on one that does not: the same logits and gradients, bit for bit; the first run's conv1
// output is the plain one's in that layout (so that path did run).
TEST_P(BlockedCnn, StepEqualsPlainBitwise) {
  const DType t = GetParam();
  CpuBackend blocked_be(1, options(true)), plain_be(1, options(false));
  const Layout layout = blocked_be.activation_layout(t);
  ASSERT_NE(layout, Layout::plain);
  EXPECT_EQ(plain_be.activation_layout(t), Layout::plain);
  struct Run {
    std::vector<float> logits, grad;
    std::vector<char> conv1;
  };
  const int64_t n = 4;
  auto xv = uniform_floats(size_t(n * 28 * 28), 0.f, 1.f, 31);
  auto dv = uniform_floats(size_t(n * 10), -1.f, 1.f, 32);
  auto run = [&](CpuBackend& be) {
    auto m = build_model("cnn", {1, 28, 28}, 10, {}, t);
    m->init_parameters(7, be);
    Context ctx{be, t, true, 99};
    Run r;
    LayerHooks hooks;
    hooks.after_forward = [&](size_t node, const Tensor& y) {
      if (node == 0)
        r.conv1.assign(static_cast<const char*>(y.data),
                       static_cast<const char*>(y.data) + y.bytes());
    };
    r.logits = copy_of(m->forward(ctx, Tensor(xv.data(), {n, 1, 28, 28}, DType::f32), hooks));
    m->backward(ctx, Tensor(dv.data(), {n, 10}, DType::f32));
    r.grad = copy_of(m->grad());
    return r;
  };
  const Run b = run(blocked_be), p = run(plain_be);
  EXPECT_EQ(b.logits, p.logits);
  EXPECT_EQ(b.grad, p.grad);
  ASSERT_EQ(b.conv1.size(), p.conv1.size());
  EXPECT_TRUE(b.conv1 == reblock(p.conv1, dtype_size(t), layout, n, 32, 26 * 26, true))
      << "conv1's output is not the plain one in layout " << int(layout);
  EXPECT_FALSE(b.conv1 == p.conv1) << "conv1's output is plain";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BlockedCnn, ::testing::Values(DType::f32, DType::bf16));

}  // namespace
}  // namespace ringtrain
