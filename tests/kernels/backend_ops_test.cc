// The op set of kernels/backend.h against slow double-precision references, in the manner of
// llama.cpp's test-backend-ops and ONNX Runtime's OpTester: every test body runs once per backend
// kiln knows (ListBackends); a backend this build or machine cannot run skips with the reason.
// Inputs go to the backend with explicit uploads and results come back with explicit downloads,
// so the same bodies hold for a device with memory of its own.
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

namespace kiln {
namespace {

constexpr float kSentinel = -12345.0f;

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<std::string> KnownBackends() {
  std::vector<std::string> names;
  for (const BackendInfo& info : ListBackends()) names.push_back(info.name);
  return names;
}

// A backend, one execution context and the buffers a test uploads.
class BackendOpsTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (absl::Status available = CheckBackendAvailable(GetParam()); !available.ok()) {
      GTEST_SKIP() << available.message();
    }
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(GetParam());
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    absl::StatusOr<std::unique_ptr<ExecutionContext>> context =
        backend_->CreateContext({.limits = {512, 8}, .scratch_bytes = 4096});
    ASSERT_TRUE(context.ok()) << context.status();
    ctx_ = std::move(*context);
  }

  // rows × cols fp32 values of `host` (row r at r·stride) in a fresh backend buffer with the same
  // row stride.
  TensorView Upload(const std::vector<float>& host, int64_t rows, int64_t cols,
                    int64_t stride = -1) {
    if (stride < 0) stride = cols;
    EXPECT_GE(static_cast<int64_t>(host.size()), rows * stride);
    return UploadBytes(host.data(), static_cast<size_t>(rows * stride) * sizeof(float), DType::kF32,
                       rows, cols, stride);
  }
  TensorView UploadBytes(const void* host, size_t bytes, DType dtype, int64_t rows, int64_t cols,
                         int64_t stride) {
    absl::StatusOr<DeviceBuffer> buffer = backend_->Allocate(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(backend_->Upload(host, bytes, *buffer).ok());
    TensorView view =
        TensorView::Matrix(buffer->data(), dtype, buffer->device(), rows, cols, stride);
    buffers_.push_back(std::move(*buffer));
    return view;
  }
  // A buffer of `rows` × `stride` floats, every one kSentinel.
  TensorView Filled(int64_t rows, int64_t cols, int64_t stride = -1) {
    if (stride < 0) stride = cols;
    return Upload(std::vector<float>(static_cast<size_t>(rows * stride), kSentinel), rows, cols,
                  stride);
  }
  // Every float the view spans (padding between rows included), back on the host.
  std::vector<float> Download(const TensorView& view) {
    std::vector<float> out(static_cast<size_t>(view.rows * view.row_stride));
    const TensorView whole =
        TensorView::Matrix(view.data, DType::kF32, view.device, 1, view.rows * view.row_stride);
    EXPECT_TRUE(ctx_->CopyToHost(whole, out.data()).ok());
    return out;
  }

  // A KV pool of `blocks` blocks of `block_size` positions of `dtype`, keys and values filled
  // from `seed`; Table() hands its blocks out in a shuffled order, so that sequences are paged
  // for real.
  void MakePool(int64_t blocks, int64_t block_size, int64_t layers, int64_t kv_dim,
                uint32_t seed = 1, DType dtype = DType::kF32) {
    pool_ = KvPoolRef{nullptr, backend_->device(), blocks, block_size, layers, kv_dim, dtype};
    const int64_t n = blocks * pool_.block_elements();
    const std::vector<float> values = Random(n, seed, -3.0f, 3.0f);
    if (dtype == DType::kBF16) {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = F32ToBF16(values[i]);
      pool_.data =
          UploadBytes(bits.data(), bits.size() * sizeof(uint16_t), DType::kBF16, 1, n, n).data;
    } else {
      pool_.data = Upload(values, 1, n).f32();
    }
    unused_.resize(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) unused_[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    std::shuffle(unused_.begin(), unused_.end(), std::mt19937(seed));
  }
  // A block table covering `positions` positions.
  std::vector<int32_t> Table(int64_t positions) {
    const int64_t count = (positions + pool_.block_size - 1) / pool_.block_size;
    EXPECT_LE(count, static_cast<int64_t>(unused_.size())) << "the test pool is too small";
    std::vector<int32_t> table(unused_.end() - count, unused_.end());
    unused_.resize(unused_.size() - static_cast<size_t>(count));
    return table;
  }
  // The pool's contents as fp32 (bf16 widens exactly).
  std::vector<float> DownloadPool() {
    const int64_t n = pool_.num_blocks * pool_.block_elements();
    if (pool_.dtype != DType::kBF16) {
      return Download(TensorView::Matrix(pool_.data, DType::kF32, backend_->device(), 1, n));
    }
    // Copied as the fp32 words the bf16 pairs fill (copies move f32 views); n is even.
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    EXPECT_TRUE(
        ctx_->CopyToHost(TensorView::Matrix(pool_.data, DType::kF32, backend_->device(), 1, n / 2),
                         bits.data())
            .ok());
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = BF16ToF32(bits[i]);
    return out;
  }
  // `value` as the pool stores it.
  float Stored(float value) const {
    return pool_.dtype == DType::kBF16 ? BF16ToF32(F32ToBF16(value)) : value;
  }
  // Index in DownloadPool() of value i (0 ≤ i < kv_dim) of the key (which = 0) or value of
  // `position` in `layer`: keys are stored transposed, [kv_dim][block_size] (kernels/step.h).
  size_t PoolIndex(const std::vector<int32_t>& table, int64_t layer, int which, int64_t position,
                   int64_t i) const {
    const int64_t block = table[static_cast<size_t>(position / pool_.block_size)];
    const int64_t offset = position % pool_.block_size;
    return static_cast<size_t>(
        block * pool_.block_elements() + (layer * 2 + which) * pool_.block_size * pool_.kv_dim +
        (which == 0 ? pool_.key_index(offset, i) : pool_.value_index(offset, i)));
  }

  // A step of one sequence per (rows, start) pair, each with its block table.
  StepMetadata Step(const std::vector<std::pair<int64_t, int64_t>>& sequences,
                    const std::vector<std::vector<int32_t>>& tables,
                    const std::vector<int32_t>& tokens = {}) {
    StepMetadata step;
    step.pool = pool_;
    int64_t row = 0;
    for (size_t s = 0; s < sequences.size(); ++s) {
      std::vector<int32_t> ids(static_cast<size_t>(sequences[s].first));
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = tokens.empty() ? 0 : tokens[static_cast<size_t>(row) + i];
      }
      step.AddSequence(ids.data(), sequences[s].first, sequences[s].second, tables[s]);
      row += sequences[s].first;
    }
    return step;
  }

  KvPoolRef pool_;
  std::vector<int32_t> unused_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ExecutionContext> ctx_;
  std::vector<DeviceBuffer> buffers_;
};

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

// ---- RopeAndAppendKv, Attention --------------------------------------------------------------

struct AttentionCase {
  int64_t n_heads, n_kv_heads, head_dim;
  std::vector<std::pair<int64_t, int64_t>> sequences;  // (rows, start position)
};

std::vector<AttentionCase> AttentionCases() {
  std::vector<AttentionCase> cases;
  // GQA ratios 1, 2 and 7; head_dim 64 and 128; decode after a prefix, prefill from 0, chunked
  // prefill after a prefix, and several sequences of different kinds in one step.
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {14, 2}, {7, 1}}) {
    for (int64_t head_dim : {64, 128}) {
      cases.push_back({heads, kv_heads, head_dim, {{1, 37}}});
      cases.push_back({heads, kv_heads, head_dim, {{9, 0}}});
      cases.push_back({heads, kv_heads, head_dim, {{5, 11}, {1, 0}, {3, 60}}});
    }
  }
  cases.push_back({14, 2, 64, {{40, 0}}});
  cases.push_back({8, 2, 128, {{17, 120}, {1, 200}}});
  // Many chunks of keys (the CPU kernel's online softmax takes 64 at a time): a speculative
  // verification of 3 tokens deep into a context.
  cases.push_back({14, 2, 64, {{3, 700}}});
  return cases;
}

