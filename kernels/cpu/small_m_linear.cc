#include "kernels/cpu/small_m_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/panel_split.h"

namespace kiln::cpu {
namespace {

#define KILN_AVX512_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// How far ahead of the loads the panel is prefetched. The hardware prefetcher follows one
// sequential stream well; this keeps more lines in flight at the start of each panel.
constexpr int64_t kPrefetchBytes = 1024;
// A thread gets at least this many weight bytes: below it the fork/join costs more than the
// second core saves.
constexpr int64_t kMinBytesPerThread = int64_t{512} << 10;

// Activations in the weight dtype, K padded with zeros (the weights' padding is zero, and 0·x must
// not meet a NaN or Inf from beyond the row). Per calling thread; only grows.
thread_local std::vector<uint16_t> tls_x_bf16;
thread_local std::vector<float> tls_x_f32;

// Writes R rows × B vectors of accumulators to y (row stride n) for columns
// [col, col + 16·B) ∩ [0, n), adding the bias.
template <int R, int B>
KILN_AVX512_TARGET KILN_ALWAYS_INLINE void StorePanel(const __m512 (&acc)[R][4], const float* bias,
                                                      int64_t col, int64_t n, float* y) {
  KILN_UNROLL
  for (int b = 0; b < B; ++b) {
    const int64_t first = col + 16 * b;
    const int64_t valid = std::clamp<int64_t>(n - first, 0, 16);
    if (valid == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << valid) - 1);
    const __m512 add =
        bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + first) : _mm512_setzero_ps();
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(y + r * n + first, mask, _mm512_add_ps(acc[r][b], add));
    }
  }
}

inline void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

// Runs rows.template operator()<R, B>() for m rows (1-8): up to 4 rows take the whole panel in one
// pass (B = 4 column vectors), 5-8 take it in two halves (B = 2), as the Panel functions say.
template <typename Rows>
void ForRowCount(int64_t m, Rows&& rows) {
  switch (m) {
    case 1:
      return rows.template operator()<1, 4>();
    case 2:
      return rows.template operator()<2, 4>();
    case 3:
      return rows.template operator()<3, 4>();
    case 4:
      return rows.template operator()<4, 4>();
    case 5:
      return rows.template operator()<5, 2>();
    case 6:
      return rows.template operator()<6, 2>();
    case 7:
      return rows.template operator()<7, 2>();
    default:
      return rows.template operator()<8, 2>();
  }
}

// ---- bf16: a panel is [k_padded / 2][64][2]; one k pair of 64 columns is 4 vectors ------------

// Accumulates R rows × B column vectors (16 columns each) of S panels over k pairs
// [j_begin, j_end), starting at vector b0, into zeroed accumulators. Up to 4 rows take the whole
// panel in one pass (B = 4); 5-8 rows take it as two halves (B = 2), each half reading its own
// two cache lines of every k pair, so the panel is still read once. Every row sums in the same
// order whatever R and S are, so a row's result does not depend on the rows or panels beside it.
template <int R, int B, int S>
KILN_AVX512_BF16_TARGET KILN_ALWAYS_INLINE void PanelsBf16(const uint16_t* const (&panels)[S],
                                                           int64_t j_begin, int64_t j_end, int b0,
                                                           const uint32_t* x, int64_t x_stride,
                                                           __m512 (&acc)[S][R][4]) {
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      KILN_UNROLL
      for (int b = 0; b < B; ++b) acc[s][r][b] = _mm512_setzero_ps();
    }
  }
  for (int64_t j = j_begin; j < j_end; ++j) {
    __m512bh xr[R];
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      xr[r] = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * x_stride + j]));
    }
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      const uint16_t* p = panels[s] + 32 * b0 + j * 128;
      KILN_UNROLL
      for (int line = 0; line < B; ++line) Prefetch(p + kPrefetchBytes / 2 + line * 32);
      if (B < 4 && b0 == 0) {
        // The other half's lines, into L2 for the second pass.
        KILN_UNROLL
        for (int line = B; line < 4; ++line) {
          _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes / 2 + line * 32),
                       _MM_HINT_T1);
        }
      }
      KILN_UNROLL
      for (int b = 0; b < B; ++b) {
        const __m512bh w = (__m512bh)_mm512_load_si512(p + 32 * b);
        KILN_UNROLL
        for (int r = 0; r < R; ++r) acc[s][r][b] = _mm512_dpbf16_ps(acc[s][r][b], xr[r], w);
      }
    }
  }
}

