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

}  // namespace kiln::cpu
