// The validators that keep bad files from becoming hangs or silent garbage: impossible
// checkpoint values and metadata (and a save that refuses to write them), declared sizes
// checked against the file (HDF5 extents, IDX headers, a model too large for the machine),
// non-regular files, incomplete shard series, non-finite float samples, the checkpoint
// directory lock and h5py's string attributes. Each case builds the bad file itself.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/hdf5.hpp"
#include "io/idx.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class ValidationTest : public testing::Test {
 protected:
  void SetUp() override {
    silence_hdf5_errors();
    char tmpl[] = "/tmp/ringtrain-validation-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Expects an Error of `kind` whose message contains every one of `want`.
  template <typename F>
  void expect_error(ErrorKind kind, F f, std::initializer_list<std::string> want) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming '" << *want.begin() << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      for (const auto& w : want)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
            << "missing '" << w << "' in: " << e.what();
    }
  }

  CheckpointMeta meta(int64_t step) const {
    CheckpointMeta m;
    m.step = step;
    m.optimizer_step = step;
    m.model = "{}";
    m.precision = "fp32";
    m.ringtrain_version = "test";
    m.optimizer = "adamw";
    return m;
  }

  // A good adamw checkpoint of one [4, 5] parameter at `step` in store `s`; returns its path.
  std::string save_good(CheckpointStore& s, int64_t step) {
    for (size_t i = 0; i < w_.size(); ++i) w_[i] = float(i) * 0.25f, sq_[i] = float(i);
    s.save(MPI_COMM_NULL, meta(step), {{"fc.weight", Tensor(w_.data(), {4, 5}, DType::f32)}},
           {{"exp_avg", {{"fc.weight", Tensor(w_.data(), {4, 5}, DType::f32)}}},
            {"exp_avg_sq", {{"fc.weight", Tensor(sq_.data(), {4, 5}, DType::f32)}}}});
    return s.path_for(step);
  }

  std::string dir_;
  std::vector<float> w_ = std::vector<float>(20), sq_ = std::vector<float>(20);
};

// Overwrites one float of dataset `name` in an existing file (what a bit flip or a bad
// writer would leave, with valid checksums).
void poke_float(const std::string& file, const std::string& name, hsize_t index, float v) {
  H5Lock lock;
  H5Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_GE(f.get(), 0);
  H5Id ds = open_dataset(f, name);
  std::vector<float> all(size_t(shape_numel(dataset_shape(ds))));
  ASSERT_GE(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()), 0);
  all[index] = v;
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()), 0);
}

template <typename T>
void poke_attr(const std::string& file, const std::string& group, const char* name, T v) {
  H5Lock lock;
  H5Id f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_GE(f.get(), 0);
  H5Id g(H5Gopen2(f, group.c_str(), H5P_DEFAULT));
  write_attr(g, name, v);
}

TEST_F(ValidationTest, ImpossibleValuesNameTheTensorAndIndex) {
  std::vector<float> v = {0.f, 1.f, -2.f, 3.f};
  EXPECT_EQ(impossible_values("params/fc.weight", v.data(), 4), "");
  v[2] = kNaN;
  EXPECT_EQ(impossible_values("params/fc.weight", v.data(), 4),
            "/params/fc.weight holds nan at index 2");
  v[2] = -kInf;
  EXPECT_EQ(impossible_values("params/fc.weight", v.data(), 4),
            "/params/fc.weight holds -inf at index 2");
  v[2] = -2.f;  // negative is fine for a parameter, impossible for an average of squares
  EXPECT_EQ(impossible_values("optimizer/fc.weight/exp_avg_sq", v.data(), 4),
            "/optimizer/fc.weight/exp_avg_sq holds -2 at index 2; expected >= 0");
  EXPECT_EQ(impossible_values("buffers/bn.running_var", v.data(), 4),
            "/buffers/bn.running_var holds -2 at index 2; expected >= 0");
  // -0 is not below 0; the smallest negative subnormal is; the first bad index is named
  // whichever kind of bad value comes first.
  std::vector<float> sq = {0.f, -0.f, 1.f, 2.f};
  EXPECT_EQ(impossible_values("optimizer/fc.weight/exp_avg_sq", sq.data(), 4), "");
  sq[3] = -std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(impossible_values("optimizer/fc.weight/exp_avg_sq", sq.data(), 4),
            "/optimizer/fc.weight/exp_avg_sq holds -1.4013e-45 at index 3; expected >= 0");
  sq[2] = kNaN;
  EXPECT_EQ(impossible_values("optimizer/fc.weight/exp_avg_sq", sq.data(), 4),
            "/optimizer/fc.weight/exp_avg_sq holds nan at index 2");
  // The last element of a length that is not a multiple of any vector width.
  std::vector<float> odd(37, 1.f);
  odd[36] = kInf;
  EXPECT_EQ(impossible_values("params/x", odd.data(), 37), "/params/x holds inf at index 36");
}

