// The include direction between the two top folders (docs/architecture.md, "Layers"): the CLI
// in launch/ includes the training run in train/, and nothing in train/ includes launch/, so
// rt_train builds and links without the CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

namespace ringtrain {
namespace {

TEST(Layout, TrainIncludesNothingOfLaunch) {
  const std::regex include_launch(R"re(#\s*include\s*"launch/[^"]*")re");
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(
           std::filesystem::path(RINGTRAIN_SOURCE_DIR) / "train")) {
    const auto ext = e.path().extension();
    if (ext != ".cpp" && ext != ".hpp") continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (std::regex_search(line, include_launch))
        ADD_FAILURE() << e.path().string() << ":" << n << " includes a launch/ header ('" << line
                      << "'); train/ must not depend on the CLI: move what both need to train/";
  }
  EXPECT_GT(files, 20) << "train/ not found under " << RINGTRAIN_SOURCE_DIR;
}

}  // namespace
}  // namespace ringtrain
