// Hostile metadata and structure: normalisation statistics that are not finite or cannot be
// real (datasets and checkpoints), the checkpoint's metadata checksum (an exponent bit
// flipped in input_std, an edited attribute, a checkpoint from before the checksum), a
// precision no run trains in, float64 parameters, a group where a dataset belongs,
// /doc_offsets going backwards, an init that makes non-finite weights, and the nearest model
// var for a mistyped --set. Each case builds the bad file itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/hdf5.hpp"
#include "io/meta_checksum.hpp"
#include "io/shard.hpp"
#include "io/stats_check.hpp"
#include "io/tokens.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model.hpp"
#include "nn/model_file.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

using test::input_error;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class HostileMetaTest : public testing::Test {
 protected:
  void SetUp() override {
    silence_hdf5_errors();
    char tmpl[] = "/tmp/ringtrain-hostile-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // A good fp32 sgd checkpoint of one [4, 5] parameter at step 3.
  std::string save_good() {
    CheckpointStore store(path("ck"), 5);
    CheckpointMeta m;
    m.step = m.optimizer_step = 3;
    m.model = "{}";
    m.precision = "fp32";
    m.ringtrain_version = "test";
    m.optimizer = "sgd";
    m.input_mean = 0.286;
    m.input_std = 0.353;
    for (size_t i = 0; i < w_.size(); ++i) w_[i] = float(i) * 0.25f;
    store.save(MPI_COMM_NULL, m, {{"fc.weight", Tensor(w_.data(), {4, 5}, DType::f32)}}, {});
    return store.path_for(3);
  }

  // Opens `file` read-write and runs fn on it.
  template <typename F>
  void edit(const std::string& file, F fn) {
    H5Lock lock;
    H5Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_GE(f.get(), 0);
    fn(f.get());
  }

  // A uint8 dataset file of 4 samples [1, 2, 3] (what convert writes).
  std::string dataset(const std::string& name) {
    std::vector<uint8_t> img(24);
    for (size_t i = 0; i < img.size(); ++i) img[i] = uint8_t(i * 10);
    std::vector<int32_t> lab = {0, 1, 0, 1};
    write_dataset_files(path(name), img.data(), {4, 1, 2, 3}, lab.data(), 2);
    return path(name);
  }

  std::string dir_;
  std::vector<float> w_ = std::vector<float>(20);
};

TEST(StatsCheck, NormalisationMustBeFiniteAndInRange) {
  EXPECT_EQ(normalisation_problem("mean", 0.286, "std", 0.353, DType::u8), "");
  EXPECT_EQ(normalisation_problem("mean", -3e6, "std", 1e4, DType::f32), "");
  EXPECT_EQ(normalisation_problem("mean", 0, "std", 1e-12), "") << "2^-40 is about 9.1e-13";
  EXPECT_EQ(normalisation_problem("mean", kInf, "std", 1), "mean is inf; expected a finite value");
  EXPECT_EQ(normalisation_problem("mean", kNaN, "std", 1), "mean is nan; expected a finite value");
  EXPECT_EQ(normalisation_problem("mean", 0, "std", kInf),
            "std is inf; expected a finite value > 0");
  EXPECT_EQ(normalisation_problem("mean", 0, "std", -1), "std is -1; expected a finite value > 0");
  EXPECT_HAS(normalisation_problem("mean", 0, "std", 1e-300), "std is 1e-300; expected");
  EXPECT_HAS(normalisation_problem("mean", 0, "std", 1e30), "std is 1e+30; expected");
  EXPECT_HAS(normalisation_problem("mean", 1e308, "std", 1), "mean is 1e+308; expected at most");
  // uint8 samples are read as v / 255: statistics outside [0, 1] are of other data.
  EXPECT_HAS(normalisation_problem("mean", 33.3, "std", 0.3, DType::u8), "lies in [0, 1]");
  EXPECT_HAS(normalisation_problem("mean", 0.5, "std", 78.0, DType::u8), "at most 1");
  EXPECT_EQ(precision_problem("bf16"), "");
  EXPECT_EQ(precision_problem("fp8"), "precision is 'fp8'; expected fp32, fp16 or bf16");
}

TEST_F(HostileMetaTest, DatasetStatisticsAreValidatedWhenRead) {
  const struct {
    double mean, std;
    const char* want;
  } cases[] = {{kInf, 0.3, "attribute mean is inf"},
               {0.3, kInf, "attribute std is inf"},
               {0.3, 1e-300, "attribute std is 1e-300"},
               {kNaN, 0.3, "attribute mean is nan"},
               {0.3, -0.5, "attribute std is -0.5"}};
  for (const auto& c : cases) {
    const std::string file = dataset("d.h5");
    edit(file, [&](hid_t f) {
      write_attr(f, "mean", c.mean);
      write_attr(f, "std", c.std);
    });
    const std::string e = input_error([&] { Dataset d(file); });
    EXPECT_HAS(e, file);
    EXPECT_HAS(e, c.want);
  }
  // std exactly 0 (constant data) still means "no normalisation".
  const std::string file = dataset("zero.h5");
  edit(file, [&](hid_t f) { write_attr(f, "std", 0.0); });
  EXPECT_FALSE(Dataset(file).info().has_norm);
  // Per channel the same rules, naming the channel.
  const std::string ch = dataset("ch.h5");
  edit(ch, [&](hid_t f) {
    H5Ldelete(f, "std", H5P_DEFAULT);
    const double v = 1e-300;
    const hsize_t n = 1;
    H5Id sp(H5Screate_simple(1, &n, nullptr));
    H5Id ds(H5Dcreate2(f, "std", H5T_NATIVE_DOUBLE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v);
  });
  EXPECT_HAS(input_error([&] { Dataset d(ch); }), "/std[0] is 1e-300");
}

TEST_F(HostileMetaTest, CheckpointNormalisationAndPrecisionAreValidated) {
  const struct {
    const char* attr;
    double value;
    const char* want;
  } cases[] = {{"input_std", 1e-300, "input_std is 1e-300"},
               {"input_mean", 1e308, "input_mean is 1e+308"},
               {"input_std", kInf, "input_std is inf"}};
  for (const auto& c : cases) {
    const std::string file = save_good();
    edit(file, [&](hid_t f) { write_attr(f, c.attr, c.value); });
    const std::string e = input_error([&] { read_checkpoint_meta(file); });
    EXPECT_HAS(e, "holds impossible metadata");
    EXPECT_HAS(e, c.want);
  }
  const std::string file = save_good();
  edit(file, [&](hid_t f) { write_attr(f, "precision", std::string("fp8")); });
  EXPECT_HAS(input_error([&] { read_checkpoint_meta(file); }), "precision is 'fp8'");
}

TEST_F(HostileMetaTest, MetadataChecksumCatchesAFlippedBitAndEdits) {
  const std::string file = save_good();
  ASSERT_NO_THROW(read_checkpoint_meta(file));
  {
    H5Lock lock;
    H5Id f = open_file_readonly(file, "checkpoint");
    ASSERT_TRUE(read_attr_int(f, kMetaChecksumAttr).has_value()) << "a save writes it";
    EXPECT_EQ(meta_checksum_problem(f), "");
  }
  // The lowest exponent bit of input_std: 0.353 becomes 0.1765, a plausible value that only
  // the checksum can tell from the real one.
  edit(file, [&](hid_t f) {
    double v = *read_attr_double(f, "input_std");
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    bits ^= uint64_t(1) << 52;
    std::memcpy(&v, &bits, 8);
    write_attr(f, "input_std", v);
  });
  std::string e = input_error([&] { read_checkpoint_meta(file); });
  EXPECT_HAS(e, file);
  EXPECT_HAS(e, "fails its checksum");
  std::string why;
  EXPECT_FALSE(validate_checkpoint(file, &why));
  EXPECT_HAS(why, "fails its checksum");
  // A group attribute is covered too.
  const std::string other = save_good();
  edit(other, [&](hid_t f) {
    H5Id g(H5Gopen2(f, "data", H5P_DEFAULT));
    write_attr(g, "position", int64_t(7));
  });
  EXPECT_HAS(input_error([&] { read_checkpoint_meta(other); }), "fails its checksum");
  // Rewriting it after an edit (what --keep-best does to best.h5) makes the file good again,
  // and a checkpoint from before the checksum (none) still loads.
  edit(other, [&](hid_t f) { write_meta_checksum(f); });
  EXPECT_NO_THROW(read_checkpoint_meta(other));
  edit(file, [&](hid_t f) { H5Adelete(f, kMetaChecksumAttr); });
  EXPECT_NO_THROW(read_checkpoint_meta(file));
}

TEST_F(HostileMetaTest, Float64ParametersAreRefused) {
  const std::string file = save_good();
  edit(file, [&](hid_t f) {
    H5Ldelete(f, "params/fc.weight", H5P_DEFAULT);
    std::vector<double> v(20, 0.5);
    const hsize_t dims[2] = {4, 5};
    H5Id sp(H5Screate_simple(2, dims, nullptr));
    H5Id ds(H5Dcreate2(f, "params/fc.weight", H5T_NATIVE_DOUBLE, sp, H5P_DEFAULT, H5P_DEFAULT,
                       H5P_DEFAULT));
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  });
  std::vector<float> back(20);
  const std::string e = input_error([&] {
    read_checkpoint_params(file, {{"fc.weight", Tensor(back.data(), {4, 5}, DType::f32)}});
  });
  EXPECT_HAS(e, file);
  EXPECT_HAS(e, "'params/fc.weight' is stored as float64; expected fp32");
}

TEST_F(HostileMetaTest, AGroupWhereADatasetBelongsIsAnInputError) {
  const std::string file = dataset("g.h5");
  edit(file, [&](hid_t f) {
    H5Ldelete(f, "images", H5P_DEFAULT);
    H5Id g(H5Gcreate2(f, "images", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  });
  const std::string e = input_error([&] { ShardFile s(file); });
  EXPECT_HAS(e, file);
  EXPECT_HAS(e, "/images is a group; expected a dataset");
}

TEST_F(HostileMetaTest, DocOffsetsGoingBackwardsAreRefusedAtOpen) {
  std::vector<uint32_t> t(50, 7);
  const std::string file = path("t.h5");
  write_token_file(file, t.data(), 50, {0, 30, 20}, 256, "bytes", "train");
  const std::string e = input_error([&] { TokenDataset d(file); });
  EXPECT_HAS(e, file);
  EXPECT_HAS(e, "/doc_offsets must rise from 0 to 50");
  EXPECT_HAS(e, "goes back from 30 to 20 at index 2");
  write_token_file(file, t.data(), 50, {0, 20, 20, 30}, 256, "bytes", "train");
  EXPECT_NO_THROW(TokenDataset d(file)) << "an empty document is not going backwards";
}

}  // namespace
}  // namespace ringtrain::io

namespace ringtrain {
namespace {

TEST(HostileInit, NormalInitThatOverflowsFloat32IsAnInputError) {
  const std::string text =
      "node { name: \"fc\" linear { out_features: 3 }\n"
      "  init { param: \"weight\" kind: NORMAL std: 1e300 } }\n";
  ModelFile f = ModelFile::parse(text, "m.pbtxt");
  f.set_data_shape({4}, 3, "the data");
  const std::string e = io::input_error([&] { build_model(f, DType::f32); });
  EXPECT_HAS(e, "m.pbtxt:2:");
  EXPECT_HAS(e, "NORMAL needs a positive std of at most 1e+37, got 1e+300");
  // Within the bound every draw is finite; the drawn values are checked all the same.
  ModelFile g = ModelFile::parse(
      "node { name: \"fc\" linear { out_features: 3 }\n"
      "  init { param: \"weight\" kind: NORMAL std: 1e37 } }\n",
      "m.pbtxt");
  g.set_data_shape({4}, 3, "the data");
  auto be = kernels::make_cpu_backend(1);
  auto m = build_model(g, DType::f32);
  EXPECT_NO_THROW(m->init_parameters(1, *be));
}

TEST(HostileInit, MistypedModelVarGetsTheNearestName) {
  ModelFile f = ModelFile::load("resnet");
  const std::string e = io::input_error([&] { f.override_var("widht", "3", "--set widht"); });
  EXPECT_HAS(e, "--set widht: model 'resnet'");
  EXPECT_HAS(e, "has no parameter 'widht' (did you mean width?)");
}

}  // namespace
}  // namespace ringtrain
