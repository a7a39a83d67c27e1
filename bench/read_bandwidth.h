// This machine's memory read bandwidth, the roofline a batch-1 decode is held against:
// decode efficiency = weight bytes streamed per token × tokens/s ÷ read bandwidth.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "base/logging.h"
#include "bench/bench_util.h"
#include "kernels/cpu/host_memory.h"

namespace kiln::bench {

// Sums `n` 64-bit words with independent vector accumulators, so that memory, not the adder
// chain, limits the loop.
inline uint64_t SumWords(const uint64_t* words, size_t n) {
#if defined(__AVX512F__)
  __m512i acc[4] = {_mm512_set1_epi64(0), _mm512_set1_epi64(0), _mm512_set1_epi64(0),
                    _mm512_set1_epi64(0)};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int a = 0; a < 4; ++a) {
      acc[a] = _mm512_add_epi64(acc[a], _mm512_loadu_si512(words + i + 8 * a));
    }
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(
      lanes, _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3])));
  uint64_t sum = 0;
  for (uint64_t lane : lanes) sum += lane;
#else
  uint64_t sum = 0;
  size_t i = 0;
#endif
  for (; i < n; ++i) sum += words[i];
  return sum;
}

// Read bandwidth in bytes/s of all OpenMP threads over a buffer far larger than the caches
// (median of `repeats` passes after one warm-up), allocated as packed weights are (2 MiB pages):
// on 4 KiB pages the TLB misses of a VM's nested page walks cut the measured rate by up to half,
// below what the decode kernels themselves stream.
inline double MeasureReadBandwidth(int repeats) {
  const size_t words = size_t{128} << 20;  // 1 GiB
  std::unique_ptr<uint64_t, void (*)(uint64_t*)> owner(
      static_cast<uint64_t*>(cpu::AllocateHost(words * sizeof(uint64_t))),
      [](uint64_t* p) { cpu::FreeHost(p); });
  CHECK(owner != nullptr) << "out of memory for the bandwidth probe";
  uint64_t* const buffer = owner.get();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < words; ++i) buffer[i] = i;
  std::vector<double> rates;
  uint64_t checksum = 0;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto start = Clock::now();
    uint64_t sum = 0;
#pragma omp parallel reduction(+ : sum)
    {
      const size_t threads = static_cast<size_t>(omp_get_num_threads());
      const size_t slice = words / threads;
      const size_t begin = static_cast<size_t>(omp_get_thread_num()) * slice;
      sum += SumWords(buffer + begin,
                      omp_get_thread_num() + 1 == omp_get_num_threads() ? words - begin : slice);
    }
    const double seconds = Seconds(start);
    checksum += sum;
    if (r > 0) rates.push_back(static_cast<double>(words * 8) / seconds);  // run 0 warms up
  }
  if (checksum == 42) std::printf(" ");  // keeps the sums observable
  return Median(rates);
}

}  // namespace kiln::bench
