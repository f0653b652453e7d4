// The training recipe's pieces against PyTorch and against their definitions: learning-rate
// schedules and label-smoothed cross-entropy against tests/ref/recipe_ref.h5 (made by
// tests/ref/make_recipe_ref.py with python3-torch), decay groups (which parameters weight
// decay touches), and augmentation (crop after zero padding and flip, per-sample streams)
// on CIFAR-shaped samples.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/loader.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model.hpp"
#include "nn/optimizer.hpp"
#include "nn/schedule.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using test::throws_kind;

class RecipeRef : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(RINGTRAIN_SOURCE_DIR) + "/tests/ref/recipe_ref.h5";
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file_, 0) << "cannot open " << path;
  }
  void TearDown() override {
    if (file_ >= 0) H5Fclose(file_);
  }
  template <typename T>
  std::vector<T> read(const std::string& name, hid_t mem) {
    hid_t ds = H5Dopen2(file_, name.c_str(), H5P_DEFAULT);
    EXPECT_GE(ds, 0) << "no dataset " << name;
    hid_t sp = H5Dget_space(ds);
    std::vector<T> v(size_t(H5Sget_simple_extent_npoints(sp)));
    H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(sp);
    H5Dclose(ds);
    return v;
  }
  double num_attr(const std::string& obj, const char* name) {
    double v = 0;
    hid_t a = H5Aopen_by_name(file_, obj.c_str(), name, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(a, 0) << obj << " has no attribute " << name;
    H5Aread(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    return v;
  }
  std::string str_attr(const std::string& obj, const char* name) {
    hid_t a = H5Aopen_by_name(file_, obj.c_str(), name, H5P_DEFAULT, H5P_DEFAULT);
    hid_t t = H5Aget_type(a);
    std::string out;
    if (H5Tis_variable_str(t) > 0) {
      char* s = nullptr;
      hid_t mem = H5Tcopy(H5T_C_S1);
      H5Tset_size(mem, H5T_VARIABLE);
      H5Tset_cset(mem, H5Tget_cset(t));
      H5Aread(a, mem, &s);
      out = s ? s : "";
      H5free_memory(s);
      H5Tclose(mem);
    } else {
      out.assign(H5Tget_size(t), '\0');
      H5Aread(a, t, out.data());
      out.resize(std::strlen(out.c_str()));
    }
    H5Tclose(t);
    H5Aclose(a);
    return out;
  }
  hid_t file_ = -1;
};

TEST_F(RecipeRef, SchedulesEqualPyTorchAtEveryStep) {
  const char* cases[] = {"constant",      "constant_warmup",    "cosine",
                         "cosine_warmup", "cosine_decay_steps", "linear_warmup",
                         "step",          "inverse_sqrt",       "inverse_sqrt_nowarm"};
  for (const char* c : cases) {
    const std::string obj = std::string("/schedule/") + c;
    const auto want = read<double>(obj, H5T_NATIVE_DOUBLE);
    ASSERT_FALSE(want.empty()) << c;
    ScheduleConfig sc;
    sc.name = str_attr(obj, "name");
    sc.warmup_steps = int64_t(num_attr(obj, "warmup_steps"));
    sc.warmup_init_lr = num_attr(obj, "warmup_init_lr");
    sc.min_lr = num_attr(obj, "min_lr");
    sc.decay_steps = int64_t(num_attr(obj, "decay_steps"));
    sc.step_every = int64_t(num_attr(obj, "step_every"));
    sc.step_gamma = num_attr(obj, "step_gamma");
    const LrSchedule s(sc, num_attr(obj, "base_lr"), int64_t(want.size()));
    for (size_t t = 0; t < want.size(); ++t)
      ASSERT_NEAR(s.lr(int64_t(t)), want[t], 1e-7) << c << " at step " << t;
  }
}

TEST(Schedule, RefusesWhatCannotWork) {
  ScheduleConfig sc;
  sc.name = "cosine";
  sc.warmup_steps = 10;
  EXPECT_TRUE(throws_kind([&] { LrSchedule(sc, 0.1, 10); }, ErrorKind::input));  // no decay left
  sc.name = "step";
  EXPECT_TRUE(throws_kind([&] { LrSchedule(sc, 0.1, 100); }, ErrorKind::input));  // no --step-every
  sc.name = "exponential";
  EXPECT_TRUE(throws_kind([&] { LrSchedule(sc, 0.1, 100); }, ErrorKind::input));
  sc.name = "constant";
  sc.min_lr = 0.5;
  EXPECT_TRUE(throws_kind([&] { LrSchedule(sc, 0.1, 100); }, ErrorKind::input));
  // Past --decay-steps cosine stays at --min-lr.
  sc = ScheduleConfig{};
  sc.name = "cosine";
  sc.min_lr = 0.01;
  sc.decay_steps = 20;
  const LrSchedule s(sc, 0.1, 100);
  EXPECT_EQ(s.lr(20), 0.01);
  EXPECT_EQ(s.lr(99), 0.01);
}

TEST_F(RecipeRef, LabelSmoothingEqualsPyTorch) {
  auto be = kernels::make_cpu_backend(1);
  for (const char* c : {"eps0", "eps01", "eps03"}) {
    const std::string g = std::string("/xent/") + c;
    auto logits = read<float>(g + "/logits", H5T_NATIVE_FLOAT);
    auto labels = read<int32_t>(g + "/labels", H5T_NATIVE_INT32);
    const auto want = read<float>(g + "/dlogits", H5T_NATIVE_FLOAT);
    const int64_t n = int64_t(labels.size()), k = int64_t(logits.size()) / n;
    std::vector<float> dl(logits.size());
    Tensor dt(dl.data(), {n, k}, DType::f32);
    const auto r = be->softmax_xent(Tensor(logits.data(), {n, k}, DType::f32),
                                    Tensor(labels.data(), {n}, DType::i32), 1.f, &dt,
                                    float(num_attr(g, "smoothing")));
    EXPECT_NEAR(r.loss_sum, num_attr(g, "loss_sum"), 1e-5 * n) << c;
    for (size_t i = 0; i < dl.size(); ++i) ASSERT_NEAR(dl[i], want[i], 1e-6) << c << " at " << i;
  }
}

// Zero gradients: AdamW's update is then its decay alone, p *= 1 - lr * wd.
TEST(DecayGroups, DecayTouchesExactlyTheParametersThatAskForIt) {
  auto be = kernels::make_cpu_backend(1);
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    const bool mlp = name == std::string("mlp");
    std::vector<std::pair<std::string, std::string>> vars;
    if (mlp) vars = {{"hidden", "16"}};
    if (name == std::string("resnet")) vars = {{"width", "4"}};
    auto model = build_model(name, mlp ? Shape{1, 8, 8} : Shape{3, 8, 8}, 4, vars, DType::f32);
    model->init_parameters(3, *be);
    OptimizerConfig oc;
    oc.lr = 0.1f;
    oc.weight_decay = 0.5f;
    auto opt = make_optimizer(oc, model->num_params());
    std::vector<DecayRange> ranges;
    int decayed = 0, kept = 0;
    for (const auto& p : model->params()) {
      ranges.push_back({p.offset, p.master.numel(), p.decay});
      // Weights of linear and convolution layers decay; biases and batch norm do not.
      const bool bias = p.name.size() > 5 && p.name.substr(p.name.size() - 5) == ".bias";
      const bool norm =
          p.name.find("bn") != std::string::npos || p.name.find("norm") != std::string::npos;
      EXPECT_EQ(p.decay, !bias && !norm) << name << ": " << p.name;
      (p.decay ? decayed : kept)++;
    }
    EXPECT_GT(decayed, 0) << name;
    EXPECT_GT(kept, 0) << name;
    opt->set_decay_ranges(ranges);
    std::vector<float> before(model->master().as<float>(),
                              model->master().as<float>() + model->num_params());
    std::vector<float> grad(size_t(model->num_params()), 0.f);
    opt->step(*be, model->master(), Tensor(grad.data(), {model->num_params()}, DType::f32), nullptr,
              0.1f);
    for (const auto& p : model->params())
      for (int64_t i = 0; i < p.master.numel(); ++i) {
        const float b = before[size_t(p.offset + i)], a = p.master.as<float>()[i];
        if (p.decay)
          ASSERT_FLOAT_EQ(a, b * (1.f - 0.1f * 0.5f)) << name << ": " << p.name << "[" << i << "]";
        else
          ASSERT_EQ(a, b) << name << ": " << p.name << "[" << i << "]";
      }
  }
}

