// Hostile inputs that used to crash, hang or silently wrap, each refused as an input error
// that names the limit or the value: model-file expressions (int64 overflow, INT64_MIN / -1,
// nesting deep enough to overflow the stack, pow with a huge exponent), model files whose
// nesting or expansion is unbounded, files that are not regular files (a FIFO, /dev/zero)
// given as a model or text input, text inputs past the size limit, and a PNG whose header
// declares more pixels than may be decoded.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.hpp"
#include "io/convert_text.hpp"
#include "io/image_decode.hpp"
#include "nn/expr.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model_file.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

using test::input_error;

int64_t int_of(const std::string& expr) {
  const ExprValue v = eval_expr(expr, {});
  EXPECT_EQ(v.kind, ExprValue::Kind::integer) << expr;
  return v.i;
}

TEST(HostileExpressions, IntegerOverflowIsAnErrorNamingTheExpression) {
  for (const std::string e :
       {"(-9223372036854775807 - 1) / -1", "pow(2, 64) + 16", "9223372036854775807 * 4 + 20",
        "9223372036854775807 + 1", "-(-9223372036854775807 - 1)", "(-9223372036854775807 - 1) - 1",
        "pow(2, 63)", "pow(3, 40)", "pow(-3, 41)"}) {
    const std::string why = input_error([&] { eval_expr(e, {}); });
    EXPECT_HAS(why, "expression '" + e + "'");
    EXPECT_HAS(why, "integer overflow");
  }
  EXPECT_HAS(input_error([] { eval_expr("pow(2, 64)", {}); }), "pow(2, 64) is outside");
  // INT64_MIN % -1 is 0 (the hardware instruction would trap).
  EXPECT_EQ(int_of("(-9223372036854775807 - 1) % -1"), 0);
  EXPECT_EQ(int_of("7 % -1"), 0);
  EXPECT_EQ(int_of("-7 % 3"), -1);
  EXPECT_EQ(int_of("9223372036854775806 + 1"), INT64_MAX);
  EXPECT_EQ(int_of("-9223372036854775807 - 1"), INT64_MIN);
  EXPECT_HAS(input_error([] { eval_expr("9223372036854775808", {}); }), "out of range");
  // Reals stay reals: a large value is written as one.
  EXPECT_DOUBLE_EQ(eval_expr("pow(2.0, 64) + 16", {}).d, 18446744073709551632.0);
}

TEST(HostileExpressions, PowSquaresAndChecks) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(int_of("pow(1, 9000000000000000000)"), 1);
  EXPECT_EQ(int_of("pow(-1, 9000000000000000001)"), -1);
  EXPECT_EQ(int_of("pow(0, 9000000000000000000)"), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0)
      << "pow is not by squaring";
  EXPECT_EQ(int_of("pow(0, 0)"), 1);
  EXPECT_EQ(int_of("pow(2, 62)"), int64_t(1) << 62);
  EXPECT_EQ(int_of("pow(-2, 63)"), INT64_MIN);
  EXPECT_EQ(int_of("pow(3, 39)"), 4052555153018976267);
  EXPECT_EQ(int_of("pow(-3, 39)"), -4052555153018976267);
  EXPECT_DOUBLE_EQ(eval_expr("pow(2, -1)", {}).d, 0.5);
}

TEST(HostileExpressions, NestingIsBoundedNotAStackOverflow) {
  const std::string parens = std::string(200000, '(') + "1" + std::string(200000, ')');
  const std::string e = input_error([&] { eval_expr(parens, {}); });
  EXPECT_HAS(e, "nested deeper than 100 levels");
  EXPECT_HAS(e, "... (400001 characters)");  // the message quotes the start only
  EXPECT_LT(e.size(), 400u);
  EXPECT_HAS(input_error([] { eval_expr(std::string(200000, '-') + "1", {}); }), "nested deeper");
  EXPECT_HAS(input_error([] { eval_expr(std::string(200000, '!') + "1", {}); }), "nested deeper");
  std::string ternary;
  for (int k = 0; k < 20000; ++k) ternary += "1 ? ";
  ternary += "1";
  for (int k = 0; k < 20000; ++k) ternary += " : 0";
  EXPECT_HAS(input_error([&] { eval_expr(ternary, {}); }), "nested deeper");
  // Real expressions nest a few levels: 40 is fine.
  EXPECT_EQ(int_of(std::string(40, '(') + "2" + std::string(40, ')')), 2);
  EXPECT_EQ(int_of(std::string(40, '-') + "2"), 2);
}

TEST(HostileExpressions, IntegersCompareExactly) {
  // As doubles, 2^53 + 1 == 2^53.
  EXPECT_EQ(int_of("9007199254740993 == 9007199254740992"), 0);
  EXPECT_EQ(int_of("9007199254740993 > 9007199254740992"), 1);
  EXPECT_EQ(int_of("max(9007199254740993, 9007199254740992)"), 9007199254740993);
  EXPECT_EQ(int_of("min(9007199254740993, 9007199254740992)"), 9007199254740992);
}

// Plans `text` as model file m.pbtxt for samples [1, 4, 4] of 3 classes.
void plan(const std::string& text) {
  ModelFile f = ModelFile::parse(text, "m.pbtxt");
  f.set_data_shape({1, 4, 4}, 3, "the data");
  plan_model(f);
}

