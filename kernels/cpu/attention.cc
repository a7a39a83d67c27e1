// Causal attention over the paged KV pool (kernels/cpu/ops.h). The AVX-512 path works on tiles:
// the query heads that share one KV head, for a few consecutive tokens, meet each chunk of 64
// keys together, so each key and value row is read once per tile rather than once per head and
// token. The pool stores keys transposed (kernels/step.h), so one dimension of 16 positions is a
// vector and scores come 16 keys to a vector straight from it; the softmax is taken online
// (flash-attention style) with a vectorized exp.

// GCC 12 reports the _mm512_undefined_ps() pass-through operand inside its own intrinsics as
// (maybe-)uninitialized once they inline into a target("...") function (the unmasked forms do not
// read it); the state has to be set before <immintrin.h> is first included.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/vector_math.h"

namespace kiln::cpu {
namespace {

// Keys per chunk of the online softmax (one max, rescale and sum per row and chunk), in
// sub-blocks of 16 that are transposed and scored as one vector each.
constexpr int64_t kKeysPerChunk = 64;
constexpr int64_t kLanes = 16;
constexpr int64_t kSubBlocks = kKeysPerChunk / kLanes;
constexpr int64_t kMaxHeadDim = 512;
// Query rows (tokens × heads of one KV group) per tile: enough to reuse each key chunk, few
// enough that a prefill still splits into many tiles for the threads.
constexpr int64_t kTargetTileRows = 32;

// One query at a time, key by key: any head_dim, any CPU. T is the pool's element.
template <typename T>
void PortableAttention(const AttentionShape& shape, const float* q, int64_t q_stride,
                       int64_t n_tokens, int64_t start_pos, const PagedKv& kv, float* out,
                       int64_t out_stride) {
  const int64_t n_heads = shape.n_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t kv_dim = kv.pool.kv_dim;
  const int64_t block_size = kv.pool.block_size;
  const int64_t group = std::max<int64_t>(1, n_heads / std::max<int64_t>(1, shape.n_kv_heads));
  const int64_t context = start_pos + n_tokens;
  const float scale = shape.scale;
  const bool parallel = n_tokens * n_heads > 1 && context * n_heads * head_dim >= 4096;
  // Query (t, h) with this thread's scratch.
  auto attend = [&](int64_t t, int64_t h, std::vector<float>& scores, std::vector<float>& acc) {
    const float* qv = q + t * q_stride + h * head_dim;
    const int64_t kv_offset = (h / group) * head_dim;
    const int64_t len = start_pos + t + 1;  // causal: keys 0 .. start_pos + t
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < len; ++p) {
      const T* key = kv.key<T>(p, kv_offset);  // transposed: dimensions block_size apart
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < head_dim; ++i) dot += qv[i] * KvToF32(key[i * block_size]);
      scores[p] = dot * scale;
      max_score = std::max(max_score, scores[p]);
    }
    float sum = 0.0f;
    for (int64_t p = 0; p < len; ++p) {
      scores[p] = std::exp(scores[p] - max_score);
      sum += scores[p];
    }
    float* a = acc.data();
    std::fill(acc.begin(), acc.end(), 0.0f);
    // Block by block: the rows inside a block are contiguous.
    for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
      const T* values = kv.values<T>(b) + kv_offset;
      const int64_t end = std::min(len - first, block_size);
      for (int64_t o = 0; o < end; ++o) {
        const T* vr = values + o * kv_dim;
        const float w = scores[first + o];
#pragma omp simd
        for (int64_t i = 0; i < head_dim; ++i) a[i] += w * KvToF32(vr[i]);
      }
    }
    const float inv_sum = 1.0f / sum;
    float* o = out + t * out_stride + h * head_dim;
#pragma omp simd
    for (int64_t i = 0; i < head_dim; ++i) o[i] = a[i] * inv_sum;
  };
  // Every (token, head) query, handed out one at a time when `split`.
  auto attend_all = [&](bool split) {
    std::vector<float> scores(static_cast<size_t>(context));
    std::vector<float> acc(static_cast<size_t>(head_dim));
    if (!split) {
      for (int64_t i = 0; i < n_tokens * n_heads; ++i)
        attend(i / n_heads, i % n_heads, scores, acc);
      return;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tokens * n_heads; ++i) attend(i / n_heads, i % n_heads, scores, acc);
  };
  // Serial runs stay outside any OpenMP construct (see parallel_for.h).
  if (!parallel) return attend_all(false);