TEST_F(ValidationTest, ImpossibleMetadataIsNamed) {
  EXPECT_EQ(impossible_meta(meta(5)), "");
  auto m = meta(5);
  m.step = -1;
  EXPECT_EQ(impossible_meta(m), "step is -1; expected >= 0");
  m = meta(5);
  m.optimizer_step = -3;
  EXPECT_EQ(impossible_meta(m), "/optimizer step is -3; expected >= 0");
  m = meta(5);
  m.optimizer_step = 6;
  EXPECT_EQ(impossible_meta(m), "/optimizer step 6 is beyond the training step 5");
  for (double bad : {0.0, -1.0, double(kNaN), double(kInf)}) {
    m = meta(5);
    m.input_std = bad;
    EXPECT_NE(impossible_meta(m).find("input_std is"), std::string::npos) << bad;
    m = meta(5);
    m.loss_scale = bad;
    EXPECT_NE(impossible_meta(m).find("/loss_scaler scale is"), std::string::npos) << bad;
  }
  m = meta(5);
  m.world_size = 0;
  EXPECT_EQ(impossible_meta(m), "world_size is 0; expected >= 1");
  // The training recipe's attributes: accumulation, per-channel normalisation, best value.
  m = meta(5);
  m.grad_accum = 4;  // one optimizer step per training step with accumulation too
  m.input_channel_mean = {0.5, 0.4, 0.3};
  m.input_channel_std = {0.2, 0.2, 0.2};
  m.best_step = 4;
  m.best_value = 0.9;
  m.evals_since_best = 1;
  EXPECT_EQ(impossible_meta(m), "");
  auto bad = m;
  bad.grad_accum = 0;
  EXPECT_EQ(impossible_meta(bad), "grad_accum is 0; expected >= 1");
  bad = m;
  bad.input_channel_mean[1] = kNaN;
  EXPECT_EQ(impossible_meta(bad), "input_channel_mean[1] is nan; expected a finite value");
  bad = m;
  bad.input_channel_std[2] = 0;
  EXPECT_EQ(impossible_meta(bad), "input_channel_std[2] is 0; expected a finite value > 0");
  bad = m;
  bad.best_step = 6;
  EXPECT_EQ(impossible_meta(bad), "best_step is 6; expected -1 (none) or 0 to the step 5");
  bad = m;
  bad.best_value = kInf;
  EXPECT_EQ(impossible_meta(bad), "best_value is inf; expected a finite value");
  bad.best_step = -1;  // no evaluation yet: the value is not used
  EXPECT_EQ(impossible_meta(bad), "");
  bad = m;
  bad.evals_since_best = -1;
  EXPECT_EQ(impossible_meta(bad), "evals_since_best is -1; expected >= 0");
}

TEST_F(ValidationTest, SaveRefusesNonFiniteValuesAndCreatesNoFile) {
  CheckpointStore store(path("ck"), 2);
  std::vector<float> w(20, 1.f), sq(20, 1.f);
  w[7] = kNaN;
  expect_error(ErrorKind::runtime,
               [&] {
                 store.save(
                     MPI_COMM_NULL, meta(3), {{"fc.weight", Tensor(w.data(), {4, 5}, DType::f32)}},
                     {{"exp_avg_sq", {{"fc.weight", Tensor(sq.data(), {4, 5}, DType::f32)}}}});
               },
               {"step 3", "/params/fc.weight holds nan at index 7"});
  w[7] = 1.f;
  sq[19] = kInf;
  expect_error(ErrorKind::runtime,
               [&] {
                 store.save(
                     MPI_COMM_NULL, meta(3), {{"fc.weight", Tensor(w.data(), {4, 5}, DType::f32)}},
                     {{"exp_avg_sq", {{"fc.weight", Tensor(sq.data(), {4, 5}, DType::f32)}}}});
               },
               {"/optimizer/fc.weight/exp_avg_sq holds inf at index 19"});
  EXPECT_TRUE(fs::is_empty(path("ck"))) << "a refused save must not leave a file";
}

