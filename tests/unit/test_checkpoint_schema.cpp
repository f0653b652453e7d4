// The checkpoint schema (io/checkpoint_schema.hpp): docs/formats.md holds exactly its
// tables, the table agrees with CheckpointMeta and the format constants, a save read back
// gives every field, and for every attribute of the table a file that lacks it (when
// required), holds another type, or holds a non-finite value where the rule wants a finite
// one is refused with a message naming it; an optional one that is absent reads as the
// default.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "io/checkpoint.hpp"
#include "io/checkpoint_schema.hpp"
#include "io/hdf5.hpp"
#include "io/meta_checksum.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class CheckpointSchemaTest : public testing::Test {
 protected:
  void SetUp() override {
    silence_hdf5_errors();
    char tmpl[] = "/tmp/ringtrain-schema-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Every field away from its default, so that a field the reader skipped shows.
  static CheckpointMeta full_meta() {
    CheckpointMeta m;
    m.step = 12;
    m.epoch = 2;
    m.samples_seen = 384;
    m.world_size = 3;
    m.global_batch = 32;
    m.precision = "bf16";
    m.model = "format_version: 1\nname: \"mlp\"\n";
    m.ringtrain_version = "test";
    m.plugins = "swish_beta=/opt/libcustom_op.so";
    m.data_epoch = 2;
    m.data_position = 64;
    m.loss_scale = 1024;
    m.growth_tracker = 5;
    m.optimizer = "adamw";
    m.optimizer_step = 11;
    m.seed = 7;
    m.input_mean = 0.4;
    m.input_std = 0.25;
    m.input_channel_mean = {0.49, 0.48, 0.45};
    m.input_channel_std = {0.25, 0.24, 0.26};
    m.grad_accum = 2;
    m.best_value = 0.75;
    m.best_step = 10;
    m.evals_since_best = 1;
    m.best_metric = "val_loss";
    m.tokenizer = "sentencepiece";
    m.tokenizer_sha256 = std::string(64, 'a');
    m.tokenizer_data = "/data/c-00000-of-00002.h5";
    return m;
  }

  // A checkpoint of full_meta() with one [2, 3] parameter; returns its path.
  std::string save_full(const std::string& sub) {
    CheckpointStore store(path(sub), 1);
    std::vector<float> w(6, 0.5f), sq(6, 1.f);
    store.save(MPI_COMM_NULL, full_meta(), {{"fc.weight", Tensor(w.data(), {2, 3}, DType::f32)}},
               {{"exp_avg", {{"fc.weight", Tensor(w.data(), {2, 3}, DType::f32)}}},
                {"exp_avg_sq", {{"fc.weight", Tensor(sq.data(), {2, 3}, DType::f32)}}}});
    return store.path_for(full_meta().step);
  }

  // A copy of `good` named after the case, for one change.
  std::string copy_of(const std::string& good, const std::string& name) {
    const std::string out = path(name + ".h5");
    fs::copy_file(good, out, fs::copy_options::overwrite_existing);
    return out;
  }

  std::string dir_;
};

// Runs `change` on attribute a's object (the root or its group) of `file`, opened read-write.
template <typename F>
void change_attr(const std::string& file, const CheckpointAttr& a, F change) {
  H5Lock lock;
  H5Id f(H5_CHECK(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)));
  H5Id g(*a.group ? H5_CHECK(H5Gopen2(f, a.group, H5P_DEFAULT)) : H5I_INVALID_HID);
  change(*a.group ? g.get() : f.get());
  // A consistent metadata checksum, as a tool that edits attributes on purpose would write:
  // these tests are of the schema's rules, the checksum's own test is test_hostile_meta.cpp.
  g.reset();
  write_meta_checksum(f);
}

// The input error read_checkpoint_meta(file) throws ("" when none).
std::string read_error(const std::string& file) {
  try {
    read_checkpoint_meta(file);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  return "";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(CheckpointSchemaTest, FormatsDocHoldsExactlyTheTable) {
  const std::string doc = read_text(std::string(RINGTRAIN_SOURCE_DIR) + "/docs/formats.md");
  const std::string begin = "<!-- BEGIN checkpoint schema -->\n",
                    end = "<!-- END checkpoint schema -->";
  const size_t a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/formats.md has no '" << begin << "'";
  ASSERT_NE(b, std::string::npos) << "docs/formats.md has no '" << end << "'";
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), checkpoint_schema_markdown())
      << "docs/formats.md's checkpoint tables differ from io/checkpoint_schema.cpp's; paste "
         "the output of `ringtrain inspect --schema` between the markers";
}

