// The fp32 CPU kernels against slow, obviously-correct double-precision references.
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

namespace kiln::cpu {
namespace {

constexpr float kSentinel = -12345.0f;

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ---- RmsNorm ---------------------------------------------------------------------------------

// Tolerance: 1e-5 relative (+1e-6): fp32 sum of squares over ≤ 896 terms and three roundings.
void CheckRmsNorm(int64_t rows, int64_t dim, int64_t x_stride, int64_t y_stride, bool in_place) {
  SCOPED_TRACE(testing::Message() << "rows=" << rows << " dim=" << dim << " in_place=" << in_place);
  const float eps = 1e-6f;
  std::vector<float> x = Random(rows * x_stride, 1, -3.0f, 3.0f);
  const std::vector<float> weight = Random(dim, 2, 0.5f, 1.5f);
  std::vector<float> y_storage(rows * y_stride, kSentinel);
  std::vector<float> original = x;
  float* y = in_place ? x.data() : y_storage.data();
  const int64_t ys = in_place ? x_stride : y_stride;
  RmsNorm(x.data(), x_stride, weight.data(), rows, dim, eps, y, ys);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = original.data() + r * x_stride;
    double mean_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean_sq += static_cast<double>(xr[i]) * xr[i];
    mean_sq /= static_cast<double>(dim);
    const double inv = 1.0 / std::sqrt(mean_sq + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const double expected = weight[i] * (xr[i] * inv);
      ASSERT_NEAR(y[r * ys + i], expected, 1e-5 * std::abs(expected) + 1e-6) << r << "," << i;
    }
    for (int64_t i = dim; i < ys; ++i) {
      ASSERT_EQ(y[r * ys + i], in_place ? original[r * x_stride + i] : kSentinel) << "padding";
    }
  }
}

TEST(RmsNormTest, MatchesReference) {
  CheckRmsNorm(1, 896, 896, 896, false);
  CheckRmsNorm(5, 896, 1000, 903, false);  // strided rows
  CheckRmsNorm(64, 896, 896, 896, false);  // enough rows for the OpenMP path
  CheckRmsNorm(3, 37, 40, 37, false);
}

TEST(RmsNormTest, InPlace) {
  CheckRmsNorm(4, 896, 900, 900, true);
  CheckRmsNorm(64, 128, 130, 130, true);
}

// ---- RoPE ------------------------------------------------------------------------------------

// The inverse frequencies in double: theta^(-2i/d), then the Llama-3.1 rule.
std::vector<double> ReferenceInvFreq(int64_t head_dim, double theta, const RopeScaling& s,
                                     int bands[3]) {
  std::vector<double> inv(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (!s.llama3) continue;
    const double wavelen = 2.0 * std::numbers::pi / inv[i];
    if (wavelen < s.original_max_position_embeddings / s.high_freq_factor) {
      ++bands[0];
    } else if (wavelen > s.original_max_position_embeddings / s.low_freq_factor) {
      inv[i] /= s.factor;
      ++bands[2];
    } else {
      const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      inv[i] = (1.0 - smooth) * inv[i] / s.factor + smooth * inv[i];
      ++bands[1];
    }
  }
  return inv;
}

RopeScaling Llama31Scaling() {
  RopeScaling s;
  s.llama3 = true;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192.0;
  return s;
}

// Tolerance 2e-6 relative: the table is fp32 (one pow rounding plus a few fp32 ops).
TEST(RopeTableTest, InverseFrequencies) {
  struct Case {
    int64_t head_dim;
    double theta;
    RopeScaling scaling;
  };
  for (const Case& c :
       {Case{64, 1000000.0, {}}, Case{128, 10000.0, {}}, Case{128, 500000.0, Llama31Scaling()},
        Case{64, 500000.0, [] {
               RopeScaling s = Llama31Scaling();
               s.factor = 32.0;  // Llama 3.2 1B/3B
               return s;
             }()}}) {
    SCOPED_TRACE(testing::Message() << "head_dim=" << c.head_dim << " theta=" << c.theta
                                    << " llama3=" << c.scaling.llama3);
    RopeTable table(c.head_dim, c.theta, c.scaling);
    ASSERT_EQ(table.head_dim(), c.head_dim);
    int bands[3] = {0, 0, 0};
    const std::vector<double> expected = ReferenceInvFreq(c.head_dim, c.theta, c.scaling, bands);
    ASSERT_EQ(table.inv_freq().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(table.inv_freq()[i], expected[i], 2e-6 * expected[i]) << i;
    }
    if (c.scaling.llama3) {  // the case exercises all three bands of the rule
      EXPECT_GT(bands[0], 0);
      EXPECT_GT(bands[1], 0);
      EXPECT_GT(bands[2], 0);
    }
  }
}

// Written from Hugging Face's apply_rotary_pos_emb: out = x·cos + rotate_half(x)·sin with
// cos/sin = cat(f, f) and rotate_half(x) = cat(−x2, x1). As in HF the angle is the fp32 product
// position · inv_freq; the rest is double. Tolerance 2e-6 absolute for |x| ≤ 1 (fp32 cos/sin
// and the fp32 rotation).
void CheckRope(int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t row_stride,
               const RopeScaling& scaling, const std::vector<int32_t>& positions) {
  SCOPED_TRACE(testing::Message() << "tokens=" << n_tokens << " heads=" << n_heads
                                  << " head_dim=" << head_dim << " llama3=" << scaling.llama3);
  RopeTable table(head_dim, 500000.0, scaling);
  std::vector<float> x = Random(n_tokens * row_stride, 11);
  const std::vector<float> original = x;
  ApplyRope(x.data(), n_tokens, row_stride, n_heads, positions.data(), table);
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* v = original.data() + t * row_stride + h * head_dim;
      for (int64_t j = 0; j < head_dim; ++j) {
        const float angle = static_cast<float>(positions[t]) * table.inv_freq()[j % half];
        const double rotated = j < half ? -static_cast<double>(v[j + half]) : v[j - half];
        const double expected = v[j] * std::cos(static_cast<double>(angle)) +
                                rotated * std::sin(static_cast<double>(angle));
        ASSERT_NEAR(x[t * row_stride + h * head_dim + j], expected, 2e-6)
            << "t=" << t << " h=" << h << " j=" << j;
      }
    }
    for (int64_t i = n_heads * head_dim; i < row_stride; ++i) {
      ASSERT_EQ(x[t * row_stride + i], original[t * row_stride + i]) << "padding";
    }
  }
}

