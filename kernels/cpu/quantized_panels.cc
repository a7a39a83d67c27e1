#include "kernels/cpu/quantized_panels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/panel_split.h"
#include "kernels/cpu/prefetch.h"

// GCC 12 reports the _mm512_undefined_ps() pass-through operand inside its own intrinsics
// (vcvtdq2ps, vcvtph2ps, vmaxps) as maybe-uninitialized once they inline into a target("...")
// function; the operand is unused by the unmasked forms.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::cpu::quantized {
namespace {

// How far ahead of the loads a panel is prefetched, into L2. On a Zen 4, alternating in one
// process (linear_bench --layer_order): prefetcht0 (into L1 too) read 10-30 % slower (int4 down
// 0.72 → 0.87 of the probe, qkv 0.54 → 0.79); 512-640 bytes ahead read the same, 2-4 KiB 10-25 %
// less where the bandwidth was high.
constexpr int64_t kPrefetchBytes = 1024;

// Quantizes `count` values (a multiple of 16, zero-padded past `valid`) symmetrically to int8:
// returns the scale; `sum` gets Σq. A NaN or Inf makes the scale NaN, so the outputs are NaN.
// One span a row, for int8 weights (QuantizeGroups takes int4's groups of 32).
KILN_VNNI_TARGET float QuantizeSpan(const float* x, int64_t valid, int64_t count, int8_t* out,
                                    int32_t* sum) {
  __m512 amax = _mm512_setzero_ps();
  __m512 non_finite = _mm512_setzero_ps();  // NaN in a lane once a NaN or Inf was seen (v · 0)
  for (int64_t i = 0; i < count; i += 16) {
    const int64_t left = std::clamp<int64_t>(valid - i, 0, 16);
    const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << left) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    non_finite = _mm512_add_ps(non_finite, _mm512_mul_ps(v, _mm512_setzero_ps()));
  }
  const float max_abs = _mm512_reduce_max_ps(amax);
  if (_mm512_cmp_ps_mask(non_finite, non_finite, _CMP_UNORD_Q) != 0) {
    std::memset(out, 0, static_cast<size_t>(count));
    *sum = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (max_abs == 0.0f) {
    std::memset(out, 0, static_cast<size_t>(count));
    *sum = 0;
    return 0.0f;
  }
  const __m512 inverse = _mm512_set1_ps(127.0f / max_abs);
  __m512i total = _mm512_setzero_si512();
  for (int64_t i = 0; i < count; i += 16) {
    const int64_t left = std::clamp<int64_t>(valid - i, 0, 16);
    const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << left) - 1);
    const __m512i q =
        _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inverse));
    total = _mm512_add_epi32(total, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtsepi32_epi8(q));
  }
  *sum = _mm512_reduce_add_epi32(total);
  return max_abs / 127.0f;
}

enum class Reduce { kMax, kAddInt32 };

template <Reduce kOp>
KILN_VNNI_TARGET KILN_ALWAYS_INLINE __m512 Combine(__m512 a, __m512 b) {
  if constexpr (kOp == Reduce::kMax) return _mm512_max_ps(a, b);
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// Lane j of the result: kOp over the 16 lanes of v[j]. One transposing reduction of 16 vectors,
// 15 pairs of shuffles, in place of 16 reductions of one vector each (4 dependent shuffles apiece).
template <Reduce kOp>
KILN_VNNI_TARGET KILN_ALWAYS_INLINE __m512 ReduceEachVector(const __m512 (&v)[16]) {
  __m512 halves[8];  // [2i] in 128-bit chunks 0-1, [2i + 1] in chunks 2-3
  KILN_UNROLL
  for (int i = 0; i < 8; ++i) {
    halves[i] = Combine<kOp>(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  }
  __m512 quarters[4];  // chunk c holds [4i + c]
  KILN_UNROLL
  for (int i = 0; i < 4; ++i) {
    quarters[i] = Combine<kOp>(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0x88),
                               _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0xdd));
  }
  __m512 pairs[2];  // in chunk c, lanes 0-1 hold [8i + c], lanes 2-3 [8i + 4 + c]
  KILN_UNROLL
  for (int i = 0; i < 2; ++i) {
    pairs[i] = Combine<kOp>(_mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], 0x44),
                            _mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], 0xee));
  }
  // Lane 4c + i holds [c + 4i].
  const __m512 done = Combine<kOp>(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88),
                                   _mm512_shuffle_ps(pairs[0], pairs[1], 0xdd));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, done);
}

