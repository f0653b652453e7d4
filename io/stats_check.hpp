// Plausibility checks of the scalar statistics a dataset or checkpoint carries: the input
// normalisation (mean, std), for the dataset reader (io/shard.cpp) and the checkpoint's
// impossible_meta, and the checkpoint's precision name. Each returns why a value cannot be
// real ("" when it can), so that both readers word their messages the same way.
#pragma once

#include <optional>
#include <string>

#include "core/dtype.hpp"

namespace ringtrain::io {

// Bounds of a usable normalisation (docs/formats.md): std in [2^-40, 2^64], |mean| <= 2^64.
// Inside them 1/std and mean/std stay far inside float32, so (x - mean) / std is finite for
// every finite input. Non-constant uint8 data (read as v / 255) of fewer than 2^64 values
// has std > 2^-40.
inline constexpr double kMinStd = 0x1p-40, kMaxStd = 0x1p64, kMaxAbsMean = 0x1p64;

// Why (mean, std) cannot be the statistics of `stored` samples (nullopt: unknown, as in a
// checkpoint): not finite, std <= 0, outside the bounds above, or for uint8 data (whose
// statistics are of v / 255) a mean outside [0, 1] or a std above 1. mean_name/std_name name the
// values in the message, e.g. "input_mean", "channel 2 mean".
std::string normalisation_problem(const std::string& mean_name, double mean,
                                  const std::string& std_name, double std,
                                  std::optional<DType> stored = std::nullopt);

// Why a checkpoint's `precision` attribute is not a compute dtype ringtrain trains in
// (fp32, fp16, bf16).
std::string precision_problem(const std::string& precision);

}  // namespace ringtrain::io
