// Safetensors read (memory-mapped) and write (see safetensors.hpp). The header is parsed
// with nlohmann-json; every offset, dtype and shape is checked against the file size before
// any tensor byte is touched, so a damaged or truncated file is an input error, never a read
// outside the map.
#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/output_file.hpp"

namespace ringtrain::io {
namespace {

// Bytes per element of the dtypes read, 0 for any other.
int64_t element_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string what = cat("safetensors file '", path, "'");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RT_REQUIRE(fd >= 0, "cannot open ", what, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_input(cat(what, " is not a regular file"));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw_input(cat("cannot map ", what, ": ", std::strerror(errno)));
  }
  RT_REQUIRE(size_ >= 8, what, " is truncated: ", size_,
             " bytes, fewer than the 8 of the header length");
  const auto* bytes = static_cast<const unsigned char*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  RT_REQUIRE(header_len <= size_ - 8, what, " is truncated: its header declares ", header_len,
             " bytes but the file has ", size_ - 8, " after the length");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const std::exception& e) {
    throw_input(cat(what, ": the header is not JSON: ", e.what()));
  }
  RT_REQUIRE(header.is_object(), what, ": the header is not a JSON object");
  const unsigned char* data = bytes + 8 + header_len;
  const uint64_t data_bytes = size_ - 8 - header_len;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = cat(what, ": tensor '", name, "'");
    RT_REQUIRE(v.is_object() && v.contains("dtype") && v["dtype"].is_string() &&
                   v.contains("shape") && v["shape"].is_array() && v.contains("data_offsets") &&
                   v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
               where, " lacks dtype, shape or data_offsets [begin, end]");
    SafetensorsEntry e;
    e.dtype = v["dtype"].get<std::string>();
    const int64_t eb = element_bytes(e.dtype);
    RT_REQUIRE(eb > 0, where, " has dtype ", e.dtype, "; expected F32, F16, BF16 or F64");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      RT_REQUIRE(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 40), where,
                 " has a dimension that is not a size: ", d.dump());
      e.shape.push_back(int64_t(d.get<uint64_t>()));
      numel *= d.get<uint64_t>();
      RT_REQUIRE(numel < (uint64_t(1) << 40), where, " has too many elements");
    }
    const auto& off = v["data_offsets"];
    RT_REQUIRE(off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
               " has data_offsets that are not sizes: ", off.dump());
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    RT_REQUIRE(begin <= end && end <= data_bytes, where, " has data_offsets [", begin, ", ", end,
               "] outside the ", data_bytes, " bytes of data (a truncated file?)");
    RT_REQUIRE(end - begin == numel * uint64_t(eb), where, " has ", end - begin,
               " bytes but its shape ", shape_str(e.shape), " of ", e.dtype, " needs ",
               numel * uint64_t(eb));
    e.data = data + begin;
    tensors_.emplace(name, std::move(e));
  }
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), size_(o.size_), tensors_(std::move(o.tensors_)) {
  o.map_ = nullptr;
  o.size_ = 0;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void safetensors_read_f32(const SafetensorsEntry& e, int64_t first, int64_t count, float* out) {
  if (e.dtype == "F32") {
    std::memcpy(out, e.data + first * 4, size_t(count) * 4);
  } else if (e.dtype == "BF16") {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, e.data + (first + i) * 2, 2);
      const uint32_t bits = uint32_t(h) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  } else if (e.dtype == "F16") {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, e.data + (first + i) * 2, 2);
      out[i] = half_to_float(h);
    }
  } else {  // F64
    for (int64_t i = 0; i < count; ++i) {
      double d;
      std::memcpy(&d, e.data + (first + i) * 8, 8);
      out[i] = float(d);
    }
  }
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = uint64_t(shape_numel(t.shape)) * 4;
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t total = 8 + text.size() + offset;
  write_outputs({path}, [&](std::string*) {
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    RT_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
    // Every byte is reserved before it is written through the map: a full disk is an error
    // here, not a SIGBUS later.
    const int err = ::posix_fallocate(fd, 0, off_t(total));
    if (err != 0) {
      ::close(fd);
      throw_runtime(__FILE__, __LINE__, cat("writing '", tmp, "': ", std::strerror(err)));
    }
    void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    RT_CHECK(map != MAP_FAILED, "cannot map '", tmp, "': ", std::strerror(errno));
    auto* out = static_cast<unsigned char*>(map);
    const uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    std::memcpy(out + 8, text.data(), text.size());
    float* data = reinterpret_cast<float*>(out + 8 + text.size());  // 8-byte aligned
    try {
      for (const auto& t : tensors) {
        t.fill(data);
        data += shape_numel(t.shape);
      }
    } catch (...) {
      ::munmap(map, total);
      throw;
    }
    const bool synced = ::msync(map, total, MS_SYNC) == 0;
    const int sync_errno = errno;
    ::munmap(map, total);
    RT_CHECK(synced, "msync '", tmp, "': ", std::strerror(sync_errno));
  });
}

}  // namespace ringtrain::io
