// The converters' parsers without MPI: the .npy header parser (versions, dtypes, byte
// order, refusals of object/structured/Fortran arrays, truncation), .npy write + read,
// PNG decoding against libpng's own encoder (and refusals of corrupt and foreign bytes),
// the resize + centre crop, the per-channel sums, and the CIFAR and NumPy sources (record
// ranges across files, NHWC transposition, file/record named in errors).
#include <gtest/gtest.h>
#include <png.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/convert_output.hpp"
#include "io/convert_source.hpp"
#include "io/image_decode.hpp"
#include "io/npy.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

using test::throws_kind;

// The bytes of a version 1.0 .npy header holding `dict` (padded as NumPy pads it).
std::vector<uint8_t> npy_bytes(const std::string& dict, size_t data_bytes = 0, int major = 1) {
  std::string h = dict;
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  b.push_back(uint8_t(h.size() & 0xff));
  b.push_back(uint8_t(h.size() >> 8));
  if (major != 1) b.insert(b.end(), {0, 0});
  b.insert(b.end(), h.begin(), h.end());
  b.resize(b.size() + data_bytes, 7);
  return b;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(NpyHeader, ParsesTypesShapesVersions) {
  auto b = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }");
  NpyHeader h = parse_npy_header(b.data(), b.size(), "x.npy");
  EXPECT_EQ(h.type, NpyType::f4);
  EXPECT_FALSE(h.big_endian);
  EXPECT_EQ(h.shape, (Shape{3, 4}));
  EXPECT_EQ(h.data_offset, b.size());
  EXPECT_EQ(h.data_offset % 64, 0u);
  b = npy_bytes("{\"descr\":\"|u1\",\"fortran_order\":False,\"shape\":(5,)}", 0, 2);
  h = parse_npy_header(b.data(), b.size(), "x.npy");
  EXPECT_EQ(h.type, NpyType::u1);
  EXPECT_EQ(h.shape, (Shape{5}));
  EXPECT_EQ(h.data_offset, b.size());
  b = npy_bytes("{'descr': '>i8', 'fortran_order': False, 'shape': (2L, 1L), }");
  h = parse_npy_header(b.data(), b.size(), "x.npy");
  EXPECT_EQ(h.type, NpyType::i8);
  EXPECT_TRUE(h.big_endian);
  EXPECT_EQ(h.shape, (Shape{2, 1}));
  b = npy_bytes("{'descr': '<i2', 'fortran_order': False, 'shape': (), }");
  EXPECT_TRUE(parse_npy_header(b.data(), b.size(), "x.npy").shape.empty());
}

TEST(NpyHeader, RefusesWhatItCannotRead) {
  const auto refuse = [](const std::string& dict) {
    const auto b = npy_bytes(dict);
    return error_of([&] { parse_npy_header(b.data(), b.size(), "bad.npy"); });
  };
  EXPECT_NE(refuse("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }").find("object array"),
            std::string::npos);
  EXPECT_NE(refuse("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }")
                .find("structured"),
            std::string::npos);
  EXPECT_NE(refuse("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }").find("Fortran"),
            std::string::npos);
  EXPECT_NE(refuse("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }").find("'<c8'"),
            std::string::npos);
  EXPECT_NE(
      refuse("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }").find("not supported"),
      std::string::npos);
  EXPECT_NE(refuse("{'descr': '<f4', 'shape': (2,), }").find("lacks"), std::string::npos);
  EXPECT_NE(
      refuse("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}").find("unknown key"),
      std::string::npos);
  auto b = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }");
  EXPECT_TRUE(throws_kind([&] { parse_npy_header(b.data(), 30, "cut.npy"); }, ErrorKind::input));
  b[1] = 'X';
  EXPECT_NE(error_of([&] {
              parse_npy_header(b.data(), b.size(), "m.npy");
            }).find("'m.npy' is not a .npy"),
            std::string::npos);
}