TEST(RopeTest, MatchesRotateHalfReference) {
  const std::vector<int32_t> positions = {0, 1, 7, 1000, 8191, 100000};
  CheckRope(6, 3, 64, 3 * 64, RopeScaling{}, positions);
  CheckRope(6, 3, 64, 3 * 64 + 5, RopeScaling{}, positions);  // strided rows
  CheckRope(6, 2, 128, 2 * 128 + 64, Llama31Scaling(), positions);
  std::vector<int32_t> many(64);
  for (int64_t i = 0; i < 64; ++i) many[i] = static_cast<int32_t>(37 + 3 * i);
  CheckRope(64, 14, 64, 14 * 64 + 8, RopeScaling{}, many);  // OpenMP path
  CheckRope(64, 8, 128, 8 * 128, Llama31Scaling(), many);
}

// ---- SiluMul, AddInPlace, EmbeddingLookup ----------------------------------------------------

// Tolerance 1e-6 relative (+1e-7): one fp32 exp, a division and a product.
TEST(SiluMulTest, MatchesReference) {
  for (auto [rows, inter] : {std::pair<int64_t, int64_t>{1, 100}, {3, 77}, {8, 4864}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " inter=" << inter);
    std::vector<float> gate_up = Random(rows * 2 * inter, 5, -8.0f, 8.0f);
    gate_up[0] = -100.0f;  // exp overflows to inf: silu → -0
    gate_up[1] = 100.0f;
    std::vector<float> out(rows * inter + 1, kSentinel);
    SiluMul(gate_up.data(), rows, inter, out.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gate_up[r * 2 * inter + i];
        const double u = gate_up[r * 2 * inter + inter + i];
        const double expected = g / (1.0 + std::exp(-g)) * u;
        ASSERT_NEAR(out[r * inter + i], expected, 1e-6 * std::abs(expected) + 1e-7)
            << r << "," << i;
      }
    }
    EXPECT_EQ(out[rows * inter], kSentinel);
  }
}

TEST(AddInPlaceTest, AddsExactly) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    std::vector<float> y = Random(n, 1);
    const std::vector<float> x = Random(n, 2);
    const std::vector<float> before = y;
    AddInPlace(y.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], before[i] + x[i]) << i;
  }
}

