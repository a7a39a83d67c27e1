#include "kernels/cpu/small_m_linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/panel_split.h"
#include "kernels/cpu/prefetch.h"

// GCC 12 reports the _mm512_undefined_epi32() pass-through operand inside its own intrinsics
// (vinserti64x4) as maybe-uninitialized once they inline into a target("...") function; the
// operand is unused by the unmasked forms.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::cpu {
namespace {

#define KILN_AVX512_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// How far ahead of the loads the 1-4-row kernel prefetches a panel, into L2 (prefetcht1). The
// hardware prefetcher follows one sequential stream well; this keeps more lines in flight (on a
// Zen 4, alternating in one process: qkv 0.64 → 0.68-0.85 of the probe at 1-3 rows, the larger
// shapes the same or a few % faster; prefetcht0, into L1 too, read 10-30 % slower at 2-4 rows).
// The f32 kernel does not prefetch: it read the same or slower with it.
constexpr int64_t kPrefetchBytes = 1024;
// A thread gets at least this many weight bytes: below it the fork/join costs more than the
// second core saves.
constexpr int64_t kMinBytesPerThread = int64_t{512} << 10;

// Activations in the weight dtype, K padded with zeros (the weights' padding is zero, and 0·x must
// not meet a NaN or Inf from beyond the row). Per calling thread; only grows. bf16 holds one
// uint32 (a pair of values) a row and k pair, the rows of a k pair side by side (ToBf16Pairs).
thread_local std::vector<uint32_t> tls_x_bf16;
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

// Runs f.template operator()<R>() with R = clamp(rows, First, Last), for kernels templated on
// their row count.
template <int First, int Last, typename F>
void ForRows(int64_t rows, F&& f) {
  if constexpr (First < Last) {
    if (rows > First) return ForRows<First + 1, Last>(rows, f);
  }
  return f.template operator()<First>();
}

// Runs rows.template operator()<R, B>() for m rows (1-8) of f32: up to 4 rows take the whole panel
// in one pass (B = 4 column vectors), 5-8 take it in two halves (B = 2).
template <typename Rows>
void ForRowCount(int64_t m, Rows&& rows) {
  ForRows<1, 8>(m, [&]<int R>() { rows.template operator()<R, R <= 4 ? 4 : 2>(); });
}

// ---- bf16: a panel is [k_padded / 2][64][2]; one k pair of 64 columns is 4 vectors ------------

// Accumulates R ≤ 4 rows × the 4 column vectors (16 columns each) of S panels over k pairs
// [j_begin, j_end) into zeroed accumulators, the whole panel in one pass. Every row sums in the
// same order whatever R and S are, so a row's result does not depend on the rows or panels beside
// it.
template <int R, int S>
KILN_AVX512_BF16_TARGET KILN_ALWAYS_INLINE void PanelsBf16(const uint16_t* const (&panels)[S],
                                                           int64_t j_begin, int64_t j_end,
                                                           const uint32_t* x, int64_t x_stride,
                                                           __m512 (&acc)[S][R][4]) {
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      KILN_UNROLL
      for (int b = 0; b < 4; ++b) acc[s][r][b] = _mm512_setzero_ps();
    }
  }
  for (int64_t j = j_begin; j < j_end; ++j) {
    __m512bh xr[R];
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      xr[r] = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[j * x_stride + r]));
    }
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      const uint16_t* p = panels[s] + j * 128;
      KILN_UNROLL
      for (int line = 0; line < 4; ++line) PrefetchToL2(p + kPrefetchBytes / 2 + line * 32);
      KILN_UNROLL
      for (int b = 0; b < 4; ++b) {
        const __m512bh w = (__m512bh)_mm512_load_si512(p + 32 * b);
        KILN_UNROLL
        for (int r = 0; r < R; ++r) acc[s][r][b] = _mm512_dpbf16_ps(acc[s][r][b], xr[r], w);
      }
    }
  }
}

