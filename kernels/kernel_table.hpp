// KernelTable: what one backend computes, registered per op family and dtype (ggml's
// supports_op, Aluminum's IsOpSupported). Backend::supports() answers from it, and the
// shared entry points of kernels.hpp refuse a dtype no family declared. Two kinds of entry:
//   - declare(op, dtypes): an op the backend implements in its protected do_<op>() method
//     (the ops with their own signature: gemm, conv2d, attention, ...);
//   - unary(op, dtypes, forward, backward): a pointwise op y = f(x), dx = dy * f'(x), whose
//     kernels are the table's function pointers. A new activation needs nothing but its
//     registration here (no virtual method, no Backend header): docs/architecture.md.
// Each backend lists its family files once (kernels/<backend>/families.hpp); a family file
// registers with RT_KERNEL_FAMILY(backend, family) { table.unary(...); table.declare(...); }.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::kernels {

// What a table kernel sees of the backend that runs it: the CPU's thread count, the CUDA
// stream (a cudaStream_t) its work is queued on.
struct KernelEnv {
  int threads = 1;
  void* stream = nullptr;
};

// y = f(x): x and y of one shape, any float dtypes each (the table is keyed by x's).
using UnaryForward = void (*)(const KernelEnv&, const Tensor& x, const Tensor& y);
// dx = dy * f'(x); dx may alias dy.
using UnaryBackward = void (*)(const KernelEnv&, const Tensor& x, const Tensor& dy,
                               const Tensor& dx);
struct UnaryKernel {
  UnaryForward forward = nullptr;
  UnaryBackward backward = nullptr;
};

// The float dtypes a kernel usually takes.
inline constexpr std::initializer_list<DType> kFloatDTypes = {DType::f32, DType::bf16, DType::f16};

class KernelTable {
 public:
  // Registration (once, when the backend's table is built). A second registration of one
  // (op, dtype) is an internal error: two families claiming one kernel.
  void declare(std::string_view op, std::initializer_list<DType> dtypes);
  void unary(std::string_view op, std::initializer_list<DType> dtypes, UnaryForward forward,
             UnaryBackward backward);

  bool has(std::string_view op, DType dtype) const;
  // The unary kernels of op for inputs of `dtype`; null when not registered.
  const UnaryKernel* find_unary(std::string_view op, DType dtype) const;
  // Every registered (op, dtype), sorted; and the names of the unary ops (for tests).
  std::vector<std::pair<std::string, DType>> entries() const;
  std::vector<std::string> unary_ops() const;

 private:
  struct Entry {
    bool unary = false;
    UnaryKernel kernel;
  };
  void add(std::string_view op, DType dtype, Entry e);
  std::map<std::pair<std::string, DType>, Entry, std::less<>> entries_;
};

}  // namespace ringtrain::kernels

// Defines the registration function of one family of one backend; the backend's families.hpp
// lists it, and the backend calls it when it builds its table.
#define RT_KERNEL_FAMILY(backend, family) \
  void rt_kernel_family_##backend##_##family(::ringtrain::kernels::KernelTable& table)