TEST(EmbeddingLookupTest, GathersRowsOfEveryDType) {
  const int64_t rows = 50;
  const int64_t cols = 33;
  const std::vector<float> values = Random(rows * cols, 3, -4.0f, 4.0f);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<std::byte> storage(rows * cols * DTypeSize(dtype) + 1);
    std::byte* data = storage.data() + 1;  // unaligned, like an mmap'ed checkpoint
    ConvertFromF32(dtype, values.data(), rows * cols, data);
    const WeightView table{dtype, rows, cols, data};
    std::vector<float> out(ids.size() * cols + 1, kSentinel);
    EmbeddingLookup(table, ids.data(), static_cast<int64_t>(ids.size()), out.data());
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t index = ids[t] * cols + c;
        float expected = values[index];
        if (dtype == DType::kBF16) {
          uint16_t bits;
          std::memcpy(&bits, data + 2 * index, 2);
          expected = BF16ToF32(bits);
        } else if (dtype == DType::kF16) {
          uint16_t bits;
          std::memcpy(&bits, data + 2 * index, 2);
          expected = F16ToF32(bits);
        }
        ASSERT_EQ(out[t * cols + c], expected) << t << "," << c;
      }
    }
    EXPECT_EQ(out.back(), kSentinel);
  }
}

// ---- CausalAttention -------------------------------------------------------------------------

// Naive attention in double: for query t (absolute position start_pos + t) and head h,
// softmax over keys 0 .. start_pos + t of scale·q·k, times v, reading kv head h / group.
// Tolerance 2e-6 absolute: outputs are convex combinations of values in [-1, 1] with fp32
// scores, exp and accumulation.
void CheckAttention(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t n_tokens,
                    int64_t start_pos) {
  SCOPED_TRACE(testing::Message() << "heads=" << n_heads << " kv_heads=" << n_kv_heads
                                  << " head_dim=" << head_dim << " tokens=" << n_tokens
                                  << " start_pos=" << start_pos);
  const AttentionShape shape{n_heads, n_kv_heads, head_dim,
                             1.0f / std::sqrt(static_cast<float>(head_dim))};
  const int64_t context = start_pos + n_tokens;
  const int64_t q_stride = n_heads * head_dim + 8;
  const int64_t kv_stride = n_kv_heads * head_dim + 4;
  const int64_t out_stride = n_heads * head_dim + 3;
  // Scaled up so that the softmax is far from uniform.
  const std::vector<float> q = Random(n_tokens * q_stride, 21, -3.0f, 3.0f);
  const std::vector<float> k = Random(context * kv_stride, 22, -3.0f, 3.0f);
  const std::vector<float> v = Random(context * kv_stride, 23);
  std::vector<float> out(n_tokens * out_stride, kSentinel);
  CausalAttention(shape, q.data(), q_stride, n_tokens, start_pos, k.data(), v.data(), kv_stride,
                  out.data(), out_stride);
  const int64_t group = n_heads / n_kv_heads;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const int64_t len = start_pos + t + 1;
      std::vector<double> scores(len);
      double max_score = -1e300;
      for (int64_t p = 0; p < len; ++p) {
        double dot = 0.0;
        for (int64_t i = 0; i < head_dim; ++i) {
          dot += static_cast<double>(q[t * q_stride + h * head_dim + i]) *
                 k[p * kv_stride + kvh * head_dim + i];
        }
        scores[p] = dot * shape.scale;
        max_score = std::max(max_score, scores[p]);
      }
      double sum = 0.0;
      for (double& s : scores) sum += (s = std::exp(s - max_score));
      for (int64_t i = 0; i < head_dim; ++i) {
        double expected = 0.0;
        for (int64_t p = 0; p < len; ++p) {
          expected += scores[p] / sum * v[p * kv_stride + kvh * head_dim + i];
        }
        ASSERT_NEAR(out[t * out_stride + h * head_dim + i], expected, 2e-6)
            << "t=" << t << " h=" << h << " i=" << i;
      }
    }
    for (int64_t i = n_heads * head_dim; i < out_stride; ++i) {
      ASSERT_EQ(out[t * out_stride + i], kSentinel) << "padding";
    }
  }
}

TEST(CausalAttentionTest, DecodeOneTokenAfterPrefix) {
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {14, 2}, {7, 1}}) {
    CheckAttention(heads, kv_heads, 64, 1, 37);
    CheckAttention(heads, kv_heads, 24, 1, 1);
  }
  CheckAttention(14, 2, 64, 1, 0);  // the very first token attends only to itself
}

TEST(CausalAttentionTest, PrefillFromStart) {
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {14, 2}, {7, 1}}) {
    CheckAttention(heads, kv_heads, 64, 9, 0);
  }
  CheckAttention(14, 2, 64, 40, 0);
}

TEST(CausalAttentionTest, ChunkedPrefillAfterPrefix) {
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {14, 2}, {7, 1}}) {
    CheckAttention(heads, kv_heads, 64, 5, 11);
  }
  CheckAttention(8, 2, 128, 17, 120);
}

}  // namespace
}  // namespace kiln::cpu