std::string Describe(const AttentionCase& c) {
  std::string text = std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads, " +
                     "head_dim " + std::to_string(c.head_dim) + ", sequences";
  for (auto [rows, start] : c.sequences) {
    text += " " + std::to_string(rows) + "@" + std::to_string(start);
  }
  return text;
}

std::vector<float> InvFreq(int64_t head_dim) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    inv[i] = static_cast<float>(
        1.0 / std::pow(500000.0, 2.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
  }
  return inv;
}

// Written from Hugging Face's apply_rotary_pos_emb: out = x·cos + rotate_half(x)·sin with
// cos/sin = cat(f, f) and rotate_half(x) = cat(−x2, x1). As in HF the angle is the fp32 product
// position · inv_freq; the rest is double. Tolerance 2e-6 absolute for |x| ≤ 1.
double Rotated(const float* head, int64_t j, int64_t head_dim, int32_t position,
               const std::vector<float>& inv_freq) {
  const int64_t half = head_dim / 2;
  const float angle = static_cast<float>(position) * inv_freq[static_cast<size_t>(j % half)];
  const double partner = j < half ? -static_cast<double>(head[j + half]) : head[j - half];
  return head[j] * std::cos(static_cast<double>(angle)) +
         partner * std::sin(static_cast<double>(angle));
}

