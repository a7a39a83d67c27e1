// AVX-512 building blocks of the CPU kernels that are not GEMMs. Each function carries its own
// target attribute: callers check Avx512Supported() at run time and keep a portable path.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/cpu_features.h"

namespace kiln::cpu {

// e^x in each lane, within 2 ulp of the exact value for results above FLT_MIN (Cody–Waite
// reduction by ln 2, a degree-7 polynomial, then 2ⁿ by vscalefps). NaN stays NaN, −inf gives 0,
// x above 88.72 gives +inf, as std::exp does.
KILN_AVX512_TARGET KILN_ALWAYS_INLINE __m512 Exp16(__m512 x) {
  // max/min return their second operand when either is NaN, so a NaN passes through.
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2, high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);      // ln 2, the rest
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Transposes 16 rows of 16 floats in place: afterwards rows[c] holds column c.
KILN_AVX512_TARGET KILN_ALWAYS_INLINE void Transpose16x16(__m512 rows[16]) {
  __m512 t[16], u[16], v[16];
  KILN_UNROLL
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
  }
  // u[4g + c]: rows 4g .. 4g+3 at columns c, c+4, c+8, c+12 (one per 128-bit lane).
  KILN_UNROLL
  for (int g = 0; g < 4; ++g) {
    const __m512d lo = _mm512_castps_pd(t[4 * g]), hi = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d lo2 = _mm512_castps_pd(t[4 * g + 2]), hi2 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, lo2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, lo2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi, hi2));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi, hi2));
  }
  // v[2c], v[2c+1]: rows 0..7 at columns (c, c+8) and (c+4, c+12); v[8+2c], v[9+2c]: rows 8..15.
  KILN_UNROLL
  for (int c = 0; c < 4; ++c) {
    v[2 * c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
    v[2 * c + 1] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
    v[8 + 2 * c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    v[9 + 2 * c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
  }
  KILN_UNROLL
  for (int c = 0; c < 4; ++c) {
    rows[c] = _mm512_shuffle_f32x4(v[2 * c], v[8 + 2 * c], 0x88);
    rows[c + 8] = _mm512_shuffle_f32x4(v[2 * c], v[8 + 2 * c], 0xdd);
    rows[c + 4] = _mm512_shuffle_f32x4(v[2 * c + 1], v[9 + 2 * c], 0x88);
    rows[c + 12] = _mm512_shuffle_f32x4(v[2 * c + 1], v[9 + 2 * c], 0xdd);
  }
}

}  // namespace kiln::cpu