// Panels first[0..S) (each k_padded × 64 values) for R rows, summed in k blocks as w.k_block
// says, stored with the bias.
template <int R, int B, int S>
KILN_AVX512_BF16_TARGET void PanelGroupBf16(const PanelWeights& w, const uint32_t* x,
                                            int64_t x_stride, const int64_t (&first)[S], float* y) {
  const auto* data = static_cast<const uint16_t*>(w.data);
  const int64_t pairs = w.k_padded / 2;
  const int64_t block_pairs = w.k_block > 0 ? w.k_block / 2 : pairs;
  const uint16_t* panels[S];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) panels[s] = data + first[s] * w.k_padded * kPanelColumns;
  KILN_UNROLL
  for (int b0 = 0; b0 < 4; b0 += B) {
    __m512 total[S][R][4];
    PanelsBf16<R, B, S>(panels, 0, std::min(pairs, block_pairs), b0, x, x_stride, total);
    for (int64_t j = block_pairs; j < pairs; j += block_pairs) {
      __m512 acc[S][R][4];
      PanelsBf16<R, B, S>(panels, j, std::min(pairs, j + block_pairs), b0, x, x_stride, acc);
      KILN_UNROLL
      for (int s = 0; s < S; ++s) {
        KILN_UNROLL
        for (int r = 0; r < R; ++r) {
          KILN_UNROLL
          for (int b = 0; b < B; ++b) total[s][r][b] = _mm512_add_ps(total[s][r][b], acc[s][r][b]);
        }
      }
    }
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      StorePanel<R, B>(total[s], w.bias, first[s] * kPanelColumns + 16 * b0, w.n, y);
    }
  }
}

// Panels first[0..count) side by side (count ≤ StreamsForRows(m)).
void GroupBf16(const PanelWeights& w, const uint16_t* x, int64_t m, const int64_t* first, int count,
               float* y) {
  const auto* xp = reinterpret_cast<const uint32_t*>(x);
  ForRowCount(m, [&]<int R, int B>() {
    ForStreamCount<StreamsForRows(R)>(first, count, [&]<int S>(const int64_t(&panels)[S]) {
      PanelGroupBf16<R, B, S>(w, xp, w.k_padded / 2, panels, y);
    });
  });
}

// Same rounding as the brgemm path's activation conversion (nearest even).
KILN_AVX512_BF16_TARGET void ToBf16Padded(const float* x, int64_t m, int64_t k, int64_t k_padded,
                                          uint16_t* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* src = x + r * k;
    uint16_t* dst = out + r * k_padded;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
      std::memcpy(dst + i, &v, sizeof(v));
    }
    if (i < k) {
      const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << (k - i)) - 1);
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + i));
      uint16_t lanes[16];
      std::memcpy(lanes, &v, sizeof(v));
      std::memcpy(dst + i, lanes, static_cast<size_t>(k - i) * sizeof(uint16_t));
    }
    std::fill(dst + k, dst + k_padded, uint16_t{0});
  }
}

// ---- f32: a panel is [k_padded][64] ---------------------------------------------------------

template <int R, int B>
KILN_AVX512_TARGET KILN_ALWAYS_INLINE void PanelF32(const float* panel, int64_t i_begin,
                                                    int64_t i_end, int b0, const float* x,
                                                    int64_t x_stride, __m512 (&acc)[R][4]) {
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    KILN_UNROLL
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  const float* base = panel + 16 * b0;
  for (int64_t i = i_begin; i < i_end; ++i) {
    const float* p = base + i * 64;
    KILN_UNROLL
    for (int line = 0; line < B; ++line) Prefetch(p + kPrefetchBytes / 4 + line * 16);
    __m512 w[B];
    KILN_UNROLL
    for (int b = 0; b < B; ++b) w[b] = _mm512_load_ps(p + 16 * b);
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * x_stride + i]);
      KILN_UNROLL
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(xr, w[b], acc[r][b]);
    }
  }
}

