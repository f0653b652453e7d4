// Plausibility checks of normalisation statistics and precision names (see stats_check.hpp).
#include "io/stats_check.hpp"

#include <cmath>

#include "core/error.hpp"

namespace ringtrain::io {

std::string normalisation_problem(const std::string& mean_name, double mean,
                                  const std::string& std_name, double std,
                                  std::optional<DType> stored) {
  if (!std::isfinite(mean)) return cat(mean_name, " is ", mean, "; expected a finite value");
  if (!std::isfinite(std) || std <= 0)
    return cat(std_name, " is ", std, "; expected a finite value > 0");
  // uint8 samples are normalised as v / 255, in [0, 1]: so is their mean, and their std is
  // at most 0.5 (0.71 with the n - 1 correction); 1 leaves room for either.
  if (stored == DType::u8 && (mean < 0 || mean > 1))
    return cat(mean_name, " is ", mean,
               "; the samples are uint8, read as v / 255, so it lies in [0, 1]");
  if (stored == DType::u8 && std > 1)
    return cat(std_name, " is ", std,
               "; the samples are uint8, read as v / 255, so it is at most 1");
  if (std < kMinStd || std > kMaxStd)
    return cat(std_name, " is ", std, "; expected ", kMinStd, " to ", kMaxStd,
               " (outside, the normalised inputs leave float32's range)");
  if (std::fabs(mean) > kMaxAbsMean)
    return cat(mean_name, " is ", mean, "; expected at most ", kMaxAbsMean,
               " in magnitude (beyond, the normalised inputs leave float32's range)");
  return "";
}

std::string precision_problem(const std::string& precision) {
  if (precision == "fp32" || precision == "fp16" || precision == "bf16") return "";
  return cat("precision is '", precision, "'; expected fp32, fp16 or bf16");
}

}  // namespace ringtrain::io