#pragma omp parallel
  attend_all(true);
}

// Per-thread state of one tile: its query rows pre-scaled, the running max, sum and output of
// each row, the current chunk's probabilities and transposed keys.
struct TileState {
  std::vector<float> q, acc, max, sum, alpha, probs, keys_t;
};
thread_local TileState tls_tile;

struct Tile {
  int64_t first_token = 0;  // within the new tokens
  int64_t tokens = 0;
  int64_t kv_head = 0;
};

// 16 pool elements as fp32: bf16 bits widen exactly by a 16-bit shift.
KILN_AVX512_TARGET KILN_ALWAYS_INLINE __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
KILN_AVX512_TARGET KILN_ALWAYS_INLINE __m512 Load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Scores of `R` rows against one sub-block of 16 keys, whose dimension d is the vector at
// keys_t + d·key_stride: s[r] = Σ_d q[r][d] · keys_t[d], summed in 4 chains
// (d mod 4) both for latency and so that rounding grows with head_dim / 4, not head_dim. The order
// is the same whatever R is: a row's scores do not depend on the rows beside it in its tile, so
// verifying k tokens gives each the same result as decoding it alone.
template <typename T, int R>
KILN_AVX512_TARGET KILN_ALWAYS_INLINE void ChunkScores(const float* q, int64_t head_dim,
                                                       const T* keys_t, int64_t key_stride,
                                                       __m512* s) {
  constexpr int kChains = 4;  // head_dim is a multiple of 16
  __m512 chain[R][kChains];
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    KILN_UNROLL
    for (int c = 0; c < kChains; ++c) chain[r][c] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < head_dim; d += kChains) {
    KILN_UNROLL
    for (int c = 0; c < kChains; ++c) {
      const __m512 k = Load16(keys_t + (d + c) * key_stride);
      KILN_UNROLL
      for (int r = 0; r < R; ++r) {
        chain[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * head_dim + d + c]), k, chain[r][c]);
      }
    }
  }
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    s[r] = _mm512_add_ps(_mm512_add_ps(chain[r][0], chain[r][1]),
                         _mm512_add_ps(chain[r][2], chain[r][3]));
  }
}

// acc[r][d0 .. d0 + 16·V) = acc · alpha[r] + Σ_j probs[r][j] · value_j, for R rows.
template <typename T, int R, int V>
KILN_AVX512_TARGET KILN_ALWAYS_INLINE void ChunkValues(const T* const* values, int64_t count,
                                                       const float* probs, const float* alpha,
                                                       int64_t d0, int64_t head_dim, float* acc) {
  __m512 a[R][V];
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(alpha[r]);
    KILN_UNROLL
    for (int v = 0; v < V; ++v) {
      a[r][v] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * head_dim + d0 + 16 * v), scale);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 row[V];
    KILN_UNROLL
    for (int v = 0; v < V; ++v) row[v] = Load16(values[j] + d0 + 16 * v);
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(probs[r * kKeysPerChunk + j]);
      KILN_UNROLL
      for (int v = 0; v < V; ++v) a[r][v] = _mm512_fmadd_ps(p, row[v], a[r][v]);
    }
  }
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    KILN_UNROLL
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc + r * head_dim + d0 + 16 * v, a[r][v]);
  }
}

template <typename T, int R>
KILN_AVX512_TARGET void ChunkValuesRows(const T* const* values, int64_t count, const float* probs,
                                        const float* alpha, int64_t head_dim, float* acc) {
  int64_t d0 = 0;
  for (; d0 + 64 <= head_dim; d0 += 64) {
    ChunkValues<T, R, 4>(values, count, probs, alpha, d0, head_dim, acc);
  }
  for (; d0 < head_dim; d0 += 16) {
    ChunkValues<T, R, 1>(values, count, probs, alpha, d0, head_dim, acc);
  }
}

