// .npy/.npz reading and float32 .npy writing (see npy.hpp). The .npz side uses Debian's
// libzip (libzip-dev) rather than a zip reader of our own: NumPy writes its members with
// zip64 extra fields (np.savez forces them) and np.savez_compressed deflates them, and
// libzip handles both, with CRC checks, in a few calls.
#include "io/npy.hpp"

#include <zip.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "io/output_file.hpp"

namespace ringtrain::io {

const char* npy_type_name(NpyType t) {
  static const char* names[] = {"uint8", "int8",   "uint16", "int16",   "uint32",
                                "int32", "uint64", "int64",  "float32", "float64"};
  return names[int(t)];
}

size_t npy_type_size(NpyType t) {
  static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
  return sizes[int(t)];
}

namespace {

// A cursor over the header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class DictParser {
 public:
  DictParser(std::string text, const std::string& what) : s_(std::move(text)), what_(what) {}

  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool accept(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) bad(cat("expected '", c, "'"));
  }
  bool peek(char c) {
    skip_space();
    return i_ < s_.size() && s_[i_] == c;
  }
  std::string string_literal() {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) bad("expected a string");
    const char q = s_[i_++];
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) ++i_;
    if (i_ >= s_.size()) bad("unterminated string");
    return s_.substr(start, i_++ - start);
  }
  std::string word() {  // True, False
    skip_space();
    const size_t start = i_;
    while (i_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[i_]))) ++i_;
    return s_.substr(start, i_ - start);
  }
  int64_t integer() {
    skip_space();
    const size_t start = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (start == i_ || i_ - start > 18) bad("expected a dimension (a non-negative integer)");
    const int64_t v = std::stoll(s_.substr(start, i_ - start));
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2's long suffix
    return v;
  }
  [[noreturn]] void bad(const std::string& why) const {
    throw_input(cat("'", what_, "' is not a valid .npy file: its header ", why, " at offset ", i_,
                    " of \"", s_, "\""));
  }

 private:
  std::string s_;
  const std::string& what_;
  size_t i_ = 0;
};

NpyType type_of(const std::string& descr, bool* big_endian, const std::string& what) {
  RT_REQUIRE(descr.size() >= 2, "'", what, "' has dtype '", descr, "', which is not understood");
  const char order = descr[0];
  const std::string kind = descr.substr(1);
  RT_REQUIRE(kind.rfind("O", 0) != 0, "'", what, "' holds a NumPy object array (dtype '", descr,
             "', stored pickled); it is refused, never unpickled: save a numeric array, e.g. "
             "np.save(f, np.asarray(x, dtype=np.uint8))");
  *big_endian = order == '>';
  static const std::pair<const char*, NpyType> known[] = {
      {"u1", NpyType::u1}, {"i1", NpyType::i1}, {"u2", NpyType::u2}, {"i2", NpyType::i2},
      {"u4", NpyType::u4}, {"i4", NpyType::i4}, {"u8", NpyType::u8}, {"i8", NpyType::i8},
      {"f4", NpyType::f4}, {"f8", NpyType::f8}};
  for (const auto& [name, t] : known)
    if (kind == name && (order == '<' || order == '>' || order == '|' || order == '=')) return t;
  throw_input(cat("'", what, "' has dtype '", descr,
                  "', which is not supported; expected a numeric array (uint8 or float32 "
                  "images; integer labels)"));
}

}  // namespace

