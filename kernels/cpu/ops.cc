#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace kiln::cpu {
namespace {

// Below this many elements an OpenMP team costs more than it saves.
constexpr int64_t kParallelElements = 1 << 15;

}  // namespace

void RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t rows, int64_t dim,
             float eps, float* y, int64_t y_stride) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t i = 0; i < dim; ++i) sum_sq += xr[i] * xr[i];
    // As Hugging Face: x * rsqrt(mean(x²) + eps), then times the weight, all in fp32.
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv_rms);
  }
}

// Follows transformers' _compute_default_rope_parameters and _compute_llama3_parameters op by
// op in fp32 (torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar).
RopeTable::RopeTable(int64_t head_dim, double theta, const RopeScaling& scaling)
    : head_dim_(head_dim), inv_freq_(static_cast<size_t>(head_dim / 2)) {
  const float base = static_cast<float>(theta);
  const float dim = static_cast<float>(head_dim);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    inv_freq_[i] = 1.0f / std::pow(base, exponent);
  }
  if (!scaling.llama3) return;
  const float factor = static_cast<float>(scaling.factor);
  const float low = static_cast<float>(scaling.low_freq_factor);
  const double old_context = scaling.original_max_position_embeddings;
  const float low_freq_wavelen = static_cast<float>(old_context / scaling.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context / scaling.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float high_minus_low =
      static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
  for (float& inv : inv_freq_) {
    const float wavelen = (1.0f / inv) * two_pi;
    if (wavelen < high_freq_wavelen) continue;  // high frequency: kept
    if (wavelen > low_freq_wavelen) {           // low frequency: scaled down
      inv = inv / factor;
      continue;
    }
    const float smooth =
        ((1.0f / wavelen) * static_cast<float>(old_context) - low) / high_minus_low;
    inv = (1.0f - smooth) * inv / factor + smooth * inv;
  }
}

void ApplyRope(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads,
               const int32_t* positions, const RopeTable& table) {
  const int64_t head_dim = table.head_dim();
  const int64_t half = head_dim / 2;
  const float* inv_freq = table.inv_freq().data();
#pragma omp parallel if (n_tokens > 1 && n_tokens * n_heads * head_dim >= kParallelElements)
  {
    std::vector<float> cos(static_cast<size_t>(half));
    std::vector<float> sin(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];  // fp32 product, as HF
        cos[i] = std::cos(angle);
        sin[i] = std::sin(angle);
      }
      float* row = x + t * row_stride;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* x1 = row + h * head_dim;
        float* x2 = x1 + half;
        const float* c = cos.data();
        const float* s = sin.data();
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i];
          const float b = x2[i];
          x1[i] = a * c[i] - b * s[i];
          x2[i] = b * c[i] + a * s[i];
        }
      }
    }
  }
}

void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) {
#pragma omp parallel for collapse(2) schedule(static) if (rows * inter >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate_up[r * 2 * inter + i];
      const float u = gate_up[r * 2 * inter + inter + i];
      out[r * inter + i] = g / (1.0f + std::exp(-g)) * u;
    }
  }
}

void AddInPlace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 4 * kParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  const int64_t cols = table.cols;
  const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(table.dtype);
#pragma omp parallel for schedule(static) if (n * cols >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    ConvertToF32(table.dtype, table.data + static_cast<size_t>(ids[i]) * row_bytes, cols,
                 out + i * cols);
  }
}

void CausalAttention(const AttentionShape& shape, const float* q, int64_t q_stride,
                     int64_t n_tokens, int64_t start_pos, const float* k_cache,
                     const float* v_cache, int64_t kv_stride, float* out, int64_t out_stride) {
  const int64_t n_heads = shape.n_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t group = std::max<int64_t>(1, n_heads / std::max<int64_t>(1, shape.n_kv_heads));
  const int64_t context = start_pos + n_tokens;
  const float scale = shape.scale;
  const bool parallel = n_tokens * n_heads > 1 && context * n_heads * head_dim >= 4096;
#pragma omp parallel if (parallel)
  {
    std::vector<float> scores(static_cast<size_t>(context));
    std::vector<float> acc(static_cast<size_t>(head_dim));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qv = q + t * q_stride + h * head_dim;
        const int64_t kv_offset = (h / group) * head_dim;
        const int64_t len = start_pos + t + 1;  // causal: keys 0 .. start_pos + t
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < len; ++p) {
          const float* kv = k_cache + p * kv_stride + kv_offset;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < head_dim; ++i) dot += qv[i] * kv[i];
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
        for (int64_t p = 0; p < len; ++p) {
          const float* vv = v_cache + p * kv_stride + kv_offset;
          const float w = scores[p];
#pragma omp simd
          for (int64_t i = 0; i < head_dim; ++i) a[i] += w * vv[i];
        }
        const float inv_sum = 1.0f / sum;
        float* o = out + t * out_stride + h * head_dim;
#pragma omp simd
        for (int64_t i = 0; i < head_dim; ++i) o[i] = a[i] * inv_sum;
      }
    }
  }
}

}  // namespace kiln::cpu