TEST_F(ValidationTest, CheckpointWithImpossibleValuesIsInvalidEverywhere) {
  CheckpointStore store(path("ck"), 5);
  const std::string older = save_good(store, 2), newer = save_good(store, 4);
  std::string why;
  ASSERT_TRUE(validate_checkpoint(newer, &why)) << why;

  poke_float(newer, "params/fc.weight", 13, kNaN);
  EXPECT_FALSE(validate_checkpoint(newer, &why));
  EXPECT_NE(why.find("params/fc.weight holds nan at index 13"), std::string::npos) << why;
  std::vector<float> back(20);
  expect_error(
      ErrorKind::input,
      [&] {
        read_checkpoint_params(newer, {{"fc.weight", Tensor(back.data(), {4, 5}, DType::f32)}});
      },
      {newer, "/params/fc.weight holds nan at index 13"});
  // Resume skips it for the older good one.
  std::vector<std::pair<std::string, std::string>> skipped;
  EXPECT_EQ(store.latest_valid(&skipped), older);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].first, newer);

  poke_float(older, "optimizer/fc.weight/exp_avg_sq", 0, -0.5f);
  EXPECT_FALSE(validate_checkpoint(older, &why));
  EXPECT_NE(why.find("exp_avg_sq holds -0.5 at index 0"), std::string::npos) << why;
  expect_error(ErrorKind::input,
               [&] {
                 read_checkpoint_optimizer(
                     older,
                     {{"exp_avg_sq", {{"fc.weight", Tensor(back.data(), {4, 5}, DType::f32)}}}});
               },
               {older, "exp_avg_sq holds -0.5"});
  EXPECT_FALSE(store.latest_valid(nullptr).has_value());
}

TEST_F(ValidationTest, CheckpointWithImpossibleMetadataIsInvalid) {
  CheckpointStore store(path("ck"), 5);
  struct Case {
    const char* group;
    const char* attr;
    double value;
    bool integer;
    const char* want;
  } cases[] = {{"/", "step", -5, true, "step is -5"},
               {"optimizer", "step", -1, true, "/optimizer step is -1"},
               {"/", "input_std", 0, false, "input_std is 0"},
               {"/", "input_std", double(kNaN), false, "input_std is nan"},
               {"loss_scaler", "scale", double(kInf), false, "/loss_scaler scale is inf"}};
  int64_t step = 10;
  for (const auto& c : cases) {
    const std::string file = save_good(store, step++);
    if (c.integer)
      poke_attr(file, c.group, c.attr, int64_t(c.value));
    else
      poke_attr(file, c.group, c.attr, c.value);
    std::string why;
    EXPECT_FALSE(validate_checkpoint(file, &why)) << c.want;
    EXPECT_NE(why.find(c.want), std::string::npos) << why;
    expect_error(ErrorKind::input, [&] { read_checkpoint_meta(file); }, {file, c.want});
  }
}

TEST_F(ValidationTest, CheckpointDirectoryLockNamesTheHolder) {
  CheckpointStore first(path("ck"), 2);
  EXPECT_EQ(first.lock(), "");
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::ifstream in(path("ck/.lock"));
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, std::string(host) + " " + std::to_string(getpid()));
  // A second store is another open file description: flock conflicts as with another job.
  CheckpointStore second(path("ck"), 2);
  expect_error(ErrorKind::input, [&] { second.lock(); },
               {"is in use by another ringtrain job", std::string("host ") + host,
                "pid " + std::to_string(getpid())});
}

TEST_F(ValidationTest, PruneRemovesStaleTmpOnlyUnderTheLock) {
  {
    CheckpointStore unlocked(path("ck"), 2);
    std::ofstream(path("ck/ckpt-000000001.h5.tmp")) << "another job's save in progress";
    save_good(unlocked, 2);
    EXPECT_TRUE(fs::exists(path("ck/ckpt-000000001.h5.tmp"))) << "pruned without the lock";
  }
  CheckpointStore locked(path("ck"), 2);
  ASSERT_EQ(locked.lock(), "");
  save_good(locked, 3);
  EXPECT_FALSE(fs::exists(path("ck/ckpt-000000001.h5.tmp"))) << "stale .tmp kept under the lock";
}

TEST_F(ValidationTest, NonRegularFilesAreRefusedBeforeOpening) {
  ASSERT_EQ(mkfifo(path("fifo.h5").c_str(), 0600), 0);
  // Opening a FIFO for reading would block forever: the check must come first.
  expect_error(ErrorKind::input, [&] { open_file_readonly(path("fifo.h5"), "dataset"); },
               {path("fifo.h5"), "is not a regular file"});
  expect_error(ErrorKind::input, [&] { Dataset d(path("fifo.h5")); }, {"is not a regular file"});
  expect_error(ErrorKind::input, [&] { read_idx(path("fifo.h5")); }, {"is not a regular file"});
}

TEST_F(ValidationTest, IncompleteShardSeriesIsAnErrorNamingTheMissingFiles) {
  std::vector<uint8_t> img(6 * 6, 7);
  std::vector<int32_t> lab = {0, 1, 0, 1, 0, 1};
  fs::create_directory(path("shards"));
  const auto files =
      write_dataset_files(path("shards/train.h5"), img.data(), {6, 1, 2, 3}, lab.data(), 2, 3);
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(Dataset(path("shards")).info().num_samples, 6);
  fs::remove(files[1]);
  const std::string missing = path("shards/train-00001-of-00003.h5");
  expect_error(ErrorKind::input, [&] { Dataset d(path("shards")); },
               {"series of 3 shards", "1 of them is missing", missing});
  expect_error(ErrorKind::input, [&] { Dataset d(path("shards/train-*.h5")); }, {missing});
  // A ?/[...] pattern picks shards on purpose.
  EXPECT_EQ(Dataset(path("shards/train-0000[02]-of-00003.h5")).info().num_samples, 4);
}

TEST_F(ValidationTest, ConverterRenamesEveryTmpFileWhenDone) {
  std::vector<uint8_t> img(4 * 6, 1);
  std::vector<int32_t> lab = {0, 1, 0, 1};
  write_dataset_files(path("ok.h5"), img.data(), {4, 6}, lab.data(), 2, 2);
  EXPECT_TRUE(fs::exists(path("ok-00000-of-00002.h5")));
  EXPECT_TRUE(fs::exists(path("ok-00001-of-00002.h5")));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
}

// IDX files with a header and no data (or less than declared).
std::string write_idx(const std::string& p, std::vector<uint32_t> dims, size_t data_bytes) {
  std::ofstream f(p, std::ios::binary);
  const unsigned char magic[4] = {0, 0, 8, uint8_t(dims.size())};
  f.write(reinterpret_cast<const char*>(magic), 4);
  for (uint32_t d : dims) {
    const unsigned char b[4] = {uint8_t(d >> 24), uint8_t(d >> 16), uint8_t(d >> 8), uint8_t(d)};
    f.write(reinterpret_cast<const char*>(b), 4);
  }
  f << std::string(data_bytes, '\1');
  return p;
}

TEST_F(ValidationTest, IdxHeadersAreCheckedAgainstTheFile) {
  const auto huge = write_idx(path("huge.idx"), {0xffffffffu, 0xffffffffu, 0xffffffffu}, 16);
  expect_error(ErrorKind::input, [&] { read_idx(huge); }, {huge, "overflows 64 bits"});
  const auto big = write_idx(path("big.idx"), {60000, 28, 28}, 100);
  expect_error(ErrorKind::input, [&] { read_idx(big); },
               {big, "47040000 bytes", "holds only 100 bytes"});
  const auto labels = write_idx(path("labels.idx"), {60000}, 60000);
  expect_error(ErrorKind::input, [&] { convert_idx(big, labels, path("out.h5")); }, {big});
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find("out"), std::string::npos) << "left " << e.path();
  const auto ok = write_idx(path("ok.idx"), {3, 2}, 6);
  EXPECT_EQ(read_idx(ok).data.size(), 6u);
}

// A dataset file written with the HDF5 C API: images of `shape` (chunked by `chunk_rows`,
// values written only if `values` is given), labels 0/1.
void write_raw_dataset(const std::string& p, const std::vector<hsize_t>& shape, hsize_t chunk_rows,
                       const float* values) {
  H5Lock lock;
  H5Id f = create_file(p);
  write_attr(f, "format", std::string(kDatasetFormat));
  write_attr(f, "format_version", kDatasetVersion);
  write_attr(f, "num_classes", int64_t(2));
  auto make = [&](const char* name, const std::vector<hsize_t>& dims, hid_t type) {
    H5Id space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min(chunk_rows, dims[0]);
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
    return H5Id(H5Dcreate2(f, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  };
  H5Id images = make("images", shape, H5T_NATIVE_FLOAT);
  H5Id labels = make("labels", {shape[0]}, H5T_NATIVE_INT32);
  if (!values) return;
  hsize_t n = 1;
  for (hsize_t d : shape) n *= d;
  H5Dwrite(images, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
  std::vector<int32_t> y(shape[0]);
  for (size_t i = 0; i < y.size(); ++i) y[i] = int32_t(i % 2);
  H5Dwrite(labels, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data());
}

TEST_F(ValidationTest, DeclaredExtentBeyondTheStoredDataIsAnInputError) {
  const std::string p = path("huge.h5");
  write_raw_dataset(p, {1000000000000ull, 4}, 1000, nullptr);
  EXPECT_LT(fs::file_size(p), 100000u);
  expect_error(ErrorKind::input, [&] { Dataset d(p); },
               {p, "/images declares 1000000000000 samples", "the file stores 0 bytes"});
}

TEST_F(ValidationTest, NonFiniteFloatSampleIsAnInputErrorNamingFileAndIndex) {
  std::vector<float> v(10 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  fs::create_directory(path("f"));
  const std::string a = path("f/x-00000-of-00002.h5"), b = path("f/x-00001-of-00002.h5");
  write_raw_dataset(a, {5, 3}, 2, v.data());
  v[15 + 7] = kNaN;  // second file, its row 2 = global sample 7, element 1
  write_raw_dataset(b, {5, 3}, 2, v.data() + 15);
  Dataset d(path("f"));
  std::vector<float> x(2 * 3);
  std::vector<int32_t> y(2);
  const int64_t fine[2] = {6, 3};
  d.read(fine, 2, x.data(), y.data(), Normalization{{0.0}, {1.0}});
  EXPECT_EQ(x[0], 18.f);
  const int64_t bad[2] = {3, 7};
  expect_error(ErrorKind::input,
               [&] {
                 d.read(bad, 2, x.data(), y.data(), Normalization{{0.0}, {1.0}});
               },
               {b, "sample 7 (row 2 of this file) holds nan at element 1"});
}

TEST_F(ValidationTest, ModelThatCannotFitInMemoryIsAnInputErrorNamingTheOption) {
  expect_error(ErrorKind::input,
               [&] {
                 build_model("mlp", {784}, 10, {{"hidden", "100000,100000"}}, DType::f32);
               },
               {"model 'mlp' with --hidden 100000,100000 on samples of shape [784] needs at least",
                "bytes of memory"});
  EXPECT_EQ(build_model("mlp", {784}, 10, {{"hidden", "32"}}, DType::f32)->num_params(),
            784 * 32 + 32 + 32 * 10 + 10);
}

TEST_F(ValidationTest, StringAttributesAsH5pyWritesThem) {
  const std::string p = path("attrs.h5");
  {
    H5Lock lock;
    H5Id f = create_file(p);
    // h5py's default for a str: variable-length UTF-8.
    H5Id vlen(H5Tcopy(H5T_C_S1));
    H5Tset_size(vlen, H5T_VARIABLE);
    H5Tset_cset(vlen, H5T_CSET_UTF8);
    H5Id scalar(H5Screate(H5S_SCALAR));
    H5Id a(H5Acreate2(f, "format", vlen, scalar, H5P_DEFAULT, H5P_DEFAULT));
    const char* s = "ringtrain-dataset";
    ASSERT_GE(H5Awrite(a, vlen, &s), 0);
    // Fixed-length ASCII (numpy bytes).
    H5Id fixed(H5Tcopy(H5T_C_S1));
    H5Tset_size(fixed, 5);
    H5Id b(H5Acreate2(f, "ascii", fixed, scalar, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Awrite(b, fixed, "hello"), 0);
    // Three integers where one is expected.
    const hsize_t three = 3;
    H5Id space3(H5Screate_simple(1, &three, nullptr));
    H5Id c(H5Acreate2(f, "num_classes", H5T_NATIVE_INT64, space3, H5P_DEFAULT, H5P_DEFAULT));
    const int64_t v[3] = {10, 11, 12};
    ASSERT_GE(H5Awrite(c, H5T_NATIVE_INT64, v), 0);
  }
  H5Lock lock;
  H5Id f = open_file_readonly(p, "file");
  EXPECT_EQ(read_attr_string(f, "format"), "ringtrain-dataset");
  EXPECT_EQ(read_attr_string(f, "ascii"), "hello");
  expect_error(ErrorKind::input, [&] { read_attr_int(f, "num_classes"); },
               {p, "attribute 'num_classes' holds 3 values; expected one integer"});
}

}  // namespace
}  // namespace ringtrain::io
