// HDF5's Fletcher32 checksum (the filter the checkpoint format puts on every chunk), computed
// by ringtrain so that the checkpoint writer can store whole chunks without HDF5's filter
// pipeline (checkpoint_writer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ringtrain::io {

// The value HDF5 1.10's H5_checksum_fletcher32 returns for the same bytes (big-endian 16-bit
// words, sums modulo 65535 with HDF5's 0/65535 convention, a trailing odd byte as the high
// half of a word): the 4 bytes HDF5 appends to a chunk, little-endian, and verifies on read.
uint32_t fletcher32(const void* data, size_t len);

// The same with a given implementation (tests): one the CPU lacks falls back to scalar.
enum class Fletcher32Isa { scalar, avx2, avx512 };
uint32_t fletcher32(const void* data, size_t len, Fletcher32Isa isa);

}  // namespace ringtrain::io
