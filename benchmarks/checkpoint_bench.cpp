// checkpoint_bench: checkpoint write throughput against a raw sequential write of the same
// number of bytes with fsync, on the same file system, in the same run. Run under mpirun:
// all ranks write the checkpoint together (parallel HDF5, as training does); the reference
// is rank 0 writing one plain file with write() in 8 MiB blocks, then fsync. Sizes: the
// MLP's training state (params + AdamW moments, 6.4 MB) and larger states. Median of 3.
// Also the time to read the state back on every rank, as a resume does. Each state is saved
// both ways the writer can store chunks, alternating: "direct" (pwritev of each chunk and its
// Fletcher32, the default) and "pipeline" (RINGTRAIN_CHECKPOINT_DIRECT=0: H5Dwrite through
// HDF5's Fletcher32 filter). Then the same state saved with --async-checkpoint's writer
// (train/async_checkpoint.hpp): the seconds training is blocked (the staging copy) against
// the synchronous save's, and the background write's own seconds. The read-back is
// compared with a raw read() of the file's bytes on every rank; --cold drops the page cache
// (echo 3 > /proc/sys/vm/drop_caches, root) before each read and each raw read.
//   usage: mpirun -n N checkpoint_bench [--dir DIR] [--json] [--cold]
#include <fcntl.h>
#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/hdf5.hpp"
#include "train/async_checkpoint.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace ringtrain;

