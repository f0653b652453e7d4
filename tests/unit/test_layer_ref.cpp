// The CPU backend's layers against PyTorch on fixed inputs: tests/ref/layer_ref.h5, made by
// tests/ref/make_layer_ref.py with python3-torch (this test itself needs no PyTorch):
// convolutions, pooling, GELU, batch norm in training and evaluation (with the running
// averages), and the whole cnn's logits, loss and every parameter gradient.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpt_ref.hpp"
#include "layer_test_util.hpp"
#include "nn/graph_builder.hpp"

namespace ringtrain {
namespace {

using kernels::Activation;
using test::copy_of;
using test::OneLayer;
using test::rel_err;

class TorchRef : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(RINGTRAIN_SOURCE_DIR) + "/tests/ref/layer_ref.h5";
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file_, 0) << "cannot open " << path;
  }
  void TearDown() override {
    if (file_ >= 0) H5Fclose(file_);
  }
  std::vector<float> read(const std::string& name, Shape* shape = nullptr) {
    return gpt_ref::read_dataset<float>(file_, name, H5T_NATIVE_FLOAT, shape);
  }
  int64_t attr(const std::string& group, const char* name) {
    int64_t v = 0;
    H5Aread_by_name_helper(group, name, &v);
    return v;
  }
  void H5Aread_by_name_helper(const std::string& group, const char* name, int64_t* v) {
    hid_t a = H5Aopen_by_name(file_, group.c_str(), name, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(a, 0) << group << " has no attribute " << name;
    H5Aread(a, H5T_NATIVE_INT64, v);
    H5Aclose(a);
  }
  // Fills every parameter of `model` named like the datasets under `group`.
  void load_params(Model& model, const std::string& group) {
    for (Param& p : model.params()) {
      Shape s;
      const auto v = read(group + "/" + p.name, &s);
      ASSERT_EQ(s, p.shape) << p.name;
      std::copy(v.begin(), v.end(), p.master.as<float>());
    }
  }
  // Runs a one-layer model on the group's x and dy; checks y, dx and the named gradients.
  void check_layer(const std::string& g, OneLayer& one, Context& ctx,
                   const std::vector<std::pair<std::string, std::string>>& grads,
                   double tol = 1e-5) {
    Shape xs, dys;
    auto x = read(g + "/x", &xs);
    auto dy = read(g + "/dy", &dys);
    const Tensor& y = one.layer().forward(ctx, Tensor(x.data(), xs, DType::f32));
    Shape ys;
    const auto want_y = read(g + "/y", &ys);
    ASSERT_EQ(y.numel(), shape_numel(ys)) << g;
    EXPECT_LE(rel_err(copy_of(y), want_y), tol) << g << " y";
    const Tensor& dx = one.layer().backward(ctx, Tensor(dy.data(), dys, DType::f32));
    EXPECT_LE(rel_err(copy_of(dx), read(g + "/dx")), tol) << g << " dx";
    for (const auto& [param, ds] : grads) {
      const Param* p = nullptr;
      for (const Param& q : one.model->params())
        if (q.name == param) p = &q;
      ASSERT_NE(p, nullptr) << param;
      EXPECT_LE(rel_err(copy_of(p->grad), read(g + "/" + ds)), tol) << g << " " << ds;
    }
  }
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  Context ctx{*backend, DType::f32, true, 0};
  hid_t file_ = -1;
};

TEST_F(TorchRef, Convolutions) {
  for (const std::string g : {"conv_s1p1", "conv_s2p0", "conv_1x1_s2"}) {
    SCOPED_TRACE(g);
    Shape ws;
    const auto w = read(g + "/weight", &ws);
    const bool bias = attr(g, "has_bias") != 0;
    OneLayer one(std::make_unique<Conv2D>(
                     "conv", Conv2D::Options{ws[1], ws[0], ws[2], attr(g, "stride"),
                                             attr(g, "padding"), bias, Activation::none}),
                 DType::f32, 1, *backend);
    std::copy(w.begin(), w.end(), one.model->params()[0].master.as<float>());
    if (bias) {
      const auto b = read(g + "/bias");
      std::copy(b.begin(), b.end(), one.model->params()[1].master.as<float>());
    }
    std::vector<std::pair<std::string, std::string>> grads = {{"conv.weight", "dweight"}};
    if (bias) grads.push_back({"conv.bias", "dbias"});
    check_layer(g, one, ctx, grads);
  }
}

