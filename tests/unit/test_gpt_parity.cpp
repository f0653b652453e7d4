// GPT parity with PyTorch, as llm.c's test_gpt2: models/gpt-tiny.pbtxt built at the size of
// tests/ref/gpt_ref.h5 (made by tests/ref/make_gpt_ref.py, float64 PyTorch; this test needs no
// PyTorch), run through the real graph executor with the reference's parameters and tokens:
// the logits, the loss, every parameter gradient (the tied embedding's sums the lookup and
// the head) and the losses of 10 AdamW steps (decay on the Linear weights only, as the model
// file's defaults give), in fp32 and in bf16/fp16 mixed precision.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

struct GptRef {
  hid_t file = -1;
  GptRef() {
    const std::string path = std::string(RINGTRAIN_SOURCE_DIR) + "/tests/ref/gpt_ref.h5";
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  ~GptRef() {
    if (file >= 0) H5Fclose(file);
  }
  template <typename T>
  std::vector<T> read(const std::string& name, hid_t type, Shape* shape = nullptr) const {
    hid_t ds = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    EXPECT_GE(ds, 0) << "gpt_ref.h5 has no dataset " << name;
    if (ds < 0) return {};
    hid_t sp = H5Dget_space(ds);
    const int rank = H5Sget_simple_extent_ndims(sp);
    std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
    H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
    Shape s(dims.begin(), dims.end());
    std::vector<T> v(static_cast<size_t>(shape_numel(s)));
    H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(sp);
    H5Dclose(ds);
    if (shape) *shape = s;
    return v;
  }
  std::vector<double> real(const std::string& name, Shape* shape = nullptr) const {
    return read<double>(name, H5T_NATIVE_DOUBLE, shape);
  }
  double attr(const char* name) const {
    double v = 0;
    hid_t a = H5Aopen_by_name(file, "/", name, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(a, 0) << "gpt_ref.h5 has no attribute " << name;
    H5Aread(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    return v;
  }
  int64_t iattr(const char* name) const { return int64_t(std::llround(attr(name))); }
};

// max |got - want| / max |want| over a tensor: its error relative to its scale.
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 1e-300;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

std::vector<float> floats_of(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  kernels::host_to_f32(t.data, t.dtype, v.data(), t.numel());
  return v;
}

// Tolerances: fp32 as the issue states; 16-bit from one rounding of every activation and
// weight (bf16 2^-8, fp16 2^-11) compounded over the network's ~20 ops.
struct Tolerance {
  double logits, loss, grads, losses;
};
Tolerance tolerance_of(DType t) {
  if (t == DType::f32) return {1e-5, 1e-5, 1e-4, 1e-5};
  if (t == DType::bf16) return {3e-2, 5e-4, 5e-2, 1e-3};
  return {5e-3, 1e-4, 1e-2, 1e-4};
}

class GptParity : public ::testing::TestWithParam<DType> {};

TEST_P(GptParity, LogitsLossGradientsAndTenAdamWSteps) {
  const DType compute = GetParam();
  const Tolerance tol = tolerance_of(compute);
  GptRef ref;
  ASSERT_GE(ref.file, 0) << "cannot open tests/ref/gpt_ref.h5";
  const int64_t v = ref.iattr("vocab_size"), vp = ref.iattr("padded_vocab_size");
  const int64_t t = ref.iattr("seq_len"), b = ref.iattr("batch");
  auto backend = kernels::make_cpu_backend(1);
  auto model = build_model(std::string(RINGTRAIN_SOURCE_DIR) + "/models/gpt-tiny.pbtxt", {t}, v,
                           {{"layers", std::to_string(ref.iattr("n_layer"))},
                            {"heads", std::to_string(ref.iattr("n_head"))},
                            {"width", std::to_string(ref.iattr("n_embd"))},
                            {"context", std::to_string(t)},
                            {"padded_vocab", std::to_string(vp)}},
                           compute);
  // Every parameter of the reference, once each (the head shares the embedding's).
  std::vector<std::string> names;
  for (Param& p : model->params()) {
    Shape s;
    const auto w = ref.real("params/" + p.name, &s);
    ASSERT_EQ(s, p.shape) << p.name;
    for (size_t i = 0; i < w.size(); ++i) p.master.as<float>()[i] = float(w[i]);
    names.push_back(p.name);
  }
  ASSERT_EQ(names.size(), size_t(4 + 12 * ref.iattr("n_layer"))) << "parameters of the model";
  model->refresh_working_copy(*backend);

  auto tok = ref.read<int32_t>("tokens", H5T_NATIVE_INT32);
  auto tgt = ref.read<int32_t>("targets", H5T_NATIVE_INT32);
  Tensor tokens(tok.data(), {b, t}, DType::i32), targets(tgt.data(), {b, t}, DType::i32);
  Context ctx{*backend, compute, true, 0};
  OwnedTensor dlogits;
  Tolerance worst{0, 0, 0, 0};  // the errors measured, printed for the record
  auto loss_and_backward = [&](bool check) {
    const Tensor& logits = model->forward(ctx, tokens);
    EXPECT_EQ(logits.shape, (Shape{b, t, vp}));
    EXPECT_EQ(logits.dtype, DType::f32) << "the last node's output is fp32";
    if (check) {
      worst.logits = rel_err(floats_of(logits), ref.real("logits"));
      EXPECT_LE(worst.logits, tol.logits) << dtype_name(compute) << " logits";
    }
    Tensor& d = dlogits.ensure(logits.shape, DType::f32);
    const double loss = backend->token_xent(logits, targets, v, 1.f, &d).loss_sum / double(b * t);
    model->backward(ctx, d);
    return loss;
  };
  const double loss = loss_and_backward(true);
  const double want_loss = ref.real("loss")[0];
  worst.loss = std::fabs(loss - want_loss) / want_loss;
  EXPECT_LE(worst.loss, tol.loss) << dtype_name(compute) << " loss " << loss << " vs " << want_loss;
  for (Param& p : model->params()) {
    const double e = rel_err(floats_of(p.grad), ref.real("grads/" + p.name));
    worst.grads = std::max(worst.grads, e);
    EXPECT_LE(e, tol.grads) << dtype_name(compute) << " gradient of " << p.name;
  }

  // AdamW from the same start, decay groups from the parameters (as the Trainer sets them).
  OptimizerConfig oc;
  oc.name = "adamw";
  oc.lr = float(ref.attr("lr"));
  oc.beta1 = float(ref.attr("beta1"));
  oc.beta2 = float(ref.attr("beta2"));
  oc.eps = float(ref.attr("eps"));
  oc.weight_decay = float(ref.attr("weight_decay"));
  auto opt = make_optimizer(oc, model->num_params());
  std::vector<DecayRange> ranges;
  for (const Param& p : model->params()) {
    int64_t want_decay = 0;
    hid_t ds = H5Dopen2(ref.file, ("params/" + p.name).c_str(), H5P_DEFAULT);
    hid_t a = H5Aopen(ds, "decay", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &want_decay);
    H5Aclose(a);
    H5Dclose(ds);
    EXPECT_EQ(p.decay, want_decay != 0) << "default weight decay of " << p.name;
    ranges.push_back({p.offset, p.master.numel(), p.decay});
  }
  opt->set_decay_ranges(ranges);
  const auto want_losses = ref.real("losses");
  OwnedTensor grad32;
  Tensor work = model->work();
  for (size_t k = 0; k < want_losses.size(); ++k) {
    const double l = k == 0 ? loss : loss_and_backward(false);
    worst.losses = std::max(worst.losses, std::fabs(l - want_losses[k]) / want_losses[k]);
    EXPECT_LE(std::fabs(l - want_losses[k]) / want_losses[k], tol.losses)
        << dtype_name(compute) << " loss before step " << k << ": " << l << " vs "
        << want_losses[k];
    Tensor g = model->grad();
    if (compute != DType::f32) {
      g = grad32.ensure({model->num_params()}, DType::f32);
      backend->cast(model->grad(), g);
    }
    opt->step(*backend, model->master(), g, compute == DType::f32 ? nullptr : &work, oc.lr);
  }
  std::printf("gpt parity %s: logits %.2e, loss %.2e, gradients %.2e, 10 AdamW losses %.2e\n",
              dtype_name(compute), worst.logits, worst.loss, worst.grads, worst.losses);
}

INSTANTIATE_TEST_SUITE_P(Precision, GptParity,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain
