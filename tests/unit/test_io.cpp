// io without MPI: dataset validation (every wrong schema is an input error naming the
// file), batched hyperslab reads against the values written, the epoch permutation, the
// IDX reader, and the checkpoint store (atomic names, keep, corruption detected and skipped).
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/rng.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/hdf5.hpp"
#include "io/idx.hpp"
#include "io/loader.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

class IoTest : public testing::Test {
 protected:
  void SetUp() override {
    silence_hdf5_errors();
    char tmpl[] = "/tmp/ringtrain-io-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // n samples [1, 2, 3]: pixel k of sample i = (i * 7 + k) % 256, label i % 5.
  std::string make_dataset(int64_t n) {
    std::vector<uint8_t> img(static_cast<size_t>(n * 6));
    std::vector<int32_t> lab(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      lab[size_t(i)] = int32_t(i % 5);
      for (int k = 0; k < 6; ++k) img[size_t(i * 6 + k)] = uint8_t((i * 7 + k) % 256);
    }
    const std::string p = path("data.h5");
    write_dataset_files(p, img.data(), {n, 1, 2, 3}, lab.data(), 5);
    return p;
  }

  // Expects an input error whose message contains `want`.
  template <typename F>
  void expect_input_error(F f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming '" << want << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }

  std::string dir_;
};

TEST_F(IoTest, DatasetReadsExactlyTheRequestedSamplesInOrder) {
  const std::string p = make_dataset(1000);
  Dataset d(p);
  EXPECT_EQ(d.info().num_samples, 1000);
  EXPECT_EQ(d.info().sample_shape, (Shape{1, 2, 3}));
  EXPECT_EQ(d.info().num_classes, 5);
  ASSERT_TRUE(d.info().has_norm);
  // Unsorted, with a run, a repeat and both ends.
  const std::vector<int64_t> idx = {999, 3, 4, 5, 0, 500, 3, 998};
  std::vector<float> x(idx.size() * 6);
  std::vector<int32_t> y(idx.size());
  d.read(idx.data(), int64_t(idx.size()), x.data(), y.data(), Normalization{{0.0}, {1.0}});
  for (size_t j = 0; j < idx.size(); ++j) {
    EXPECT_EQ(y[j], idx[j] % 5) << "at position " << j;
    for (int k = 0; k < 6; ++k)
      ASSERT_FLOAT_EQ(x[j * 6 + k], float((idx[j] * 7 + k) % 256) / 255.f) << "sample " << idx[j];
  }
  // Normalisation: (v - mean) / std.
  d.read(idx.data(), 1, x.data(), y.data(), Normalization{{0.5}, {2.0}});
  EXPECT_FLOAT_EQ(x[0], (float((999 * 7) % 256) / 255.f - 0.5f) / 2.f);
}

TEST_F(IoTest, WrongSchemasAreInputErrorsNamingTheFile) {
  expect_input_error([&] { Dataset d(path("none.h5")); }, "does not exist");
  { std::ofstream(path("text.h5")) << "hello"; }
  expect_input_error([&] { Dataset d(path("text.h5")); }, "is not an HDF5 file");
  auto make = [&](const std::string& name, auto&& body) {
    H5Id f = create_file(path(name));
    body(f);
    return path(name);
  };
  uint8_t img[12] = {0};
  int32_t lab[2] = {0, 1};
  auto ok_attrs = [](hid_t f) {
    write_attr(f, "format", std::string(kDatasetFormat));
    write_attr(f, "format_version", kDatasetVersion);
    write_attr(f, "num_classes", int64_t(2));
  };
  const Tensor images(img, {2, 6}, DType::u8), labels(lab, {2}, DType::i32);
  const Tensor short_labels(lab, {1}, DType::i32), float_labels(img, {2}, DType::f32);
  expect_input_error(
      [&] { Dataset d(make("noformat.h5", [&](hid_t f) { write_dataset(f, "images", images); })); },
      "attribute 'format' is missing");
  expect_input_error(
      [&] {
        Dataset d(make("v2.h5", [&](hid_t f) {
          ok_attrs(f);
          write_attr(f, "format_version", int64_t(2));
        }));
      },
      "format_version 2");
  expect_input_error(
      [&] {
        Dataset d(make("nolabels.h5", [&](hid_t f) {
          ok_attrs(f);
          write_dataset(f, "images", images);
        }));
      },
      "/labels");
  expect_input_error(
      [&] {
        Dataset d(make("short.h5", [&](hid_t f) {
          ok_attrs(f);
          write_dataset(f, "images", images);
          write_dataset(f, "labels", short_labels);
        }));
      },
      "/labels has shape [1]; expected [2]");
  expect_input_error(
      [&] {
        Dataset d(make("floatlabels.h5", [&](hid_t f) {
          ok_attrs(f);
          write_dataset(f, "images", images);
          write_dataset(f, "labels", float_labels);
        }));
      },
      "/labels must be int32 or int64");
  expect_input_error(
      [&] {
        Dataset d(make("3d.h5", [&](hid_t f) {
          ok_attrs(f);
          write_dataset(f, "images", Tensor(img, {2, 2, 3}, DType::u8));
          write_dataset(f, "labels", labels);
        }));
      },
      "expected [N, C, H, W] or [N, D]");
  // A label outside [0, num_classes) is reported when read.
  const std::string bad = make("badlabel.h5", [&](hid_t f) {
    ok_attrs(f);
    write_dataset(f, "images", images);
    int32_t big[2] = {0, 7};
    write_dataset(f, "labels", Tensor(big, {2}, DType::i32));
  });
  Dataset d(bad);
  float x[12];
  int32_t y[2];
  const int64_t idx[2] = {0, 1};
  expect_input_error([&] { d.read(idx, 2, x, y, Normalization{}); }, "label 7 of sample 1");
}

TEST_F(IoTest, EpochPermutationIsAPermutationThatDependsOnSeedAndEpoch) {
  auto p = epoch_permutation(1, 0, 1000);
  std::set<int64_t> seen(p.begin(), p.end());
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 999);
  EXPECT_EQ(p, epoch_permutation(1, 0, 1000)) << "deterministic";
  EXPECT_NE(p, epoch_permutation(1, 1, 1000)) << "differs by epoch";
  EXPECT_NE(p, epoch_permutation(2, 0, 1000)) << "differs by seed";
}

TEST_F(IoTest, RanksTakeContiguousSlicesOfTheSameGlobalBatch) {
  const std::string p = make_dataset(100);
  Dataset d(p);
  Loader one(d, 3, 20, 0, 1, Normalization{});
  std::vector<int32_t> global;
  for (int s = 0; s < 6; ++s) {  // crosses the epoch end (5 batches of 20 per epoch)
    const Batch& b = one.next();
    global.insert(global.end(), b.y.as<int32_t>(), b.y.as<int32_t>() + 20);
  }
  for (int world : {2, 4}) {
    std::vector<int32_t> stitched;
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back(std::make_unique<Loader>(d, 3, 20, r, world, Normalization{}));
    for (int s = 0; s < 6; ++s)
      for (int r = 0; r < world; ++r) {
        const Batch& b = ranks[size_t(r)]->next();
        stitched.insert(stitched.end(), b.y.as<int32_t>(), b.y.as<int32_t>() + 20 / world);
      }
    EXPECT_EQ(stitched, global) << world << " ranks see another sample order";
  }
  expect_input_error([&] { Loader l(d, 3, 21, 0, 2, Normalization{}); },
                     "does not divide by 2 ranks");
  expect_input_error([&] { Loader l(d, 3, 200, 0, 1, Normalization{}); }, "larger than dataset");
}

TEST_F(IoTest, ShardsDirectoryGlobAndFileReadTheSameSamples) {
  const int64_t n = 1003;  // not divisible by the shard count
  std::vector<uint8_t> img(static_cast<size_t>(n * 6));
  std::vector<int32_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    lab[size_t(i)] = int32_t(i % 5);
    for (int k = 0; k < 6; ++k) img[size_t(i * 6 + k)] = uint8_t((i * 7 + k) % 256);
  }
  const auto one = write_dataset_files(path("one.h5"), img.data(), {n, 1, 2, 3}, lab.data(), 5);
  fs::create_directories(path("sh"));
  const auto files =
      write_dataset_files(path("sh/part.h5"), img.data(), {n, 1, 2, 3}, lab.data(), 5, 4);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(fs::path(files[0]).filename(), "part-00000-of-00004.h5");
  EXPECT_EQ(fs::path(files[3]).filename(), "part-00003-of-00004.h5");
  Dataset whole(one[0]), dir(path("sh")), glob(path("sh/part-*-of-00004.h5"));
  EXPECT_EQ(dir.info().num_shards, 4);
  EXPECT_EQ(glob.info().num_samples, n);
  EXPECT_DOUBLE_EQ(dir.info().mean, whole.info().mean) << "one mean for all shards";
  // Indices crossing every shard boundary, unsorted, with repeats.
  const std::vector<int64_t> idx = {1002, 0, 250, 251, 249, 500, 501, 752, 751, 0, 1001};
  auto read_all = [&](Dataset& d) {
    std::vector<float> x(idx.size() * 6);
    std::vector<int32_t> y(idx.size());
    d.read(idx.data(), int64_t(idx.size()), x.data(), y.data(), Normalization{{0.1}, {0.5}});
    return std::make_pair(x, y);
  };
  const auto ref = read_all(whole);
  EXPECT_EQ(read_all(dir), ref);
  EXPECT_EQ(read_all(glob), ref);
  dir.enable_cache();
  EXPECT_EQ(read_all(dir), ref) << "first read, filling the cache";
  EXPECT_EQ(dir.cached_samples(), 10) << "the distinct indices";
  EXPECT_EQ(read_all(dir), ref) << "from the cache";
  EXPECT_EQ(dir.cached_samples(), 10) << "cached samples are not read again";
  // The hyperslab path (filtered data, or RINGTRAIN_DIRECT_READ=0) reads the same values.
  setenv("RINGTRAIN_DIRECT_READ", "0", 1);
  Dataset slow(path("sh"));
  unsetenv("RINGTRAIN_DIRECT_READ");
  EXPECT_EQ(read_all(slow), ref);
  expect_input_error([&] { Dataset d(path("sh/nothing-*.h5")); }, "matches no file");
  fs::create_directories(path("empty"));
  expect_input_error([&] { Dataset d(path("empty")); }, "holds no .h5 files");
  // A shard of another schema.
  std::vector<uint8_t> other(24);
  write_dataset_files(path("sh/zzz.h5"), other.data(), {2, 12}, lab.data(), 5);
  expect_input_error([&] { Dataset d(path("sh")); }, "must share one schema");
}

TEST_F(IoTest, PrefetchingLoaderHandsOutTheSameBatchesAndPositions) {
  const std::string p = make_dataset(100);
  Dataset d(p), d2(p);  // one Dataset per loader: reads of one Dataset are not concurrent
  Loader sync(d, 9, 20, 1, 2, Normalization{}, 0);
  Loader ahead(d2, 9, 20, 1, 2, Normalization{}, 3);
  sync.seek(1, 40);
  ahead.seek(1, 40);
  for (int s = 0; s < 12; ++s) {  // crosses two epoch ends
    const Batch& a = sync.next();
    const Batch& b = ahead.next();
    ASSERT_EQ(a.epoch, b.epoch) << "step " << s;
    ASSERT_EQ(a.position, b.position) << "step " << s;
    ASSERT_EQ(sync.epoch(), ahead.epoch());
    ASSERT_EQ(sync.position(), ahead.position());
    for (int i = 0; i < 10; ++i) {
      ASSERT_EQ(a.y.as<int32_t>()[i], b.y.as<int32_t>()[i]) << "step " << s << " sample " << i;
      ASSERT_EQ(a.x.as<float>()[i * 6 + 5], b.x.as<float>()[i * 6 + 5]);
    }
  }
  EXPECT_EQ(sync.epoch(), 3);
  EXPECT_EQ(sync.position(), 80) << "(1,40): 3 batches, 5 in epoch 2, 4 in epoch 3";
}

TEST_F(IoTest, IdxReaderAndConverter) {
  auto write_gz = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    gzFile f = gzopen(path(name).c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
    return path(name);
  };
  std::vector<uint8_t> images = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2};
  for (int i = 0; i < 12; ++i) images.push_back(uint8_t(i * 20));
  const std::string im = write_gz("im.gz", images);
  const std::string lb = write_gz("lb.gz", {0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 1});
  IdxArray a = read_idx(im);
  EXPECT_EQ(a.shape, (Shape{3, 2, 2}));
  EXPECT_EQ(a.data[11], 220);
  auto r = convert_idx(im, lb, path("out.h5"));
  EXPECT_EQ(r.samples, 3);
  EXPECT_EQ(r.num_classes, 3);
  Dataset d(path("out.h5"));
  EXPECT_EQ(d.info().sample_shape, (Shape{1, 2, 2}));
  const std::string wrong = write_gz("lb2.gz", {0, 0, 8, 1, 0, 0, 0, 2, 0, 1});
  expect_input_error([&] { convert_idx(im, wrong, path("x.h5")); }, "holds 2 labels");
  const std::string trunc = write_gz("t.gz", {0, 0, 8, 3, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0, 0, 2, 1});
  expect_input_error([&] { read_idx(trunc); }, "truncated");
  expect_input_error(
      [&] {
        read_idx(write_gz("i32.gz", {0, 0, 0x0c, 1, 0, 0, 0, 1, 1, 2, 3, 4}));
      },
      "only unsigned bytes");
}

TEST_F(IoTest, CheckpointStoreKeepsTheNewestAndSkipsCorruptFiles) {
  std::vector<float> w(4000), m(4000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f;
  CheckpointStore store(path("ck"), 2);
  CheckpointMeta meta;
  meta.model = "{}";
  meta.precision = "fp32";
  meta.ringtrain_version = "test";
  meta.optimizer = "sgd";
  for (int64_t step : {10, 20, 30}) {
    meta.step = step;
    w[0] = float(step);
    store.save(MPI_COMM_NULL, meta, {{"fc.weight", Tensor(w.data(), {40, 100}, DType::f32)}},
               {{"momentum", {{"fc.weight", Tensor(m.data(), {40, 100}, DType::f32)}}}});
  }
  const auto files = store.list();
  ASSERT_EQ(files.size(), 2u) << "--keep 2";
  EXPECT_EQ(fs::path(files[0]).filename(), "ckpt-000000020.h5");
  EXPECT_EQ(fs::path(files[1]).filename(), "ckpt-000000030.h5");
  EXPECT_EQ(read_checkpoint_meta(files[1]).step, 30);
  std::vector<float> back(4000);
  read_checkpoint_params(files[1], {{"fc.weight", Tensor(back.data(), {40, 100}, DType::f32)}});
  EXPECT_EQ(back[0], 30.f);
  EXPECT_EQ(back[3999], w[3999]);
  expect_input_error(
      [&] {
        read_checkpoint_params(files[1],
                               {{"fc.weight", Tensor(back.data(), {100, 40}, DType::f32)}});
      },
      "has shape [40, 100]; expected [100, 40]");

  // Flip bytes inside the newest file's parameter data: Fletcher32 catches it and the
  // store falls back to the previous checkpoint.
  {
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> all((std::istreambuf_iterator<char>(f)), {});
    // The data of fc.weight is the run of w's bytes; find w[100]'s bytes and corrupt them.
    const float probe[4] = {w[100], w[101], w[102], w[103]};
    auto it = std::search(all.begin(), all.end(), reinterpret_cast<const char*>(probe),
                          reinterpret_cast<const char*>(probe) + 16);
    ASSERT_NE(it, all.end());
    f.seekp(it - all.begin());
    const char junk[4] = {1, 2, 3, 4};
    f.write(junk, 4);
  }
  std::string why;
  EXPECT_FALSE(validate_checkpoint(files[1], &why));
  EXPECT_NE(why.find("fc.weight"), std::string::npos) << why;
  std::vector<std::pair<std::string, std::string>> skipped;
  auto latest = store.latest_valid(&skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, files[0]);
  EXPECT_EQ(skipped.size(), 1u);
  // A truncated file is no checkpoint either.
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);
  EXPECT_FALSE(store.latest_valid(nullptr).has_value());
  expect_input_error([&] { CheckpointStore s(path("ck"), 0); }, "--keep 0");
}

// The checkpoint writer stores whole chunks itself (pwritev of the data and its Fletcher32):
// every chunk's stored bytes, read raw, equal those HDF5's filter pipeline writes for the
// same tensors (RINGTRAIN_CHECKPOINT_DIRECT=0), a short last chunk and a 1-row dataset
// included, and the values read back through HDF5 (which verifies each checksum).
TEST_F(IoTest, DirectChunkWritesStoreTheBytesOfHdf5sFilter) {
  std::vector<float> a(3000 * 700), b(5), m(3000 * 700);
  uint64_t s = 3;
  for (auto* v : {&a, &b, &m})
    for (auto& x : *v) x = float(int64_t(splitmix64(s) % 20001) - 10000) / 997.f;
  CheckpointMeta meta;
  meta.model = "{}";
  meta.precision = "fp32";
  meta.ringtrain_version = "test";
  meta.optimizer = "sgd";
  meta.step = 1;
  const std::vector<NamedTensor> params = {{"a", Tensor(a.data(), {3000, 700}, DType::f32)},
                                           {"b", Tensor(b.data(), {5}, DType::f32)}};
  const std::vector<OptimizerState> opt = {
      {"momentum", {{"a", Tensor(m.data(), {3000, 700}, DType::f32)}}}};
  std::string files[2];
  int64_t direct[2];
  for (int pipeline : {0, 1}) {
    if (pipeline)
      setenv("RINGTRAIN_CHECKPOINT_DIRECT", "0", 1);
    else
      unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
    CheckpointStore store(path(pipeline ? "pipeline" : "direct"), 1);
    store.save(MPI_COMM_NULL, meta, params, opt);
    files[pipeline] = store.list().back();
    direct[pipeline] = store.last_direct_chunks();
  }
  unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
  // a: 8.4 MB in 9 chunks of 334 rows (the last holds 328), b: 1 chunk, momentum: 9.
  EXPECT_EQ(direct[0], 19);
  EXPECT_EQ(direct[1], 0);
  int64_t compared = 0;
  for (const char* name : {"params/a", "params/b", "optimizer/a/momentum"}) {
    H5Id f0 = open_file_readonly(files[0], "checkpoint");
    H5Id f1 = open_file_readonly(files[1], "checkpoint");
    H5Id d0(H5Dopen2(f0, name, H5P_DEFAULT)), d1(H5Dopen2(f1, name, H5P_DEFAULT));
    ASSERT_GE(d0.get(), 0) << name;
    ASSERT_GE(d1.get(), 0) << name;
    H5Id sp(H5Dget_space(d0));
    hsize_t n0 = 0, n1 = 0;
    ASSERT_GE(H5Dget_num_chunks(d0, sp, &n0), 0);
    ASSERT_GE(H5Dget_num_chunks(d1, sp, &n1), 0);
    ASSERT_EQ(n0, n1) << name;
    for (hsize_t i = 0; i < n0; ++i) {
      hsize_t off[2] = {0, 0}, size0 = 0, size1 = 0;
      unsigned mask0 = 1, mask1 = 1;
      haddr_t addr = 0;
      ASSERT_GE(H5Dget_chunk_info(d0, sp, i, off, &mask0, &addr, &size0), 0);
      ASSERT_GE(H5Dget_chunk_storage_size(d1, off, &size1), 0);
      ASSERT_EQ(size0, size1) << name << " chunk " << i;
      std::vector<char> raw0(size0), raw1(size1);
      ASSERT_GE(H5Dread_chunk(d0, H5P_DEFAULT, off, &mask0, raw0.data()), 0);
      ASSERT_GE(H5Dread_chunk(d1, H5P_DEFAULT, off, &mask1, raw1.data()), 0);
      EXPECT_EQ(mask0, mask1);
      EXPECT_TRUE(raw0 == raw1) << name << " chunk " << i << " differs";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 19);
  std::vector<float> back(a.size());
  read_checkpoint_params(files[0], {{"a", Tensor(back.data(), {3000, 700}, DType::f32)}});
  EXPECT_TRUE(back == a);
}

// A checkpoint's whole datasets are read back with one preadv per chunk and ringtrain's
// Fletcher32 check (read_chunks_direct): the values equal HDF5's read of the same file (a
// short last chunk included), and a flipped bit in a chunk is an input error naming the
// dataset and the chunk, as HDF5's own check (RINGTRAIN_CHECKPOINT_DIRECT=0) refuses it.
TEST_F(IoTest, DirectChunkReadsVerifyFletcher32) {
  std::vector<float> a(3000 * 700), m(3000 * 700);
  uint64_t s = 5;
  for (auto* v : {&a, &m})
    for (auto& x : *v) x = float(int64_t(splitmix64(s) % 20001) - 10000) / 997.f;
  CheckpointMeta meta;
  meta.model = "{}";
  meta.precision = "fp32";
  meta.ringtrain_version = "test";
  meta.optimizer = "sgd";
  meta.step = 1;
  CheckpointStore store(path("read"), 1);
  store.save(MPI_COMM_NULL, meta, {{"a", Tensor(a.data(), {3000, 700}, DType::f32)}},
             {{"momentum", {{"a", Tensor(m.data(), {3000, 700}, DType::f32)}}}});
  const std::string file = store.list().back();
  std::vector<float> back(a.size()), back_m(m.size());
  const std::vector<NamedTensor> into = {{"a", Tensor(back.data(), {3000, 700}, DType::f32)}};
  const std::vector<OptimizerState> into_m = {
      {"momentum", {{"a", Tensor(back_m.data(), {3000, 700}, DType::f32)}}}};
  for (const char* direct : {"1", "0"}) {
    setenv("RINGTRAIN_CHECKPOINT_DIRECT", direct, 1);
    std::fill(back.begin(), back.end(), 0.f);
    std::fill(back_m.begin(), back_m.end(), 0.f);
    read_checkpoint_params(file, into);
    read_checkpoint_optimizer(file, into_m);
    EXPECT_TRUE(back == a) << "RINGTRAIN_CHECKPOINT_DIRECT=" << direct;
    EXPECT_TRUE(back_m == m) << "RINGTRAIN_CHECKPOINT_DIRECT=" << direct;
  }
  // One bit of the last (short) chunk of params/a flipped, where its data lies.
  haddr_t addr = 0;
  {
    H5Id f = open_file_readonly(file, "checkpoint");
    H5Id ds(H5Dopen2(f, "params/a", H5P_DEFAULT));
    hsize_t off[2] = {2672, 0}, size = 0;  // 8 chunks of 334 rows before it
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(ds, off, &mask, &addr, &size), 0);
  }
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(std::streamoff(addr + 1000));
    char c = 0;
    io.read(&c, 1);
    c ^= 0x10;
    io.seekp(std::streamoff(addr + 1000));
    io.write(&c, 1);
  }
  auto expect_refused = [&](const std::string& want) {
    try {
      read_checkpoint_params(file, into);
      ADD_FAILURE() << "no error; expected one naming '" << want << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
      for (const std::string& w : {file, want})
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
            << "missing '" << w << "' in: " << e.what();
    }
  };
  unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
  expect_refused("dataset 'params/a' could not be read (chunk 8 fails its Fletcher32 checksum)");
  setenv("RINGTRAIN_CHECKPOINT_DIRECT", "0", 1);
  expect_refused("dataset 'params/a' could not be read");
  unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
}

}  // namespace
}  // namespace ringtrain::io

