// Force-included into kiln_kernels when the fuzz build uses clang 14 (Debian bookworm's), which
// lacks two GCC 12 features kernels/ relies on. The fuzzers reach kernels/ only to load the model
// the GenerateRequest target converts against; the shims keep the kernels' meaning.
#pragma once

#include <cpuid.h>

#include <cstring>

// clang 14 on x86-64 has arithmetic _Float16 only with AVX512-FP16. kernels/ uses it for
// conversions to and from float only; __fp16 is the same IEEE binary16 storage type, converting
// through float with round-to-nearest-even.
#define _Float16 __fp16

namespace kiln_clang14_compat {

// __builtin_cpu_supports with the feature names kernels/ asks for; clang 14 does not know
// "f16c" (clang 15 does), so that one is read from CPUID leaf 1 directly.
inline bool CpuSupports(const char* feature) {
  if (std::strcmp(feature, "f16c") == 0) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }
  if (std::strcmp(feature, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(feature, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (std::strcmp(feature, "avx512vl") == 0) return __builtin_cpu_supports("avx512vl");
  if (std::strcmp(feature, "avx512dq") == 0) return __builtin_cpu_supports("avx512dq");
  if (std::strcmp(feature, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
  if (std::strcmp(feature, "avx512bf16") == 0) return __builtin_cpu_supports("avx512bf16");
  return false;  // a feature not listed here: the kernels take their portable path
}

}  // namespace kiln_clang14_compat

#define __builtin_cpu_supports(feature) ::kiln_clang14_compat::CpuSupports(feature)