// ChunkScores for n ≤ 4 rows.
template <typename T>
KILN_AVX512_TARGET void Scores(int64_t n, const float* q, int64_t head_dim, const T* keys_t,
                               int64_t key_stride, __m512* s) {
  switch (n) {
    case 4:
      return ChunkScores<T, 4>(q, head_dim, keys_t, key_stride, s);
    case 3:
      return ChunkScores<T, 3>(q, head_dim, keys_t, key_stride, s);
    case 2:
      return ChunkScores<T, 2>(q, head_dim, keys_t, key_stride, s);
    default:
      return ChunkScores<T, 1>(q, head_dim, keys_t, key_stride, s);
  }
}

// fn(p, offset, n) for each run [p, p + n) of positions [first, last) that lies in one block (at
// `offset` in it): one division per block, not per position.
template <typename Fn>
inline void ForEachBlockRun(int64_t first, int64_t last, int64_t block_size, Fn&& fn) {
  for (int64_t p = first; p < last;) {
    const int64_t offset = p % block_size;
    const int64_t n = std::min(block_size - offset, last - p);
    fn(p, offset, n);
    p += n;
  }
}

// The cache lines of one KV head's keys and values at positions [first, first + kKeysPerChunk),
// asked for into L2 a few at a time while the chunk before them is scored, keys first.
class ChunkPrefetch {
 public:
  template <typename T>
  void Reset(const PagedKv& kv, int64_t kv_offset, int64_t head_dim, int64_t first, int64_t end,
             int64_t steps) {
    spans_ = 0;
    next_span_ = 0;
    next_line_ = 0;
    total_ = 0;
    const int64_t block_size = kv.pool.block_size;
    const int64_t last = std::min(first + kKeysPerChunk, end);
    ForEachBlockRun(first, last, block_size, [&](int64_t p, int64_t offset, int64_t n) {
      const T* rows = kv.key<T>(p - offset, kv_offset);  // the head's first dimension's row
      if (block_size <= kKeysPerChunk) {
        // A head's rows of a block lie back to back: the block at once.
        Add(rows, head_dim * block_size * sizeof(T));
      } else {
        // Larger blocks: only the chunk's positions of each dimension's row.
        for (int64_t d = 0; d < head_dim; ++d) Add(rows + d * block_size + offset, n * sizeof(T));
      }
    });
    const int64_t kv_dim = kv.pool.kv_dim;
    ForEachBlockRun(first, last, block_size, [&](int64_t p, int64_t, int64_t n) {
      const T* row = kv.value<T>(p, kv_offset);
      for (int64_t i = 0; i < n; ++i) Add(row + i * kv_dim, head_dim * sizeof(T));
    });
    per_step_ = (total_ + steps - 1) / std::max<int64_t>(steps, 1);
  }
  // The next lines of a step's share.
  void Step() { Issue(per_step_); }
  void Rest() { Issue(total_); }

 private:
  static constexpr int64_t kLine = 64;
  struct Span {
    uintptr_t first_line;
    int64_t lines;
  };
  void Add(const void* p, int64_t bytes) {
    const auto begin = reinterpret_cast<uintptr_t>(p);
    const uintptr_t first_line = begin / kLine;
    const int64_t lines = static_cast<int64_t>((begin + bytes + kLine - 1) / kLine - first_line);
    span_[spans_++] = Span{first_line, lines};
    total_ += lines;
  }
  void Issue(int64_t lines) {
    for (; lines > 0 && next_span_ < spans_; --lines) {
      const Span& span = span_[next_span_];
      PrefetchToL2(reinterpret_cast<const void*>((span.first_line + next_line_) * kLine));
      if (++next_line_ == span.lines) {
        next_line_ = 0;
        ++next_span_;
      }
    }
  }

