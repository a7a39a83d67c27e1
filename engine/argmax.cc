#include "engine/argmax.h"

// GCC 12 reports the _mm512_undefined_ps() pass-through operand inside its own reduce intrinsics
// as (maybe-)uninitialized once they inline into a target("...") function; the state has to be
// set before <immintrin.h> is first included.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <algorithm>
#include <limits>

namespace kiln {
namespace {

#define KILN_ARGMAX_TARGET __attribute__((target("avx512f")))

bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// The maximum of `row` in *max; false when the row holds a NaN (the caller then defers to
// std::max_element, whose answer depends on where the NaN is).
KILN_ARGMAX_TARGET bool VectorMax(std::span<const float> row, float* max) {
  const float* data = row.data();
  const int64_t n = static_cast<int64_t>(row.size());
  __m512 best[4];
  for (__m512& b : best) b = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 unordered = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int v = 0; v < 4; ++v) {
      const __m512 x = _mm512_loadu_ps(data + i + 16 * v);
      unordered |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      best[v] = _mm512_max_ps(best[v], x);
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 valid = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    const __m512 x = _mm512_mask_loadu_ps(best[0], valid, data + i);
    unordered |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    best[0] = _mm512_max_ps(best[0], x);
  }
  if (unordered != 0) return false;
  *max = _mm512_reduce_max_ps(
      _mm512_max_ps(_mm512_max_ps(best[0], best[1]), _mm512_max_ps(best[2], best[3])));
  return true;
}

// The first index holding `value`, which the row holds.
KILN_ARGMAX_TARGET int32_t FirstEqual(std::span<const float> row, float value) {
  const float* data = row.data();
  const int64_t n = static_cast<int64_t>(row.size());
  const __m512 target = _mm512_set1_ps(value);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(data + i), target, _CMP_EQ_OQ);
    if (hit != 0) return static_cast<int32_t>(i + __builtin_ctz(hit));
  }
  for (; i < n; ++i) {
    if (data[i] == value) return static_cast<int32_t>(i);
  }
  return 0;  // not reached: the value came from the row
}

}  // namespace

int32_t ArgmaxFirst(std::span<const float> row) {
  if (row.empty()) return 0;
  float max = 0;
  if (HasAvx512() && VectorMax(row, &max)) return FirstEqual(row, max);
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

float MaxValue(std::span<const float> row) {
  float max = 0;
  if (HasAvx512() && VectorMax(row, &max)) return max;
  return *std::max_element(row.begin(), row.end());
}

}  // namespace kiln