// One row of int4 activations, each group of 32 values quantized on its own as QuantizeSpan
// does, 16 groups at a time with their maxima, scales and sums side by side in vectors: group by
// group, 28 groups (K = 896) took 0.4-0.9 µs a call and 152 (K = 4864) 2.3-3.9.
KILN_VNNI_TARGET void QuantizeGroups(const float* x, int64_t k, int64_t groups, int8_t* out,
                                     float* scales, int32_t* offsets) {
  static_assert(kInt4GroupSize == 32, "two vectors a group");
  const __m512 infinity = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  const __m512 levels = _mm512_set1_ps(127.0f);
  for (int64_t g0 = 0; g0 < groups; g0 += 16) {
    const int64_t count = std::min<int64_t>(16, groups - g0);
    __m512 v[16][2];
    __m512 magnitude[16];  // per group, |v| lane by lane; +inf where a value is NaN or Inf
    KILN_UNROLL
    for (int j = 0; j < 16; ++j) {
      KILN_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int64_t at = (g0 + j) * kInt4GroupSize + 16 * h;
        const int64_t valid = std::clamp<int64_t>(k - at, 0, 16);
        v[j][h] = valid == 0 ? _mm512_setzero_ps()
                             : _mm512_maskz_loadu_ps(
                                   static_cast<__mmask16>((uint32_t{1} << valid) - 1), x + at);
      }
      const __m512 a0 = _mm512_mask_mov_ps(
          _mm512_abs_ps(v[j][0]), _mm512_cmp_ps_mask(v[j][0], v[j][0], _CMP_UNORD_Q), infinity);
      const __m512 a1 = _mm512_mask_mov_ps(
          _mm512_abs_ps(v[j][1]), _mm512_cmp_ps_mask(v[j][1], v[j][1], _CMP_UNORD_Q), infinity);
      magnitude[j] = _mm512_max_ps(a0, a1);
    }
    const __m512 max_abs = ReduceEachVector<Reduce::kMax>(magnitude);
    const __mmask16 finite = _mm512_cmp_ps_mask(max_abs, infinity, _CMP_LT_OQ);
    const __mmask16 nonzero = _mm512_cmp_ps_mask(max_abs, _mm512_setzero_ps(), _CMP_GT_OQ);
    // A group with a NaN or Inf gets a NaN scale (its outputs become NaN) and q = 0, as does
    // QuantizeSpan; an all-zero group scale 0 and q = 0.
    const __m512 scale = _mm512_mask_div_ps(_mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                                            finite, max_abs, levels);
    const __mmask16 scaled = finite & nonzero;
    const __m512 inverse = _mm512_maskz_div_ps(scaled, levels, max_abs);
    const auto store_mask = static_cast<__mmask16>((uint32_t{1} << count) - 1);
    _mm512_mask_storeu_ps(scales + g0, store_mask, scale);
    __m512 sums[16];
    KILN_UNROLL
    for (int j = 0; j < 16; ++j) {
      const __m512 group_inverse = _mm512_permutexvar_ps(_mm512_set1_epi32(j), inverse);
      const auto lanes = static_cast<__mmask16>((scaled >> j & 1) != 0 ? 0xffff : 0);
      const __m512i q0 = _mm512_maskz_cvtps_epi32(lanes, _mm512_mul_ps(v[j][0], group_inverse));
      const __m512i q1 = _mm512_maskz_cvtps_epi32(lanes, _mm512_mul_ps(v[j][1], group_inverse));
      if (j < count) {
        int8_t* group_out = out + (g0 + j) * kInt4GroupSize;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(group_out), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(group_out + 16), _mm512_cvtsepi32_epi8(q1));
      }
      sums[j] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
    }
    const __m512i total = _mm512_castps_si512(ReduceEachVector<Reduce::kAddInt32>(sums));
    _mm512_mask_storeu_epi32(offsets + g0, store_mask,
                             _mm512_mullo_epi32(total, _mm512_set1_epi32(8)));
  }
}

}  // namespace

void QuantizeActivations(const PackedView& w, const float* x, int64_t m, QuantizedActivations& a) {
  const int64_t groups_per_row = w.kind == Quantization::kInt8 ? 1 : w.k_padded / kInt4GroupSize;
  a.values.resize(static_cast<size_t>(m * w.k_padded));
  a.scales.resize(static_cast<size_t>(m * groups_per_row));
  a.offsets.resize(static_cast<size_t>(m * groups_per_row));
  for (int64_t r = 0; r < m; ++r) {
    int8_t* values = a.values.data() + r * w.k_padded;
    float* scales = a.scales.data() + r * groups_per_row;
    int32_t* offsets = a.offsets.data() + r * groups_per_row;
    if (w.kind == Quantization::kInt4) {
      QuantizeGroups(x + r * w.k, w.k, groups_per_row, values, scales, offsets);
      continue;
    }
    int32_t sum = 0;
    *scales = QuantizeSpan(x + r * w.k, w.k, w.k_padded, values, &sum);
    *offsets = 128 * sum;
  }
}