// Block sizes of the KV pool the attention tests page through: one position per block, a
// typical 16, 5 (blocks that do not divide the sequences' lengths), 32 (a 64-key chunk of
// attention spanning two blocks) and 80 (a block larger than a chunk, which the CPU kernel
// prefetches dimension by dimension).
constexpr int64_t kBlockSizes[] = {1, 16, 5, 32, 80};
// What the pool stores: fp32, and bf16 (half the memory; the ops convert on the way in and out).
constexpr DType kKvDTypes[] = {DType::kF32, DType::kBF16};

TEST_P(BackendOpsTest, RopeAndAppendKvRotatesAndWritesThePool) {
  const int64_t layers = 2;
  const int64_t layer = 1;
  for (const DType kv_dtype : kKvDTypes) {
    for (const int64_t block_size : kBlockSizes) {
      for (const AttentionCase& c : AttentionCases()) {
        SCOPED_TRACE(Describe(c) + ", block size " + std::to_string(block_size) + ", " +
                     std::string(DTypeApiName(kv_dtype)) + " pool");
        const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f};
        const int64_t qkv_dim = shape.qkv_dim();
        int64_t blocks = 2;  // a few the sequences do not use
        for (auto [rows, start] : c.sequences)
          blocks += (rows + start + 3 + block_size - 1) / block_size;
        MakePool(blocks, block_size, layers, shape.kv_dim(), 30, kv_dtype);
        std::vector<std::vector<int32_t>> tables;
        for (auto [rows, start] : c.sequences) tables.push_back(Table(rows + start + 3));
        const std::vector<float> before = DownloadPool();
        const StepMetadata step = Step(c.sequences, tables);
        ASSERT_TRUE(ctx_->BeginStep(step).ok());
        const int64_t rows = step.rows();
        const std::vector<float> x = Random(rows * qkv_dim, 7);
        const std::vector<float> inv_freq = InvFreq(c.head_dim);
        const TensorView qkv = Upload(x, rows, qkv_dim);
        ASSERT_TRUE(
            ctx_->RopeAndAppendKv(qkv, shape, Upload(inv_freq, 1, c.head_dim / 2), layer).ok());
        const std::vector<float> got = Download(qkv);
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t pos = step.positions[static_cast<size_t>(r)];
          for (int64_t h = 0; h < c.n_heads + c.n_kv_heads; ++h) {  // q heads, then k heads
            const float* head = x.data() + r * qkv_dim + h * c.head_dim;
            for (int64_t j = 0; j < c.head_dim; ++j) {
              ASSERT_NEAR(got[r * qkv_dim + h * c.head_dim + j],
                          Rotated(head, j, c.head_dim, pos, inv_freq), 2e-6)
                  << "row " << r << " head " << h << " j " << j;
            }
          }
          for (int64_t i = shape.q_dim() + shape.kv_dim(); i < qkv_dim; ++i) {
            ASSERT_EQ(got[r * qkv_dim + i], x[r * qkv_dim + i]) << "v is not rotated";
          }
        }
        // Layer `layer` of each sequence's new positions holds the rotated k and the v, through
        // its block table; every other value of the pool is as it was.
        std::vector<float> expected = before;
        for (size_t s = 0; s < tables.size(); ++s) {
          const StepSequence& seq = step.sequences[s];
          for (int64_t t = 0; t < seq.rows; ++t) {
            const int64_t row = seq.first_row + t;
            const int64_t p = seq.start_position + t;
            for (int64_t i = 0; i < shape.kv_dim(); ++i) {
              expected[PoolIndex(tables[s], layer, 0, p, i)] =
                  Stored(got[row * qkv_dim + shape.q_dim() + i]);
              expected[PoolIndex(tables[s], layer, 1, p, i)] =
                  Stored(x[row * qkv_dim + shape.q_dim() + shape.kv_dim() + i]);
            }
          }
        }
        ASSERT_EQ(DownloadPool(), expected);
      }
    }
  }
}