TEST(Augment, ParsesAndRefuses) {
  EXPECT_EQ(io::parse_augment("crop:4,flip").pad, 4);
  EXPECT_TRUE(io::parse_augment("crop:4,flip").flip);
  EXPECT_TRUE(io::parse_augment("flip").flip);
  EXPECT_FALSE(io::parse_augment("").any());
  for (const char* bad : {"crop", "crop:0", "crop:-1", "crop:4x", "flop", "flip,flip", "crop:2,"})
    EXPECT_TRUE(throws_kind([&] { io::parse_augment(bad); }, ErrorKind::input)) << bad;
}

// CIFAR-shaped [3, 32, 32] samples: every output pixel is the input pixel its crop offset
// and flip name, or the channel's normalised zero where that falls into the padding.
TEST(Augment, CropAndFlipMoveEveryPixelAsDrawn) {
  const Shape ss = {3, 32, 32};
  const int64_t per = 3 * 32 * 32, n = 64;
  io::Normalization norm{{0.49, 0.48, 0.45}, {0.25, 0.24, 0.26}};
  std::vector<float> x(size_t(n * per));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 9973) * 0.001f + 1.f;  // all > 0
  const std::vector<float> orig = x;
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = 1000 + 7 * i;
  io::Augment aug{4, true};
  io::augment_samples(aug, 42, 3, idx.data(), n, ss, norm, x.data());
  int moved = 0, flipped = 0, padded = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Find the (dy, dx, flip) that explains the sample: exactly one must.
    int found = 0;
    for (int f = 0; f < 2; ++f)
      for (int64_t dy = -4; dy <= 4; ++dy)
        for (int64_t dx = -4; dx <= 4; ++dx) {
          bool ok = true;
          for (int64_t c = 0; c < 3 && ok; ++c)
            for (int64_t r = 0; r < 32 && ok; ++r)
              for (int64_t col = 0; col < 32 && ok; ++col) {
                const int64_t sr = r + dy, sc = (f ? 31 - col : col) + dx;
                const float want = sr >= 0 && sr < 32 && sc >= 0 && sc < 32
                                       ? orig[size_t(i * per + (c * 32 + sr) * 32 + sc)]
                                       : float(-norm.mean[size_t(c)] / norm.std[size_t(c)]);
                ok = x[size_t(i * per + (c * 32 + r) * 32 + col)] == want;
              }
          if (ok) {
            ++found;
            moved += dy != 0 || dx != 0;
            flipped += f;
            padded += dy != 0 || dx != 0;
          }
        }
    ASSERT_EQ(found, 1) << "sample " << i;
  }
  // 64 draws: some crops move and some flips happen (a broken draw would give none).
  EXPECT_GT(moved, 32);
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
  EXPECT_GT(padded, 0);
}

