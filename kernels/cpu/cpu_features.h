// What the CPU the process runs on can execute, asked once per kernel family at run time: kiln's
// kernels are compiled with per-function target attributes and keep a portable path.
#pragma once

// The instruction sets every AVX-512 kernel of kiln assumes; families that need more (BF16,
// VNNI) add them to their own target attribute and check.
#define KILN_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))

// For a kernel's helpers over register arrays: inlined, the arrays can live in registers.
#define KILN_ALWAYS_INLINE inline __attribute__((always_inline))

// Put before a loop over a compile-time count of registers (rows, column vectors): unrolled, the
// accumulators stay in registers; GCC at -O2 otherwise keeps such arrays on the stack.
#if defined(__clang__)
#define KILN_UNROLL _Pragma("unroll")
#else
#define KILN_UNROLL _Pragma("GCC unroll 16")
#endif

namespace kiln::cpu {

// Whether this CPU has AVX-512 F, DQ, BW and VL (KILN_AVX512_TARGET).
bool Avx512Supported();

}  // namespace kiln::cpu