TEST_F(CheckpointSchemaTest, TableAgreesWithTheMetaAndTheFormatConstants) {
  std::set<std::string> labels;
  const auto& groups = checkpoint_required_groups();
  for (const auto& a : checkpoint_attrs()) {
    EXPECT_TRUE(labels.insert(a.label()).second) << a.label() << " is declared twice";
    EXPECT_TRUE(!*a.group || std::find_if(groups.begin(), groups.end(),
                                          [&](const char* g) {
                                            return std::string(g) == a.group;
                                          }) != groups.end())
        << a.label() << ": group not created by the writer";
    EXPECT_EQ(find_checkpoint_attr(a.group, a.name), &a);
    EXPECT_EQ(a.since_version, 1) << a.label();
    if (a.rule == AttrRule::equals) {
      EXPECT_TRUE(std::holds_alternative<std::monostate>(a.member)) << a.label();
      continue;
    }
    // The member's C++ type is the one the table declares.
    const size_t want = a.type == AttrType::int64     ? 1
                        : a.type == AttrType::float64 ? 2
                        : a.type == AttrType::string  ? 3
                                                      : 4;
    EXPECT_EQ(a.member.index(), want) << a.label() << " is bound to a field of another type";
  }
  EXPECT_STREQ(find_checkpoint_attr("", "format")->value, kCheckpointFormat);
  EXPECT_EQ(std::stoll(find_checkpoint_attr("", "format_version")->value), kCheckpointVersion);
  EXPECT_EQ(find_checkpoint_attr("", "nope"), nullptr);
  EXPECT_TRUE(checkpoint_dataset_nonnegative("optimizer/fc1.weight/exp_avg_sq"));
  EXPECT_TRUE(checkpoint_dataset_nonnegative("buffers/bn.running_var"));
  EXPECT_FALSE(checkpoint_dataset_nonnegative("optimizer/fc1.weight/exp_avg"));
  EXPECT_EQ(impossible_meta(full_meta()), "");
}

TEST_F(CheckpointSchemaTest, EveryFieldRoundTrips) {
  const std::string file = save_full("ck");
  std::string why;
  ASSERT_TRUE(validate_checkpoint(file, &why)) << why;
  const CheckpointMeta want = full_meta(), got = read_checkpoint_meta(file);
  const CheckpointMeta defaults;
  int compared = 0;
  for (const auto& a : checkpoint_attrs()) {
    std::visit(
        [&](auto member) {
          if constexpr (!std::is_same_v<decltype(member), std::monostate>) {
            EXPECT_EQ(got.*member, want.*member) << a.label();
            EXPECT_NE(want.*member, defaults.*member) << a.label() << ": test a non-default";
            ++compared;
          }
        },
        a.member);
    H5Lock lock;
    H5Id f = open_file_readonly(file, "checkpoint");
    H5Id g(*a.group ? H5Gopen2(f, a.group, H5P_DEFAULT) : H5I_INVALID_HID);
    EXPECT_TRUE(has_attr(*a.group ? g.get() : f.get(), a.name)) << a.label() << " not written";
  }
  EXPECT_EQ(compared + 2, int(checkpoint_attrs().size()));  // all but format, format_version
}

// Whether another attribute must have as many values as `a` (input_channel_mean).
bool partnered(const CheckpointAttr& a) {
  for (const auto& b : checkpoint_attrs())
    if (std::string(b.same_length_as) == a.name) return true;
  return false;
}

