// require_regular_file (see files.hpp).
#include "core/files.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace ringtrain {

uint64_t require_regular_file(const std::string& path, const std::string& role,
                              const std::string& expected) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  RT_REQUIRE(fs::exists(st), role, " '", path, "' does not exist");
  RT_REQUIRE(!fs::is_directory(st), role, " '", path, "' is a directory; expected ", expected);
  RT_REQUIRE(fs::is_regular_file(st), role, " '", path, "' is not a regular file; expected ",
             expected);
  RT_REQUIRE(access(path.c_str(), R_OK) == 0, role, " '", path,
             "' cannot be read: ", std::strerror(errno));
  const uintmax_t size = fs::file_size(path, ec);
  RT_REQUIRE(!ec, role, " '", path, "' cannot be read: ", ec.message());
  return uint64_t(size);
}

}  // namespace ringtrain
