// The device description line and the precision warning for a GPU (its compute capability
// against --precision), shared by the CUDA build and the CPU-only stubs (plain C++: no
// CUDA calls).
#include <cstdio>
#include <string>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cuda/cuda_api.hpp"

namespace ringtrain::kernels::cuda {

std::string describe(const DeviceInfo& d) {
  char buf[256];
  auto ver = [](int v) { return cat(v / 1000, ".", v % 1000 / 10); };
  std::snprintf(buf, sizeof buf, "cuda:%d %s, %.1f GiB (%.1f free), compute capability %d.%d",
                d.index, d.name.c_str(), double(d.total_bytes) / double(1 << 30),
                double(d.free_bytes) / double(1 << 30), d.cc_major, d.cc_minor);
  return cat(buf, ", driver ", ver(d.driver_version), ", runtime ", ver(d.runtime_version),
             d.pci_bus_id.empty() ? std::string() : cat(", PCI ", d.pci_bus_id));
}

std::string precision_warning(const DeviceInfo& d, DType compute) {
  const int cc = d.cc_major * 10 + d.cc_minor;
  if (compute == DType::f16 && cc < 70)
    return cat("--precision fp16 on ", d.name, " (compute capability ", d.cc_major, ".", d.cc_minor,
               "): fp16 tensor cores need 7.0; expect it to be slow or to fail");
  if (compute == DType::bf16 && cc < 80)
    return cat("--precision bf16 on ", d.name, " (compute capability ", d.cc_major, ".", d.cc_minor,
               "): bf16 needs 8.0 (cuBLAS and cuDNN have no bf16 kernels below); "
               "use fp16 or fp32");
  return "";
}

}  // namespace ringtrain::kernels::cuda