TEST_F(CheckpointSchemaTest, MissingRequiredAttributeIsNamedAndOptionalReadsAsDefault) {
  const std::string good = save_full("ck");
  for (const auto& a : checkpoint_attrs()) {
    const std::string file = copy_of(good, "missing");
    change_attr(file, a, [&](hid_t obj) { H5_CHECK(H5Adelete(obj, a.name)); });
    const std::string err = read_error(file);
    std::string why;
    if (a.required) {
      // format and format_version have their own messages ("... is missing").
      const std::string want =
          a.rule == AttrRule::equals
              ? "missing"
              : cat("lacks the ", attr_type_name(a.type), " attribute '", a.label(), "'");
      EXPECT_NE(err.find(want), std::string::npos) << a.label() << ": " << err;
      EXPECT_NE(err.find(a.name), std::string::npos) << a.label() << ": " << err;
      EXPECT_FALSE(validate_checkpoint(file, &why)) << a.label();
      EXPECT_NE(why.find(a.name), std::string::npos) << why;
    } else if (*a.same_length_as || partnered(a)) {
      // One of the two per-channel lists alone: refused as lists of different lengths.
      EXPECT_NE(err.find("input_channel_std has"), std::string::npos) << a.label() << ": " << err;
    } else {
      EXPECT_EQ(err, "") << a.label() << " is optional";
      const CheckpointMeta got = read_checkpoint_meta(file), defaults;
      std::visit(
          [&](auto member) {
            if constexpr (!std::is_same_v<decltype(member), std::monostate>) {
              EXPECT_EQ(got.*member, defaults.*member) << a.label() << " absent";
            }
          },
          a.member);
    }
  }
}

TEST_F(CheckpointSchemaTest, AttributeOfAnotherTypeIsNamed) {
  const std::string good = save_full("ck");
  for (const auto& a : checkpoint_attrs()) {
    if (a.rule == AttrRule::equals) continue;  // format, format_version: their own messages
    const std::string file = copy_of(good, "type");
    change_attr(file, a, [&](hid_t obj) {
      if (a.type == AttrType::string)
        write_attr(obj, a.name, int64_t(7));
      else
        write_attr(obj, a.name, std::string("seven"));
    });
    const std::string err = read_error(file);
    const std::string want = cat("attribute '", a.label(), "' is ",
                                 a.type == AttrType::string ? "an integer" : "a string",
                                 "; expected ", attr_type_name(a.type));
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n got: " << err;
    EXPECT_NE(err.find(file), std::string::npos) << err;
  }
  // A float where an integer belongs is another type too.
  const std::string file = copy_of(good, "float_step");
  change_attr(file, *find_checkpoint_attr("", "step"),
              [&](hid_t obj) { write_attr(obj, "step", 12.5); });
  EXPECT_NE(read_error(file).find("attribute 'step' is a float; expected int64"), std::string::npos)
      << read_error(file);
}

TEST_F(CheckpointSchemaTest, NonFiniteValueIsNamed) {
  const std::string good = save_full("ck");
  int cases = 0;
  for (const auto& a : checkpoint_attrs()) {
    if (a.rule != AttrRule::finite && a.rule != AttrRule::finite_positive &&
        a.rule != AttrRule::finite_if_best)
      continue;
    const std::string file = copy_of(good, "nan");
    std::string want = a.label();
    change_attr(file, a, [&](hid_t obj) {
      if (a.type == AttrType::float64_list) {
        write_attr(obj, a.name, std::vector<double>{0.5, kNaN, 0.5});
        want += "[1]";
      } else {
        write_attr(obj, a.name, kNaN);
      }
    });
    want += " is nan; expected a finite value";
    const std::string err = read_error(file);
    EXPECT_NE(err.find(want), std::string::npos) << want << "\n got: " << err;
    EXPECT_NE(err.find("holds impossible metadata"), std::string::npos) << err;
    std::string why;
    EXPECT_FALSE(validate_checkpoint(file, &why));
    EXPECT_NE(why.find(want), std::string::npos) << why;
    ++cases;
  }
  EXPECT_EQ(cases, 6);  // input_mean/std, the channel lists, best_value, /loss_scaler scale
}

TEST_F(CheckpointSchemaTest, ValueOutsideAnEnumIsNamed) {
  CheckpointMeta m = full_meta();
  m.precision = "fp8";
  EXPECT_EQ(impossible_meta(m), "precision is 'fp8'; expected fp32, fp16 or bf16");
  m = full_meta();
  m.optimizer = "lamb";
  EXPECT_EQ(impossible_meta(m), "/optimizer name is 'lamb'; expected sgd or adamw");
  m = full_meta();
  m.best_metric = "";  // absent: fine
  EXPECT_EQ(impossible_meta(m), "");
  m.best_metric = "loss";
  EXPECT_EQ(impossible_meta(m), "best_metric is 'loss'; expected val_loss or val_accuracy");
  m = full_meta();
  m.input_channel_std.pop_back();
  EXPECT_EQ(impossible_meta(m),
            "input_channel_std has 2 values and input_channel_mean 3; expected one per channel in "
            "each");
}

}  // namespace
}  // namespace ringtrain::io
