// The CPU backend's quantized linears (int8 per channel, int4 in groups of 32) against a
// double-precision reference of the scheme kernels/quantization.h states: the same integer
// values, summed exactly, scaled in double. Tolerance: fp32 rounding of the kernel's scaling,
// 1e-5 of the sum of the magnitudes of the scaled terms and the bias. A second check against the
// unquantized product bounds the quantization error itself on random weights.
#include "kernels/cpu/quantized_linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_registry.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/quantized_panels.h"

namespace kiln {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Symmetric int8 of `values` as the kernels quantize activations (and int8 weights): the scale
// max|v| / 127 and q = round(v · 127 / max|v|).
double QuantizeSymmetric(const float* values, int64_t count, std::vector<int>& q) {
  float max_abs = 0.0f;
  for (int64_t i = 0; i < count; ++i) max_abs = std::max(max_abs, std::fabs(values[i]));
  q.assign(static_cast<size_t>(count), 0);
  if (max_abs == 0.0f) return 0.0;
  const float inverse = 127.0f / max_abs;
  for (int64_t i = 0; i < count; ++i) {
    q[i] = static_cast<int>(std::clamp(std::nearbyint(values[i] * inverse), -127.0f, 127.0f));
  }
  return static_cast<double>(max_abs / 127.0f);
}

struct Reference {
  std::vector<double> y;      // [m, n]
  std::vector<double> bound;  // Σ |scaled terms| per output, for the tolerance
};

// y = x·Wᵀ + bias under kernels/quantization.h's scheme, in double.
Reference QuantizedReference(Quantization kind, const std::vector<float>& w, int64_t n, int64_t k,
                             const std::vector<float>& x, int64_t m,
                             const std::vector<float>& bias) {
  const int64_t group = kind == Quantization::kInt8 ? k : kInt4GroupSize;
  const int64_t groups = (k + group - 1) / group;
  // Weights: q and a scale per (column, group).
  std::vector<int> wq(static_cast<size_t>(n * k));
  std::vector<double> ws(static_cast<size_t>(n * groups));
  for (int64_t c = 0; c < n; ++c) {
    const float* row = w.data() + c * k;
    if (kind == Quantization::kInt8) {
      std::vector<int> q;
      ws[c] = QuantizeSymmetric(row, k, q);
      std::copy(q.begin(), q.end(), wq.begin() + c * k);
      continue;
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first = g * group, last = std::min(k, first + group);
      float extreme = 0.0f;
      for (int64_t i = first; i < last; ++i) {
        if (std::fabs(row[i]) > std::fabs(extreme)) extreme = row[i];
      }
      const float d = F16ToF32(F32ToF16(extreme / -8.0f));
      ws[c * groups + g] = d;
      for (int64_t i = first; i < last; ++i) {
        wq[c * k + i] =
            d == 0.0f
                ? 0
                : static_cast<int>(std::clamp(std::nearbyint(row[i] * (1.0f / d)), -8.0f, 7.0f));
      }
    }
  }
  Reference ref;
  ref.y.assign(static_cast<size_t>(m * n), 0.0);
  ref.bound.assign(static_cast<size_t>(m * n), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first = g * group, count = std::min(k, first + group) - first;
      std::vector<int> xq;
      const double xs = QuantizeSymmetric(x.data() + r * k + first, count, xq);
      for (int64_t c = 0; c < n; ++c) {
        int64_t sum = 0;
        for (int64_t i = 0; i < count; ++i) sum += int64_t{xq[i]} * wq[c * k + first + i];
        const double term = static_cast<double>(sum) * xs * ws[c * groups + g];
        ref.y[r * n + c] += term;
        ref.bound[r * n + c] += std::fabs(term);
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      if (!bias.empty()) {
        ref.y[r * n + c] += bias[c];
        ref.bound[r * n + c] += std::fabs(bias[c]);
      }
      ref.bound[r * n + c] += 1e-6;
    }
  }
  return ref;
}

class QuantizedLinearTest : public testing::TestWithParam<Quantization> {
 protected:
  void SetUp() override {
    if (!cpu::QuantizedKernelSupported()) {
      GTEST_SKIP() << "this CPU has no AVX-512 VNNI: the quantized kernels cannot run here "
                      "(linears fall back to oneDNN in their compute dtype)";
    }
  }
};

// Packs [n, k] weights given as blocks of `rows` (a fused projection when several), stored as
// bf16 like a checkpoint, and returns them with their values as stored.
struct Weights {
  std::vector<std::vector<uint16_t>> storage;
  std::vector<float> values;
  LinearPackSpec spec;
};

Weights MakeWeights(Quantization kind, int64_t k, const std::vector<int64_t>& rows, bool bias,
                    std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.05f);
  Weights w;
  w.spec.name = "test";
  w.spec.compute_dtype = DType::kBF16;
  w.spec.quantization = kind;
  int64_t n = 0;
  for (int64_t r : rows) {
    std::vector<uint16_t> block(static_cast<size_t>(r * k));
    for (uint16_t& v : block) {
      v = F32ToBF16(dist(rng));
      w.values.push_back(BF16ToF32(v));
    }
    w.storage.push_back(std::move(block));
    w.spec.row_blocks.push_back(WeightView{
        DType::kBF16, r, k, reinterpret_cast<const std::byte*>(w.storage.back().data())});
    n += r;
  }
  if (bias) {
    for (int64_t c = 0; c < n; ++c) w.spec.bias.push_back(0.01f * static_cast<float>(c % 7));
  }
  return w;
}