// The same dataset index in the same epoch is augmented the same way wherever it sits in a
// batch (so on any rank and after a resume); another epoch draws anew.
TEST(Augment, DependsOnSeedEpochAndIndexOnly) {
  const Shape ss = {3, 8, 8};
  const int64_t per = 3 * 64;
  io::Normalization norm;
  auto sample = [&](int64_t index, int64_t epoch, uint64_t seed, int64_t at, int64_t n) {
    std::vector<float> x(size_t(n * per));
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i == at ? index : 500 + i;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < per; ++k) x[size_t(i * per + k)] = float(idx[size_t(i)] * 1000 + k);
    io::augment_samples(io::Augment{2, true}, seed, epoch, idx.data(), n, ss, norm, x.data());
    return std::vector<float>(x.begin() + at * per, x.begin() + (at + 1) * per);
  };
  const auto a = sample(17, 2, 9, 0, 1);
  EXPECT_EQ(a, sample(17, 2, 9, 5, 8));
  EXPECT_EQ(a, sample(17, 2, 9, 2, 3));
  int differ = 0;
  for (int64_t e = 3; e < 13; ++e) differ += sample(17, e, 9, 0, 1) != a;
  EXPECT_GT(differ, 5);
}

}  // namespace
}  // namespace ringtrain