template <int R, int B>
KILN_AVX512_TARGET void RowsF32(const PanelWeights& w, const float* x, int64_t x_stride,
                                int64_t p_begin, int64_t p_end, float* y) {
  const auto* data = static_cast<const float*>(w.data);
  const int64_t block = w.k_block > 0 ? w.k_block : w.k_padded;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const float* panel = data + p * w.k_padded * kPanelColumns;
    KILN_UNROLL
    for (int b0 = 0; b0 < 4; b0 += B) {
      __m512 total[R][4];
      PanelF32<R, B>(panel, 0, std::min(w.k_padded, block), b0, x, x_stride, total);
      for (int64_t i = block; i < w.k_padded; i += block) {
        __m512 acc[R][4];
        PanelF32<R, B>(panel, i, std::min(w.k_padded, i + block), b0, x, x_stride, acc);
        KILN_UNROLL
        for (int r = 0; r < R; ++r) {
          KILN_UNROLL
          for (int b = 0; b < B; ++b) total[r][b] = _mm512_add_ps(total[r][b], acc[r][b]);
        }
      }
      StorePanel<R, B>(total, w.bias, p * kPanelColumns + 16 * b0, w.n, y);
    }
  }
}

void RangeF32(const PanelWeights& w, const float* x, int64_t m, int64_t p_begin, int64_t p_end,
              float* y) {
  ForRowCount(m, [&]<int R, int B>() { RowsF32<R, B>(w, x, w.k_padded, p_begin, p_end, y); });
}

void F32Padded(const float* x, int64_t m, int64_t k, int64_t k_padded, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    std::memcpy(out + r * k_padded, x + r * k, static_cast<size_t>(k) * sizeof(float));
    std::fill(out + r * k_padded + k, out + (r + 1) * k_padded, 0.0f);
  }
}

}  // namespace

bool SmallMKernelSupported(DType dtype) {
  const bool avx512 = Avx512Supported();
  if (dtype == DType::kF32) return avx512;
  if (dtype == DType::kBF16) return avx512 && __builtin_cpu_supports("avx512bf16");
  return false;
}

void RunSmallM(const PanelWeights& w, const float* x, int64_t m, float* y, int threads) {
  const int64_t panels = (w.n + kPanelColumns - 1) / kPanelColumns;
  const int64_t weight_bytes = w.k_padded * panels * kPanelColumns * DTypeSize(w.dtype);
  const int64_t useful_threads =
      std::clamp<int64_t>(weight_bytes / kMinBytesPerThread, 1, std::min<int64_t>(threads, panels));
  const void* xp = nullptr;
  if (w.dtype == DType::kBF16) {
    tls_x_bf16.resize(static_cast<size_t>(m * w.k_padded));
    ToBf16Padded(x, m, w.k, w.k_padded, tls_x_bf16.data());
    xp = tls_x_bf16.data();
  } else {
    tls_x_f32.resize(static_cast<size_t>(m * w.k_padded));
    F32Padded(x, m, w.k, w.k_padded, tls_x_f32.data());
    xp = tls_x_f32.data();
  }
  const int64_t streams = w.dtype == DType::kBF16 ? StreamsForRows(m) : 1;
  ForPanelStreams(panels, static_cast<int>(streams), static_cast<int>(useful_threads),
                  [&](const int64_t* first, int count) {
                    if (w.dtype == DType::kBF16) {
                      GroupBf16(w, static_cast<const uint16_t*>(xp), m, first, count, y);
                      return;
                    }
                    for (int i = 0; i < count; ++i) {
                      RangeF32(w, static_cast<const float*>(xp), m, first[i], first[i] + 1, y);
                    }
                  });
}

}  // namespace kiln::cpu