TEST_F(TorchRef, Pooling) {
  OneLayer mp(std::make_unique<MaxPool2D>("pool", 2, 2), DType::f32, 1, *backend);
  check_layer("maxpool2", mp, ctx, {});
  OneLayer ap(std::make_unique<GlobalAvgPool>("pool"), DType::f32, 1, *backend);
  check_layer("avgpool_global", ap, ctx, {});
}

TEST_F(TorchRef, Gelu) {
  OneLayer one(std::make_unique<GELU>("gelu"), DType::f32, 1, *backend);
  check_layer("gelu", one, ctx, {}, 2e-6);
}

TEST_F(TorchRef, BatchNormTrainAndEval) {
  for (const bool training : {true, false}) {
    const std::string g = training ? "batchnorm_train" : "batchnorm_eval";
    SCOPED_TRACE(g);
    OneLayer one(std::make_unique<BatchNorm2D>("bn", 3), DType::f32, 1, *backend);
    auto set = [&](const Tensor& t, const std::string& ds) {
      const auto v = read(g + "/" + ds);
      ASSERT_EQ(int64_t(v.size()), t.numel());
      std::copy(v.begin(), v.end(), t.as<float>());
    };
    set(one.model->params()[0].master, "weight");
    set(one.model->params()[1].master, "bias");
    set(one.model->buffers()[0].value, "running_mean");
    set(one.model->buffers()[1].value, "running_var");
    Context c{*backend, DType::f32, training, 0};
    check_layer(g, one, c, {{"bn.weight", "dweight"}, {"bn.bias", "dbias"}}, 2e-5);
    if (training) {
      EXPECT_LE(rel_err(copy_of(one.model->buffers()[0].value), read(g + "/running_mean_out")),
                1e-6);
      EXPECT_LE(rel_err(copy_of(one.model->buffers()[1].value), read(g + "/running_var_out")),
                1e-6);
    }
  }
}

// The whole CNN (dropout off) against PyTorch: logits, loss and every parameter gradient.
TEST_F(TorchRef, CnnModel) {
  auto model = build_model("cnn", {1, 28, 28}, 10, {{"dropout", "0"}}, DType::f32);
  load_params(*model, "cnn/params");
  model->refresh_working_copy(*backend);
  Shape xs;
  auto x = read("cnn/x", &xs);
  hid_t ds = H5Dopen2(file_, "cnn/labels", H5P_DEFAULT);
  std::vector<int32_t> labels(static_cast<size_t>(xs[0]));
  H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
  H5Dclose(ds);
  const Tensor& logits = model->forward(ctx, Tensor(x.data(), xs, DType::f32));
  EXPECT_LE(rel_err(copy_of(logits), read("cnn/logits")), 1e-5);
  std::vector<float> dl(static_cast<size_t>(logits.numel()));
  Tensor dlogits(dl.data(), logits.shape, DType::f32);
  const auto xent =
      backend->softmax_xent(logits, Tensor(labels.data(), {xs[0]}, DType::i32), 1.f, &dlogits);
  EXPECT_NEAR(xent.loss_sum / double(xs[0]), read("cnn/loss")[0], 1e-5);
  model->backward(ctx, dlogits);
  for (const Param& p : model->params())
    EXPECT_LE(rel_err(copy_of(p.grad), read("cnn/grads/" + p.name)), 1e-4) << p.name;
}

}  // namespace
}  // namespace ringtrain