// Panels first[0..S) (each k_padded × 64 values) for R ≤ 4 rows, summed in k blocks as w.k_block
// says, stored with the bias.
template <int R, int S>
KILN_AVX512_BF16_TARGET void PanelGroupBf16(const PanelWeights& w, const uint32_t* x,
                                            int64_t x_stride, const int64_t (&first)[S], float* y) {
  const auto* data = static_cast<const uint16_t*>(w.data);
  const int64_t pairs = w.k_padded / 2;
  const int64_t block_pairs = w.k_block > 0 ? w.k_block / 2 : pairs;
  const uint16_t* panels[S];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) panels[s] = data + first[s] * w.k_padded * kPanelColumns;
  __m512 total[S][R][4];
  PanelsBf16<R, S>(panels, 0, std::min(pairs, block_pairs), x, x_stride, total);
  for (int64_t j = block_pairs; j < pairs; j += block_pairs) {
    __m512 acc[S][R][4];
    PanelsBf16<R, S>(panels, j, std::min(pairs, j + block_pairs), x, x_stride, acc);
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        KILN_UNROLL
        for (int b = 0; b < 4; ++b) total[s][r][b] = _mm512_add_ps(total[s][r][b], acc[s][r][b]);
      }
    }
  }
  KILN_UNROLL
  for (int s = 0; s < S; ++s) {
    StorePanel<R, 4>(total[s], w.bias, first[s] * kPanelColumns, w.n, y);
  }
}

// ---- bf16, 5-16 rows: a panel's k pairs in chunks, every pass over a chunk before the next ------
//
// 5-8 rows take a panel as two column halves (8 rows × 2 vectors fill the registers), 9-16 rows
// also as two row groups: up to four passes. Passes over the whole panel would leave memory idle
// while the later ones read it from cache; over a chunk (16 KiB) they read it from L1 and, spread
// over them, prefetch the next chunk into L2, so the weights stream at an even rate while the FMAs
// run (linear_bench --layer_order, the 0.5B shapes on a Zen 5 EPYC: 15 % faster than whole-panel
// passes at 8 rows, and at 16 rows about 20 % faster than brgemm in the dispatcher's rounds; on a
// Zen 4, whose AVX-512 units are 256 bits wide, brgemm stayed ahead at 9-16 rows until the
// prefetch below really ran; with it this kernel wins there too, gate_up 2239 against 2643 µs at
// 16 rows in the dispatcher's rounds). On the Zen 4 at 8 rows gate_up read 0.44 of the probe
// without the prefetch (compiled out, see prefetch.h), 0.52-0.63 with it into L1 and 0.76 into L2.
// Accumulators go to a scratch between passes (exact), so each row sums in the order above.

// k pairs per chunk: 64 × 256 bytes = 16 KiB, half of L1. With the activations laid out by k pair
// (ToBf16Pairs), alternating chunk sizes call by call in kiln_linear_bench --layer_order on a
// Zen 4: 64 pairs took 1-10 % less time than 32 at 8, 12 and 16 rows in every shape, 48 and 96
// more than 64, 16 about 12 % more than 32 (before that layout 16-64 measured the same at 16
// rows; 128, the whole of L1 with the next chunk's lines arriving, ran 15-20 % slower).
constexpr int64_t kChunkPairs = 64;
// Rows a pass holds in registers.
constexpr int kRowsPerPass = 8;
static_assert(kSmallMMaxRows <= 2 * kRowsPerPass);
// Cache lines of one k pair (64 columns × 2 values × 2 bytes).
constexpr int kLinesPerPair = 4;

// Accumulators of up to 16 rows × 4 vectors between passes.
struct alignas(64) ChunkScratch {
  float acc[2 * kRowsPerPass][4][16];
};