namespace {

// Masked store of one vector of 16 columns starting at `col`, with the bias.
KILN_VNNI_TARGET KILN_ALWAYS_INLINE void StoreColumns(__m512 value, const float* bias, int64_t col,
                                                      int64_t n, float* y_row) {
  const int64_t valid = std::clamp<int64_t>(n - col, 0, 16);
  if (valid == 0) return;
  const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << valid) - 1);
  if (bias != nullptr) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, bias + col));
  _mm512_mask_storeu_ps(y_row + col, mask, value);
}

// ---- int8: R rows × the whole 64-column panel, S panels at once -------------------------------

template <int R, int S>
KILN_VNNI_TARGET void Int8Panels(const PackedView& w, const QuantizedActivations& a, int64_t row0,
                                 const int64_t (&p)[S], float* y) {
  const uint8_t* panel[S];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) panel[s] = w.data + p[s] * w.panel_bytes;
  const int8_t* x = a.values.data() + row0 * w.k_padded;
  __m512i acc[S][R][4];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      KILN_UNROLL
      for (int b = 0; b < 4; ++b) acc[s][r][b] = _mm512_setzero_si512();
    }
  }
  const int64_t quads = w.k_padded / 4;
  for (int64_t j = 0; j < quads; ++j) {
    __m512i xr[R];
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, x + r * w.k_padded + 4 * j, sizeof(quad));
      xr[r] = _mm512_set1_epi32(quad);
    }
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = panel[s] + j * kQuadBytesInt8;
      KILN_UNROLL
      for (int line = 0; line < 4; ++line) PrefetchToL2(q + kPrefetchBytes + 64 * line);
      KILN_UNROLL
      for (int b = 0; b < 4; ++b) {
        const __m512i weights = _mm512_load_si512(q + 64 * b);
        KILN_UNROLL
        for (int r = 0; r < R; ++r)
          acc[s][r][b] = _mm512_dpbusd_epi32(acc[s][r][b], weights, xr[r]);
      }
    }
  }
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    KILN_UNROLL
    for (int b = 0; b < 4; ++b) {
      const int64_t col = p[s] * kInt8PanelColumns + 16 * b;
      const __m512 column_scales = _mm512_load_ps(w.scales + col);
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        const size_t at = static_cast<size_t>(row0 + r);
        const __m512 sums =
            _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[s][r][b], _mm512_set1_epi32(a.offsets[at])));
        const __m512 scale = _mm512_mul_ps(column_scales, _mm512_set1_ps(a.scales[at]));
        StoreColumns(_mm512_mul_ps(sums, scale), w.bias, col, w.n, y + (row0 + r) * w.n);
      }
    }
  }
}

// ---- int4: R rows × the whole 32-column panel, scaled group by group, S panels at once ---------

