// Software prefetch the compiler keeps. GCC 12 at -O2 deletes _mm_prefetch (__builtin_prefetch)
// as dead code in some of kiln's kernels: the bf16 small-M kernel's object held none of the
// prefetches its source asked for, and a loop of them ahead of attention compiled to nothing.
// An asm statement is always emitted.
#pragma once

#include "kernels/cpu/cpu_features.h"

namespace kiln::cpu {

// The cache line holding *p into L2 and the levels beyond it, not L1 (prefetcht1). On the Zen 4
// VMs this beat prefetcht0 in every kernel measured: the lines wait in L2 without taking L1's few
// miss buffers from the loads that need them now.
KILN_ALWAYS_INLINE void PrefetchToL2(const void* p) {
  __asm__ volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
}

}  // namespace kiln::cpu
