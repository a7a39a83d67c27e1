#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::cpu {
namespace {

// Below this many elements an OpenMP team costs more than it saves.
constexpr int64_t kParallelElements = 1 << 15;

}  // namespace

void RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t rows, int64_t cols,
             int64_t group, float eps, float* y, int64_t y_stride) {
  const int64_t groups = cols / group;
  const int64_t n = rows * groups;
#pragma omp parallel for schedule(static) if (n > 1 && rows * cols >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / groups;
    const int64_t g = i % groups;
    const float* xr = x + r * x_stride + g * group;
    float* yr = y + r * y_stride + g * group;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t j = 0; j < group; ++j) sum_sq += xr[j] * xr[j];
    // As Hugging Face: x * rsqrt(mean(x²) + eps), then times the weight, all in fp32.
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(group) + eps);
#pragma omp simd
    for (int64_t j = 0; j < group; ++j) yr[j] = weight[j] * (xr[j] * inv_rms);
  }
}

void AddRmsNorm(float* residual, int64_t residual_stride, const float* delta, int64_t delta_stride,
                const float* weight, int64_t rows, int64_t dim, float eps, float* y,
                int64_t y_stride) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = residual + r * residual_stride;
    const float* dr = delta + r * delta_stride;
    float* yr = y + r * y_stride;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t i = 0; i < dim; ++i) {
      xr[i] += dr[i];
      sum_sq += xr[i] * xr[i];
    }
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv_rms);
  }
}

void ApplyRope(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq) {
  const int64_t half = head_dim / 2;
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

void SiluMul(const float* gate_up, int64_t gate_up_stride, int64_t rows, int64_t inter, float* out,
             int64_t out_stride) {
#pragma omp parallel for collapse(2) schedule(static) if (rows * inter >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate_up[r * gate_up_stride + i];
      const float u = gate_up[r * gate_up_stride + inter + i];
      out[r * out_stride + i] = g / (1.0f + std::exp(-g)) * u;
    }
  }
}

void Add(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t cols) {
  if ((y_stride == cols && x_stride == cols) || rows == 1) {
    const int64_t n = rows * cols;
#pragma omp parallel for simd schedule(static) if (n >= 4 * kParallelElements)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
    return;
  }
#pragma omp parallel for schedule(static) if (rows * cols >= 4 * kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * y_stride;
    const float* xr = x + r * x_stride;
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) yr[i] += xr[i];
  }
}

void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                     int64_t out_stride) {
  const int64_t cols = table.cols;
  const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(table.dtype);
#pragma omp parallel for schedule(static) if (n * cols >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    ConvertToF32(table.dtype, table.data + static_cast<size_t>(ids[i]) * row_bytes, cols,
                 out + i * out_stride);
  }
}

void CausalAttention(const AttentionShape& shape, const float* q, int64_t q_stride,
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
        // Block by block: the rows inside a block are contiguous.
        for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
          const float* keys = kv.keys(b) + kv_offset;
          const int64_t end = std::min(len - first, block_size);
          for (int64_t o = 0; o < end; ++o) {
            const float* kr = keys + o * kv_dim;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < head_dim; ++i) dot += qv[i] * kr[i];
            scores[first + o] = dot * scale;
            max_score = std::max(max_score, scores[first + o]);
          }
        }
        float sum = 0.0f;
        for (int64_t p = 0; p < len; ++p) {
          scores[p] = std::exp(scores[p] - max_score);
          sum += scores[p];
        }
        float* a = acc.data();
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
          const float* values = kv.values(b) + kv_offset;
          const int64_t end = std::min(len - first, block_size);
          for (int64_t o = 0; o < end; ++o) {
            const float* vr = values + o * kv_dim;
            const float w = scores[first + o];
#pragma omp simd
            for (int64_t i = 0; i < head_dim; ++i) a[i] += w * vr[i];
          }
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