// Naive attention in double: for a row at position p and head h, softmax over keys 0 .. p of
// scale·q·k, times v, reading kv head h / group through the sequence's block table. Tolerance
// 6e-6 absolute: outputs are convex combinations of values in [-3, 3] with fp32 scores, exp and
// accumulation (2e-6 per unit of value magnitude). A bf16 pool is held to the same tolerance: the
// reference reads the values the pool holds, which the kernel widens exactly.
TEST_P(BackendOpsTest, AttentionThroughBlockTablesMatchesNaiveReference) {
  const int64_t layers = 3;
  const int64_t layer = 2;
  for (const DType kv_dtype : kKvDTypes) {
    for (const int64_t block_size : kBlockSizes) {
      for (const AttentionCase& c : AttentionCases()) {
        SCOPED_TRACE(Describe(c) + ", block size " + std::to_string(block_size) + ", " +
                     std::string(DTypeApiName(kv_dtype)) + " pool");
        const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim,
                                   1.0f / std::sqrt(static_cast<float>(c.head_dim))};
        const int64_t qkv_dim = shape.qkv_dim();
        const int64_t kv_dim = shape.kv_dim();
        int64_t blocks = 2;
        for (auto [rows, start] : c.sequences)
          blocks += (rows + start + 2 + block_size - 1) / block_size;
        MakePool(blocks, block_size, layers, kv_dim, 40, kv_dtype);
        std::vector<std::vector<int32_t>> tables;
        for (auto [rows, start] : c.sequences) tables.push_back(Table(rows + start + 2));
        const std::vector<float> contents = DownloadPool();
        const StepMetadata step = Step(c.sequences, tables);
        ASSERT_TRUE(ctx_->BeginStep(step).ok());
        const int64_t rows = step.rows();
        // Scaled up so that the softmax is far from uniform.
        const std::vector<float> x = Random(rows * qkv_dim, 21, -3.0f, 3.0f);
        const TensorView out = Filled(rows, shape.q_dim(), shape.q_dim() + 3);
        ASSERT_TRUE(ctx_->Attention(Upload(x, rows, qkv_dim), shape, layer, out).ok());
        const std::vector<float> got = Download(out);
        const int64_t group = c.n_heads / c.n_kv_heads;
        for (size_t s = 0; s < tables.size(); ++s) {
          const StepSequence& seq = step.sequences[s];
          for (int64_t t = 0; t < seq.rows; ++t) {
            const int64_t row = seq.first_row + t;
            const int64_t len = seq.start_position + t + 1;
            for (int64_t h = 0; h < c.n_heads; ++h) {
              const int64_t kv_offset = (h / group) * c.head_dim;
              std::vector<double> scores(static_cast<size_t>(len));
              double max_score = -1e300;
              for (int64_t p = 0; p < len; ++p) {
                double dot = 0.0;
                for (int64_t i = 0; i < c.head_dim; ++i) {
                  dot += static_cast<double>(x[row * qkv_dim + h * c.head_dim + i]) *
                         contents[PoolIndex(tables[s], layer, 0, p, kv_offset + i)];
                }
                scores[static_cast<size_t>(p)] = dot * shape.scale;
                max_score = std::max(max_score, scores[static_cast<size_t>(p)]);
              }
              double sum = 0.0;
              for (double& score : scores) sum += (score = std::exp(score - max_score));
              for (int64_t i = 0; i < c.head_dim; ++i) {
                double expected = 0.0;
                for (int64_t p = 0; p < len; ++p) {
                  expected += scores[static_cast<size_t>(p)] / sum *
                              contents[PoolIndex(tables[s], layer, 1, p, kv_offset + i)];
                }
                ASSERT_NEAR(got[row * out.row_stride + h * c.head_dim + i], expected, 6e-6)
                    << "row " << row << " head " << h << " i " << i;
              }
            }
            for (int64_t i = shape.q_dim(); i < out.row_stride; ++i) {
              ASSERT_EQ(got[row * out.row_stride + i], kSentinel) << "padding";
            }
          }
        }
      }
    }
  }
}