// `depth` repeats of one iteration nested around one flatten node.
std::string nested_repeats(int depth, int count = 1) {
  std::string open, close;
  for (int k = 0; k < depth; ++k) {
    open += "node { name: \"r" + std::to_string(k) + "\" repeat { count: " + std::to_string(count) +
            " index: \"i" + std::to_string(k) + "\" prefix: \"l" + std::to_string(k) + "_{i" +
            std::to_string(k) + "}.\"\n";
    close += "} }\n";
  }
  return open + "node { name: \"f\" flatten {} }\n" + close +
         "node { name: \"out\" linear { out_features: 3 } }\n";
}

TEST(HostileModelFiles, OverflowInAFileNamesTheExpressionAndItsPlace) {
  std::string e = input_error([] {
    plan(
        "node { name: \"f\" flatten {} }\n"
        "node { name: \"fc\" linear {}\n"
        "  set { field: \"out_features\" expr: \"pow(2, 64) + 16\" } }\n");
  });
  EXPECT_HAS(e, "m.pbtxt:3:3: node 'fc': ");
  EXPECT_HAS(e, "expression 'pow(2, 64) + 16': integer overflow");
  e = input_error(
      [] { plan("node { name: \"f\" flatten {} when: \"(-9223372036854775807 - 1) / -1\" }"); });
  EXPECT_HAS(e, "m.pbtxt:1:");
  EXPECT_HAS(e, "integer overflow");
  // Templates in a repeat's input and output are located too.
  e = input_error([] {
    plan(
        "node { name: \"f\" flatten {} }\n"
        "node { name: \"r\" repeat { count: 1 output: \"x{9223372036854775807 * 4 + 20}\"\n"
        "  node { name: \"x\" linear { out_features: 3 } } } }\n");
  });
  EXPECT_HAS(e, "m.pbtxt:2:");
  EXPECT_HAS(e, "integer overflow");
  // A real that does not fit an integer field is refused, not cast.
  e = input_error([] {
    plan(
        "node { name: \"f\" flatten {} }\n"
        "node { name: \"fc\" linear {} set { field: \"out_features\" expr: \"1e30\" } }\n");
  });
  EXPECT_HAS(e, "needs an integer");
}

TEST(HostileModelFiles, NestingAndExpansionAreBounded) {
  const auto t0 = std::chrono::steady_clock::now();
  // Thousands of nested repeats: refused while parsing, with the place.
  std::string e = input_error([] { plan(nested_repeats(3000)); });
  EXPECT_HAS(e, "m.pbtxt:");
  EXPECT_HAS(e, "recursion limit of 100");
  // A few more than the limit of nested repeats.
  e = input_error([] { plan(nested_repeats(17)); });
  EXPECT_HAS(e, "at most 16 repeats may nest");
  // 100,000 x 100,000 iterations: refused before they are expanded.
  e = input_error([] { plan(nested_repeats(2, 100000)); });
  EXPECT_HAS(e, "nodes after expansion");
  EXPECT_HAS(e, "200000");
  e = input_error([] { plan(nested_repeats(1, 100000) + nested_repeats(1, 100000)); });
  EXPECT_HAS(e, "nodes after expansion");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  // At the limits, a model still plans.
  plan(nested_repeats(16));
}

class HostileFiles : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ringtrain-hostile-XXXXXX";
    dir_ = mkdtemp(tmpl);
    ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
};

// Each of these would block forever on the FIFO, or read /dev/zero until memory ran out.
TEST_F(HostileFiles, AFifoOrDeviceIsNotAModelOrATextInput) {
  for (const std::string& f : {path("fifo"), std::string("/dev/zero")}) {
    EXPECT_HAS(input_error([&] { ModelFile::load(f); }),
               "--model '" + f + "' is not a regular file");
    EXPECT_HAS(input_error([&] { io::convert_text({f}, path("t.h5"), 1, 0.0); }),
               "--input '" + f + "' is not a regular file");
    EXPECT_HAS(input_error([&] { io::decode_image(f, 3); }), "is not a regular file");
  }
  EXPECT_FALSE(fs::exists(path("t.h5")));
}

TEST_F(HostileFiles, TextInputsPastTheLimitAreRefusedBeforeReading) {
  std::ofstream(path("a.txt")) << std::string(3000, 'a');
  std::ofstream(path("b.txt")) << std::string(2000, 'b');
  const std::string e = input_error([&] {
    io::convert_text({path("a.txt"), path("b.txt")}, path("t.h5"), 1, 0.0, 4096);
  });
  EXPECT_HAS(e, "2 file(s) of 5000 bytes in all; at most 4096 bytes");
  EXPECT_HAS(e, "--max-input-mb");
  EXPECT_EQ(
      io::convert_text({path("a.txt"), path("b.txt")}, path("t.h5"), 1, 0.0, 5000).train_tokens,
      5000);
}

uint32_t crc32_of(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

std::string be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

std::string png_chunk(const std::string& type, const std::string& data) {
  return be32(uint32_t(data.size())) + type + data + be32(crc32_of(type + data));
}

// A PNG of a hundred bytes whose header declares height x width RGB pixels.
std::string png_declaring(uint32_t height, uint32_t width) {
  const std::string ihdr = be32(width) + be32(height) + std::string("\x08\x02\x00\x00\x00", 5);
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) +
         png_chunk("IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8)) +
         png_chunk("IEND", "");
}

TEST(HostileImages, DeclaredPixelsAreBoundedBeforeDecoding) {
  const std::string png = png_declaring(60000, 60000);
  const std::string e = input_error([&] {
    io::decode_image_bytes(reinterpret_cast<const uint8_t*>(png.data()), png.size(), 3, "big.png");
  });
  EXPECT_HAS(e, "image 'big.png' declares 60000x60000 (HxW) pixels; at most 268435456");
}

}  // namespace
}  // namespace ringtrain
