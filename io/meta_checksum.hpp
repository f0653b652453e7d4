// The checkpoint's metadata checksum: the root attribute `meta_checksum`, a CRC-32 over a
// canonical text of every other attribute of the root and its groups (step, precision,
// input_std, /loss_scaler scale, ...). Fletcher32 guards the datasets' chunks but not the
// attributes, so without it a flipped bit in input_std would evaluate silently wrong.
// docs/formats.md gives the canonical form, so other tools can compute it too.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>

namespace ringtrain::io {

inline constexpr const char* kMetaChecksumAttr = "meta_checksum";

// The CRC-32 of the canonical serialisation of the attributes below `file`'s root.
uint32_t meta_checksum(hid_t file);
// (Re)writes the root attribute meta_checksum; call after the last attribute is written
// (collectively, on every rank, when the file is open with MPI-IO).
void write_meta_checksum(hid_t file);
// Why the attributes do not match the stored meta_checksum; "" when they do or when the
// file has none (checkpoints written before it existed).
std::string meta_checksum_problem(hid_t file);

}  // namespace ringtrain::io
