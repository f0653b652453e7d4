// Reader for the IDX format of (Fashion-)MNIST, plain or gzip-compressed, and the
// `ringtrain convert idx` conversion into a dataset file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

struct IdxArray {
  Shape shape;                // e.g. [60000, 28, 28] or [60000]
  std::vector<uint8_t> data;  // unsigned bytes (the only element type MNIST uses)
};

// Input error naming the file when it is missing, not IDX, not uint8 or truncated.
IdxArray read_idx(const std::string& path);

struct ConvertResult {
  int64_t samples = 0;
  int64_t num_classes = 0;
  Shape sample_shape;
  std::vector<std::string> files;  // written, in order
};
// Images [N, H, W] become /images [N, 1, H, W]; labels must match N. With shards > 1 the
// samples go, in order, to files OUT-00000-of-0000S.h5 (OUT without its .h5).
ConvertResult convert_idx(const std::string& images, const std::string& labels,
                          const std::string& out, int shards = 1);

}  // namespace ringtrain::io
