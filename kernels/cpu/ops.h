// fp32 CPU kernels for the parts of a decoder layer that are not GEMMs. Each runs on all cores
// (OpenMP) and has a slow reference twin in tests/kernels/.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace kiln::cpu {

// y[r] = x[r] * rsqrt(mean(x[r]²) + eps) * weight, for `rows` rows of `dim` values.
// Row r of x starts at x + r*x_stride (same for y). x and y may be the same buffer.
void RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t rows, int64_t dim,
             float eps, float* y, int64_t y_stride);

// Rotary position embedding in the Hugging Face "rotate_half" convention: each head's vector is
// split in halves (x1, x2) and becomes (x1·cos − x2·sin, x2·cos + x1·sin), with frequencies
// cat(f, f). Llama-3 scaling adjusts the inverse frequencies.
struct RopeScaling {
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

class RopeTable {
 public:
  // rotary_dim == head_dim for every architecture kiln supports now.
  RopeTable(int64_t head_dim, double theta, const RopeScaling& scaling);
  int64_t head_dim() const { return head_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }  // head_dim/2 values

 private:
  int64_t head_dim_;
  std::vector<float> inv_freq_;
};

// Rotates `n_heads` heads of `head_dim` values in each of `n_tokens` rows in place. Row t
// starts at x + t*row_stride; its heads are contiguous. positions[t] is the absolute position.
void ApplyRope(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads,
               const int32_t* positions, const RopeTable& table);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i], for rows of [gate | up].
void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out);

// y[i] += x[i].
void AddInPlace(float* y, const float* x, int64_t n);

// Gathers rows of an embedding table (any stored dtype) into fp32 rows. Ids are checked by the
// caller.
void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out);

// Causal grouped-query attention for n_tokens new queries of one sequence at absolute
// positions start_pos .. start_pos+n_tokens-1, over a cache that already holds keys and values
// for positions 0 .. start_pos+n_tokens-1.
//   q:       row t at q + t*q_stride, n_heads heads of head_dim values
//   k_cache: row p at k_cache + p*kv_stride, n_kv_heads heads of head_dim values (same for v)
//   out:     row t at out + t*out_stride, n_heads*head_dim values
// Query head h reads kv head h / (n_heads / n_kv_heads). Scores are scaled by `scale`.
struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
};
void CausalAttention(const AttentionShape& shape, const float* q, int64_t q_stride,
                     int64_t n_tokens, int64_t start_pos, const float* k_cache,
                     const float* v_cache, int64_t kv_stride, float* out, int64_t out_stride);

}  // namespace kiln::cpu