// One pass: R rows (x, k pair stride x_stride) × vectors [b0, b0 + 2) of the panel's k pairs
// [j_begin, j_end), continuing the sums in `scratch` (or from zero when `first`), and prefetching
// `lines` cache lines a k pair from `ahead` on (spreading the next chunk over the passes).
template <int R, int L>
KILN_AVX512_BF16_TARGET KILN_ALWAYS_INLINE void ChunkPassBf16(
    const uint16_t* panel, int64_t j_begin, int64_t j_end, int b0, const uint32_t* x,
    int64_t x_stride, bool first, const char* ahead, float (*scratch)[4][16]) {
  __m512 acc[R][2];
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    KILN_UNROLL
    for (int b = 0; b < 2; ++b) {
      acc[r][b] = first ? _mm512_setzero_ps() : _mm512_load_ps(scratch[r][b0 + b]);
    }
  }
  const uint16_t* p = panel + j_begin * 128 + 32 * b0;
  for (int64_t j = j_begin; j < j_end; ++j, p += 128) {
    KILN_UNROLL
    for (int line = 0; line < L; ++line) PrefetchToL2(ahead + line * 64);
    ahead += L * 64;
    const __m512bh w0 = (__m512bh)_mm512_load_si512(p);
    const __m512bh w1 = (__m512bh)_mm512_load_si512(p + 32);
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512bh xr = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[j * x_stride + r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
    }
  }
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    KILN_UNROLL
    for (int b = 0; b < 2; ++b) _mm512_store_ps(scratch[r][b0 + b], acc[r][b]);
  }
}

// Both column halves of R rows over a chunk, each pass prefetching its share of the next chunk
// (`ahead`, then `ahead + ahead_stride`). A function of its own, not a lambda, so that the passes
// inline under the AVX-512 target (a lambda does not take its enclosing function's target).
template <int R, int L>
KILN_AVX512_BF16_TARGET void ChunkGroupBf16(const uint16_t* panel, int64_t j_begin, int64_t j_end,
                                            const uint32_t* x, int64_t x_stride, bool first,
                                            const char* ahead, int64_t ahead_stride,
                                            float (*scratch)[4][16]) {
  ChunkPassBf16<R, L>(panel, j_begin, j_end, 0, x, x_stride, first, ahead, scratch);
  ChunkPassBf16<R, L>(panel, j_begin, j_end, 2, x, x_stride, first, ahead + ahead_stride, scratch);
}

// Panel `panel_index` for 5 ≤ m ≤ 16 rows, summed in k blocks as w.k_block says.
KILN_AVX512_BF16_TARGET void ChunkedPanelBf16(const PanelWeights& w, const uint32_t* x, int64_t m,
                                              int64_t panel_index, float* y) {
  const auto* panel =
      static_cast<const uint16_t*>(w.data) + panel_index * w.k_padded * kPanelColumns;
  const int64_t pairs = w.k_padded / 2;
  const int64_t block_pairs = w.k_block > 0 ? w.k_block / 2 : pairs;
  const int64_t x_stride = m;
  const int groups = m > kRowsPerPass ? 2 : 1;
  const int64_t group_rows[2] = {groups == 2 ? (m + 1) / 2 : m, groups == 2 ? m / 2 : 0};
  const int passes = 2 * groups;
  ChunkScratch block;
  ChunkScratch total;
  for (int64_t block_begin = 0; block_begin < pairs; block_begin += block_pairs) {
    const int64_t block_end = std::min(pairs, block_begin + block_pairs);
    for (int64_t begin = block_begin; begin < block_end; begin += kChunkPairs) {
      const int64_t end = std::min(block_end, begin + kChunkPairs);
      // The next chunk's lines (beyond the panel: the next panel's first), shared among the
      // passes: 4 lines a k pair over 2 or 4 passes.
      const char* ahead = reinterpret_cast<const char*>(panel + end * 128);
      const int64_t ahead_stride = (end - begin) * kLinesPerPair * 64 / passes;
      int64_t row0 = 0;
      for (int g = 0; g < groups; ++g) {
        const char* group_ahead = ahead + 2 * g * ahead_stride;
        ForRows<4, kRowsPerPass>(group_rows[g], [&]<int R>() {
          if (groups == 2) {
            ChunkGroupBf16<R, 1>(panel, begin, end, x + row0, x_stride, begin == block_begin,
                                 group_ahead, ahead_stride, block.acc + row0);
          } else {
            ChunkGroupBf16<R, 2>(panel, begin, end, x + row0, x_stride, begin == block_begin,
                                 group_ahead, ahead_stride, block.acc + row0);
          }
        });
        row0 += group_rows[g];
      }
    }
    for (int64_t r = 0; r < m; ++r) {
      KILN_UNROLL
      for (int b = 0; b < 4; ++b) {
        const __m512 sum = _mm512_load_ps(block.acc[r][b]);
        _mm512_store_ps(total.acc[r][b], block_begin == 0
                                             ? sum
                                             : _mm512_add_ps(_mm512_load_ps(total.acc[r][b]), sum));
      }
    }
  }
  const int64_t col = panel_index * kPanelColumns;
  for (int b = 0; b < 4; ++b) {
    const int64_t first = col + 16 * b;
    const int64_t valid = std::clamp<int64_t>(w.n - first, 0, 16);
    if (valid == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << valid) - 1);
    const __m512 add =
        w.bias != nullptr ? _mm512_maskz_loadu_ps(mask, w.bias + first) : _mm512_setzero_ps();
    for (int64_t r = 0; r < m; ++r) {
      _mm512_mask_storeu_ps(y + r * w.n + first, mask,
                            _mm512_add_ps(_mm512_load_ps(total.acc[r][b]), add));
    }
  }
}