class ConvertFiles : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ringtrain-conv-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream(path(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  std::string dir_;
};

TEST_F(ConvertFiles, NpyWriteReadRoundTripAndByteSwap) {
  std::vector<float> v = {1.5f, -2.f, 0.f, 3.25f, 1e-7f, 8.f};
  write_npy_f32(path("a.npy"), v.data(), {2, 3});
  NpyArray a = read_npy(path("a.npy"));
  ASSERT_EQ(a.header.shape, (Shape{2, 3}));
  ASSERT_EQ(a.data.size(), v.size() * 4);
  EXPECT_EQ(std::memcmp(a.data.data(), v.data(), a.data.size()), 0);
  write_npy_f32(path("b.npy"), v.data(), {6});
  EXPECT_EQ(read_npy(path("b.npy")).header.shape, (Shape{6}));
  // A big-endian int32 array is swapped to native order.
  auto b = npy_bytes("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }");
  b.insert(b.end(), {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe});
  write("be.npy", b);
  NpyArray be = read_npy(path("be.npy"));
  int32_t got[2];
  std::memcpy(got, be.data.data(), 8);
  EXPECT_EQ(got[0], 258);
  EXPECT_EQ(got[1], -2);
  // Data shorter than the header declares: named with both sizes.
  b.resize(b.size() - 1);
  write("short.npy", b);
  EXPECT_NE(error_of([&] { read_npy(path("short.npy")); }).find("(8 bytes of data) but holds 7"),
            std::string::npos);
}

// Encodes rgb [h, w, 3] as PNG with libpng's own writer.
std::vector<uint8_t> encode_png(const std::vector<uint8_t>& rgb, int h, int w) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(w);
  img.height = png_uint_32(h);
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t n = 0;
  EXPECT_TRUE(png_image_write_to_memory(&img, nullptr, &n, 0, rgb.data(), 0, nullptr));
  std::vector<uint8_t> out(n);
  EXPECT_TRUE(png_image_write_to_memory(&img, out.data(), &n, 0, rgb.data(), 0, nullptr));
  out.resize(n);
  return out;
}

TEST(ImageDecode, PngRoundTripGrayAndRefusals) {
  const int h = 5, w = 7;
  std::vector<uint8_t> rgb(size_t(h * w * 3));
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(i * 37 % 251);
  const auto png = encode_png(rgb, h, w);
  Image im = decode_image_bytes(png.data(), png.size(), 3, "a.png");
  ASSERT_EQ(im.height, h);
  ASSERT_EQ(im.width, w);
  EXPECT_EQ(im.pixels, rgb);
  std::vector<uint8_t> planar(rgb.size());
  to_planar(im, planar.data());
  EXPECT_EQ(planar[size_t(2 * h * w + 1 * w + 3)], rgb[size_t((1 * w + 3) * 3 + 2)]);
  // A gray pixel (v, v, v) decodes to v in grayscale.
  std::vector<uint8_t> grey(size_t(h * w * 3), 77);
  const auto gp = encode_png(grey, h, w);
  Image g = decode_image_bytes(gp.data(), gp.size(), 1, "g.png");
  EXPECT_EQ(g.channels, 1);
  EXPECT_EQ(g.pixels, std::vector<uint8_t>(size_t(h * w), 77));
  const std::string cut =
      error_of([&] { decode_image_bytes(png.data(), png.size() - 20, 3, "cut.png"); });
  EXPECT_NE(cut.find("image 'cut.png' is a corrupt PNG"), std::string::npos) << cut;
  const uint8_t text[] = "hello, not an image";
  EXPECT_NE(error_of([&] {
              decode_image_bytes(text, sizeof text, 3, "t.jpg");
            }).find("'t.jpg' is neither PNG nor JPEG"),
            std::string::npos);
  const uint8_t soi[] = {0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F'};
  EXPECT_NE(error_of([&] {
              decode_image_bytes(soi, sizeof soi, 3, "h.jpg");
            }).find("'h.jpg' is not a valid JPEG"),
            std::string::npos);
}

TEST(ImageDecode, ResizeCentreCrop) {
  Image im;
  im.height = 4;
  im.width = 6;
  im.channels = 1;
  for (int i = 0; i < 24; ++i) im.pixels.push_back(uint8_t(i * 10));
  // Same height: scale 1, the centre 4 columns (1..4) exactly.
  std::vector<uint8_t> out(16);
  resize_center_crop(im, 4, 4, out.data());
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      EXPECT_EQ(out[size_t(y * 4 + x)], im.pixels[size_t(y * 6 + x + 1)]) << y << "," << x;
  // A uniform image stays uniform at any size, up or down.
  Image u = im;
  std::fill(u.pixels.begin(), u.pixels.end(), 200);
  for (auto [h, w] : {std::pair{2, 2}, {9, 5}, {13, 17}}) {
    std::vector<uint8_t> o(size_t(h * w));
    resize_center_crop(u, h, w, o.data());
    EXPECT_EQ(o, std::vector<uint8_t>(size_t(h * w), 200)) << h << "x" << w;
  }
  // Halving averages: a column pattern 0, 100, 0, 100 ... shrinks to about 50 everywhere
  // inside (the triangle filter spans 4 input columns).
  Image s;
  s.height = 2;
  s.width = 8;
  s.channels = 1;
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 8; ++x) s.pixels.push_back(x % 2 ? 100 : 0);
  std::vector<uint8_t> half(4);
  resize_center_crop(s, 1, 4, half.data());
  EXPECT_EQ(half[1], 50);
  EXPECT_EQ(half[2], 50);
}

