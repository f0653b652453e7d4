// Every loss of a model file's `loss` block (nn/loss.hpp, kernels/cpu/cpu_loss.cpp) against
// PyTorch, computed at test time: this test writes its inputs, /usr/bin/python3 (Debian's
// python3-torch) evaluates the loss and its autograd gradient in float64 on exactly those
// values, and LossFunction::apply on the CPU backend must agree:
//   - fp32: predictions and targets as drawn; loss and gradient within fp32 rounding;
//   - bf16: the predictions rounded to bf16 (a bf16 network's output), the loss computed in
//     fp32 as always: the same tolerance on the loss, and the gradient, rounded to bf16 as
//     the network's backward reads it, within bf16 rounding of PyTorch's.
// Cases: nn.MSELoss, L1Loss, HuberLoss(delta), BCEWithLogitsLoss (with and without
// pos_weight), CrossEntropyLoss(ignore_index) on dense labels [N, H, W], and a weighted sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "nn/loss.hpp"
#include "test_util.hpp"

namespace ringtrain::test {
namespace {

// argv: input file, output file, then one case: the torch expression of the loss over p
// (float64, requires grad), t (float64; long for cross_entropy) and w (pos_weight), and the
// sizes np, nt, nw. Writes the loss then dloss/dp, float64.
constexpr const char* kScript = R"(
import sys, numpy as np, torch
import torch.nn.functional as F
np_, nt, nw = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
v = np.fromfile(sys.argv[1], dtype=np.float32).astype(np.float64)
shape_p = [int(s) for s in sys.argv[7].split(',')]
shape_t = [int(s) for s in sys.argv[8].split(',')]
p = torch.tensor(v[:np_].reshape(shape_p), requires_grad=True)
t = torch.tensor(v[np_:np_ + nt].reshape(shape_t))
w = torch.tensor(v[np_ + nt:np_ + nt + nw])
loss = eval(sys.argv[3])
loss.backward()
np.concatenate([[loss.item()], p.grad.numpy().ravel()]).astype(np.float64).tofile(sys.argv[2])
)";

struct Case {
  std::string name;
  std::vector<LossTerm> terms;
  std::string torch;  // over p, t, w
  Shape pred, target;
  bool int_target = false;
};

std::vector<float> through(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> raw(v.size() * dtype_size(t));
  kernels::host_from_f32(v.data(), raw.data(), t, int64_t(v.size()));
  std::vector<float> back(v.size());
  kernels::host_to_f32(raw.data(), t, back.data(), int64_t(v.size()));
  return back;
}

void torch_reference(const Case& c, const std::vector<float>& p, const std::vector<float>& t,
                     const std::vector<float>& w, double& loss, std::vector<double>& grad) {
  const std::string dir = ::testing::TempDir();
  const std::string script = dir + "rt_loss_ref.py", in = dir + "rt_loss_in.bin",
                    out = dir + "rt_loss_out.bin";
  std::ofstream(script) << kScript;
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto* v : {&p, &t, &w})
      f.write(reinterpret_cast<const char*>(v->data()), std::streamsize(v->size() * 4));
  }
  auto dims = [](const Shape& s) {
    std::string r;
    for (int64_t d : s) r += (r.empty() ? "" : ",") + std::to_string(d);
    return r;
  };
  const std::string cmd = "OMP_NUM_THREADS=1 /usr/bin/python3 " + script + " " + in + " " + out +
                          " \"" + c.torch + "\" " + std::to_string(p.size()) + " " +
                          std::to_string(t.size()) + " " + std::to_string(w.size()) + " " +
                          dims(c.pred) + " " + dims(c.target);
  std::remove(out.c_str());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<double> r(1 + p.size());
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(r.data()), std::streamsize(r.size() * 8));
  ASSERT_TRUE(f) << "short output from " << cmd;
  loss = r[0];
  grad.assign(r.begin() + 1, r.end());
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto term = [](LossKind k) {
    LossTerm t;
    t.kind = k;
    return t;
  };
  v.push_back({"mse", {term(LossKind::mse)}, "F.mse_loss(p, t)", {6, 3, 8, 8}, {6, 3, 8, 8}});
  v.push_back({"l1", {term(LossKind::l1)}, "F.l1_loss(p, t)", {16, 5}, {16, 5}});
  LossTerm huber = term(LossKind::huber);
  huber.delta = 0.7f;
  v.push_back({"huber", {huber}, "F.huber_loss(p, t, delta=0.7)", {16, 40}, {16, 40}});
  v.push_back({"bce_logits",
               {term(LossKind::bce_logits)},
               "F.binary_cross_entropy_with_logits(p, t)",
               {32, 6},
               {32, 6}});
  LossTerm bce_w = term(LossKind::bce_logits);
  bce_w.pos_weight = {0.5f, 1.f, 2.f, 3.f, 0.25f, 8.f};
  v.push_back({"bce_logits_pos_weight",
               {bce_w},
               "F.binary_cross_entropy_with_logits(p, t, pos_weight=w)",
               {32, 6},
               {32, 6}});
  LossTerm pixel = term(LossKind::pixel_cross_entropy);
  pixel.ignore_index = 255;
  v.push_back({"pixel_cross_entropy_ignore",
               {pixel},
               "F.cross_entropy(p, t.long(), ignore_index=255)",
               {4, 5, 6, 7},
               {4, 6, 7},
               true});
  LossTerm half_mse = term(LossKind::mse);
  half_mse.weight = 0.5;
  v.push_back({"weighted_sum",
               {half_mse, huber},
               "0.5 * F.mse_loss(p, t) + F.huber_loss(p, t, delta=0.7)",
               {8, 12},
               {8, 12}});
  return v;
}

