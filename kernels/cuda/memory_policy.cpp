// --gpu-memory parsing (MemoryPolicy::parse), shared by the CUDA build and the CPU-only
// stubs (plain C++: no CUDA calls).
#include <cstdio>
#include <string>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cuda/cuda_api.hpp"

namespace ringtrain::kernels::cuda {

MemoryPolicy MemoryPolicy::parse(std::string_view s) {
  MemoryPolicy p;
  if (s == "grow") return p;
  constexpr std::string_view kReserve = "reserve:";
  if (s.substr(0, kReserve.size()) == kReserve) {
    const std::string num(s.substr(kReserve.size()));
    size_t used = 0;
    double f = 0;
    try {
      f = std::stod(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_REQUIRE(used == num.size() && !num.empty() && f > 0 && f <= 0.99, "--gpu-memory '", s,
               "' is not valid; expected reserve:FRACTION with FRACTION in (0, 0.99], e.g. "
               "reserve:0.9");
    p.reserve = true;
    p.fraction = f;
    return p;
  }
  throw_input(cat("--gpu-memory '", s, "' is not valid; expected grow or reserve:FRACTION"));
}

std::string MemoryPolicy::str() const {
  if (!reserve) return "grow";
  char buf[32];
  std::snprintf(buf, sizeof buf, "reserve:%g", fraction);
  return buf;
}

}  // namespace ringtrain::kernels::cuda
