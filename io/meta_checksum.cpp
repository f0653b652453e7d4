// The checkpoint metadata checksum (see meta_checksum.hpp). Canonical form, one record per
// attribute of the root or of a group, records sorted bytewise by key and concatenated:
//   KEY \0 TYPE VALUES \0
// KEY is the group path and the name ("/step", "/loss_scaler/scale"); TYPE is i (integers,
// in decimal), f (floats, the 16 lowercase hex digits of each value's float64 bits), s (a
// string, its bytes) or x (any other type, no values); several values are comma-separated.
#include "io/meta_checksum.hpp"

#include <zlib.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "io/hdf5.hpp"

namespace ringtrain::io {
namespace {

struct Collect {
  std::string group;                         // "" for the root, else "/name"
  std::map<std::string, std::string>* recs;  // key -> record
};

std::string values_text(hid_t attr, hid_t obj, const char* name) {
  H5Id type(H5_CHECK(H5Aget_type(attr)));
  H5Id space(H5_CHECK(H5Aget_space(attr)));
  const hssize_t n = std::max<hssize_t>(H5_CHECK(H5Sget_simple_extent_npoints(space)), 0);
  std::string out;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      std::vector<int64_t> v(static_cast<size_t>(n));
      if (n) H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, v.data()));
      out = "i";
      for (size_t k = 0; k < v.size(); ++k) out += cat(k ? "," : "", v[k]);
      return out;
    }
    case H5T_FLOAT: {
      std::vector<double> v(static_cast<size_t>(n));
      if (n) H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()));
      out = "f";
      for (size_t k = 0; k < v.size(); ++k) {
        uint64_t bits;
        std::memcpy(&bits, &v[k], 8);
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016" PRIx64, bits);
        out += cat(k ? "," : "", hex);
      }
      return out;
    }
    case H5T_STRING:
      if (n == 1) return "s" + read_attr_string(obj, name).value_or("");
      return "x";
    default:
      return "x";
  }
}

herr_t on_attr(hid_t obj, const char* name, const H5A_info_t*, void* data) {
  auto* c = static_cast<Collect*>(data);
  const std::string key = c->group + "/" + name;
  if (key == std::string("/") + kMetaChecksumAttr) return 0;
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (attr.get() < 0) return -1;
  (*c->recs)[key] = key + '\0' + values_text(attr, obj, name) + '\0';
  return 0;
}

herr_t on_object(hid_t loc, const char* name, const H5O_info_t* info, void* data) {
  if (info->type != H5O_TYPE_GROUP) return 0;
  auto* c = static_cast<Collect*>(data);
  H5Id obj(H5Oopen(loc, name, H5P_DEFAULT));
  if (obj.get() < 0) return -1;
  c->group = std::strcmp(name, ".") == 0 ? "" : cat("/", name);
  hsize_t idx = 0;
  return H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, on_attr, c) < 0 ? -1 : 0;
}

}  // namespace

uint32_t meta_checksum(hid_t file) {
  H5Lock lock;
  std::map<std::string, std::string> recs;
  Collect c{"", &recs};
  H5_CHECK(H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, on_object, &c, H5O_INFO_BASIC));
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [key, rec] : recs)
    crc = crc32(crc, reinterpret_cast<const Bytef*>(rec.data()), uInt(rec.size()));
  return uint32_t(crc);
}

void write_meta_checksum(hid_t file) {
  write_attr(file, kMetaChecksumAttr, int64_t(meta_checksum(file)));
}

std::string meta_checksum_problem(hid_t file) {
  const auto stored = read_attr_int(file, kMetaChecksumAttr);
  if (!stored) {
    if (has_attr(file, kMetaChecksumAttr))
      return cat("attribute '", kMetaChecksumAttr, "' is not an integer");
    return "";
  }
  const uint32_t have = meta_checksum(file);
  if (*stored == int64_t(have)) return "";
  return cat("its metadata (root and group attributes) fails its checksum: meta_checksum is ",
             *stored, " but the attributes give ", have,
             "; an attribute changed after the save (a bit flip or an edit)");
}

}  // namespace ringtrain::io