// Panels first[0..count) side by side (count ≤ StreamsForRows(m)).
void GroupBf16(const PanelWeights& w, const uint32_t* x, int64_t m, const int64_t* first, int count,
               float* y) {
  if (m > 4) {
    for (int i = 0; i < count; ++i) ChunkedPanelBf16(w, x, m, first[i], y);
    return;
  }
  auto rows = [&]<int R>() {
    ForStreamCount<StreamsForRows(R)>(first, count, [&]<int S>(const int64_t(&panels)[S]) {
      PanelGroupBf16<R, S>(w, x, m, panels, y);
    });
  };
  ForRows<1, 4>(m, rows);
}

// 16 values of one row as bf16 pairs (8 uint32), the first min(left, 16) read from x, the rest
// zero (left ≤ 0: all zero, and no address beyond the row is formed), with the brgemm path's
// rounding (nearest even).
KILN_AVX512_BF16_TARGET KILN_ALWAYS_INLINE __m256i PairsOf16(const float* x, int64_t left) {
  if (left <= 0) return _mm256_setzero_si256();
  const __mmask16 mask = static_cast<__mmask16>((uint32_t{1} << std::min<int64_t>(left, 16)) - 1);
  return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x));
}

// Transposes 8 rows of 8 uint32 in place: v[l] becomes what was lane l of every row.
KILN_AVX512_BF16_TARGET KILN_ALWAYS_INLINE void Transpose8x8(__m256i* v) {
  __m256i t[8], u[8];
  KILN_UNROLL
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  KILN_UNROLL
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  KILN_UNROLL
  for (int l = 0; l < 4; ++l) {
    v[l] = _mm256_permute2x128_si256(u[l], u[4 + l], 0x20);
    v[4 + l] = _mm256_permute2x128_si256(u[l], u[4 + l], 0x31);
  }
}