TEST_P(QuantizedLinearTest, MatchesTheSchemeForEveryShapeAndRowCount) {
  const Quantization kind = GetParam();
  std::mt19937 rng(7);
  struct Shape {
    int64_t k;
    std::vector<int64_t> rows;
    bool bias;
  };
  const std::vector<Shape> shapes = {
      {1, {1}, false},      {31, {17}, true},          {32, {64}, false},
      {33, {65}, true},     {100, {40, 24, 36}, true}, {896, {128, 32, 32}, true},
      {1000, {300}, false}, {4864, {96}, false},       {64, {448}, true},
  };
  std::normal_distribution<float> x_dist(0.0f, 1.0f);
  for (const Shape& shape : shapes) {
    Weights w = MakeWeights(kind, shape.k, shape.rows, shape.bias, rng);
    const int64_t n = static_cast<int64_t>(w.values.size()) / shape.k;
    absl::StatusOr<std::unique_ptr<PackedLinear>> packed = cpu::PackQuantizedLinear(w.spec, 2);
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_EQ((*packed)->quantization(), kind);
    EXPECT_EQ((*packed)->in_features(), shape.k);
    EXPECT_EQ((*packed)->out_features(), n);
    for (const int64_t m : {1, 2, 3, 4, 5, 8, 9, 17}) {
      SCOPED_TRACE(testing::Message()
                   << QuantizationName(kind) << " K=" << shape.k << " N=" << n << " M=" << m);
      std::vector<float> x(static_cast<size_t>(m * shape.k));
      for (float& v : x) v = x_dist(rng);
      x[0] = 9.0f;  // an outlier in row 0
      std::vector<float> y(static_cast<size_t>(m * n) + 1, -1.0f);
      ASSERT_TRUE(cpu::RunLinear(**packed, x.data(), m, y.data()).ok());
      EXPECT_EQ(y.back(), -1.0f) << "wrote past the output";
      const Reference ref = QuantizedReference(kind, w.values, n, shape.k, x, m, w.spec.bias);
      int bad = 0;
      for (size_t i = 0; i < ref.y.size(); ++i) {
        if (!(std::fabs(y[i] - ref.y[i]) <= 1e-5 * ref.bound[i]) && ++bad <= 3) {
          ADD_FAILURE() << "output " << i << ": " << y[i] << " vs " << ref.y[i];
        }
      }
      // Against the unquantized product: a bound on the quantization error itself.
      double error = 0, norm = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          double exact = w.spec.bias.empty() ? 0.0 : w.spec.bias[c];
          for (int64_t i = 0; i < shape.k; ++i)
            exact += double{x[r * shape.k + i]} * w.values[c * shape.k + i];
          error += std::pow(y[r * n + c] - exact, 2);
          norm += exact * exact;
        }
      }
      const double relative = std::sqrt(error / std::max(norm, 1e-30));
      EXPECT_LT(relative, kind == Quantization::kInt8 ? 0.03 : 0.15);
    }
  }
}

