// IDX files: a big-endian header (zero, zero, type 0x08 = uint8, number of dimensions,
// then each dimension as uint32) followed by the data. zlib's gz* functions read both
// compressed and plain files.
#include "io/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
#include "io/dataset.hpp"

namespace ringtrain::io {

IdxArray read_idx(const std::string& path) {
  RT_REQUIRE(std::filesystem::exists(path), "IDX file '", path, "' does not exist");
  RT_REQUIRE(std::filesystem::is_regular_file(path), "IDX file '", path,
             "' is not a regular file");  // a FIFO would block the read forever
  gzFile f = gzopen(path.c_str(), "rb");
  RT_REQUIRE(f, "IDX file '", path, "' cannot be opened");
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  auto read_exact = [&](void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = unsigned(std::min<size_t>(n - done, 1u << 30));
      int got = gzread(f, static_cast<char*>(dst) + done, chunk);
      RT_REQUIRE(got > 0, "IDX file '", path, "' is truncated or corrupt (read ", done, " of ", n,
                 " bytes)");
      done += size_t(got);
    }
  };
  uint8_t magic[4];
  read_exact(magic, 4);
  RT_REQUIRE(magic[0] == 0 && magic[1] == 0 && magic[3] >= 1 && magic[3] <= 4, "'", path,
             "' is not an IDX file (bad magic number)");
  RT_REQUIRE(magic[2] == 0x08, "IDX file '", path, "' holds element type 0x", std::hex,
             int(magic[2]), "; only unsigned bytes (0x08) are supported");
  IdxArray a;
  uint64_t bytes = 1;
  bool overflow = false;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t b[4];
    read_exact(b, 4);
    a.shape.push_back(int64_t(b[0]) << 24 | int64_t(b[1]) << 16 | int64_t(b[2]) << 8 | b[3]);
    overflow |= __builtin_mul_overflow(bytes, uint64_t(a.shape.back()), &bytes);
  }
  // The header's sizes are checked against the file before anything is allocated.
  RT_REQUIRE(!overflow, "IDX file '", path, "' declares shape ", shape_str(a.shape),
             ", whose size overflows 64 bits; the header is corrupt");
  RT_REQUIRE(bytes > 0, "IDX file '", path, "' declares shape ", shape_str(a.shape),
             ", which holds no values");
  const size_t header = 4 + 4 * size_t(magic[3]);
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (gzdirect(f)) {  // uncompressed: the file size is the truth
    RT_REQUIRE(!ec && bytes <= file_bytes - header, "IDX file '", path, "' declares shape ",
               shape_str(a.shape), " (", bytes, " bytes) but holds only ", file_bytes - header,
               " bytes of data; the file is truncated or its header is corrupt");
    a.data.resize(size_t(bytes));
    read_exact(a.data.data(), a.data.size());
    return a;
  }
  // Compressed: the size is known only by decompressing, so memory grows with the data
  // actually read rather than with what the header claims.
  constexpr size_t kPiece = size_t(64) << 20;
  while (a.data.size() < bytes) {
    const size_t have = a.data.size(), want = size_t(std::min<uint64_t>(kPiece, bytes - have));
    a.data.resize(have + want);
    const int got = gzread(f, a.data.data() + have, unsigned(want));
    RT_REQUIRE(got > 0, "IDX file '", path, "' declares shape ", shape_str(a.shape), " (", bytes,
               " bytes) but its compressed data ends after ", have,
               " bytes; the file is truncated or its header is corrupt");
    a.data.resize(have + size_t(got));
  }
  return a;
}

ConvertResult convert_idx(const std::string& images, const std::string& labels,
                          const std::string& out, int shards) {
  IdxArray im = read_idx(images);
  IdxArray lb = read_idx(labels);
  RT_REQUIRE(im.shape.size() == 3 || im.shape.size() == 2, "--images '", images, "' has shape ",
             shape_str(im.shape), "; expected [N, H, W] or [N, D]");
  RT_REQUIRE(lb.shape.size() == 1, "--labels '", labels, "' has shape ", shape_str(lb.shape),
             "; expected [N]");
  RT_REQUIRE(im.shape[0] > 0, "--images '", images, "' holds no images");
  RT_REQUIRE(lb.shape[0] == im.shape[0], "--labels '", labels, "' holds ", lb.shape[0],
             " labels but --images '", images, "' holds ", im.shape[0], " images");
  Shape shape = im.shape;
  if (shape.size() == 3) shape.insert(shape.begin() + 1, 1);  // one channel
  std::vector<int32_t> y(lb.data.begin(), lb.data.end());
  const int64_t classes = *std::max_element(y.begin(), y.end()) + 1;
  RT_REQUIRE(classes >= 2, "--labels '", labels, "' holds fewer than 2 classes");
  auto files = write_dataset_files(out, im.data.data(), shape, y.data(), classes, shards);
  return {shape[0], classes, Shape(shape.begin() + 1, shape.end()), files};
}

}  // namespace ringtrain::io
