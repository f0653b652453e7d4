// The environment-settings table (core/env.hpp): the docs list exactly the table, every
// RINGTRAIN_* name the sources read is declared, an undeclared name is refused, and an
// unknown variable in the environment is named with the setting it is closest to.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
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
  for (const char* dir : {"core", "kernels", "comm", "io", "launch", "nn"}) {
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
