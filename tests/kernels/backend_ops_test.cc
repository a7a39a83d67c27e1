// The op set of kernels/backend.h against slow double-precision references
// (backend_ops_fixture.h): embedding, norms, linears, the elementwise ops, copies and step
// metadata. The KV pool's ops (RoPE with the append, attention) are in backend_attention_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/backend_registry.h"
#include "kernels/dtype.h"
#include "tests/kernels/backend_ops_fixture.h"

namespace kiln {
namespace {

using backend_ops_testing::BackendOpsTest;
using backend_ops_testing::KnownBackends;
using backend_ops_testing::kSentinel;
using backend_ops_testing::Random;

INSTANTIATE_TEST_SUITE_P(Backends, BackendOpsTest, testing::ValuesIn(KnownBackends()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---- Embed -----------------------------------------------------------------------------------

// Exact: a gather plus an exact widening of the stored dtype.
TEST_P(BackendOpsTest, EmbedGathersRowsOfEveryDType) {
  const int64_t vocab = 50;
  const int64_t hidden = 33;
  const std::vector<float> values = Random(vocab * hidden, 3, -4.0f, 4.0f);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  MakePool(4, 4, 1, 4);
  const std::vector<int32_t> blocks = Table(8);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<std::byte> stored(static_cast<size_t>(vocab * hidden) * DTypeSize(dtype));
    ConvertFromF32(dtype, values.data(), vocab * hidden, stored.data());
    std::vector<float> expected(stored.size() / DTypeSize(dtype));
    ConvertToF32(dtype, stored.data(), vocab * hidden, expected.data());
    const TensorView table =
        UploadBytes(stored.data(), stored.size(), dtype, vocab, hidden, hidden);
    for (bool zero_first : {false, true}) {
      // One sequence starting at position 0, so row 0 is the one zeroed.
      ASSERT_TRUE(ctx_->BeginStep(Step({{5, 0}}, {blocks}, ids)).ok());
      const TensorView out = Filled(5, hidden, hidden + 3);
      ASSERT_TRUE(ctx_->Embed(table, {.zero_at_position_zero = zero_first}, out).ok());
      const std::vector<float> got = Download(out);
      for (size_t t = 0; t < ids.size(); ++t) {
        for (int64_t c = 0; c < hidden; ++c) {
          const float want =
              zero_first && t == 0 ? 0.0f : expected[static_cast<size_t>(ids[t] * hidden + c)];
          ASSERT_EQ(got[t * (hidden + 3) + c], want) << t << "," << c;
        }
        for (int64_t c = hidden; c < hidden + 3; ++c) {
          ASSERT_EQ(got[t * (hidden + 3) + c], kSentinel) << "padding";
        }
      }
    }
  }
}

TEST_P(BackendOpsTest, EmbedRefusesIdsOutsideTheTable) {
  MakePool(2, 4, 1, 4);
  const std::vector<float> values(10 * 4, 1.0f);
  const TensorView table = Upload(values, 10, 4);
  ASSERT_TRUE(ctx_->BeginStep(Step({{2, 0}}, {Table(2)}, {1, 10})).ok());
  absl::Status status = ctx_->Embed(table, {}, Filled(2, 4));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token id 10"), std::string::npos) << status;
}

// ---- RmsNorm, AddRmsNorm ---------------------------------------------------------------------

// Reference in double. Tolerance: 1e-5 relative (+1e-6): fp32 sum of squares over ≤ 896 terms
// and three roundings.
void ExpectNormed(const std::vector<float>& x, int64_t x_stride, const std::vector<float>& weight,
                  int64_t rows, int64_t cols, float eps, const std::vector<float>& y,
                  int64_t y_stride) {
  const int64_t group = static_cast<int64_t>(weight.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / group; ++g) {
      const float* xr = x.data() + r * x_stride + g * group;
      double mean_sq = 0.0;
      for (int64_t i = 0; i < group; ++i) mean_sq += static_cast<double>(xr[i]) * xr[i];
      mean_sq /= static_cast<double>(group);
      const double inv = 1.0 / std::sqrt(mean_sq + eps);
      for (int64_t i = 0; i < group; ++i) {
        const double expected = weight[static_cast<size_t>(i)] * (xr[i] * inv);
        ASSERT_NEAR(y[r * y_stride + g * group + i], expected, 1e-5 * std::abs(expected) + 1e-6)
            << r << "," << g * group + i;
      }
    }
  }
}

TEST_P(BackendOpsTest, RmsNormPerRowAndPerHead) {
  struct Case {
    int64_t rows, cols, group, x_stride, y_stride;
    bool in_place;
  };
  for (const Case& c : {Case{1, 896, 896, 896, 896, false}, Case{5, 896, 896, 1000, 903, false},
                        Case{64, 896, 896, 896, 896, false}, Case{3, 37, 37, 40, 37, false},
                        Case{4, 896, 896, 900, 900, true},
                        // per-head q/k norm over the q columns of qkv rows
                        Case{3, 14 * 64, 64, 14 * 64 + 2 * 2 * 64, 14 * 64 + 2 * 2 * 64, true},
                        Case{70, 8 * 128, 128, 8 * 128 + 2 * 128, 8 * 128 + 2 * 128, true},
                        Case{2, 7 * 24, 24, 7 * 24, 7 * 24 + 1, false}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << c.rows << " cols=" << c.cols
                                    << " group=" << c.group << " in_place=" << c.in_place);
    const float eps = 1e-6f;
    const std::vector<float> x = Random(c.rows * c.x_stride, 1, -3.0f, 3.0f);
    const std::vector<float> weight = Random(c.group, 2, 0.5f, 1.5f);
    const TensorView in = Upload(x, c.rows, c.cols, c.x_stride);
    const TensorView out = c.in_place ? in : Filled(c.rows, c.cols, c.y_stride);
    ASSERT_TRUE(ctx_->RmsNorm(in, Upload(weight, 1, c.group), eps, out).ok());
    const std::vector<float> y = Download(out);
    ExpectNormed(x, c.x_stride, weight, c.rows, c.cols, eps, y, out.row_stride);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t i = c.cols; i < out.row_stride; ++i) {
        ASSERT_EQ(y[r * out.row_stride + i], c.in_place ? x[r * c.x_stride + i] : kSentinel)
            << "padding";
      }
    }
  }
}

