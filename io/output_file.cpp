// Safe output files and the full-disk message (see output_file.hpp).
#include "io/output_file.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

// The directory a path's file system is asked about: the path's parent, or the nearest
// existing ancestor of it.
std::string holding_dir(const std::string& path) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  while (!fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir)
    dir = dir.parent_path();
  return dir.string();
}

// fsync of a path, returning the errno of a failure (0 when fine).
int fsync_errno(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  // A directory on some file systems refuses fsync; that is not a failed write.
  return rc == 0 || err == EINVAL || err == EROFS ? 0 : err;
}

}  // namespace

bool no_space_errno(int err) { return err == ENOSPC || err == EDQUOT; }

int64_t free_bytes(const std::string& path) {
  struct statvfs st {};
  const std::string dir = fs::is_directory(path) ? path : holding_dir(path);
  if (statvfs(dir.c_str(), &st) != 0) return -1;
  return int64_t(st.f_bavail) * int64_t(st.f_frsize);
}

bool failed_for_space(const std::string& path, const std::string& cause) {
  // The words each layer uses: strerror (ENOSPC, EDQUOT), HDF5's sec2 driver ("errno =
  // 28"), Open MPI's MPI-IO error classes.
  for (const char* words : {"No space left on device", "Disk quota exceeded", "errno = 28",
                            "errno = 122", "MPI_ERR_NO_SPACE", "MPI_ERR_QUOTA", "ENOSPC"})
    if (cause.find(words) != std::string::npos) return true;
  const int64_t left = free_bytes(path);
  return left >= 0 && left < (int64_t(1) << 20);
}

std::string full_disk_note(const std::string& path) {
  const int64_t left = free_bytes(path);
  // Much free space and still ENOSPC: a quota, a device like /dev/full, or space freed since.
  const std::string detail = left >= 0 && left < (int64_t(1) << 20)
                                 ? cat(left / 1024, " KiB free")
                                 : std::string("no space left on device or quota exceeded");
  return cat("the file system holding '", holding_dir(path), "' is full (ENOSPC, ", detail, ")");
}

std::string disk_full_message(const std::string& doing, const std::string& path,
                              const std::string& after) {
  return cat(doing, " '", path, "' failed; ", full_disk_note(path), after.empty() ? "" : "; ",
             after);
}

void throw_disk_full(const std::string& doing, const std::string& path, const std::string& after) {
  throw Error(ErrorKind::runtime, disk_full_message(doing, path, after));
}

void rethrow_write_failure(const std::string& path, const std::function<void()>& remove) {
  std::string message;
  try {
    throw;
  } catch (const Error& e) {
    if (failed_for_space(path, e.what()))
      message = disk_full_message("writing", path, "nothing was written");
  } catch (...) {
  }
  remove();
  if (!message.empty()) throw Error(ErrorKind::runtime, message);
  throw;
}

void write_outputs(const std::vector<std::string>& paths,
                   const std::function<void(std::string* current)>& write) {
  std::string current = paths.empty() ? std::string() : paths.front();
  size_t committed = 0;
  try {
    write(&current);
    for (const std::string& p : paths) {
      current = p;
      commit_output(p + ".tmp", p);
      ++committed;
    }
  } catch (...) {
    rethrow_write_failure(current, [&] {
      for (size_t i = 0; i < paths.size(); ++i)
        remove_quietly(paths[i] + (i < committed ? "" : ".tmp"));
    });
  }
}

void commit_output(const std::string& tmp, const std::string& path) {
  auto failed = [&](const char* step, int err) {
    if (no_space_errno(err)) throw_disk_full("writing", path, "nothing was written");
    throw_runtime(__FILE__, __LINE__,
                  cat(step, " '", tmp, "' (for '", path, "') failed: ", std::strerror(err)));
  };
  if (const int err = fsync_errno(tmp)) failed("fsync", err);
  if (::rename(tmp.c_str(), path.c_str()) != 0) failed("rename", errno);
  if (const int err = fsync_errno(holding_dir(path))) failed("fsync of the directory of", err);
}

void write_whole_file(const std::string& path,
                      std::initializer_list<std::pair<const void*, size_t>> pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (!no_space_errno(err))  // a directory that is missing or not writable: the user's to fix
      throw_input(cat("cannot create '", path, "': ", std::strerror(err)));
    throw_runtime(__FILE__, __LINE__, cat("cannot create '", path, "': ", std::strerror(err)));
  }
  for (const auto& [data, bytes] : pieces) {
    const char* p = static_cast<const char*>(data);
    for (size_t done = 0; done < bytes;) {
      const ssize_t n = ::write(fd, p + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;  // no progress: the device took nothing
        ::close(fd);
        throw_runtime(__FILE__, __LINE__, cat("writing '", path, "' failed: ", std::strerror(err)));
      }
      done += size_t(n);
    }
  }
  if (::close(fd) != 0)
    throw_runtime(__FILE__, __LINE__, cat("closing '", path, "' failed: ", std::strerror(errno)));
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

int reserve_output(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  int err = bytes == 0 ? 0 : ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, off_t(bytes));
  if (err != 0) err = errno;
  ::close(fd);
  if (err == EOPNOTSUPP || err == ENOSYS) {  // no reservations here: check what is free
    const int64_t left = free_bytes(path);
    err = left >= 0 && uint64_t(left) < bytes ? ENOSPC : 0;
  }
  return err;
}

void release_unused_reserve(const std::string& path) {
  // Truncating to its own size frees the blocks beyond the end (tmpfs, ext4, XFS).
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec) fs::resize_file(path, size, ec);
}

}  // namespace ringtrain::io