class LossTorch : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(LossTorch, LossAndGradientMatchPyTorch) {
  const Case c = cases()[size_t(std::get<0>(GetParam()))];
  const DType dt = std::get<1>(GetParam());
  const int64_t np = shape_numel(c.pred), nt = shape_numel(c.target);
  std::vector<float> p = through(uniform_floats(size_t(np), -4.f, 4.f, 3), dt), t;
  if (c.int_target) {
    // Labels in [0, C), one position in 7 ignored.
    const int64_t classes = c.pred[1];
    const auto r = uniform_floats(size_t(nt), 0.f, float(classes), 5);
    for (int64_t i = 0; i < nt; ++i)
      t.push_back(i % 7 == 3 ? 255.f : std::min(std::floor(r[size_t(i)]), float(classes - 1)));
  } else if (c.terms[0].kind == LossKind::bce_logits) {
    const auto r = uniform_floats(size_t(nt), 0.f, 1.f, 5);
    for (int64_t i = 0; i < nt; ++i) t.push_back(i % 3 == 0 ? r[size_t(i)] : r[size_t(i)] > 0.5f);
  } else {
    t = uniform_floats(size_t(nt), -4.f, 4.f, 5);
  }
  const std::vector<float>& w = c.terms[0].pos_weight;
  double want_loss = 0;
  std::vector<double> want_grad;
  torch_reference(c, p, t, w, want_loss, want_grad);
  if (HasFatalFailure()) return;

  auto backend = kernels::make_cpu_backend(2);
  LossSpec spec;
  spec.terms = c.terms;
  LossFunction fn(spec);
  std::vector<float> grad(size_t(np), 123.f);  // overwritten by the first term
  std::vector<int32_t> labels;
  Tensor pt(p.data(), c.pred, DType::f32), gt(grad.data(), c.pred, DType::f32);
  Tensor tt(t.data(), c.target, DType::f32);
  if (c.int_target) {
    for (float v : t) labels.push_back(int32_t(v));
    tt = Tensor(labels.data(), c.target, DType::i32);
  }
  const auto r = fn.apply(*backend, pt, tt, 1.f, &gt);
  const double got_loss = r.loss_sum / double(c.pred[0]);  // apply reports the loss times N
  EXPECT_TRUE(close(got_loss, want_loss, 2e-6, 1e-7))
      << c.name << " " << dtype_name(dt) << ": loss " << got_loss << ", PyTorch " << want_loss;
  const std::vector<float> got = dt == DType::f32 ? grad : through(grad, dt);
  // bf16 holds 8 significant bits: half a unit in the last place of the rounded value.
  const double rtol = dt == DType::f32 ? 2e-5 : 1.0 / 256;
  double scale = 0;
  for (double g : want_grad) scale = std::max(scale, std::fabs(g));
  double worst = 0;  // the largest gradient error relative to the largest gradient
  for (int64_t i = 0; i < np; ++i)
    worst = std::max(worst, std::fabs(got[size_t(i)] - want_grad[size_t(i)]) / scale);
  std::printf("%-28s %-4s loss %.9g (PyTorch %.9g, rel. error %.2e), gradient max error %.2e\n",
              c.name.c_str(), dtype_name(dt), got_loss, want_loss,
              std::fabs(got_loss - want_loss) / std::fabs(want_loss), worst);
  int bad = 0;
  for (int64_t i = 0; i < np && bad < 5; ++i)
    if (!close(got[size_t(i)], want_grad[size_t(i)], rtol, scale * 1e-6)) {
      ++bad;
      ADD_FAILURE() << c.name << " " << dtype_name(dt) << ": gradient at index " << i << " (p "
                    << p[size_t(i)] << ", t " << t[size_t(i % nt)] << "): got " << got[size_t(i)]
                    << ", PyTorch " << want_grad[size_t(i)];
    }
}

INSTANTIATE_TEST_SUITE_P(AllLosses, LossTorch,
                         ::testing::Combine(::testing::Range(0, int(cases().size())),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         [](const ::testing::TestParamInfo<std::tuple<int, DType>>& info) {
                           return cases()[size_t(std::get<0>(info.param))].name + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

// A label that is neither a class nor the ignore_index is refused; ignored positions do not count.
TEST(LossKernels, PixelXentRefusesALabelOutsideTheClasses) {
  auto backend = kernels::make_cpu_backend(1);
  std::vector<float> logits(2 * 3 * 4, 0.f);
  std::vector<int32_t> labels = {0, 1, 2, 3, 0, 1, 2, 0};  // 3 is not a class of 3
  Tensor l(logits.data(), {2, 3, 4}, DType::f32), y(labels.data(), {2, 4}, DType::i32);
  EXPECT_THROW(backend->pixel_xent(l, y, -100, 1.f, nullptr), Error);
  labels[3] = -100;  // ignored
  const auto r = backend->pixel_xent(l, y, -100, 1.f, nullptr);
  EXPECT_EQ(r.counted, 7);
  EXPECT_NEAR(r.loss_sum, 7 * std::log(3.0), 1e-12);
}

}  // namespace
}  // namespace ringtrain::test