TEST_P(BackendOpsTest, AddRmsNormUpdatesTheResidualExactly) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 896}, {7, 37}, {64, 896}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    const std::vector<float> residual = Random(rows * cols, 4, -3.0f, 3.0f);
    const std::vector<float> delta = Random(rows * cols, 5, -3.0f, 3.0f);
    const std::vector<float> weight = Random(cols, 6, 0.5f, 1.5f);
    const TensorView r = Upload(residual, rows, cols);
    const TensorView out = Filled(rows, cols);
    ASSERT_TRUE(
        ctx_->AddRmsNorm(r, Upload(delta, rows, cols), Upload(weight, 1, cols), 1e-5f, out).ok());
    std::vector<float> sum(residual.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + delta[i];
    EXPECT_EQ(Download(r), sum);
    ExpectNormed(sum, cols, weight, rows, cols, 1e-5f, Download(out), cols);
  }
}

// ---- Linear ----------------------------------------------------------------------------------

float RoundBF16(float v) { return BF16ToF32(F32ToBF16(v)); }

// Reference: for bf16 compute, x and W rounded to bf16 as the kernel does; products summed in
// double. Tolerance: 1e-5 · (Σ_k |x||w| + |bias|).
TEST_P(BackendOpsTest, LinearMatchesReference) {
  struct Case {
    DType compute;
    DType stored;
    int64_t k;
    std::vector<int64_t> blocks;
    bool bias;
  };
  for (const Case& c : {Case{DType::kF32, DType::kF32, 37, {29}, false},
                        Case{DType::kF32, DType::kBF16, 96, {64, 16, 16}, true},
                        Case{DType::kBF16, DType::kBF16, 128, {200}, true},
                        Case{DType::kBF16, DType::kF32, 70, {33, 7}, false}}) {
    SCOPED_TRACE(testing::Message()
                 << DTypeName(c.compute) << " from " << DTypeName(c.stored) << " k=" << c.k);
    std::vector<std::vector<std::byte>> storage;
    LinearPackSpec spec;
    spec.name = "test.linear";
    spec.compute_dtype = c.compute;
    std::vector<float> w;  // stacked, as stored
    uint32_t seed = 10;
    for (int64_t rows : c.blocks) {
      const std::vector<float> values = Random(rows * c.k, seed++);
      storage.emplace_back(static_cast<size_t>(rows * c.k) * DTypeSize(c.stored));
      ConvertFromF32(c.stored, values.data(), rows * c.k, storage.back().data());
      std::vector<float> back(values.size());
      ConvertToF32(c.stored, storage.back().data(), rows * c.k, back.data());
      w.insert(w.end(), back.begin(), back.end());
      spec.row_blocks.push_back({c.stored, rows, c.k, storage.back().data()});
    }
    const int64_t n = static_cast<int64_t>(w.size()) / c.k;
    if (c.bias) spec.bias = Random(n, 99, -2.0f, 2.0f);
    absl::StatusOr<std::unique_ptr<PackedLinear>> linear = backend_->PackLinear(spec);
    ASSERT_TRUE(linear.ok()) << linear.status();
    EXPECT_EQ((*linear)->in_features(), c.k);
    EXPECT_EQ((*linear)->out_features(), n);
    for (int64_t m : {1, 3, 17, 64}) {
      const std::vector<float> x = Random(m * c.k, static_cast<uint32_t>(m));
      const TensorView out = Filled(m, n);
      ASSERT_TRUE(ctx_->Linear(**linear, Upload(x, m, c.k), out).ok());
      const std::vector<float> y = Download(out);
      const bool bf16 = c.compute == DType::kBF16;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = c.bias ? spec.bias[static_cast<size_t>(j)] : 0.0;
          double magnitude = std::abs(sum);
          for (int64_t q = 0; q < c.k; ++q) {
            const double xv = bf16 ? RoundBF16(x[i * c.k + q]) : x[i * c.k + q];
            const double wv = bf16 ? RoundBF16(w[j * c.k + q]) : w[j * c.k + q];
            sum += xv * wv;
            magnitude += std::abs(xv * wv);
          }
          ASSERT_NEAR(y[i * n + j], sum, 1e-5 * magnitude + 1e-6)
              << "m=" << m << " " << i << "," << j;
        }
      }
    }
  }
}