template <int R, int S>
KILN_VNNI_TARGET void Int4Panels(const PackedView& w, const QuantizedActivations& a, int64_t row0,
                                 const int64_t (&p)[S], float* y) {
  const uint8_t* panel[S];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) panel[s] = w.data + p[s] * w.panel_bytes;
  const int64_t groups = w.k_padded / kInt4GroupSize;
  const int8_t* x = a.values.data() + row0 * w.k_padded;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
  const __m512i high_nibbles = _mm512_set1_epi8(static_cast<char>(0xf0));
  __m512 total[S][R][2];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    KILN_UNROLL
    for (int r = 0; r < R; ++r) total[s][r][0] = total[s][r][1] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    // For up to 2 rows (decode), the low nibbles' sums and, apart, the high nibbles' sums 16
    // times over: a high nibble is used in place (byte & 0xf0, still an unsigned byte for
    // vpdpbusd) and its sum shifted down once per group, exactly, instead of every byte shifted
    // down, a third fewer instructions a load. With 3-4 rows (prefill's passes) the second set
    // of accumulators would not fit the registers: the bytes are shifted there.
    constexpr bool kHighApart = R <= 2;
    __m512i acc[S][R][2];
    __m512i acc_hi[S][R][2];
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      const uint8_t* block = panel[s] + g * kInt4GroupBytes;
      KILN_UNROLL
      for (int line = 0; line < 9; ++line) PrefetchToL2(block + kPrefetchBytes + 64 * line);
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        acc[s][r][0] = acc[s][r][1] = _mm512_setzero_si512();
        if constexpr (kHighApart) acc_hi[s][r][0] = acc_hi[s][r][1] = _mm512_setzero_si512();
      }
    }
    KILN_UNROLL
    for (int i = 0; i < 4; ++i) {
      __m512i x_lo[R], x_hi[R];
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        int32_t quads[2];
        std::memcpy(quads, x + r * w.k_padded + g * kInt4GroupSize + 8 * i, sizeof(quads));
        x_lo[r] = _mm512_set1_epi32(quads[0]);
        x_hi[r] = _mm512_set1_epi32(quads[1]);
      }
      KILN_UNROLL
      for (int s = 0; s < S; ++s) {
        const uint8_t* block = panel[s] + g * kInt4GroupBytes;
        KILN_UNROLL
        for (int b = 0; b < 2; ++b) {
          const __m512i raw = _mm512_load_si512(block + (b * 4 + i) * 64);
          const __m512i lo = _mm512_and_si512(raw, low_nibbles);
          if constexpr (kHighApart) {
            const __m512i hi = _mm512_and_si512(raw, high_nibbles);
            KILN_UNROLL
            for (int r = 0; r < R; ++r) {
              acc[s][r][b] = _mm512_dpbusd_epi32(acc[s][r][b], lo, x_lo[r]);
              acc_hi[s][r][b] = _mm512_dpbusd_epi32(acc_hi[s][r][b], hi, x_hi[r]);
            }
          } else {
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_nibbles);
            KILN_UNROLL
            for (int r = 0; r < R; ++r) {
              acc[s][r][b] = _mm512_dpbusd_epi32(acc[s][r][b], lo, x_lo[r]);
              acc[s][r][b] = _mm512_dpbusd_epi32(acc[s][r][b], hi, x_hi[r]);
            }
          }
        }
      }
    }
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      const auto* scale_bits =
          reinterpret_cast<const __m256i*>(panel[s] + g * kInt4GroupBytes + kInt4GroupWeightBytes);
      const __m512 column_scales[2] = {_mm512_cvtph_ps(_mm256_load_si256(scale_bits)),
                                       _mm512_cvtph_ps(_mm256_load_si256(scale_bits + 1))};
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        const size_t at = static_cast<size_t>((row0 + r) * groups + g);
        const __m512i offset = _mm512_set1_epi32(a.offsets[at]);
        const __m512 row_scale = _mm512_set1_ps(a.scales[at]);
        KILN_UNROLL
        for (int b = 0; b < 2; ++b) {
          __m512i exact = acc[s][r][b];
          if constexpr (kHighApart) {
            exact = _mm512_add_epi32(exact, _mm512_srai_epi32(acc_hi[s][r][b], 4));
          }
          const __m512 sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(exact, offset));
          total[s][r][b] =
              _mm512_fmadd_ps(sums, _mm512_mul_ps(column_scales[b], row_scale), total[s][r][b]);
        }
      }
    }
  }
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    KILN_UNROLL
    for (int b = 0; b < 2; ++b) {
      const int64_t col = p[s] * kInt4PanelColumns + 16 * b;
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        StoreColumns(total[s][r][b], w.bias, col, w.n, y + (row0 + r) * w.n);
      }
    }
  }
}

}  // namespace

void PrefetchPanelStarts(const PackedView& w, const int64_t* first, int count) {
  cpu::PrefetchPanelStarts(w.data, w.panel_bytes, first, count, kPrefetchBytes);
}

// Panels first[0..count) side by side for m ≤ 4 rows (count ≤ StreamsForRows(m)); with more rows
// each panel in turn, in passes of 4 rows, so that the later passes read it from cache.
void RunPanelGroup(const PackedView& w, const QuantizedActivations& a, int64_t m,
                   const int64_t* first, int count, float* y) {
  auto pass = [&]<int R>(int64_t row0, const int64_t* panels, int n) {
    ForStreamCount<StreamsForRows(R)>(panels, n, [&]<int S>(const int64_t(&group)[S]) {
      w.kind == Quantization::kInt8 ? Int8Panels<R, S>(w, a, row0, group, y)
                                    : Int4Panels<R, S>(w, a, row0, group, y);
    });
  };
  switch (m) {
    case 1:
      return pass.template operator()<1>(0, first, count);
    case 2:
      return pass.template operator()<2>(0, first, count);
    case 3:
      return pass.template operator()<3>(0, first, count);
    case 4:
      return pass.template operator()<4>(0, first, count);
    default:
      break;
  }
  for (int i = 0; i < count; ++i) {
    for (int64_t row0 = 0; row0 < m; row0 += kMaxRowsPerPass) {
      switch (std::min<int64_t>(m - row0, kMaxRowsPerPass)) {
        case 1:
          pass.template operator()<1>(row0, first + i, 1);
          break;
        case 2:
          pass.template operator()<2>(row0, first + i, 1);
          break;
        case 3:
          pass.template operator()<3>(row0, first + i, 1);
          break;
        default:
          pass.template operator()<4>(row0, first + i, 1);
          break;
      }
    }
  }
}

}  // namespace kiln::cpu::quantized
