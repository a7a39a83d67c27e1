// fp32 CPU kernels for the parts of a decoder layer that are not GEMMs: what the CPU backend's
// execution context runs (kernels/cpu/cpu_backend.cc). Each runs on all cores (OpenMP) when the
// work is large enough; the backend op tests (tests/kernels/backend_ops_test.cc) check them
// against slow references through the seam.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"

namespace kiln::cpu {

// y = x · rsqrt(mean(x²) + eps) · weight for every group of `group` contiguous values of each
// of `rows` rows of `cols` values (cols % group == 0). Row r of x starts at x + r·x_stride (same
// for y). x and y may be the same buffer.
void RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t rows, int64_t cols,
             int64_t group, float eps, float* y, int64_t y_stride);

// residual += delta, then y = RmsNorm(residual) per row (one pass over each row).
void AddRmsNorm(float* residual, int64_t residual_stride, const float* delta, int64_t delta_stride,
                const float* weight, int64_t rows, int64_t dim, float eps, float* y,
                int64_t y_stride);

// Rotary position embedding in the Hugging Face "rotate_half" convention: each head's vector is
// split in halves (x1, x2) and becomes (x1·cos − x2·sin, x2·cos + x1·sin) with angle
// position · inv_freq[i] (fp32, as HF). Rotates `n_heads` heads of `head_dim` values in each of
// `n_tokens` rows in place; row t starts at x + t·row_stride, its heads contiguous.
void ApplyRope(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq);

// out[r, i] = silu(gate_up[r, i]) · gate_up[r, inter + i].
void SiluMul(const float* gate_up, int64_t gate_up_stride, int64_t rows, int64_t inter, float* out,
             int64_t out_stride);

// y[r, i] += x[r, i].
void Add(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t cols);

// Gathers rows of an embedding table (any stored dtype) into fp32 rows of `out` (row i at
// out + i·out_stride). Ids are checked by the caller.
void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                     int64_t out_stride);

// A pool element (float for kF32, uint16_t bf16 bits for kBF16) from and to fp32: bf16 rounds to
// nearest even on the way in and widens exactly on the way out.
inline float KvToF32(float value) { return value; }
inline float KvToF32(uint16_t bf16) { return BF16ToF32(bf16); }
template <typename T>
T KvFromF32(float value) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return F32ToBF16(value);
  } else {
    return value;
  }
}

// One layer of one sequence in the KV pool: position p lies in block table[p / block_size] at
// offset p % block_size of keys() and values(), laid out as KvPoolRef says (keys transposed).
// T is the pool's element: float (kF32) or uint16_t bf16 bits (kBF16).
struct PagedKv {
  KvPoolRef pool;
  const int32_t* table = nullptr;
  int64_t layer = 0;

  template <typename T>
  const T* keys(int64_t block) const {
    return pool.rows<T>(table[block], layer, 0);
  }
  template <typename T>
  const T* values(int64_t block) const {
    return pool.rows<T>(table[block], layer, 1);
  }
  // Key value i of position p; value i + 1 lies pool.block_size elements further on (transposed).
  template <typename T>
  const T* key(int64_t p, int64_t i) const {
    return keys<T>(p / pool.block_size) + pool.key_index(p % pool.block_size, i);
  }
  // Value i of position p; values i + 1 .. kv_dim − 1 follow it, then position p + 1's row
  // (within the block).
  template <typename T>
  const T* value(int64_t p, int64_t i) const {
    return values<T>(p / pool.block_size) + pool.value_index(p % pool.block_size, i);
  }
};

// Causal grouped-query attention for n_tokens new queries of one sequence at absolute
// positions start_pos .. start_pos+n_tokens-1, over the sequence's blocks, which already hold
// keys and values for positions 0 .. start_pos+n_tokens-1.
//   q:   row t at q + t*q_stride, n_heads heads of head_dim values
//   out: row t at out + t*out_stride, n_heads*head_dim values
void CausalAttention(const AttentionShape& shape, const float* q, int64_t q_stride,
                     int64_t n_tokens, int64_t start_pos, const PagedKv& kv, float* out,
                     int64_t out_stride);

// One sequence's part of a step's attention: CausalAttention's arguments.
struct AttentionSequence {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t n_tokens = 0;
  int64_t start_pos = 0;
  PagedKv kv;
  float* out = nullptr;
  int64_t out_stride = 0;
};

// CausalAttention for every sequence of a step, bit for bit, with the work of all of them handed
// to the threads at once, the tiles that see the most keys first: one hand-over a layer, not one
// a sequence (16 decoding streams made 16 a layer, each of two tiles).
void CausalAttention(const AttentionShape& shape, const AttentionSequence* sequences,
                     int64_t count);

}  // namespace kiln::cpu
