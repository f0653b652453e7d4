// The environment-settings table (core/env.hpp): the docs list exactly the table, every
// RINGTRAIN_* name the sources read is declared and read only through its typed accessor,
// an undeclared name is refused, a value the table does not allow is an input error naming
// the variable, the value and what it takes, and an unknown variable in the environment is
// named with the setting it is closest to.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include "core/env.hpp"
#include "core/error.hpp"

namespace ringtrain {
namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EnvTable, UsageDocListsExactlyTheTable) {
  const std::string doc = read_text(std::string(RINGTRAIN_SOURCE_DIR) + "/docs/usage.md");
  const std::string begin = "<!-- BEGIN env table -->\n", end = "<!-- END env table -->";
  const size_t a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/usage.md has no '" << begin << "'";
  ASSERT_NE(b, std::string::npos) << "docs/usage.md has no '" << end << "'";
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), env::markdown_table())
      << "docs/usage.md's environment table differs from core/env.cpp's; paste the expected "
         "text above between the markers";
}

TEST(EnvTable, EveryNameTheSourcesUseIsDeclared) {
  // Every quoted "RINGTRAIN_..." in the C++ sources that read settings (test and build
  // names aside) must be in the table.
  std::set<std::string> declared;
  for (const auto& s : env::settings()) declared.insert(s.name);
  const std::regex quoted("\"(RINGTRAIN_[A-Z0-9_]+)\"");
  int files = 0;
  for (const char* dir : {"core", "kernels", "comm", "io", "launch", "train", "nn"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(
             std::filesystem::path(RINGTRAIN_SOURCE_DIR) / dir)) {
      const auto ext = e.path().extension();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
      ++files;
      const std::string text = read_text(e.path());
      for (std::sregex_iterator m(text.begin(), text.end(), quoted), none; m != none; ++m)
        EXPECT_TRUE(declared.count((*m)[1].str()))
            << e.path() << " reads " << (*m)[1].str() << ", which core/env.cpp does not declare";
    }
  }
  EXPECT_GT(files, 50);
}

TEST(EnvTable, ReadsTheEnvironmentAndRefusesUndeclaredNames) {
  unsetenv("RINGTRAIN_DIRECT_READ");
  EXPECT_EQ(env::raw("RINGTRAIN_DIRECT_READ"), nullptr);
  EXPECT_EQ(env::value("RINGTRAIN_DIRECT_READ"), "1");    // the table's default
  EXPECT_EQ(env::value("RINGTRAIN_RANKS_PER_NODE"), "");  // "unset"
  setenv("RINGTRAIN_DIRECT_READ", "0", 1);
  EXPECT_EQ(std::string(env::raw("RINGTRAIN_DIRECT_READ")), "0");
  EXPECT_EQ(env::value("RINGTRAIN_DIRECT_READ"), "0");
  unsetenv("RINGTRAIN_DIRECT_READ");
  try {
    env::raw("RINGTRAIN_NOT_DECLARED");
    FAIL() << "an undeclared name was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::runtime);
    EXPECT_NE(std::string(e.what()).find("RINGTRAIN_NOT_DECLARED"), std::string::npos) << e.what();
  }
}

// The message of the input error fn() throws ("" when it throws none).
template <typename Fn>
std::string input_error(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  return "";
}

TEST(EnvTable, ValuesTheDocsRefuseAreInputErrors) {
  const struct {
    const char *name, *value, *message;
    std::function<void()> read;
  } cases[] = {
      {"RINGTRAIN_DIRECT_READ", "2", "RINGTRAIN_DIRECT_READ='2' is not valid; expected 0 or 1",
       [] { env::direct_read(); }},
      {"RINGTRAIN_VERBOSE", "2", "RINGTRAIN_VERBOSE='2' is not valid; expected 0 or 1",
       [] { env::verbose(); }},
      {"RINGTRAIN_CHECKPOINT_DIRECT", "yes",
       "RINGTRAIN_CHECKPOINT_DIRECT='yes' is not valid; expected 0 or 1",
       [] { env::checkpoint_direct(); }},
      {"RINGTRAIN_CUDA_GEMM_WORKSPACE_MB", "-1",
       "RINGTRAIN_CUDA_GEMM_WORKSPACE_MB='-1' is not valid; expected an integer from 0 to 65536 "
       "(MiB)",
       [] { env::cuda_gemm_workspace_mb(); }},
      {"RINGTRAIN_CUDA_CONV_WORKSPACE_MB", "99999999999999999999",
       "RINGTRAIN_CUDA_CONV_WORKSPACE_MB='99999999999999999999' is not valid",
       [] { env::cuda_conv_workspace_mb(); }},
      {"RINGTRAIN_RANKS_PER_NODE", "0", "RINGTRAIN_RANKS_PER_NODE='0' is not valid",
       [] { env::ranks_per_node(); }},
      {"RINGTRAIN_GEMM", "mkl",
       "RINGTRAIN_GEMM='mkl' is not valid; expected auto, onednn or openblas", [] { env::gemm(); }},
      {"RINGTRAIN_CUDA_GEMM", "lt", "RINGTRAIN_CUDA_GEMM='lt' is not valid; expected gemmex",
       [] { env::cuda_gemm(); }},
      {"RINGTRAIN_TEST_STALL", "1:3",
       "RINGTRAIN_TEST_STALL='1:3' is not valid; expected "
       "RANK:STEP:SECONDS[:gather|:reduce]",
       [] { env::test_stall(); }},
  };
  for (const auto& c : cases) {
    setenv(c.name, c.value, 1);
    const std::string by_accessor = input_error(c.read), by_check = input_error(env::check_all);
    unsetenv(c.name);
    EXPECT_NE(by_accessor.find(c.message), std::string::npos)
        << c.name << "=" << c.value << ": '" << by_accessor << "'";
    EXPECT_EQ(by_check, by_accessor) << c.name << "=" << c.value;
  }
  EXPECT_EQ(input_error(env::check_all), "");
}

