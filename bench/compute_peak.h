// This machine's arithmetic rooflines, measured: independent chains of fp32 FMAs (vfmadd231ps)
// and of bf16 dot products (vdpbf16ps) on every thread at once. A kernel bound by arithmetic
// (attention over a few hundred positions, a linear at 16 rows) is held against these as a
// batch-1 decode is held against the read bandwidth (read_bandwidth.h).
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/cpu_features.h"

namespace kiln::bench {
namespace peak_internal {

// ≥ latency × pipes on the cores measured, so that the chains, not their latency, bind.
constexpr int kChains = 12;

// Lane 0 of the chains' sum, for the caller to use, so that the compiler keeps every chain.
__attribute__((target("avx512f"))) KILN_ALWAYS_INLINE double KeepChains(
    const __m512 (&acc)[kChains]) {
  __m512 total = acc[0];
  KILN_UNROLL
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  return static_cast<double>(lanes[0]);
}

__attribute__((target("avx512f"), noinline)) inline double FmaChains(int64_t iterations) {
  __m512 acc[kChains];
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  KILN_UNROLL
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (int64_t i = 0; i < iterations; ++i) {
    KILN_UNROLL
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
  }
  return KeepChains(acc);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) inline double DotChains(
    int64_t iterations) {
  __m512 acc[kChains];
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);  // bf16 ~6e-8
  KILN_UNROLL
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (int64_t i = 0; i < iterations; ++i) {
    KILN_UNROLL
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
  }
  return KeepChains(acc);
}

// FLOP/s of `threads` threads each running chains(iterations), `flops` per chain step; the
// median of 5.
template <typename Chains>
double Peak(int threads, double flops, Chains chains) {
  constexpr int64_t kIterations = 20'000'000;
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const auto start = Clock::now();
    double sink = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += chains(kIterations);
    const double seconds = Seconds(start);
    if (sink != sink) return 0.0;  // never: keeps the sums alive
    rates.push_back(static_cast<double>(threads) * kChains * flops * kIterations / seconds);
  }
  return Median(rates);
}

}  // namespace peak_internal

// fp32 FLOP/s (a multiply-add is 2) of `threads` threads; 0 without AVX-512.
inline double Fp32FmaPeak(int threads) {
  if (!cpu::Avx512Supported()) return 0.0;
  return peak_internal::Peak(threads, 2.0 * 16, peak_internal::FmaChains);
}

// FLOP/s of bf16 dot products into fp32 (a multiply-add is 2, 32 a vdpbf16ps) of `threads`
// threads; 0 where the CPU lacks AVX512_BF16.
inline double Bf16DotPeak(int threads) {
  if (!cpu::Avx512Supported() || !__builtin_cpu_supports("avx512bf16")) return 0.0;
  return peak_internal::Peak(threads, 2.0 * 32, peak_internal::DotChains);
}

}  // namespace kiln::bench
