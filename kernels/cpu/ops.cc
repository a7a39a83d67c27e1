// GCC 12 reports the _mm512_undefined_ps() pass-through operand inside its own intrinsics as
// (maybe-)uninitialized once they inline into a target("...") function (the unmasked forms do not
// read it); the state has to be set before <immintrin.h> is first included.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/vector_math.h"

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
    // The angles of one row: on the stack for the usual head sizes (a decode step calls this
    // once a layer, and an allocation costs as much as the rotation).
    constexpr int64_t kStackHalf = 256;
    float cos_stack[kStackHalf], sin_stack[kStackHalf];
    std::vector<float> cos_heap, sin_heap;
    float* cos = cos_stack;
    float* sin = sin_stack;
    if (half > kStackHalf) {
      cos_heap.resize(static_cast<size_t>(half));
      sin_heap.resize(static_cast<size_t>(half));
      cos = cos_heap.data();
      sin = sin_heap.data();
    }
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
        const float* c = cos;
        const float* s = sin;
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

namespace {

KILN_AVX512_TARGET void SiluMulRowAvx512(const float* gate, const float* up, int64_t n,
                                         float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask =
        n - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(mask, up + i);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
  }
}

}  // namespace

void SiluMul(const float* gate_up, int64_t gate_up_stride, int64_t rows, int64_t inter, float* out,
             int64_t out_stride) {
  static const bool avx512 = Avx512Supported();
  if (avx512) {
    // Pieces of 1024 values so that a few rows still spread over the threads.
    constexpr int64_t kPiece = 1024;
    const int64_t pieces = (inter + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (rows * inter >= kParallelElements)
    for (int64_t i = 0; i < rows * pieces; ++i) {
      const int64_t r = i / pieces, first = i % pieces * kPiece;
      const float* gate = gate_up + r * gate_up_stride;
      SiluMulRowAvx512(gate + first, gate + inter + first, std::min(kPiece, inter - first),
                       out + r * out_stride + first);
    }
    return;
  }
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

}  // namespace kiln::cpu
