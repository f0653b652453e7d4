// The check every command makes before it opens a file named on its command line (--data,
// --model, --config, convert inputs): the path must be a regular file this process may read.
// A directory reads as empty, a FIFO or a terminal blocks the first read forever, and
// /dev/zero never ends: each is refused with a message instead.
#pragma once

#include <cstdint>
#include <string>

namespace ringtrain {

// Input error unless `path` is an existing, readable regular file (symlinks followed);
// messages are "ROLE 'PATH' does not exist", "... is a directory; expected EXPECTED",
// "... is not a regular file; expected EXPECTED" and "... cannot be read: WHY". Returns the
// file's size in bytes.
uint64_t require_regular_file(const std::string& path, const std::string& role,
                              const std::string& expected);

}  // namespace ringtrain
