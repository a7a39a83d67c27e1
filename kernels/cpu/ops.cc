// GCC 12 reports the _mm512_undefined_ps() pass-through operand inside its own intrinsics as
// (maybe-)uninitialized once they inline into a target("...") function (the unmasked forms do not
// read it); the state has to be set before <immintrin.h> is first included.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/vector_math.h"

namespace kiln::cpu {
namespace {

// Below this many elements an OpenMP team costs more than it saves.
constexpr int64_t kParallelElements = 1 << 15;
// On a step's team (step_team.h) SiluMul splits a row of at least this many values.
constexpr int64_t kTeamMinElements = 2048;
// Add splits its elements into pieces of this many, each a vector loop.
constexpr int64_t kAddPiece = 4096;

}  // namespace

void RmsNorm(const float* x, int64_t x_stride, const float* weight, int64_t rows, int64_t cols,
             int64_t group, float eps, float* y, int64_t y_stride) {
  const int64_t groups = cols / group;
  const int64_t n = rows * groups;
  ParallelFor(n, rows * cols >= kParallelElements, [&](int64_t i) {
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
  });
}

void AddRmsNorm(float* residual, int64_t residual_stride, const float* delta, int64_t delta_stride,
                const float* weight, int64_t rows, int64_t dim, float eps, float* y,
                int64_t y_stride) {
  ParallelFor(rows, rows * dim >= kParallelElements, [&](int64_t r) {
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
  });
}

void ApplyRope(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq) {
  const int64_t half = head_dim / 2;
  // Rotates rows [first, last) with `cos` and `sin` (half values each) as scratch for the angles.
  auto rotate_rows = [&](int64_t first, int64_t last, float* cos, float* sin) {
    for (int64_t t = first; t < last; ++t) {
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
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i];
          const float b = x2[i];
          x1[i] = a * cos[i] - b * sin[i];
          x2[i] = b * cos[i] + a * sin[i];
        }
      }
    }
  };
  // The angles of one row: on the stack for the usual head sizes (a decode step calls this once a
  // layer, and an allocation costs as much as the rotation).
  auto with_scratch = [&](int64_t first, int64_t last) {
    constexpr int64_t kStackHalf = 256;
    if (half > kStackHalf) {
      std::vector<float> cos(static_cast<size_t>(half)), sin(static_cast<size_t>(half));
      rotate_rows(first, last, cos.data(), sin.data());
    } else {
      float cos[kStackHalf], sin[kStackHalf];
      rotate_rows(first, last, cos, sin);
    }
  };
  if (n_tokens <= 1 || n_tokens * n_heads * head_dim < kParallelElements) {
    with_scratch(0, n_tokens);
    return;
  }
#pragma omp parallel
  {
    // This thread's contiguous share of the rows, as schedule(static) would give it.
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    with_scratch(n_tokens * thread / threads, n_tokens * (thread + 1) / threads);
  }
}

namespace {

KILN_AVX512_TARGET void SiluMulRowAvx512(const float* gate, const float* up, int64_t n,
                                         float* out) {
  // Every line asked for at once: in a decode step the other thread wrote half of them (the up
  // projection's columns), and across two CCDs each such line takes about 150 ns.
  PrefetchRangeToL2(gate, n * static_cast<int64_t>(sizeof(float)));
  PrefetchRangeToL2(up, n * static_cast<int64_t>(sizeof(float)));
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
    // Pieces of up to 1024 values so that a few rows still spread over the threads. A step's
    // team (step_team.h) hands work over in well under a microsecond, so there even one decode
    // row is split, in as many equal pieces as threads: at 4864 values the row took 2.9 µs on
    // one thread, and 6.5 when the threads sat on two CCDs, one reading the other's half of
    // gate_up (the up projection's columns) across them.
    const StepTeam* team = StepTeam::Current();
    const bool split_row = team != nullptr && team->size() > 1 && inter >= kTeamMinElements;
    const int64_t piece =
        split_row ? std::min<int64_t>(1024, (inter + team->size() - 1) / team->size()) : 1024;
    const int64_t pieces = (inter + piece - 1) / piece;
    ParallelFor(rows * pieces, split_row || rows * inter >= kParallelElements, [&](int64_t i) {
      const int64_t r = i / pieces, first = i % pieces * piece;
      const float* gate = gate_up + r * gate_up_stride;
      SiluMulRowAvx512(gate + first, gate + inter + first, std::min(piece, inter - first),
                       out + r * out_stride + first);
    });
    return;
  }
  ParallelFor(rows, rows * inter >= kParallelElements, [&](int64_t r) {
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate_up[r * gate_up_stride + i];
      const float u = gate_up[r * gate_up_stride + inter + i];
      out[r * out_stride + i] = g / (1.0f + std::exp(-g)) * u;
    }
  });
}

void Add(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t cols) {
  if ((y_stride == cols && x_stride == cols) || rows == 1) {
    const int64_t n = rows * cols;
    ParallelFor((n + kAddPiece - 1) / kAddPiece, n >= 4 * kParallelElements, [&](int64_t piece) {
      const int64_t first = piece * kAddPiece, last = std::min(n, first + kAddPiece);
#pragma omp simd
      for (int64_t i = first; i < last; ++i) y[i] += x[i];
    });
    return;
  }
  ParallelFor(rows, rows * cols >= 4 * kParallelElements, [&](int64_t r) {
    float* yr = y + r * y_stride;
    const float* xr = x + r * x_stride;
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) yr[i] += xr[i];
  });
}

void EmbeddingLookup(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                     int64_t out_stride) {
  const int64_t cols = table.cols;
  const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(table.dtype);
  ParallelFor(n, n * cols >= kParallelElements, [&](int64_t i) {
    ConvertToF32(table.dtype, table.data + static_cast<size_t>(ids[i]) * row_bytes, cols,
                 out + i * out_stride);
  });
}

}  // namespace kiln::cpu
