// Chrome-trace timeline (see timeline.hpp).
#include "train/timeline.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "comm/mpi/mpi_check.hpp"
#include "core/error.hpp"

namespace ringtrain::launch {

std::pair<int64_t, int64_t> parse_step_window(const std::string& s) {
  long long a = 0, b = 0;
  char tail = 0;
  RT_REQUIRE(std::sscanf(s.c_str(), "%lld:%lld%c", &a, &b, &tail) == 2 && a >= 1 && b >= a,
             "--timeline-steps '", s, "' is not valid; expected A:B with 1 <= A <= B, e.g. 10:20");
  return {a, b};
}

void check_timeline_path(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    RT_REQUIRE(!std::filesystem::is_directory(path, ec), "--timeline '", path,
               "' is a directory; expected a file name");
    RT_REQUIRE(access(path.c_str(), W_OK) == 0, "--timeline '", path,
               "' cannot be written: ", std::strerror(errno));
    return;
  }
  FILE* f = std::fopen(path.c_str(), "w");  // created and removed: nothing left if unused
  RT_REQUIRE(f, "--timeline '", path, "' cannot be created: ", std::strerror(errno));
  std::fclose(f);
  std::remove(path.c_str());
}

Timeline::Timeline(MPI_Comm comm, std::string path, int64_t first_step, int64_t last_step)
    : path_(std::move(path)), first_(first_step), last_(last_step) {
  if (path_.empty()) return;
  MPI_Comm_rank(comm, &rank_);
  MPI_CHECK(MPI_Barrier(comm));
  zero_ = Clock::now();
  char meta[256];
  std::snprintf(
      meta, sizeof meta,
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"main\"}},"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":"
      "\"communication\"}}",
      rank_, rank_, rank_, rank_);
  events_ = meta;
}

void Timeline::span(const std::string& name, const char* category, int tid, Clock::time_point t0,
                    Clock::time_point t1, int64_t step) {
  using us = std::chrono::duration<double, std::micro>;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                ",{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                "\"dur\":%.3f,\"args\":{\"step\":%lld}}",
                name.c_str(), category, rank_, tid, us(t0 - zero_).count(), us(t1 - t0).count(),
                static_cast<long long>(step));
  events_ += buf;
  ++spans_;
}

std::string Timeline::write(MPI_Comm comm) {
  if (path_.empty()) return "";
  int size = 1;
  MPI_Comm_size(comm, &size);
  unsigned long long spans = spans_, all_spans = 0;
  MPI_CHECK(MPI_Reduce(&spans, &all_spans, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, comm));
  int mine = int(events_.size());
  std::vector<int> sizes(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm));
  std::string all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[size_t(r)] = total;
      total += sizes[size_t(r)];
    }
    all.resize(size_t(total));
  }
  MPI_CHECK(MPI_Gatherv(events_.data(), mine, MPI_CHAR, all.data(), sizes.data(), displs.data(),
                        MPI_CHAR, 0, comm));
  if (rank_ != 0) return "";
  if (all_spans == 0) {  // e.g. resumed after the window: keep whatever trace is there
    std::fprintf(stderr,
                 "ringtrain: warning: no step of --timeline-steps %lld:%lld ran in this run "
                 "(it resumed after them or ended before them); '%s' was not written%s\n",
                 static_cast<long long>(first_), static_cast<long long>(last_), path_.c_str(),
                 std::filesystem::exists(path_) ? " and still holds the earlier trace" : "");
    return "";
  }
  // Each rank's part starts with its metadata object; join the parts with commas.
  std::string joined;
  for (int r = 0; r < size; ++r) {
    if (r) joined += ",";
    joined.append(all, size_t(displs[size_t(r)]), size_t(sizes[size_t(r)]));
  }
  // stdio, not a stream: every failure (open, a full disk at write or at close) has an errno.
  const std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[" + joined + "]}\n";
  FILE* f = std::fopen(path_.c_str(), "w");
  if (!f)
    throw Error(ErrorKind::runtime, cat("--timeline '", path_,
                                        "' cannot be opened for writing: ", std::strerror(errno)));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool flushed = std::fflush(f) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !flushed || !closed)
    throw Error(ErrorKind::runtime, cat("--timeline '", path_, "': writing the trace failed: ",
                                        std::strerror(!wrote     ? write_errno
                                                      : !flushed ? flush_errno
                                                                 : errno)));
  return path_;
}

}  // namespace ringtrain::launch