  // Keys: one a block (blocks of up to kKeysPerChunk positions), or one a dimension of each of
  // the (at most two) larger blocks a chunk meets; values: one a position.
  Span span_[std::max(kKeysPerChunk, 2 * kMaxHeadDim) + kKeysPerChunk];
  int spans_ = 0;
  int next_span_ = 0;
  int64_t next_line_ = 0;
  int64_t total_ = 0;
  int64_t per_step_ = 0;
};

// T is the pool's element (float, or uint16_t bf16 bits).
template <typename T>
KILN_AVX512_TARGET void RunTile(const AttentionShape& shape, const float* q, int64_t q_stride,
                                int64_t start_pos, const PagedKv& kv, const Tile& tile, float* out,
                                int64_t out_stride) {
  const int64_t head_dim = shape.head_dim;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t rows = tile.tokens * group;  // row = token · group + head within the group
  const int64_t kv_offset = tile.kv_head * head_dim;
  const int64_t block_size = kv.pool.block_size;
  const int64_t kv_dim = kv.pool.kv_dim;
  TileState& st = tls_tile;
  st.q.resize(static_cast<size_t>(rows * head_dim));
  st.acc.assign(static_cast<size_t>(rows * head_dim), 0.0f);
  st.max.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  st.sum.assign(static_cast<size_t>(rows), 0.0f);
  st.alpha.resize(static_cast<size_t>(rows));
  st.probs.resize(static_cast<size_t>(rows * kKeysPerChunk));
  st.keys_t.resize(static_cast<size_t>(head_dim * kKeysPerChunk + kLanes));
  float* keys_t = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(st.keys_t.data()) + 63) &
                                           ~uintptr_t{63});
  const __m512 scale = _mm512_set1_ps(shape.scale);
  for (int64_t t = 0; t < tile.tokens; ++t) {
    for (int64_t h = 0; h < group; ++h) {
      const float* src =
          q + (tile.first_token + t) * q_stride + (tile.kv_head * group + h) * head_dim;
      float* dst = st.q.data() + (t * group + h) * head_dim;
      for (int64_t d = 0; d < head_dim; d += 16) {
        _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(src + d), scale));
      }
    }
  }
  // Keys 0 .. last position of the tile; row r sees keys up to start_pos + its token.
  const int64_t first_pos = start_pos + tile.first_token;
  const int64_t keys = first_pos + tile.tokens;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const bool direct_keys = block_size % kLanes == 0;
  const T* value_rows[kKeysPerChunk];
  // The first chunk's lines are asked for at once; each later chunk's trickle out while the
  // chunk before it is scored (one share after each Scores call), into L2.
  const int64_t score_steps = (rows + 3) / 4 * kSubBlocks;
  ChunkPrefetch prefetch;
  prefetch.Reset<T>(kv, kv_offset, head_dim, 0, keys, 1);
  prefetch.Rest();
  for (int64_t k0 = 0; k0 < keys; k0 += kKeysPerChunk) {
    const int64_t count = std::min(kKeysPerChunk, keys - k0);
    prefetch.Reset<T>(kv, kv_offset, head_dim, k0 + kKeysPerChunk, keys, score_steps);
    const int64_t sub_blocks = (count + kLanes - 1) / kLanes;
    ForEachBlockRun(k0, k0 + count, block_size, [&](int64_t p, int64_t, int64_t n) {
      const T* row = kv.value<T>(p, kv_offset);
      for (int64_t i = 0; i < n; ++i) value_rows[p - k0 + i] = row + i * kv_dim;
    });
    // Sub-block b (keys 16b .. 16b+15 of the chunk) as 16-key vectors, dimension d at
    // key_t[b] + d·block_size: read where they lie when a block holds whole sub-blocks (the pool
    // stores keys transposed), else gathered as fp32 into keys_t first (gathered[b] + d·16).
    const T* key_t[kSubBlocks];
    const float* gathered[kSubBlocks];
    if (direct_keys) {
      for (int64_t b = 0; b < sub_blocks; ++b) {
        const int64_t p = k0 + b * kLanes;
        key_t[b] = kv.key<T>(p, kv_offset);
      }
    } else {
      for (int64_t b = 0; b < sub_blocks; ++b) {
        float* sub_t = keys_t + b * head_dim * kLanes;
        gathered[b] = sub_t;
        for (int64_t j = 0; j < kLanes; ++j) {
          const int64_t p = k0 + b * kLanes + j;
          if (p - k0 >= count) {
            for (int64_t d = 0; d < head_dim; ++d) sub_t[d * kLanes + j] = 0.0f;
            continue;
          }
          const T* key = kv.key<T>(p, kv_offset);
          for (int64_t d = 0; d < head_dim; ++d) {
            sub_t[d * kLanes + j] = KvToF32(key[d * block_size]);
          }
        }
      }
    }
    // Scores, mask, and the online softmax update of each row.
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      __m512 s[kSubBlocks][4];
      const int64_t n = std::min<int64_t>(4, rows - r0);
      const float* qr = st.q.data() + r0 * head_dim;
      for (int64_t b = 0; b < sub_blocks; ++b) {
        if (direct_keys) {
          Scores(n, qr, head_dim, key_t[b], block_size, s[b]);
        } else {
          Scores(n, qr, head_dim, gathered[b], kLanes, s[b]);
        }
        prefetch.Step();
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const int64_t visible = std::min(count, first_pos + r / group + 1 - k0);  // keys < this
        __m512 scores[kSubBlocks];
        __m512 chunk_max = minus_inf;
        for (int64_t b = 0; b < sub_blocks; ++b) {
          const __mmask16 mask = _mm512_cmplt_epi32_mask(
              lane, _mm512_set1_epi32(static_cast<int32_t>(visible - b * kLanes)));
          scores[b] = _mm512_mask_blend_ps(mask, minus_inf, s[b][i]);
          chunk_max = _mm512_max_ps(chunk_max, scores[b]);
        }
        const float old_max = st.max[static_cast<size_t>(r)];
        const float new_max = std::max(old_max, _mm512_reduce_max_ps(chunk_max));
        // The first chunk holds key 0, which every row sees: new_max is finite from there on
        // (or NaN, which then spreads to the row's output as it should).
        const float alpha = std::exp(old_max - new_max);
        __m512 total = _mm512_setzero_ps();
        for (int64_t b = 0; b < sub_blocks; ++b) {
          const __m512 probs = Exp16(_mm512_sub_ps(scores[b], _mm512_set1_ps(new_max)));
          _mm512_storeu_ps(st.probs.data() + r * kKeysPerChunk + b * kLanes, probs);
          total = _mm512_add_ps(total, probs);
        }
        st.sum[static_cast<size_t>(r)] =
            st.sum[static_cast<size_t>(r)] * alpha + _mm512_reduce_add_ps(total);
        st.max[static_cast<size_t>(r)] = new_max;
        st.alpha[static_cast<size_t>(r)] = alpha;
      }
    }
    prefetch.Rest();
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t n = std::min<int64_t>(4, rows - r0);
      const float* probs = st.probs.data() + r0 * kKeysPerChunk;
      const float* alpha = st.alpha.data() + r0;
      float* acc = st.acc.data() + r0 * head_dim;
      switch (n) {
        case 4:
          ChunkValuesRows<T, 4>(value_rows, count, probs, alpha, head_dim, acc);
          break;
        case 3:
          ChunkValuesRows<T, 3>(value_rows, count, probs, alpha, head_dim, acc);
          break;
        case 2:
          ChunkValuesRows<T, 2>(value_rows, count, probs, alpha, head_dim, acc);
          break;
        default:
          ChunkValuesRows<T, 1>(value_rows, count, probs, alpha, head_dim, acc);
          break;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r / group, h = tile.kv_head * group + r % group;
    const __m512 inverse = _mm512_set1_ps(1.0f / st.sum[static_cast<size_t>(r)]);
    const float* a = st.acc.data() + r * head_dim;
    float* o = out + (tile.first_token + t) * out_stride + h * head_dim;
    for (int64_t d = 0; d < head_dim; d += 16) {
      _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(a + d), inverse));
    }
  }
}