// Speculative verification runs k + 1 rows of a sequence in one step and keeps the tokens only
// where they equal what decoding one row at a time would have chosen: a row's attention output
// must not depend on the rows beside it, bit for bit (GQA 3 and 7; contexts across chunks).
TEST_P(BackendOpsTest, AttentionOfEachRowEqualsTheRowAlone) {
  const int64_t layers = 1;
  for (const DType kv_dtype : kKvDTypes) {
    for (auto [heads, kv_heads, rows, start] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{6, 2, 4, 61},
          {14, 2, 9, 120},
          {4, 4, 3, 0}}) {
      SCOPED_TRACE(testing::Message() << heads << "/" << kv_heads << " heads, " << rows << "@"
                                      << start << ", " << DTypeApiName(kv_dtype) << " pool");
      const AttentionShape shape{heads, kv_heads, 64, 0.125f};
      MakePool((rows + start) / 16 + 2, 16, layers, shape.kv_dim(), 7, kv_dtype);
      const std::vector<int32_t> table = Table(rows + start);
      const std::vector<float> x = Random(rows * shape.qkv_dim(), 9, -3.0f, 3.0f);
      ASSERT_TRUE(ctx_->BeginStep(Step({{rows, start}}, {table})).ok());
      const TensorView together = Filled(rows, shape.q_dim());
      ASSERT_TRUE(ctx_->Attention(Upload(x, rows, shape.qkv_dim()), shape, 0, together).ok());
      const std::vector<float> all = Download(together);
      for (int64_t t = 0; t < rows; ++t) {
        ASSERT_TRUE(ctx_->BeginStep(Step({{1, start + t}}, {table})).ok());
        const std::vector<float> row(x.begin() + t * shape.qkv_dim(),
                                     x.begin() + (t + 1) * shape.qkv_dim());
        const TensorView alone = Filled(1, shape.q_dim());
        ASSERT_TRUE(ctx_->Attention(Upload(row, 1, shape.qkv_dim()), shape, 0, alone).ok());
        const std::vector<float> got = Download(alone);
        for (int64_t i = 0; i < shape.q_dim(); ++i) {
          ASSERT_EQ(got[static_cast<size_t>(i)], all[static_cast<size_t>(t * shape.q_dim() + i)])
              << "row " << t << " value " << i;
        }
      }
    }
  }
}

