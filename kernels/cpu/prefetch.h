// Software prefetch the compiler keeps. GCC 12 at -O2 deletes _mm_prefetch (__builtin_prefetch)
// as dead code in some of kiln's kernels: the bf16 small-M kernel's object held none of the
// prefetches its source asked for, and a loop of them ahead of attention compiled to nothing.
// An asm statement is always emitted.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace kiln::cpu {

// The cache line holding *p into L2 and the levels beyond it, not L1 (prefetcht1). On the Zen 4
// VMs this beat prefetcht0 in every kernel measured: the lines wait in L2 without taking L1's few
// miss buffers from the loads that need them now.
KILN_ALWAYS_INLINE void PrefetchToL2(const void* p) {
  __asm__ volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
}

// Every line of [p, p + bytes) into L2, all asked for at once (for data another thread wrote,
// whose lines a loop reading them in turn would fetch a few at a time).
inline void PrefetchRangeToL2(const void* p, int64_t bytes) {
  const auto* first = static_cast<const char*>(p);
  for (int64_t at = 0; at < bytes; at += 64) PrefetchToL2(first + at);
}

// The first `bytes` of each of panels first[0..count), laid `panel_bytes` apart from `data`, into
// L2: the lines a decode kernel reads before its own prefetches run ahead of it.
inline void PrefetchPanelStarts(const void* data, int64_t panel_bytes, const int64_t* first,
                                int count, int64_t bytes) {
  for (int i = 0; i < count; ++i) {
    PrefetchRangeToL2(static_cast<const char*>(data) + first[i] * panel_bytes,
                      bytes < panel_bytes ? bytes : panel_bytes);
  }
}

}  // namespace kiln::cpu