TEST_P(BackendOpsTest, LinearRefusesMismatchedShapesAndForeignWeights) {
  std::vector<float> values(8 * 16, 0.5f);
  LinearPackSpec spec;
  spec.name = "test.shapes";
  spec.row_blocks.push_back(
      {DType::kF32, 8, 16, reinterpret_cast<const std::byte*>(values.data())});
  absl::StatusOr<std::unique_ptr<PackedLinear>> linear = backend_->PackLinear(spec);
  ASSERT_TRUE(linear.ok()) << linear.status();
  absl::Status wrong = ctx_->Linear(**linear, Filled(2, 15), Filled(2, 8));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("test.shapes"), std::string::npos) << wrong;
  EXPECT_EQ(ctx_->Linear(**linear, Filled(2, 16), Filled(3, 8)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctx_->Linear(**linear, Filled(2, 16, 20), Filled(2, 8)).code(),
            absl::StatusCode::kInvalidArgument)
      << "strided input rows";

  class Foreign final : public PackedLinear {
   public:
    const std::string& name() const override { return name_; }
    int64_t in_features() const override { return 16; }
    int64_t out_features() const override { return 8; }
    DType compute_dtype() const override { return DType::kF32; }
    size_t packed_bytes() const override { return 0; }
    std::string kernel_name() const override { return "none"; }

   private:
    std::string name_ = "foreign";
  } foreign;
  absl::Status status = ctx_->Linear(foreign, Filled(2, 16), Filled(2, 8));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("foreign"), std::string::npos) << status;
}

// ---- SiluMul, Add, GatherRows, copies ----------------------------------------------------------

// Tolerance 1e-6 relative (+1e-7): one fp32 exp, a division and a product.
TEST_P(BackendOpsTest, SiluMulMatchesReference) {
  for (auto [rows, inter] : {std::pair<int64_t, int64_t>{1, 100}, {3, 77}, {8, 4864}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " inter=" << inter);
    std::vector<float> gate_up = Random(rows * 2 * inter, 5, -8.0f, 8.0f);
    gate_up[0] = -100.0f;  // exp overflows to inf: silu → -0
    gate_up[1] = 100.0f;
    const TensorView out = Filled(rows, inter, inter + 1);
    ASSERT_TRUE(ctx_->SiluMul(Upload(gate_up, rows, 2 * inter), out).ok());
    const std::vector<float> got = Download(out);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gate_up[r * 2 * inter + i];
        const double u = gate_up[r * 2 * inter + inter + i];
        const double expected = g / (1.0 + std::exp(-g)) * u;
        ASSERT_NEAR(got[r * (inter + 1) + i], expected, 1e-6 * std::abs(expected) + 1e-7)
            << r << "," << i;
      }
      ASSERT_EQ(got[r * (inter + 1) + inter], kSentinel);
    }
  }
}

