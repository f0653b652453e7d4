// The per-category byte counters behind Buffer (see memory_stats.hpp): lock-free atomics, so
// the loader and communication threads charge their buffers beside the main thread.
#include "core/memory_stats.hpp"

#include <atomic>

namespace ringtrain {
namespace {

struct Counters {
  std::array<std::atomic<int64_t>, kMemCategories> current{}, peak{};
  std::atomic<int64_t> total{0}, total_peak{0};
};
Counters g_counters[2];  // host, device
thread_local MemCategory t_category = MemCategory::workspace;

void raise(std::atomic<int64_t>& peak, int64_t v) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

const char* mem_category_name(MemCategory c) {
  static const char* const names[kMemCategories] = {
      "masters", "optimizer", "working", "gathered", "gradients", "activations", "workspace"};
  return names[int(c)];
}

MemoryScope::MemoryScope(MemCategory c) : prev_(t_category) { t_category = c; }
MemoryScope::~MemoryScope() { t_category = prev_; }
MemCategory MemoryScope::current() { return t_category; }

void memory_charge(bool device, MemCategory c, int64_t bytes) {
  Counters& k = g_counters[device ? 1 : 0];
  const int64_t now = k.current[size_t(c)].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const int64_t total = k.total.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes <= 0) return;
  raise(k.peak[size_t(c)], now);
  raise(k.total_peak, total);
}

MemoryCounts memory_counts(bool device) {
  const Counters& k = g_counters[device ? 1 : 0];
  MemoryCounts m;
  for (int i = 0; i < kMemCategories; ++i) {
    m.current[size_t(i)] = k.current[size_t(i)].load(std::memory_order_relaxed);
    m.peak[size_t(i)] = k.peak[size_t(i)].load(std::memory_order_relaxed);
  }
  m.total_current = k.total.load(std::memory_order_relaxed);
  m.total_peak = k.total_peak.load(std::memory_order_relaxed);
  return m;
}

void reset_memory_peaks() {
  for (Counters& k : g_counters) {
    for (int i = 0; i < kMemCategories; ++i)
      k.peak[size_t(i)].store(k.current[size_t(i)].load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
    k.total_peak.store(k.total.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

}  // namespace ringtrain