NpyHeader parse_npy_header(const uint8_t* b, size_t n, const std::string& what) {
  static const uint8_t magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  RT_REQUIRE(n >= 10 && std::memcmp(b, magic, 6) == 0, "'", what,
             "' is not a .npy file (no \\x93NUMPY magic at its start)");
  const int major = b[6];
  RT_REQUIRE(major >= 1 && major <= 3, "'", what, "' is .npy format version ", major, ".",
             int(b[7]), "; this reader knows versions 1.0 to 3.0");
  size_t len = 0, pre = 0;
  if (major == 1) {
    len = size_t(b[8]) | size_t(b[9]) << 8;
    pre = 10;
  } else {
    RT_REQUIRE(n >= 12, "'", what, "' is truncated inside its .npy header");
    len = size_t(b[8]) | size_t(b[9]) << 8 | size_t(b[10]) << 16 | size_t(b[11]) << 24;
    pre = 12;
  }
  RT_REQUIRE(len <= n - pre, "'", what, "' is truncated: its .npy header declares ", len,
             " bytes but ", n - pre, " follow");
  DictParser p(std::string(reinterpret_cast<const char*>(b + pre), len), what);
  NpyHeader h;
  h.data_offset = pre + len;
  bool have_descr = false, have_order = false, have_shape = false;
  p.expect('{');
  while (!p.accept('}')) {
    const std::string key = p.string_literal();
    p.expect(':');
    if (key == "descr") {
      if (p.peek('[')) {
        throw_input(cat("'", what,
                        "' holds a structured array (a dtype with fields); expected a plain "
                        "numeric array"));
      }
      h.type = type_of(p.string_literal(), &h.big_endian, what);
      have_descr = true;
    } else if (key == "fortran_order") {
      const std::string v = p.word();
      if (v != "True" && v != "False") p.bad("has fortran_order that is not True or False");
      RT_REQUIRE(v == "False", "'", what,
                 "' is stored in Fortran (column-major) order; expected C order: save "
                 "np.ascontiguousarray(x)");
      have_order = true;
    } else if (key == "shape") {
      p.expect('(');
      while (!p.accept(')')) {
        h.shape.push_back(p.integer());
        if (!p.accept(',')) {
          p.expect(')');
          break;
        }
      }
      have_shape = true;
    } else {
      p.bad(cat("has an unknown key '", key, "'"));
    }
    if (!p.accept(',')) {
      p.expect('}');
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    p.bad("lacks one of 'descr', 'fortran_order', 'shape'");
  return h;
}

namespace {

void to_native(NpyArray& a) {
  if (!a.header.big_endian) return;
  const size_t s = npy_type_size(a.header.type);
  for (size_t i = 0; i + s <= a.data.size(); i += s) std::reverse(&a.data[i], &a.data[i + s]);
  a.header.big_endian = false;
}

// Takes the bytes of one whole .npy file (or .npz member) and checks its size.
NpyArray from_bytes(std::vector<uint8_t> bytes, const std::string& what) {
  NpyArray a;
  a.what = what;
  a.header = parse_npy_header(bytes.data(), bytes.size(), what);
  uint64_t need = npy_type_size(a.header.type);
  for (int64_t d : a.header.shape)
    RT_REQUIRE(!__builtin_mul_overflow(need, uint64_t(d), &need), "'", what, "' declares shape ",
               shape_str(a.header.shape), ", whose size overflows 64 bits");
  const uint64_t have = bytes.size() - a.header.data_offset;
  RT_REQUIRE(have == need, "'", what, "' declares ", shape_str(a.header.shape), " ",
             npy_type_name(a.header.type), " (", need, " bytes of data) but holds ", have,
             " bytes after its header; the file is truncated or not what it claims");
  a.data.assign(bytes.begin() + std::ptrdiff_t(a.header.data_offset), bytes.end());
  to_native(a);
  return a;
}

std::vector<uint8_t> read_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  RT_REQUIRE(fs::exists(path, ec), "'", path, "' does not exist");
  RT_REQUIRE(fs::is_regular_file(path, ec), "'", path, "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  RT_REQUIRE(in, "'", path, "' cannot be opened");
  std::vector<uint8_t> bytes(size_t(fs::file_size(path)));
  in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  RT_REQUIRE(in || bytes.empty(), "'", path, "' could not be read");
  return bytes;
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};

NpyArray read_npz_member(const std::string& path, std::string key) {
  namespace fs = std::filesystem;
  std::error_code ec;
  RT_REQUIRE(fs::exists(path, ec), "'", path, "' does not exist");
  RT_REQUIRE(fs::is_regular_file(path, ec), "'", path, "' is not a regular file");
  int err = 0;
  std::unique_ptr<zip_t, ZipCloser> z(zip_open(path.c_str(), ZIP_RDONLY, &err));
  if (!z) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    const std::string why = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    throw_input(cat("'", path, "' is not a readable .npz (zip) archive: ", why));
  }
  const zip_int64_t members = zip_get_num_entries(z.get(), 0);
  std::string names;
  for (zip_int64_t i = 0; i < members; ++i) {
    std::string n = zip_get_name(z.get(), zip_uint64_t(i), 0);
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".npy") == 0) n.resize(n.size() - 4);
    names += cat(names.empty() ? "" : ", ", n);
  }
  if (key.empty()) {
    RT_REQUIRE(members == 1, "'", path, "' holds ", members, " arrays (", names, "); name one as '",
               path, ":KEY'");
    key = zip_get_name(z.get(), 0, 0);
  }
  zip_int64_t index = zip_name_locate(z.get(), (key + ".npy").c_str(), 0);
  if (index < 0) index = zip_name_locate(z.get(), key.c_str(), 0);
  RT_REQUIRE(index >= 0, "'", path, "' holds no array '", key, "'; it holds: ", names);
  const std::string what = cat(path, ":", key);
  zip_stat_t st;
  zip_stat_init(&st);
  RT_REQUIRE(
      zip_stat_index(z.get(), zip_uint64_t(index), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE), "'",
      what, "': the archive does not say the member's size");
  std::vector<uint8_t> bytes(size_t(st.size));
  zip_file_t* f = zip_fopen_index(z.get(), zip_uint64_t(index), 0);
  RT_REQUIRE(f, "'", what, "' cannot be opened: ", zip_strerror(z.get()));
  size_t done = 0;
  while (done < bytes.size()) {
    const zip_int64_t got = zip_fread(f, bytes.data() + done, bytes.size() - done);
    if (got <= 0) {
      const std::string why = got < 0 ? zip_file_strerror(f) : "unexpected end of data";
      zip_fclose(f);
      throw_input(cat("'", what, "' could not be read (", why, "); the archive is corrupt"));
    }
    done += size_t(got);
  }
  const int rc = zip_fclose(f);  // reports a CRC mismatch
  RT_REQUIRE(rc == 0, "'", what, "' is corrupt (", zip_error_strerror(zip_get_error(z.get())), ")");
  return from_bytes(std::move(bytes), what);
}

}  // namespace