namespace {

double median3(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double raw_write(const std::string& path, uint64_t bytes) {
  std::vector<char> block(8 << 20, 'x');
  const auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = size_t(std::min<uint64_t>(block.size(), bytes - done));
    if (::write(fd, block.data(), n) != ssize_t(n)) std::perror("write");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  fs::remove(path);
  return s;
}

// Every rank reads the whole file with read() in 8 MiB blocks, as a resume of replicated state
// reads all of it on every rank; the slowest rank's seconds.
double raw_read(const std::string& path) {
  std::vector<char> block(8 << 20);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --cold: the page cache dropped (one rank per node would do; every rank writes, harmlessly).
void drop_caches(bool cold) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (!cold) return;
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0 || ::write(fd, "3\n", 2) != 2) std::perror("--cold: /proc/sys/vm/drop_caches");
  if (fd >= 0) ::close(fd);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  // As ringtrain's main() does: HDF5's ~1 MiB chunk buffers come from the heap instead of
  // fresh zeroed mmap pages on every chunk (perf: 15% of a save in clear_page).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  int provided = 0;  // the async writer's thread calls MPI, as in training
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  io::silence_hdf5_errors();
  std::string dir = "build/ckpt-bench";
  bool json = false, cold = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--json")
      json = true;
    else if (a == "--cold")
      cold = true;
    else {
      if (rank == 0)
        std::fprintf(stderr, "usage: checkpoint_bench [--dir DIR] [--json] [--cold]\n");
      MPI_Finalize();
      return a == "--help" ? 0 : 1;
    }
  }
  // (name, parameters): each saved with two AdamW moments, like training does.
  const std::vector<std::pair<const char*, int64_t>> cases = {
      {"mlp-784-512-256-10", 535818}, {"8M-params", 8 << 20}, {"32M-params", 32 << 20}};
  if (rank == 0 && !json)
    std::printf(
        "# checkpoint write (parallel HDF5, %d rank(s), fsync + rename) vs raw write + fsync;\n"
        "# async: blocking_s (staging copy) vs the direct save's ckpt_s; read (%s) vs raw read\n"
        "%-20s %-9s %12s %10s %12s %10s %7s %8s %8s %9s %8s %10s %9s\n",
        size, cold ? "cold" : "page cache", "state", "writer", "bytes", "ckpt_s", "ckpt_MB/s",
        "raw_MB/s", "ratio", "read_s", "direct", "rawread_s", "read_x", "blocking_s", "block_x");
  if (rank == 0 && json) std::printf("[");
  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t n = cases[c].second;
    // Four layers' worth of parameters with realistic shapes: rows of 1024 values.
    std::vector<float> p(size_t(n), 0.5f), m(size_t(n), 0.25f), v(size_t(n), 0.125f);
    std::vector<io::NamedTensor> params;
    std::vector<io::OptimizerState> opt = {{"exp_avg", {}}, {"exp_avg_sq", {}}};
    const int64_t cols = 1024, rows = n / cols, tail = n - rows * cols;
    params.push_back({"w", Tensor(p.data(), {rows, cols}, DType::f32)});
    opt[0].per_param.push_back({"w", Tensor(m.data(), {rows, cols}, DType::f32)});
    opt[1].per_param.push_back({"w", Tensor(v.data(), {rows, cols}, DType::f32)});
    if (tail) {
      params.push_back({"b", Tensor(p.data() + rows * cols, {tail}, DType::f32)});
      opt[0].per_param.push_back({"b", Tensor(m.data() + rows * cols, {tail}, DType::f32)});
      opt[1].per_param.push_back({"b", Tensor(v.data() + rows * cols, {tail}, DType::f32)});
    }
    io::CheckpointMeta meta;
    meta.model = "{}";
    meta.precision = "fp32";
    meta.ringtrain_version = "bench";
    meta.optimizer = "adamw";
    meta.world_size = size;
    io::CheckpointStore store(dir, 1);
    const char* writers[2] = {"direct", "pipeline"};
    std::array<std::vector<double>, 2> ckpt, raw, read, rawread;
    std::array<int64_t, 2> direct_chunks{};
    uint64_t bytes = 0;
    for (int rep = 0; rep < 3; ++rep) {
      for (int w = 0; w < 2; ++w) {
        if (w)
          setenv("RINGTRAIN_CHECKPOINT_DIRECT", "0", 1);
        else
          unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
        meta.step = 2 * rep + w + 1;
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        const uint64_t b = store.save(MPI_COMM_WORLD, meta, params, opt);
        MPI_Barrier(MPI_COMM_WORLD);
        ckpt[w].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        direct_chunks[w] = store.last_direct_chunks();
        // Reading it back, as a resume does on every rank: parameters and optimizer state.
        drop_caches(cold);
        const auto t1 = Clock::now();
        io::read_checkpoint_params(store.path_for(meta.step), params);
        io::read_checkpoint_optimizer(store.path_for(meta.step), opt);
        MPI_Barrier(MPI_COMM_WORLD);
        read[w].push_back(std::chrono::duration<double>(Clock::now() - t1).count());
        drop_caches(cold);
        rawread[w].push_back(raw_read(store.path_for(meta.step)));
        if (rank == 0) {
          bytes = b;
          raw[w].push_back(raw_write(dir + "/raw.bin", bytes));
        }
      }
    }
    unsetenv("RINGTRAIN_CHECKPOINT_DIRECT");
    // The asynchronous writer on the same state: what the caller waits for (the copy into
    // staging) and the background write (wait() right after; nothing trains meanwhile).
    std::vector<double> blocking, background;
    {
      launch::AsyncCheckpointer async(store, MPI_COMM_WORLD, {params, opt, {}});
      for (int rep = 0; rep < 3; ++rep) {
        meta.step = 100 + rep;
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        async.start(meta, {params, opt, {}});
        const auto t1 = Clock::now();
        async.wait();
        MPI_Barrier(MPI_COMM_WORLD);
        blocking.push_back(std::chrono::duration<double>(t1 - t0).count());
        background.push_back(async.take_finished()->seconds);
      }
    }
    double max_blocking = median3(blocking);  // the slowest rank's
    MPI_Allreduce(MPI_IN_PLACE, &max_blocking, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    for (int w = 0; w < 2 && rank == 0; ++w) {
      const double cs = median3(ckpt[w]), rs = median3(raw[w]), rd = median3(read[w]);
      const double rr = median3(rawread[w]);
      const double cmb = double(bytes) / cs / 1e6, rmb = double(bytes) / rs / 1e6;
      if (json)
        std::printf(
            "%s{\"state\":\"%s\",\"writer\":\"%s\",\"ranks\":%d,\"bytes\":%llu,"
            "\"ckpt_s\":%.4f,\"ckpt_MBps\":%.1f,\"raw_MBps\":%.1f,\"ratio\":%.3f,"
            "\"read_s\":%.4f,\"direct_chunks_rank0\":%lld,\"raw_read_s\":%.4f,"
            "\"read_vs_raw\":%.3f,\"cold\":%s",
            c || w ? "," : "", cases[c].first, writers[w], size,
            static_cast<unsigned long long>(bytes), cs, cmb, rmb, cmb / rmb, rd,
            static_cast<long long>(direct_chunks[w]), rr, rr / rd, cold ? "true" : "false");
      if (json && w == 0)
        std::printf(
            ",\"async_blocking_s\":%.4f,\"async_background_s\":%.4f,"
            "\"blocking_vs_sync\":%.4f}",
            max_blocking, median3(background), max_blocking / cs);
      else if (json)
        std::printf("}");
      else
        std::printf("%-20s %-9s %12llu %10.3f %12.1f %10.1f %7.3f %8.3f %8lld %9.3f %8.3f %s\n",
                    cases[c].first, writers[w], static_cast<unsigned long long>(bytes), cs, cmb,
                    rmb, cmb / rmb, rd, static_cast<long long>(direct_chunks[w]), rr, rr / rd,
                    w == 0 ? cat(max_blocking, " ", max_blocking / cs, " (async write ",
                                 median3(background), " s)")
                                 .c_str()
                           : "");
    }
  }
  if (rank == 0 && json) std::printf("]\n");
  if (rank == 0) fs::remove_all(dir);
  MPI_Finalize();
  return 0;
}