// A tile of one of a step's sequences, and the keys its last token sees (its work).
struct SequenceTile {
  const AttentionSequence* sequence = nullptr;
  Tile tile;
  int64_t keys = 0;
};
thread_local std::vector<SequenceTile> tls_sequence_tiles;

bool TiledPathSupports(const AttentionShape& shape) {
  static const bool avx512 = Avx512Supported();
  return avx512 && shape.head_dim % 16 == 0 && shape.head_dim <= kMaxHeadDim &&
         shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0;
}

}  // namespace

void CausalAttention(const AttentionShape& shape, const AttentionSequence* sequences,
                     int64_t count) {
  if (!TiledPathSupports(shape)) {
    for (int64_t s = 0; s < count; ++s) {
      const AttentionSequence& seq = sequences[s];
      if (seq.kv.pool.dtype == DType::kBF16) {
        PortableAttention<uint16_t>(shape, seq.q, seq.q_stride, seq.n_tokens, seq.start_pos, seq.kv,
                                    seq.out, seq.out_stride);
      } else {
        PortableAttention<float>(shape, seq.q, seq.q_stride, seq.n_tokens, seq.start_pos, seq.kv,
                                 seq.out, seq.out_stride);
      }
    }
    return;
  }
  // Each sequence's tokens in tiles of a few tokens × one KV head's query heads; a row's result
  // depends only on its own tile, so a sequence gets the same bits alone or beside others.
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  std::vector<SequenceTile>& tiles = tls_sequence_tiles;
  tiles.clear();
  int64_t work = 0;
  for (int64_t s = 0; s < count; ++s) {
    const AttentionSequence& seq = sequences[s];
    if (seq.n_tokens <= 0) continue;
    const int64_t tile_tokens = std::clamp<int64_t>(kTargetTileRows / group, 1, seq.n_tokens);
    for (int64_t first = 0; first < seq.n_tokens; first += tile_tokens) {
      for (int64_t kv_head = 0; kv_head < shape.n_kv_heads; ++kv_head) {
        SequenceTile unit;
        unit.sequence = &seq;
        unit.tile.first_token = first;
        unit.tile.tokens = std::min(tile_tokens, seq.n_tokens - first);
        unit.tile.kv_head = kv_head;
        unit.keys = seq.start_pos + first + unit.tile.tokens;
        tiles.push_back(unit);
      }
    }
    work += (seq.start_pos + seq.n_tokens) * shape.n_heads * shape.head_dim;
  }
  // Tiles that see more keys take longer: hand them out first so the threads finish together.
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const SequenceTile& a, const SequenceTile& b) { return a.keys > b.keys; });
  const bool parallel = tiles.size() > 1 && work >= 4096;
  ParallelForDynamic(static_cast<int64_t>(tiles.size()), parallel, [&](int64_t i) {
    const SequenceTile& unit = tiles[static_cast<size_t>(i)];
    const AttentionSequence& seq = *unit.sequence;
    if (seq.kv.pool.dtype == DType::kBF16) {
      RunTile<uint16_t>(shape, seq.q, seq.q_stride, seq.start_pos, seq.kv, unit.tile, seq.out,
                        seq.out_stride);
    } else {
      RunTile<float>(shape, seq.q, seq.q_stride, seq.start_pos, seq.kv, unit.tile, seq.out,
                     seq.out_stride);
    }
  });
}

void CausalAttention(const AttentionShape& shape, const float* q, int64_t q_stride,
                     int64_t n_tokens, int64_t start_pos, const PagedKv& kv, float* out,
                     int64_t out_stride) {
  const AttentionSequence sequence{q, q_stride, n_tokens, start_pos, kv, out, out_stride};
  CausalAttention(shape, &sequence, 1);
}

}  // namespace kiln::cpu