TEST_P(BackendOpsTest, AddIsExact) {
  for (auto [rows, cols, stride] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                                    {3, 1000, 1000},
                                    {301, 1000, 1000},
                                    {5, 33, 40}}) {
    const std::vector<float> y = Random(rows * stride, 1);
    const std::vector<float> x = Random(rows * stride, 2);
    const TensorView yv = Upload(y, rows, cols, stride);
    ASSERT_TRUE(ctx_->Add(yv, Upload(x, rows, cols, stride)).ok());
    const std::vector<float> got = Download(yv);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < stride; ++i) {
        const size_t at = static_cast<size_t>(r * stride + i);
        ASSERT_EQ(got[at], i < cols ? y[at] + x[at] : y[at]) << r << "," << i;
      }
    }
  }
}

TEST_P(BackendOpsTest, GatherRowsTakesTheListedRows) {
  MakePool(4, 4, 1, 4);
  StepMetadata step = Step({{10, 0}}, {Table(16)});
  step.gather_rows = {0, 3, 4, 9};
  ASSERT_TRUE(ctx_->BeginStep(step).ok());
  const std::vector<float> x = Random(10 * 7, 3);
  const TensorView in = Upload(x, 10, 7);
  const TensorView out = Filled(2, 7);
  ASSERT_TRUE(ctx_->GatherRows(in, 1, 2, out).ok());
  const std::vector<float> got = Download(out);
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(got[static_cast<size_t>(i)], x[static_cast<size_t>(3 * 7 + i)]);
    EXPECT_EQ(got[static_cast<size_t>(7 + i)], x[static_cast<size_t>(4 * 7 + i)]);
  }
  EXPECT_EQ(ctx_->GatherRows(in, 3, 2, Filled(2, 7)).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendOpsTest, CopiesKeepRowStrides) {
  const std::vector<float> host = Random(4 * 5, 8);
  const TensorView dst = Filled(4, 5, 9);
  ASSERT_TRUE(ctx_->CopyFromHost(host.data(), dst).ok());
  std::vector<float> back(4 * 5);
  ASSERT_TRUE(ctx_->CopyToHost(dst, back.data()).ok());
  EXPECT_EQ(back, host);
  const std::vector<float> whole = Download(dst);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t i = 5; i < 9; ++i) EXPECT_EQ(whole[static_cast<size_t>(r * 9 + i)], kSentinel);
  }
  TensorView on_host = TensorView::HostF32(back.data(), 4, 5);
  on_host.device = Device{DeviceKind::kCuda, 3};  // a device this context is not
  EXPECT_EQ(ctx_->CopyToHost(on_host, back.data()).code(), absl::StatusCode::kInvalidArgument);
}

// ---- Step metadata -----------------------------------------------------------------------------

TEST_P(BackendOpsTest, BeginStepRefusesInconsistentMetadata) {
  MakePool(64, 4, 1, 4);
  const std::vector<int32_t> a = Table(8);
  const std::vector<int32_t> b = Table(8);
  EXPECT_TRUE(ctx_->BeginStep(Step({{2, 0}, {3, 5}}, {a, b})).ok());
  // Sequences may share blocks (a cached prefix).
  EXPECT_TRUE(ctx_->BeginStep(Step({{2, 4}, {1, 4}}, {a, a})).ok());

  absl::Status short_table = ctx_->BeginStep(Step({{4, 6}}, {a}));
  EXPECT_EQ(short_table.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_table.message().find("block table of 2 blocks"), std::string::npos)
      << short_table;

  StepMetadata foreign_block = Step({{2, 0}}, {{a[0], 64}});
  EXPECT_EQ(ctx_->BeginStep(foreign_block).code(), absl::StatusCode::kInvalidArgument);

  StepMetadata no_pool = Step({{2, 0}}, {a});
  no_pool.pool = KvPoolRef{};
  EXPECT_EQ(ctx_->BeginStep(no_pool).code(), absl::StatusCode::kInvalidArgument);

  StepMetadata bad_position = Step({{3, 0}}, {a});
  bad_position.positions[1] = 7;
  EXPECT_EQ(ctx_->BeginStep(bad_position).code(), absl::StatusCode::kInvalidArgument);

  StepMetadata unordered = Step({{3, 0}}, {a});
  unordered.gather_rows = {2, 1};
  EXPECT_EQ(ctx_->BeginStep(unordered).code(), absl::StatusCode::kInvalidArgument);

  std::vector<std::pair<int64_t, int64_t>> many(9, {1, 0});
  std::vector<std::vector<int32_t>> tables(9, a);
  absl::Status too_many = ctx_->BeginStep(Step(many, tables));
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("limit of 8"), std::string::npos) << too_many;
}

}  // namespace
}  // namespace kiln