// A row gives the same bits alone and in any batch, on any thread count (integer sums), and a
// NaN in one row's input makes that row NaN and leaves the others alone.
TEST_P(QuantizedLinearTest, RowsAreIndependentOfTheirBatch) {
  const Quantization kind = GetParam();
  std::mt19937 rng(11);
  Weights w = MakeWeights(kind, 896, {1152}, true, rng);
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed = cpu::PackQuantizedLinear(w.spec, 2);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const int64_t k = 896, n = 1152, m = 11;
  std::normal_distribution<float> x_dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = x_dist(rng);
  x[3 * k + 5] = kNaN;
  std::vector<float> batch(static_cast<size_t>(m * n));
  ASSERT_TRUE(cpu::RunQuantizedLinear(**packed, x.data(), m, batch.data(), 2).ok());
  for (int64_t r = 0; r < m; ++r) {
    std::vector<float> alone(static_cast<size_t>(n));
    ASSERT_TRUE(cpu::RunQuantizedLinear(**packed, x.data() + r * k, 1, alone.data(), 1).ok());
    if (r == 3) {
      for (float v : alone) ASSERT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(std::memcmp(alone.data(), batch.data() + r * n, n * sizeof(float)), 0) << "row " << r;
    for (float v : alone) ASSERT_TRUE(std::isfinite(v)) << "row " << r;
  }
}

// How many panels a thread reads side by side at one row (measured when the backend packs) changes
// no bit of the result, at one and two rows.
TEST_P(QuantizedLinearTest, DecodeStreamsChangeNoResult) {
  const Quantization kind = GetParam();
  std::mt19937 rng(13);
  Weights w = MakeWeights(kind, 896, {1000}, true, rng);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed = (*backend)->PackLinear(w.spec);
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ((*packed)->quantization(), kind);
  const int chosen = cpu::DecodeStreams(**packed);
  EXPECT_TRUE(chosen == 1 || chosen == 2 || chosen == 4) << chosen;
  const int64_t k = 896, n = 1000;
  std::normal_distribution<float> x_dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(2 * k));
  for (float& v : x) v = x_dist(rng);
  for (const int64_t m : {1, 2}) {
    std::vector<float> first;
    for (const int streams : {4, 2, 1}) {
      SCOPED_TRACE(testing::Message() << "M=" << m << " streams=" << streams);
      ASSERT_TRUE(cpu::SetDecodeStreams(**packed, streams).ok());
      EXPECT_EQ(cpu::DecodeStreams(**packed), streams);
      std::vector<float> y(static_cast<size_t>(m * n));
      ASSERT_TRUE(cpu::RunQuantizedLinear(**packed, x.data(), m, y.data(), 2).ok());
      if (first.empty()) {
        first = y;
      } else {
        ASSERT_EQ(std::memcmp(y.data(), first.data(), y.size() * sizeof(float)), 0);
      }
    }
  }
}