namespace ringtrain::io {
namespace {

// CIFAR-shaped synthetic data ([3, 32, 32] uint8, written by the converter's writer with its
// per-channel /mean and /std) through the loader with crop+flip: the global batches are
// bitwise the same on 1, 2 and 3 ranks, and from a loader that seeks to a saved position
// (a resume), and the normalisation is per channel.
// A save reserves checkpoint_bytes_bound before HDF5 writes: were the file ever larger,
// HDF5 could meet a full disk inside its collective flush (checkpoint_writer.cpp). Many
// small datasets (a ResNet's), a large multi-chunk one, per-rank rows and buffers, with and
// without direct chunk writes; and the bound is not wildly above the file either.
TEST_F(IoTest, CheckpointBytesBoundCoversTheFile) {
  CheckpointMeta meta;
  meta.step = 1;
  meta.precision = "fp32";
  meta.model = std::string(3000, 'm');  // a model file's text
  meta.optimizer = "adamw";
  std::vector<std::vector<float>> store;
  auto tensor = [&](Shape shape) {
    store.emplace_back(size_t(shape_numel(shape)), 0.5f);
    return Tensor(store.back().data(), shape, DType::f32);
  };
  store.reserve(1000);
  struct Case {
    const char* name;
    std::vector<NamedTensor> params, per_rank, buffers;
  };
  std::vector<Case> cases(3);
  cases[0].name = "many small";
  for (int i = 0; i < 150; ++i)
    cases[0].params.push_back({cat("layer", i, ".weight"), tensor({3, 5})});
  for (int i = 0; i < 20; ++i)
    cases[0].buffers.push_back({cat("bn", i, ".running_var"), tensor({8})});
  cases[1].name = "large";
  cases[1].params = {{"a", tensor({3000, 700})}, {"b", tensor({5})}};
  cases[2].name = "per-rank rows";
  cases[2].params = {{"w", tensor({300, 300})}};
  cases[2].per_rank = {{"rng/streams", tensor({100})}};
  for (const Case& c : cases) {
    std::vector<OptimizerState> opt(2);
    opt[0].state = "exp_avg";
    opt[1].state = "exp_avg_sq";
    for (const auto& p : c.params)
      for (auto& s : opt) s.per_param.push_back({p.name, p.tensor});
    for (int pipeline : {0, 1}) {
      if (pipeline)
        setenv("RINGTRAIN_CHECKPOINT_DIRECT", "0", 1);
      else
        unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
      CheckpointStore st(path(cat("bound", &c - cases.data(), pipeline)), 1);
      st.save(MPI_COMM_NULL, meta, c.params, opt, c.per_rank, c.buffers);
      const uint64_t file = std::filesystem::file_size(st.list().back());
      const uint64_t bound =
          checkpoint_bytes_bound(meta, c.params, opt, c.per_rank, c.buffers, 1, 4096);
      EXPECT_LE(file, bound) << c.name << (pipeline ? ", through HDF5" : ", direct");
      EXPECT_LE(bound, file + file / 2 + (2u << 20)) << c.name << ": the bound is too generous";
    }
  }
  unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
}

TEST_F(IoTest, AugmentedCifarBatchesAreTheSameOnAnyRankCountAndAfterASeek) {
  const int64_t n = 96, per = 3 * 32 * 32;
  std::vector<uint8_t> img(static_cast<size_t>(n * per));
  std::vector<int32_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    lab[size_t(i)] = int32_t(i % 10);
    for (int64_t k = 0; k < per; ++k)  // channel c centred near 60 * (c + 1)
      img[size_t(i * per + k)] = uint8_t(60 * (k / 1024 + 1) + (i * 13 + k * 7) % 50);
  }
  const std::string p = path("cifar.h5");
  write_dataset_files(p, img.data(), {n, 3, 32, 32}, lab.data(), 10);
  Dataset d(p);
  ASSERT_EQ(d.info().channel_mean.size(), 3u);
  const Normalization norm = normalization_of(d.info());
  ASSERT_TRUE(norm.per_channel());
  EXPECT_LT(norm.mean[0], norm.mean[1]);  // the channels' own statistics
  EXPECT_LT(norm.mean[1], norm.mean[2]);
  const Augment aug = parse_augment("crop:4,flip");
  const int64_t g = 24, steps = 9;  // 4 batches per epoch: crosses two epoch ends
  auto run = [&](int world, int64_t skip) {
    std::vector<std::unique_ptr<Dataset>> files;  // one per rank, as each process has its own
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int r = 0; r < world; ++r) {
      files.push_back(std::make_unique<Dataset>(p));
      ranks.push_back(std::make_unique<Loader>(*files.back(), 5, g, r, world, norm, r % 2, aug));
      if (skip) ranks.back()->seek(skip / 4, (skip % 4) * g);  // where a checkpoint resumes
    }
    std::vector<float> out;
    for (int64_t s = skip; s < steps; ++s)
      for (int r = 0; r < world; ++r) {
        const Batch& b = ranks[size_t(r)]->next();
        out.insert(out.end(), b.x.as<float>(), b.x.as<float>() + b.x.numel());
      }
    return out;
  };
  const auto one = run(1, 0);
  EXPECT_EQ(run(2, 0), one) << "2 ranks";
  EXPECT_EQ(run(3, 0), one) << "3 ranks";
  const auto resumed = run(3, 5);
  EXPECT_EQ(resumed, std::vector<float>(one.begin() + 5 * g * per, one.end())) << "after a seek";
  // Augmentation happened: the plain batches differ.
  std::vector<float> plain;
  Loader l(d, 5, g, 0, 1, norm);
  for (int64_t s = 0; s < steps; ++s) {
    const Batch& b = l.next();
    plain.insert(plain.end(), b.x.as<float>(), b.x.as<float>() + b.x.numel());
  }
  EXPECT_NE(plain, one);
  // Per-channel normalisation: un-augmented channel c of a sample is (v/255 - mean_c) / std_c.
  const int64_t i0 = epoch_permutation(5, 0, n)[0];
  for (int64_t c = 0; c < 3; ++c) {
    const double v = img[size_t(i0 * per + c * 1024)] / 255.0;
    EXPECT_NEAR(plain[size_t(c * 1024)], (v - norm.mean[size_t(c)]) / norm.std[size_t(c)], 1e-5);
  }
  // Flat samples [D] cannot be cropped or flipped.
  std::vector<uint8_t> flat_img(50 * 6, 7);
  std::vector<int32_t> flat_lab(50, 1);
  write_dataset_files(path("flat.h5"), flat_img.data(), {50, 6}, flat_lab.data(), 2);
  Dataset flat(path("flat.h5"));
  expect_input_error(
      [&] {
        Loader bad(flat, 5, 10, 0, 1, Normalization{}, 0, Augment{2, false});
      },
      "--augment needs image samples [C, H, W]");
}

}  // namespace
}  // namespace ringtrain::io
