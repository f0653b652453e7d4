// Bytes by category: every Buffer (host or device) is charged, while it lives, to the
// category of the MemoryScope current on the allocating thread (workspace outside any), so a
// run can print what it holds of masters, optimizer state, working weights, gathered
// parameters, gradients, activations and workspace, now and at their peaks, per device kind,
// beside the memory plan (train/memory_plan.hpp) that predicts the same categories.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace ringtrain {

enum class MemCategory : int {
  masters,      // fp32 masters (the shard a rank keeps) and fp32 non-trainable state
  optimizer,    // optimizer state (moments, momentum)
  working,      // compute-dtype working weights, fp32 copies layers read, dtype-override casts
  gathered,     // parameters all-gathered for a node's use and freed after it (ZeRO-3)
  gradients,    // compute-dtype, fp32, wire and accumulation gradients, shared-parameter grads
  activations,  // node outputs, what backward keeps of forward, input gradients, the logits'
  workspace,    // data batches, staging copies, backend scratch: what no other category is
};
inline constexpr int kMemCategories = 7;
const char* mem_category_name(MemCategory c);  // "masters", ..., "workspace"

// Charges this thread's allocations to `c` while it lives (nests; restores the outer one).
class MemoryScope {
 public:
  explicit MemoryScope(MemCategory c);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;
  static MemCategory current();

 private:
  MemCategory prev_;
};

// Bytes per category on one kind of device: held now and the most ever held (each category's
// own high-water mark), and the high-water mark of their sum.
struct MemoryCounts {
  std::array<int64_t, kMemCategories> current{}, peak{};
  int64_t total_current = 0, total_peak = 0;
  int64_t at(MemCategory c) const { return current[size_t(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[size_t(c)]; }
};
// `device`: device memory (cuda); else host memory.
MemoryCounts memory_counts(bool device);
// Sets every peak to what is held now (e.g. after set-up, so the peaks are the training's).
void reset_memory_peaks();

// Called by Buffer (core/tensor.cpp) for every allocation and free (requested bytes).
void memory_charge(bool device, MemCategory c, int64_t bytes);

}  // namespace ringtrain