// Through the backend: quantized specs become quantized linears, the others stay dense, in order;
// a linear of the wrong kind is refused with its name.
TEST_P(QuantizedLinearTest, TheBackendPacksQuantizedAndDenseSpecsInOrder) {
  const Quantization kind = GetParam();
  std::mt19937 rng(5);
  Weights a = MakeWeights(kind, 64, {32}, false, rng);
  Weights b = MakeWeights(Quantization::kNone, 64, {48}, false, rng);
  Weights c = MakeWeights(kind, 128, {16}, true, rng);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<LinearPackSpec> specs = {a.spec, b.spec, c.spec};
  absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> packed =
      (*backend)->PackLinears(specs);
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(packed->size(), 3u);
  EXPECT_EQ((*packed)[0]->quantization(), kind);
  EXPECT_EQ((*packed)[0]->out_features(), 32);
  EXPECT_EQ((*packed)[1]->quantization(), Quantization::kNone);
  EXPECT_EQ((*packed)[1]->out_features(), 48);
  EXPECT_EQ((*packed)[2]->quantization(), kind);
  EXPECT_EQ((*packed)[2]->in_features(), 128);
  std::vector<float> x(64, 0.5f), y(48);
  absl::Status wrong_path =
      cpu::RunLinear(*(*packed)[0], x.data(), 1, y.data(), cpu::LinearPath::kBrgemm);
  EXPECT_EQ(wrong_path.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_path.message().find("test"), std::string::npos) << wrong_path;
  EXPECT_EQ(cpu::RunQuantizedLinear(*(*packed)[1], x.data(), 1, y.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Kinds, QuantizedLinearTest,
                         testing::Values(Quantization::kInt8, Quantization::kInt4),
                         [](const testing::TestParamInfo<Quantization>& info) {
                           return std::string(QuantizationName(info.param));
                         });

// The activations of an int4 call, quantized 16 groups at a time in vectors, equal group by
// group QuantizeSymmetric bit for bit: values, scales and offsets (8·Σq), for K that is and is not
// a multiple of the group and of 16 groups, rows after one another, a group holding a NaN or an
// Inf (scale NaN, q 0), an all-zero group and the groups of K's padding (scale 0, q 0).
TEST(QuantizeActivationsTest, Int4GroupsEqualTheScalarQuantizationBitForBit) {
  if (!cpu::QuantizedKernelSupported()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const int64_t k : {1, 31, 32, 33, 100, 511, 512, 513, 896, 1000, 4864}) {
    cpu::quantized::PackedView view;
    view.kind = Quantization::kInt4;
    view.k = k;
    view.k_padded =
        (k + cpu::quantized::kKAlign - 1) / cpu::quantized::kKAlign * cpu::quantized::kKAlign;
    const int64_t groups = view.k_padded / kInt4GroupSize;
    const int64_t m = 3;
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = dist(rng);
    x[0] = 40.0f;  // an outlier
    if (k > 70) {
      x[k + 40] = std::numeric_limits<float>::quiet_NaN();    // row 1, group 1, its first half
      x[k + 52] = -std::numeric_limits<float>::infinity();    // row 1, group 1, its second half
      x[2 * k + 3] = std::numeric_limits<float>::infinity();  // row 2, group 0
      for (int64_t i = 64; i < 96; ++i) x[2 * k + i] = 0.0f;  // row 2, group 2
    }
    cpu::quantized::QuantizedActivations a;
    a.values.assign(5, 99);  // stale contents from a wider call
    cpu::quantized::QuantizeActivations(view, x.data(), m, a);
    ASSERT_EQ(a.values.size(), static_cast<size_t>(m * view.k_padded));
    ASSERT_EQ(a.scales.size(), static_cast<size_t>(m * groups));
    ASSERT_EQ(a.offsets.size(), static_cast<size_t>(m * groups));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        SCOPED_TRACE(testing::Message() << "K=" << k << " row " << r << " group " << g);
        const size_t at = static_cast<size_t>(r * groups + g);
        const int64_t first = g * kInt4GroupSize;
        const int64_t count = std::clamp<int64_t>(k - first, 0, kInt4GroupSize);
        const float* values = x.data() + r * k + first;
        bool finite = true;
        for (int64_t i = 0; i < count; ++i) finite = finite && std::isfinite(values[i]);
        std::vector<int> q(kInt4GroupSize, 0);
        double scale = std::numeric_limits<double>::quiet_NaN();
        if (finite) {
          scale = QuantizeSymmetric(values, count, q);
          q.resize(kInt4GroupSize, 0);
        }
        if (std::isnan(scale)) {
          EXPECT_TRUE(std::isnan(a.scales[at]));
        } else {
          EXPECT_EQ(a.scales[at], static_cast<float>(scale));
        }
        int32_t sum = 0;
        for (int64_t i = 0; i < kInt4GroupSize; ++i) {
          sum += q[static_cast<size_t>(i)];
          ASSERT_EQ(a.values[static_cast<size_t>(r * view.k_padded + first + i)],
                    q[static_cast<size_t>(i)])
              << "value " << i;
        }
        EXPECT_EQ(a.offsets[at], 8 * sum);
      }
    }
  }
}

TEST(QuantizationTest, ParsesNames) {
  EXPECT_EQ(*ParseQuantization(""), Quantization::kNone);
  EXPECT_EQ(*ParseQuantization("none"), Quantization::kNone);
  EXPECT_EQ(*ParseQuantization("INT8"), Quantization::kInt8);
  EXPECT_EQ(*ParseQuantization("int4"), Quantization::kInt4);
  const absl::StatusOr<Quantization> bad = ParseQuantization("q4_0");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q4_0"), std::string::npos);
  EXPECT_NE(bad.status().message().find("int8"), std::string::npos);
}

}  // namespace
}  // namespace kiln