NpyArray read_npy(const std::string& spec) {
  // "X.npz:key" (a ':' after an .npz name) or "X.npz" or "X.npy".
  const size_t at = spec.find(".npz");
  if (at != std::string::npos && (at + 4 == spec.size() || spec[at + 4] == ':')) {
    const std::string path = spec.substr(0, at + 4);
    return read_npz_member(path, at + 4 < spec.size() ? spec.substr(at + 5) : std::string());
  }
  return from_bytes(read_file(spec), spec);
}

void write_npy_f32(const std::string& path, const float* data, const Shape& shape) {
  std::string dims;  // "3, 4", or "3," for one dimension (a Python tuple)
  for (size_t i = 0; i < shape.size(); ++i) dims += cat(i ? ", " : "", shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = cat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic + version + 2-byte length + header, padded with spaces to a multiple of 64, ending
  // in '\n' (the alignment NumPy itself writes).
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  const uint8_t pre[10] = {0x93,
                           'N',
                           'U',
                           'M',
                           'P',
                           'Y',
                           1,
                           0,
                           uint8_t(header.size() & 0xff),
                           uint8_t(header.size() >> 8)};
  write_whole_file(
      path, {{pre, 10}, {header.data(), header.size()}, {data, size_t(shape_numel(shape)) * 4}});
}

}  // namespace ringtrain::io
