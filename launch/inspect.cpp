// `ringtrain inspect FILE.h5`: what a dataset or checkpoint holds (attributes, datasets,
// dtypes, shapes, checksums) and, for a checkpoint, whether it is valid; `inspect --schema`:
// the checkpoint schema's tables (io/checkpoint_schema.hpp). A checkpoint's attributes are
// printed against the schema: an attribute of another type than it declares is marked.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "io/checkpoint.hpp"
#include "io/checkpoint_schema.hpp"
#include "io/hdf5.hpp"
#include "launch/commands.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {
namespace {

// The n values of an attribute of class `cls` as text (strings quoted), whatever its type
// and size; empty when they cannot be read.
std::vector<std::string> attr_items(hid_t attr, hid_t type, hssize_t n, H5T_class_t cls) {
  std::vector<std::string> items;
  if (cls == H5T_STRING) {
    if (H5Tis_variable_str(type) > 0) {
      std::vector<char*> v(size_t(n), nullptr);
      io::H5Id mem(H5Tcopy(H5T_C_S1));
      if (mem.get() < 0 || H5Tset_size(mem, H5T_VARIABLE) < 0 ||
          H5Tset_cset(mem, H5Tget_cset(type)) < 0 || H5Aread(attr, mem, v.data()) < 0)
        return {};
      for (char* s : v) {
        items.push_back(cat("\"", s ? s : "", "\""));
        H5free_memory(s);
      }
    } else {
      const size_t size = H5Tget_size(type);
      std::string buf(size * size_t(n), '\0');
      if (H5Aread(attr, type, buf.data()) < 0) return {};
      for (hssize_t i = 0; i < n; ++i) {
        std::string s = buf.substr(size_t(i) * size, size);
        s.resize(std::strlen(s.c_str()));
        items.push_back(cat("\"", s, "\""));
      }
    }
  } else if (cls == H5T_INTEGER) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    if (H5Aread(attr, H5T_NATIVE_INT64, v.data()) < 0) return {};
    for (int64_t x : v) items.push_back(std::to_string(x));
  } else if (cls == H5T_FLOAT) {
    std::vector<double> v(static_cast<size_t>(n));
    if (H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()) < 0) return {};
    for (double x : v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", x);
      items.push_back(buf);
    }
  }
  return items;
}

// Whether a stored attribute of class `cls` holding n values (scalar or not) is what the
// schema's type declares; the reader's rules (an integer is a number too).
bool matches(io::AttrType t, H5T_class_t cls, hssize_t n, bool scalar) {
  const bool number = cls == H5T_FLOAT || cls == H5T_INTEGER;
  switch (t) {
    case io::AttrType::string:
      return cls == H5T_STRING && n == 1;
    case io::AttrType::int64:
      return cls == H5T_INTEGER && n == 1;
    case io::AttrType::float64:
      return number && n == 1;
    case io::AttrType::float64_list:
      return number && (n >= 1 || !scalar);
  }
  return false;
}

// The value of attribute `name` of obj as text: a string in quotes, a number, or a list
// [a, b, c] when its dataspace is not scalar or the schema declares a list. `field`, when the
// file is a checkpoint and the schema has the attribute, marks a stored type that differs.
std::string attr_value(hid_t obj, const char* name, const io::CheckpointAttr* field) {
  io::H5Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  io::H5Id type(attr.get() < 0 ? H5I_INVALID_HID : H5Aget_type(attr));
  io::H5Id space(attr.get() < 0 ? H5I_INVALID_HID : H5Aget_space(attr));
  if (type.get() < 0 || space.get() < 0) return "(unreadable)";
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  const bool scalar = H5Sget_simple_extent_type(space) == H5S_SCALAR;
  const H5T_class_t cls = H5Tget_class(type);
  const std::vector<std::string> items =
      n >= 0 ? attr_items(attr, type, n, cls) : std::vector<std::string>{};
  std::string text;
  if (items.empty() && n != 0) {
    text = "(unprintable)";
  } else if (items.size() == 1 && scalar && !(field && field->type == io::AttrType::float64_list)) {
    text = items[0];
  } else {
    text = "[";
    for (size_t i = 0; i < items.size(); ++i) text += (i ? ", " : "") + items[i];
    text += "]";
  }
  if (field && !matches(field->type, cls, n, scalar))
    text += cat("  (expected ",
                field->type == io::AttrType::float64_list
                    ? "float64 [C]"
                    : cat("one ", io::attr_type_name(field->type)),
                ")");
  return text;
}