// A step of many sequences (batched decode, prefill beside decode) hands all their attention to
// the threads at once: each sequence's rows must be the bits it gets in a step of its own.
TEST_P(BackendOpsTest, AttentionOfEachSequenceEqualsTheSequenceAlone) {
  const std::vector<std::pair<int64_t, int64_t>> sequences = {{1, 0}, {1, 5},  {4, 61}, {1, 130},
                                                              {9, 0}, {1, 33}, {1, 17}, {2, 200}};
  for (const DType kv_dtype : kKvDTypes) {
    for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{14, 2}, {6, 2}}) {
      SCOPED_TRACE(testing::Message()
                   << heads << "/" << kv_heads << " heads, " << DTypeApiName(kv_dtype) << " pool");
      const AttentionShape shape{heads, kv_heads, 64, 0.125f};
      int64_t blocks = 2;
      for (auto [rows, start] : sequences) blocks += (rows + start + 15) / 16;
      MakePool(blocks, 16, 1, shape.kv_dim(), 11, kv_dtype);
      std::vector<std::vector<int32_t>> tables;
      for (auto [rows, start] : sequences) tables.push_back(Table(rows + start));
      const StepMetadata step = Step(sequences, tables);
      const int64_t rows = step.rows();
      const std::vector<float> x = Random(rows * shape.qkv_dim(), 13, -3.0f, 3.0f);
      ASSERT_TRUE(ctx_->BeginStep(step).ok());
      const TensorView together = Filled(rows, shape.q_dim());
      ASSERT_TRUE(ctx_->Attention(Upload(x, rows, shape.qkv_dim()), shape, 0, together).ok());
      const std::vector<float> all = Download(together);
      for (size_t s = 0; s < sequences.size(); ++s) {
        const StepSequence& seq = step.sequences[s];
        ASSERT_TRUE(ctx_->BeginStep(Step({sequences[s]}, {tables[s]})).ok());
        const std::vector<float> own(x.begin() + seq.first_row * shape.qkv_dim(),
                                     x.begin() + (seq.first_row + seq.rows) * shape.qkv_dim());
        const TensorView alone = Filled(seq.rows, shape.q_dim());
        ASSERT_TRUE(ctx_->Attention(Upload(own, seq.rows, shape.qkv_dim()), shape, 0, alone).ok());
        const std::vector<float> got = Download(alone);
        for (int64_t i = 0; i < seq.rows * shape.q_dim(); ++i) {
          ASSERT_EQ(got[static_cast<size_t>(i)],
                    all[static_cast<size_t>(seq.first_row * shape.q_dim() + i)])
              << "sequence " << s << " value " << i;
        }
      }
    }
  }
}

TEST_P(BackendOpsTest, AttentionOpsRefuseLayersAndShapesTheCacheDoesNotHave) {
  const AttentionShape shape{4, 2, 64, 0.125f};
  MakePool(4, 4, 2, shape.kv_dim(), 3);
  ASSERT_TRUE(ctx_->BeginStep(Step({{2, 0}}, {Table(8)})).ok());
  const TensorView qkv = Filled(2, shape.qkv_dim());
  const TensorView inv_freq = Upload(InvFreq(64), 1, 32);
  absl::Status status = ctx_->RopeAndAppendKv(qkv, shape, inv_freq, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("layer 2"), std::string::npos) << status;
  const AttentionShape other{4, 4, 64, 0.125f};
  EXPECT_EQ(ctx_->Attention(Filled(2, other.qkv_dim()), other, 0, Filled(2, other.q_dim())).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctx_->RopeAndAppendKv(qkv, shape, Upload(InvFreq(64), 1, 16), 0).code(),
            absl::StatusCode::kInvalidArgument)
      << "RoPE table of the wrong width";
  EXPECT_EQ(ctx_->Attention(Filled(3, shape.qkv_dim()), shape, 0, Filled(3, shape.q_dim())).code(),
            absl::StatusCode::kInvalidArgument)
      << "more rows than the step";
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