// The m ≤ kSmallMMaxRows (16) rows of x as bf16 pairs, k pair by k pair: out[j·m + r] holds row r's
// values 2j and 2j + 1 (low half first), zero past k. The kernels broadcast row r's pair from one
// pointer that moves m values a k pair, at the constant offset r: with the rows one after another,
// the 5-16-row kernel's eight row pointers outgrew the registers and were reloaded from the stack
// before each broadcast. 5-16 rows are transposed 16 values of every row at a time in registers
// (16 rows, K = 4864: 5 µs against 26 with a store per pair); 2-4 rows store each pair.
KILN_AVX512_BF16_TARGET void ToBf16Pairs(const float* x, int64_t m, int64_t k, int64_t k_padded,
                                         uint32_t* out) {
  // k_padded is a multiple of 16: 8 pairs a step.
  if (m == 1) {
    for (int64_t i = 0; i < k_padded; i += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i / 2), PairsOf16(x + i, k - i));
    }
    return;
  }
  if (m <= 4) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < k_padded; i += 16) {
        alignas(32) uint32_t pairs[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(pairs), PairsOf16(x + r * k + i, k - i));
        uint32_t* dst = out + i / 2 * m + r;
        KILN_UNROLL
        for (int l = 0; l < 8; ++l) dst[l * m] = pairs[l];
      }
    }
    return;
  }
  const __mmask16 rows_mask = static_cast<__mmask16>((uint32_t{1} << m) - 1);
  for (int64_t i = 0; i < k_padded; i += 16) {
    __m256i rows[16];
    KILN_UNROLL
    for (int r = 0; r < 16; ++r) {
      rows[r] = r < m ? PairsOf16(x + r * k + i, k - i) : _mm256_setzero_si256();
    }
    Transpose8x8(rows);
    if (m > 8) Transpose8x8(rows + 8);
    KILN_UNROLL
    for (int l = 0; l < 8; ++l) {
      const __m512i pair = _mm512_inserti64x4(_mm512_castsi256_si512(rows[l]), rows[8 + l], 1);
      _mm512_mask_storeu_epi32(out + (i / 2 + l) * m, rows_mask, pair);
    }
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
  // More than 8 rows: two passes of rows, the second reading the panel from cache.
  const int64_t first_rows = m <= 8 ? m : (m + 1) / 2;
  const int64_t row0[2] = {0, first_rows};
  const int64_t rows[2] = {first_rows, m - first_rows};
  for (int g = 0; g < 2 && rows[g] > 0; ++g) {
    ForRowCount(rows[g], [&]<int R, int B>() {
      RowsF32<R, B>(w, x + row0[g] * w.k_padded, w.k_padded, p_begin, p_end, y + row0[g] * w.n);
    });
  }
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
  // Past one pass of rows a byte costs a pass more of FMAs.
  const int64_t work_bytes = weight_bytes * ((m + kRowsPerPass - 1) / kRowsPerPass);
  const int64_t useful_threads =
      std::clamp<int64_t>(work_bytes / kMinBytesPerThread, 1, std::min<int64_t>(threads, panels));
  const int64_t streams =
      w.dtype == DType::kBF16 ? std::min<int64_t>(w.max_streams, StreamsForRows(m)) : 1;
  const int64_t panel_bytes = weight_bytes / panels;
  // Every thread lays the activations out for itself as soon as it has the job, while the first
  // lines of its panels are on their way, rather than the others waiting for the calling thread
  // (at 16 rows and K = 4864 the layout takes 5 µs).
  ForPanelStreams(
      panels, static_cast<int>(streams), static_cast<int>(useful_threads),
      [&](const int64_t* first, int count) {
        if (w.dtype == DType::kBF16) {
          PrefetchPanelStarts(w.data, panel_bytes, first, count, kPrefetchBytes);
          tls_x_bf16.resize(static_cast<size_t>(m * w.k_padded / 2));
          ToBf16Pairs(x, m, w.k, w.k_padded, tls_x_bf16.data());
        } else {
          tls_x_f32.resize(static_cast<size_t>(m * w.k_padded));
          F32Padded(x, m, w.k, w.k_padded, tls_x_f32.data());
        }
      },
      [&](const int64_t* first, int count) {
        if (w.dtype == DType::kBF16) {
          GroupBf16(w, tls_x_bf16.data(), m, first, count, y);
          return;
        }
        for (int i = 0; i < count; ++i) {
          RangeF32(w, tls_x_f32.data(), m, first[i], first[i] + 1, y);
        }
      });
}

}  // namespace kiln::cpu