TEST(EnvTable, AccessorsReturnTheTablesDefaultsAndTheValuesSet) {
  // With nothing set, every accessor answers its row's default (which the row's own check
  // accepts), so no reader needs to know it.
  for (const auto& s : env::settings()) {
    ASSERT_EQ(std::getenv(s.name), nullptr) << s.name;
    if (std::string(s.default_value) != "unset" && s.kind != env::Kind::script) {
      EXPECT_EQ(input_error([&] { env::check(s, s.default_value); }), "") << s.name;
    }
    if (s.kind == env::Kind::integer && std::string(s.default_value) == "unset") {
      EXPECT_GE(s.min, 1) << s.name << ": 0 stands for unset, so it cannot be a value";
    }
  }
  EXPECT_TRUE(env::direct_read());
  EXPECT_FALSE(env::verbose());
  EXPECT_EQ(env::gemm(), "auto");
  EXPECT_EQ(env::cuda_gemm(), "");
  EXPECT_EQ(env::cuda_gemm_workspace_mb(), 32);
  EXPECT_EQ(env::ranks_per_node(), 0);
  EXPECT_EQ(env::test_stall(), "");
  setenv("RINGTRAIN_DIRECT_READ", "0", 1);
  setenv("RINGTRAIN_CUDA_GEMM_WORKSPACE_MB", "0", 1);
  setenv("RINGTRAIN_TEST_STALL", "1:3:0.5:gather", 1);
  setenv("RINGTRAIN_VERBOSE", "", 1);  // empty: unset
  EXPECT_FALSE(env::direct_read());
  EXPECT_EQ(env::cuda_gemm_workspace_mb(), 0);
  EXPECT_EQ(env::test_stall(), "1:3:0.5:gather");
  EXPECT_FALSE(env::verbose());
  EXPECT_EQ(input_error(env::check_all), "");
  for (const char* n : {"RINGTRAIN_DIRECT_READ", "RINGTRAIN_CUDA_GEMM_WORKSPACE_MB",
                        "RINGTRAIN_TEST_STALL", "RINGTRAIN_VERBOSE"})
    unsetenv(n);
}

TEST(EnvTable, NoSourceReadsTheEnvironmentAroundTheAccessors) {
  // A getenv of a RINGTRAIN_* name, or env::raw/env::value outside the table, would read a
  // setting without its check and restate its default; and one launcher variable is read
  // in one place.
  const std::regex around(R"re((getenv\s*\(\s*"RINGTRAIN_|env::(raw|value)\s*\())re");
  const std::regex ompi_size(R"re(getenv\s*\(\s*"OMPI_COMM_WORLD_SIZE")re");
  int ompi_reads = 0;
  for (const char* dir : {"core", "kernels", "comm", "io", "launch", "train", "nn"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(
             std::filesystem::path(RINGTRAIN_SOURCE_DIR) / dir)) {
      const auto ext = e.path().extension();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
      const std::string text = read_text(e.path());
      ompi_reads += int(std::distance(std::sregex_iterator(text.begin(), text.end(), ompi_size),
                                      std::sregex_iterator()));
      if (e.path().filename() == "env.cpp" || e.path().filename() == "env.hpp") continue;
      for (std::sregex_iterator m(text.begin(), text.end(), around), none; m != none; ++m)
        ADD_FAILURE() << e.path() << " reads the environment with '" << m->str()
                      << "'; call the setting's accessor in core/env.hpp";
    }
  }
  EXPECT_EQ(ompi_reads, 1) << "getenv(\"OMPI_COMM_WORLD_SIZE\") outside started_by_mpirun()";
}

TEST(EnvTable, UnknownVariablesAreNamedWithTheNearestSetting) {
  EXPECT_TRUE(env::unknown_settings().empty());  // the test main cleared RINGTRAIN_*
  setenv("RINGTRAIN_GEM", "onednn", 1);
  setenv("RINGTRAIN_ZZZ_NOTHING_LIKE_IT", "1", 1);
  setenv("RINGTRAIN_CONV", "im2col", 1);  // declared: not reported
  const auto unknown = env::unknown_settings();
  unsetenv("RINGTRAIN_GEM");
  unsetenv("RINGTRAIN_ZZZ_NOTHING_LIKE_IT");
  unsetenv("RINGTRAIN_CONV");
  ASSERT_EQ(unknown, (std::vector<std::string>{"RINGTRAIN_GEM", "RINGTRAIN_ZZZ_NOTHING_LIKE_IT"}));
  EXPECT_EQ(env::unknown_settings_message(unknown),
            "RINGTRAIN_GEM is not a ringtrain setting (did you mean RINGTRAIN_GEMM?); "
            "RINGTRAIN_ZZZ_NOTHING_LIKE_IT is not a ringtrain setting");
  EXPECT_EQ(env::unknown_settings_message({}), "");
}

}  // namespace
}  // namespace ringtrain
