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
  RT_REQUIRE(std::filesystem::is_regular_file(path), "IDX file '", path, "' does not exist");
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
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t b[4];
    read_exact(b, 4);
    a.shape.push_back(int64_t(b[0]) << 24 | int64_t(b[1]) << 16 | int64_t(b[2]) << 8 | b[3]);
  }
  a.data.resize(size_t(shape_numel(a.shape)));
  read_exact(a.data.data(), a.data.size());
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