struct PrintAttrs {
  const char* indent;
  std::string group;  // "" for the root
  bool checkpoint;    // print against the checkpoint schema
};

herr_t print_attr(hid_t obj, const char* name, const H5A_info_t*, void* data) {
  const auto* p = static_cast<const PrintAttrs*>(data);
  const io::CheckpointAttr* field =
      p->checkpoint ? io::find_checkpoint_attr(p->group, name) : nullptr;
  std::printf("%s@%s = %s\n", p->indent, name, attr_value(obj, name, field).c_str());
  return 0;
}

herr_t print_object(hid_t root, const char* name, const H5O_info_t* info, void* checkpoint) {
  if (std::string(name) == ".") return 0;
  if (info->type == H5O_TYPE_GROUP) {
    std::printf("/%s/\n", name);
    io::H5Id g(H5Gopen2(root, name, H5P_DEFAULT));
    PrintAttrs p{"    ", name, *static_cast<bool*>(checkpoint)};
    H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, print_attr, &p);
  } else if (info->type == H5O_TYPE_DATASET) {
    io::H5Id ds = io::open_dataset(root, name);
    auto t = io::dataset_dtype(ds);
    io::H5Id dcpl(H5Dget_create_plist(ds));
    bool checksum = false;
    for (int i = 0, n = H5Pget_nfilters(dcpl); i < n; ++i) {
      unsigned flags = 0, cd[8];
      size_t ncd = 8;
      checksum |= H5Pget_filter2(dcpl, unsigned(i), &flags, &ncd, cd, 0, nullptr, nullptr) ==
                  H5Z_FILTER_FLETCHER32;
    }
    // Types outside DType, named here: float64 (the per-channel /mean and /std) and
    // strings (/class_names).
    std::string type = t ? dtype_name(*t) : "?";
    if (!t) {
      io::H5Id ht(H5Dget_type(ds));
      if (H5Tget_class(ht) == H5T_FLOAT && H5Tget_size(ht) == 8) type = "float64";
      if (H5Tget_class(ht) == H5T_STRING) type = "string";
    }
    std::printf("/%s  %s %s%s\n", name, type.c_str(), shape_str(io::dataset_shape(ds)).c_str(),
                checksum ? "  fletcher32" : "");
  }
  return 0;
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& args, comm::Communicator& comm) {
  const char* usage =
      "usage: ringtrain inspect FILE.h5\n"
      "       ringtrain inspect --schema\n"
      "  prints what a dataset or checkpoint holds (attributes, datasets, dtypes, shapes);\n"
      "  for a checkpoint, also whether it is valid (exit 1 when it is not).\n"
      "  --schema prints the checkpoint format: every attribute and dataset, its type,\n"
      "  whether a file must hold it and the values that are possible (docs/formats.md).\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.rank() == 0) std::cout << usage;
    return 0;
  }
  if (args.size() == 1 && args[0] == "--schema") {
    if (comm.rank() == 0) std::cout << io::checkpoint_schema_markdown();
    return 0;
  }
  bool valid = true;
  run_and_agree(comm, [&] {
    RT_REQUIRE(args.size() == 1,
               "ringtrain inspect: expected one file (usage: ringtrain inspect FILE.h5)");
    if (comm.rank() != 0) return;
    std::error_code ec;  // a FIFO or device would block HDF5's open: refuse it first
    const auto st = std::filesystem::status(args[0], ec);
    RT_REQUIRE(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st),
               "ringtrain inspect: '", args[0], "' is not a regular file; expected an HDF5 file");
    io::H5Id f = io::open_file_readonly(args[0], "file");
    auto format = io::read_attr_string(f, "format");
    bool checkpoint = format && *format == io::kCheckpointFormat;
    std::printf("%s: %s, %llu bytes\n", args[0].c_str(),
                format ? format->c_str() : "(not a ringtrain file)",
                static_cast<unsigned long long>(std::filesystem::file_size(args[0])));
    PrintAttrs root{"  ", "", checkpoint};
    H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, print_attr, &root);
    H5_CHECK(
        H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, print_object, &checkpoint, H5O_INFO_BASIC));
    if (checkpoint) {
      std::string why;
      valid = io::validate_checkpoint(args[0], &why);
      std::printf("valid: %s%s\n",
                  valid ? "yes (all checksums verified)" : "NO: ", valid ? "" : why.c_str());
    }
  });
  return valid ? 0 : 1;  // scripts can test a checkpoint with `ringtrain inspect FILE`
}

}  // namespace ringtrain::launch
