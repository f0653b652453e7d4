// io::fletcher32 against HDF5's own Fletcher32 (the function its filter calls), for every
// implementation, on lengths that end inside a vector, a block and a word, on unaligned
// data, and on the patterns where HDF5's 0/65535 convention decides the value.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "io/fletcher32.hpp"

// Exported by libhdf5 (H5checksum.c) though absent from its public headers.
extern "C" uint32_t H5_checksum_fletcher32(const void* data, size_t len);

namespace ringtrain::io {
namespace {

std::vector<unsigned char> pattern(std::mt19937_64& rng, size_t len, int kind) {
  std::vector<unsigned char> d(len + 1);
  for (auto& c : d) {
    switch (kind) {
      case 0:
        c = 0;
        break;  // sums of 0
      case 1:
        c = 0xff;
        break;  // words of 65535
      case 2:
        c = rng() % 97 == 0 ? (unsigned char)rng() : 0;
        break;  // sparse
      default:
        c = (unsigned char)rng();
    }
  }
  return d;
}

TEST(Fletcher32, EqualsHdf5ForEveryImplementation) {
  std::mt19937_64 rng(7);
  std::vector<size_t> lens = {0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 4095, 4096, 4097, 8191, 8192};
  for (int i = 0; i < 300; ++i) lens.push_back(rng() % 40000);
  lens.push_back(5u << 20);  // 5 MiB: many blocks
  for (auto isa : {Fletcher32Isa::scalar, Fletcher32Isa::avx2, Fletcher32Isa::avx512}) {
    int checked = 0;
    for (size_t k = 0; k < lens.size(); ++k) {
      const size_t len = lens[k];
      const int kind = int(k % 4);
      const auto d = pattern(rng, len, kind);
      for (size_t off : {size_t(0), size_t(1)}) {
        const unsigned char* p = d.data() + off;
        const size_t n = len - (off && len ? 1 : 0);
        ASSERT_EQ(fletcher32(p, n, isa), H5_checksum_fletcher32(p, n))
            << "isa " << int(isa) << " length " << n << " pattern " << kind << " offset " << off;
        ++checked;
      }
    }
    EXPECT_EQ(checked, int(2 * lens.size()));
  }
}

TEST(Fletcher32, DefaultMatchesAndSeesOneChangedByte) {
  std::mt19937_64 rng(11);
  auto d = pattern(rng, 1 << 20, 3);
  const uint32_t before = fletcher32(d.data(), d.size());
  EXPECT_EQ(before, H5_checksum_fletcher32(d.data(), d.size()));
  d[777777] ^= 0x10;
  EXPECT_NE(fletcher32(d.data(), d.size()), before);
  EXPECT_EQ(fletcher32(d.data(), d.size()), H5_checksum_fletcher32(d.data(), d.size()));
}

}  // namespace
}  // namespace ringtrain::io
