// io/safetensors: files written by write_safetensors read back bitwise through the map; the
// F16, BF16 and F64 conversions against hand-computed values; and each damaged header (a
// length beyond the file, not JSON, an unknown dtype, offsets outside the data or not
// matching the shape) an input error naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace ringtrain::io {
namespace {

class SafetensorsTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ringtrain-st-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A file of the given header text and data bytes.
  std::string raw(const std::string& header, const std::string& data, uint64_t len = ~0ull) {
    const std::string path = dir_ + "/t.safetensors";
    std::ofstream f(path, std::ios::binary);
    if (len == ~0ull) len = header.size();
    for (int i = 0; i < 8; ++i) f.put(char((len >> (8 * i)) & 0xff));
    f << header << data;
    return path;
  }
  // The input error of opening `path`, "" if none.
  static std::string error_of(const std::string& path) {
    try {
      SafetensorsFile f(path);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 1);
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(SafetensorsTest, WrittenFileReadsBackBitwise) {
  std::vector<float> a = {1.5f, -2.25f, 3e-30f, 7.f, 0.f, -0.f};
  std::vector<float> b = {42.f};
  const std::string path = dir_ + "/w.safetensors";
  write_safetensors(path, {{"a", {2, 3}, [&](float* d) { std::copy(a.begin(), a.end(), d); }},
                           {"b.bias", {1}, [&](float* d) { d[0] = b[0]; }}});
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  const SafetensorsEntry* e = f.find("a");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (Shape{2, 3}));
  std::vector<float> got(6);
  safetensors_read_f32(*e, 0, 6, got.data());
  EXPECT_EQ(std::memcmp(got.data(), a.data(), 24), 0);
  safetensors_read_f32(*e, 4, 2, got.data());  // a part
  EXPECT_EQ(std::memcmp(got.data(), a.data() + 4, 8), 0);
  float v = 0;
  safetensors_read_f32(*f.find("b.bias"), 0, 1, &v);
  EXPECT_EQ(v, 42.f);
}

TEST_F(SafetensorsTest, ConvertsHalfBfloatAndDouble) {
  // F16: 1.0 = 0x3c00, -2.5 = 0xc100, smallest subnormal 2^-24 = 0x0001, inf = 0x7c00.
  const uint16_t h[] = {0x3c00, 0xc100, 0x0001, 0x7c00};
  // BF16: the top half of the fp32 bits: 1.0 = 0x3f80, -3.0 = 0xc040.
  const uint16_t bf[] = {0x3f80, 0xc040};
  const double d[] = {0.1, -1e10};
  std::string data(reinterpret_cast<const char*>(h), 8);
  data.append(reinterpret_cast<const char*>(bf), 4);
  data.append(reinterpret_cast<const char*>(d), 16);
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
      R"("bf":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("d":{"dtype":"F64","shape":[2],"data_offsets":[12,28]},"__metadata__":{"format":"pt"}})";
  SafetensorsFile f(raw(header, data));
  float out[4];
  safetensors_read_f32(*f.find("h"), 0, 4, out);
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], std::ldexp(1.f, -24));
  EXPECT_TRUE(std::isinf(out[3]) && out[3] > 0);
  safetensors_read_f32(*f.find("bf"), 0, 2, out);
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -3.f);
  safetensors_read_f32(*f.find("d"), 0, 2, out);
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_EQ(out[1], -1e10f);
}

TEST_F(SafetensorsTest, DamagedHeadersAreInputErrorsNamingWhat) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string eight(8, '\0');
  EXPECT_NE(error_of(raw(ok, eight, 1000)).find("is truncated: its header declares 1000 bytes"),
            std::string::npos);
  EXPECT_NE(error_of(raw("{not json", eight)).find("the header is not JSON"), std::string::npos);
  EXPECT_NE(error_of(raw(R"({"w":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})", eight))
                .find("tensor 'w' has dtype I8; expected F32, F16, BF16 or F64"),
            std::string::npos);
  EXPECT_NE(error_of(raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight))
                .find("tensor 'w' has data_offsets [0, 16] outside the 8 bytes of data"),
            std::string::npos);
  EXPECT_NE(error_of(raw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight))
                .find("tensor 'w' has 8 bytes but its shape [3] of F32 needs 12"),
            std::string::npos);
  EXPECT_NE(error_of(raw(R"({"w":{"dtype":"F32","shape":[2]}})", eight))
                .find("tensor 'w' lacks dtype, shape or data_offsets"),
            std::string::npos);
  EXPECT_EQ(error_of(raw(ok, eight)), "");
}

}  // namespace
}  // namespace ringtrain::io
