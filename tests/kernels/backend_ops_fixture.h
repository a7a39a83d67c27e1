// The fixture of the backend op tests (backend_ops_test.cc, backend_attention_test.cc), in the
// manner of llama.cpp's test-backend-ops and ONNX Runtime's OpTester: every test body runs once per
// backend kiln knows (ListBackends, instantiated in backend_ops_test.cc); a backend this build or
// machine cannot run skips with the reason. Inputs go to the backend with explicit uploads and
// results come back with explicit downloads, so the same bodies hold for a device with memory of
// its own.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/backend_registry.h"
#include "kernels/dtype.h"

namespace kiln::backend_ops_testing {

inline constexpr float kSentinel = -12345.0f;

inline std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<std::string> KnownBackends() {
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

}  // namespace kiln::backend_ops_testing