TEST(ChannelStats, SumsPerChannel) {
  // 2 samples [2, 1, 2]: channel 0 values 1, 2, 5, 6; channel 1 values 3, 4, 7, 8.
  const uint8_t v[] = {1, 2, 3, 4, 5, 6, 7, 8};
  double sum[2] = {0, 0}, sq[2] = {0, 0};
  add_channel_stats(v, 2, {2, 1, 2}, DType::u8, sum, sq);
  EXPECT_EQ(sum[0], 14);
  EXPECT_EQ(sum[1], 22);
  EXPECT_EQ(sq[0], 1 + 4 + 25 + 36);
  EXPECT_EQ(sq[1], 9 + 16 + 49 + 64);
  const float f[] = {0.5f, -1.f, 2.f};
  double fs_[1] = {0}, fq[1] = {0};
  add_channel_stats(reinterpret_cast<const uint8_t*>(f), 1, {3}, DType::f32, fs_, fq);
  EXPECT_DOUBLE_EQ(fs_[0], 1.5);
  EXPECT_DOUBLE_EQ(fq[0], 5.25);
  EXPECT_EQ(shard_names("d/x.h5", 2),
            (std::vector<std::string>{"d/x-00000-of-00002.h5", "d/x-00001-of-00002.h5"}));
}

TEST_F(ConvertFiles, CifarRecordsAcrossFiles) {
  auto records = [](int n, int first_label) {
    std::vector<uint8_t> b;
    for (int r = 0; r < n; ++r) {
      b.push_back(uint8_t((first_label + r) % 10));
      for (int k = 0; k < 3072; ++k) b.push_back(uint8_t((r * 3 + k) % 256));
    }
    return b;
  };
  write("a.bin", records(3, 0));
  write("b.bin", records(2, 3));
  auto src = open_cifar({path("a.bin"), path("b.bin")}, false);
  ASSERT_EQ(src->info().num_samples, 5);
  EXPECT_EQ(src->info().sample_shape, (Shape{3, 32, 32}));
  EXPECT_TRUE(src->info().class_names.empty());
  std::vector<uint8_t> img(3 * 3072);
  std::vector<int64_t> lab(3);
  src->read(2, 5, img.data(), lab.data());  // the last of a.bin, both of b.bin
  EXPECT_EQ(lab, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(img[0], uint8_t(2 * 3 % 256));
  EXPECT_EQ(img[3072 + 5], uint8_t(5));
  auto cut = records(2, 0);
  cut.pop_back();
  write("cut.bin", cut);
  const std::string e = error_of([&] { open_cifar({path("a.bin"), path("cut.bin")}, false); });
  EXPECT_NE(
      e.find("'" + path("cut.bin") + "' holds 6145 bytes, which is not a multiple of the 3073"),
      std::string::npos)
      << e;
  write("c100.bin", std::vector<uint8_t>(2 * 3074, 1));
  EXPECT_EQ(open_cifar({path("c100.bin")}, true)->info().num_classes, 100);
}

TEST_F(ConvertFiles, NpySourceNhwcAndLabels) {
  // Images [2, 2, 3, 2] NHWC uint8, value = n*100 + h*10 + w*2 + c.
  auto b = npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3, 2), }");
  for (int n = 0; n < 2; ++n)
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 3; ++w)
        for (int c = 0; c < 2; ++c) b.push_back(uint8_t(n * 100 + h * 10 + w * 2 + c));
  write("x.npy", b);
  auto l = npy_bytes("{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }");
  l.insert(l.end(), {4, 0, 1, 0});
  write("y.npy", l);
  auto src = open_npy_source(path("x.npy"), path("y.npy"), "nhwc");
  EXPECT_EQ(src->info().sample_shape, (Shape{2, 2, 3}));
  EXPECT_EQ(src->info().num_classes, 5);
  std::vector<uint8_t> img(12);
  int64_t lab = -1;
  src->read(1, 2, img.data(), &lab);
  EXPECT_EQ(lab, 1);
  EXPECT_EQ(img[size_t(1 * 6 + 1 * 3 + 2)], uint8_t(100 + 10 + 4 + 1));  // c=1, h=1, w=2
  l[l.size() - 4] = 0xff;
  l[l.size() - 3] = 0xff;  // the first label: -1
  write("neg.npy", l);
  const std::string e = error_of([&] { open_npy_source(path("x.npy"), path("neg.npy"), "nhwc"); });
  EXPECT_NE(e.find("record 0 holds a negative"), std::string::npos) << e;
  EXPECT_TRUE(throws_kind([&] { open_npy_source(path("x.npy"), "", "nhcw"); }, ErrorKind::input));
}

}  // namespace
}  // namespace ringtrain::io
