// The CPU backend's packed linears (oneDNN brgemm) against a double-precision reference: packing
// paths, dtypes, fused blocks, every M. The op itself runs through an execution context, as in
// a forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend_registry.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/small_m_linear.h"
#include "kernels/cpu/step_team.h"

namespace kiln {

// Readable parameter names in gtest output.
void PrintTo(DType dtype, std::ostream* os) { *os << DTypeName(dtype); }

namespace {

// A weight block stored in its checkpoint dtype at an odd (unaligned) address, plus the fp32
// values it really holds after rounding to that dtype.
struct StoredBlock {
  std::vector<std::byte> storage;
  std::vector<float> values;  // [rows, cols]
  WeightView view;
};

StoredBlock MakeBlock(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng,
                      size_t misalignment = 1) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  StoredBlock block;
  block.values.resize(rows * cols);
  for (float& v : block.values) v = dist(rng);
  block.storage.resize(rows * cols * DTypeSize(dtype) + 64);
  // vector<std::byte> storage comes from operator new: 16-byte aligned.
  std::byte* data = block.storage.data() + misalignment;
  ConvertFromF32(dtype, block.values.data(), rows * cols, data);
  ConvertToF32(dtype, data, rows * cols, block.values.data());
  block.view = WeightView{dtype, rows, cols, data};
  return block;
}

float RoundBF16(float v) { return BF16ToF32(F32ToBF16(v)); }

struct Problem {
  DType compute = DType::kF32;
  int64_t k = 0;
  std::vector<StoredBlock> blocks;
  std::vector<float> bias;
  std::vector<float> w;  // stacked [n, k] values as stored
  int64_t n = 0;

  LinearPackSpec Spec(const std::string& name) const {
    LinearPackSpec spec;
    spec.name = name;
    for (const StoredBlock& b : blocks) spec.row_blocks.push_back(b.view);
    spec.bias = bias;
    spec.compute_dtype = compute;
    return spec;
  }
};

Problem MakeProblem(DType compute, DType source, int64_t k, const std::vector<int64_t>& rows,
                    bool bias, uint32_t seed, size_t misalignment = 1) {
  std::mt19937 rng(seed);
  Problem p;
  p.compute = compute;
  p.k = k;
  for (int64_t r : rows) {
    p.blocks.push_back(MakeBlock(source, r, k, rng, misalignment));
    p.w.insert(p.w.end(), p.blocks.back().values.begin(), p.blocks.back().values.end());
    p.n += r;
  }
  if (bias) {
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    p.bias.resize(p.n);
    for (float& b : p.bias) b = dist(rng);
  }
  return p;
}

std::vector<float> RandomInput(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(count);
  for (float& v : x) v = dist(rng);
  return x;
}

// Reference: for bf16 compute, x and W rounded to bf16 as the kernel does; products summed in
// double. Tolerance: 1e-5 · (Σ_k |x||w| + |bias|) — fp32 accumulation over K ≤ 896 terms stays
// well inside that, while a wrong element, transposition or dropped block is off by O(1).
void ExpectMatchesReference(const Problem& p, const std::vector<float>& x, int64_t m,
                            const float* y) {
  const bool bf16 = p.compute == DType::kBF16;
  int failures = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0.0;
      double magnitude = 0.0;
      for (int64_t c = 0; c < p.k; ++c) {
        const double xv = bf16 ? RoundBF16(x[i * p.k + c]) : x[i * p.k + c];
        const double wv = bf16 ? RoundBF16(p.w[j * p.k + c]) : p.w[j * p.k + c];
        sum += xv * wv;
        magnitude += std::abs(xv * wv);
      }
      if (!p.bias.empty()) {
        sum += p.bias[j];
        magnitude += std::abs(p.bias[j]);
      }
      const double tolerance = 1e-5 * magnitude + 1e-6;
      if (std::abs(y[i * p.n + j] - sum) > tolerance && ++failures <= 5) {
        ADD_FAILURE() << "y[" << i << ", " << j << "] = " << y[i * p.n + j] << ", expected " << sum
                      << " ± " << tolerance;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

std::unique_ptr<Backend> MakeBackend() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// y = x·Wᵀ through a CPU execution context (one per thread; the CPU backend's memory is host
// memory, so x and y are used in place).
absl::Status RunLinear(const PackedLinear& linear, const float* x, int64_t m, float* y) {
  static const std::unique_ptr<Backend> backend = MakeBackend();
  thread_local const std::unique_ptr<ExecutionContext> context = [] {
    absl::StatusOr<std::unique_ptr<ExecutionContext>> created =
        backend->CreateContext({.limits = {1, 1}, .scratch_bytes = 0});
    EXPECT_TRUE(created.ok()) << created.status();
    return std::move(*created);
  }();
  return context->Linear(linear, TensorView::HostF32(x, m, linear.in_features()),
                         TensorView::HostF32(y, m, linear.out_features()));
}

// Runs `run(x, m, y)` with an x and y misaligned by one float, and checks y against the reference
// and that nothing past the m·n outputs was written. The outputs go to `out` when given.
template <typename Run>
void RunAndCheck(const Problem& p, int64_t m, uint32_t seed, Run&& run,
                 std::vector<float>* out = nullptr) {
  std::vector<float> x_storage = RandomInput(m * p.k + 1, seed);
  std::vector<float> x(x_storage.begin() + 1, x_storage.end());
  std::vector<float> y_storage(m * p.n + 1 + 16, -777.0f);
  float* y = y_storage.data() + 1;
  const absl::Status status = run(x_storage.data() + 1, m, y);
  ASSERT_TRUE(status.ok()) << status;
  ExpectMatchesReference(p, x, m, y);
  for (int64_t i = m * p.n; i < m * p.n + 16; ++i) ASSERT_EQ(y[i], -777.0f) << "overrun";
  if (out != nullptr) out->assign(y, y + m * p.n);
}

// Runs Forward through an execution context for each M (RunAndCheck).
void CheckForward(const PackedLinear& linear, const Problem& p, const std::vector<int64_t>& ms) {
  for (int64_t m : ms) {
    SCOPED_TRACE(testing::Message() << "M=" << m);
    RunAndCheck(
        p, m, static_cast<uint32_t>(m * 7 + 1),
        [&](const float* x, int64_t rows, float* y) { return RunLinear(linear, x, rows, y); });
  }
}

struct Shape {
  int64_t k;
  std::vector<int64_t> rows;  // row blocks, stacked
};

class PackedLinearTest : public testing::TestWithParam<DType> {};

TEST_P(PackedLinearTest, MatchesReferenceForSmallShapes) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  const std::vector<Shape> shapes = {
      {72, {33}}, {72, {16, 8, 9}}, {33, {7, 5}}, {1, {1}}, {130, {64, 64, 3}}};
  uint32_t seed = 1;
  for (const Shape& shape : shapes) {
    for (DType source : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << "K=" << shape.k << " blocks=" << shape.rows.size()
                                        << " source=" << DTypeName(source) << " bias=" << bias);
        Problem p = MakeProblem(GetParam(), source, shape.k, shape.rows, bias, seed++);
        auto linear = backend->PackLinear(p.Spec("test.small"));
        ASSERT_TRUE(linear.ok()) << linear.status();
        EXPECT_EQ((*linear)->in_features(), shape.k);
        EXPECT_EQ((*linear)->out_features(), p.n);
        EXPECT_EQ((*linear)->compute_dtype(), GetParam());
        EXPECT_GE((*linear)->packed_bytes(), p.n * p.k * DTypeSize(GetParam()));
        EXPECT_FALSE((*linear)->kernel_name().empty());
        CheckForward(**linear, p, {1, 2, 7, 16, 64, 300});
      }
    }
  }
}

// A single naturally aligned block already in the compute dtype is reordered where it lies
// (no staging copy); misaligned or converted blocks are staged. Both give the reference result.
TEST_P(PackedLinearTest, AlignedSingleBlockPacksInPlace) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  for (size_t misalignment : {size_t{0}, size_t{1}, size_t{2}, size_t{4}}) {
    for (DType source : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(testing::Message()
                   << "misalignment " << misalignment << " source " << DTypeName(source));
      Problem p = MakeProblem(GetParam(), source, 160, {96}, false, 7, misalignment);
      const std::vector<std::byte> before = p.blocks[0].storage;
      auto linear = backend->PackLinear(p.Spec("test.in_place"));
      ASSERT_TRUE(linear.ok()) << linear.status();
      EXPECT_EQ(p.blocks[0].storage, before) << "packing must not write its source";
      CheckForward(**linear, p, {1, 5, 64});
    }
  }
}

// Qwen2-0.5B's fused q/k/v: 896 inputs, 14·64 + 2·64 + 2·64 outputs, with bias.
TEST_P(PackedLinearTest, MatchesReferenceForFusedQkv) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  for (DType source : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(source));
    Problem p = MakeProblem(GetParam(), source, 896, {896, 128, 128}, true, 99);
    auto linear = backend->PackLinear(p.Spec("layers.0.qkv"));
    ASSERT_TRUE(linear.ok()) << linear.status();
    CheckForward(**linear, p, {1, 7, 300});
  }
}

// Aligned blocks already in the compute dtype are reordered from where they lie straight into
// their rows of the packed layout when every cut falls on a layout block; other shapes take the
// stacked copy. Either way the source is untouched and the result matches the reference.
TEST_P(PackedLinearTest, AlignedBlocksPackWhereTheyLie) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  const DType source = GetParam();  // the compute dtype: no conversion
  const std::vector<Shape> shapes = {
      {896, {896, 128, 128}}, {64, {64, 192}}, {96, {64, 64, 3}}, {40, {8, 64}}};
  uint32_t seed = 40;
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(testing::Message() << "K=" << shape.k << " blocks=" << shape.rows.size());
    Problem p = MakeProblem(GetParam(), source, shape.k, shape.rows, true, seed++, 0);
    std::vector<std::vector<std::byte>> before;
    for (const StoredBlock& block : p.blocks) before.push_back(block.storage);
    auto linear = backend->PackLinear(p.Spec("test.blocks_in_place"));
    ASSERT_TRUE(linear.ok()) << linear.status();
    for (size_t i = 0; i < p.blocks.size(); ++i) {
      EXPECT_EQ(p.blocks[i].storage, before[i]) << "packing must not write its source";
    }
    CheckForward(**linear, p, {1, 7, 64});
  }
}

// PackLinears packs a whole model's weights (concurrently on the CPU backend): every result is
// in spec order and computes exactly what PackLinear's does; a bad spec fails the batch with an
// error naming it.
TEST_P(PackedLinearTest, PackLinearsMatchesPackLinearInOrder) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  std::vector<Problem> problems;
  std::vector<LinearPackSpec> specs;
  const std::vector<Shape> shapes = {{896, {896, 128, 128}}, {64, {4096}}, {33, {7, 5}},
                                     {896, {4864}},          {72, {33}},   {128, {64, 64}}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    problems.push_back(MakeProblem(GetParam(), i % 2 ? DType::kBF16 : DType::kF32, shapes[i].k,
                                   shapes[i].rows, i % 3 == 0, static_cast<uint32_t>(70 + i),
                                   i % 2));
  }
  for (size_t i = 0; i < problems.size(); ++i) {
    specs.push_back(problems[i].Spec("layers." + std::to_string(i)));
  }
  auto packed = backend->PackLinears(specs);
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(packed->size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(specs[i].name);
    auto single = backend->PackLinear(specs[i]);
    ASSERT_TRUE(single.ok()) << single.status();
    ASSERT_EQ((*packed)[i]->out_features(), problems[i].n);
    const std::vector<float> x = RandomInput(5 * problems[i].k, 3);
    std::vector<float> y_batch(5 * problems[i].n), y_single(5 * problems[i].n);
    ASSERT_TRUE(RunLinear(*(*packed)[i], x.data(), 5, y_batch.data()).ok());
    ASSERT_TRUE(RunLinear(**single, x.data(), 5, y_single.data()).ok());
    EXPECT_EQ(y_batch, y_single);
    ExpectMatchesReference(problems[i], x, 5, y_batch.data());
  }
  specs[3].row_blocks.push_back(specs[2].row_blocks[0]);  // 33 cols beside 896: invalid
  auto failed = backend->PackLinears(specs);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(failed.status().message().find("layers.3"), std::string::npos) << failed.status();
}

TEST_P(PackedLinearTest, ZeroRowsIsANoOpAndNegativeIsAnError) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Problem p = MakeProblem(GetParam(), DType::kF32, 16, {8}, false, 5);
  auto linear = backend->PackLinear(p.Spec("test.edge"));
  ASSERT_TRUE(linear.ok()) << linear.status();
  float y = 3.0f;
  EXPECT_TRUE(RunLinear(**linear, nullptr, 0, &y).ok());
  EXPECT_EQ(y, 3.0f);
  absl::Status negative = RunLinear(**linear, &y, -1, &y);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("test.edge"), std::string::npos);
  EXPECT_EQ(RunLinear(**linear, nullptr, 1, &y).code(), absl::StatusCode::kInvalidArgument);
}

// Several threads share one layer (and the backend's primitive cache) with different M; each
// result must be bit-identical to the serial one.
TEST_P(PackedLinearTest, ConcurrentForwardMatchesSerial) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Problem p = MakeProblem(GetParam(), DType::kBF16, 896, {896, 128, 128}, true, 7);
  auto packed = backend->PackLinear(p.Spec("test.concurrent"));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const PackedLinear& linear = **packed;
  const std::vector<int64_t> ms = {1, 3, 17, 64, 300, 2, 1, 40};
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<float>> serial;
  for (size_t i = 0; i < ms.size(); ++i) {
    inputs.push_back(RandomInput(ms[i] * p.k, static_cast<uint32_t>(100 + i)));
    serial.emplace_back(ms[i] * p.n);
    ASSERT_TRUE(RunLinear(linear, inputs[i].data(), ms[i], serial[i].data()).ok());
  }
  constexpr int kThreads = 4;
  constexpr int kRounds = 3;
  std::vector<std::vector<std::vector<float>>> results(kThreads);
  std::vector<int> errors(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        for (size_t j = 0; j < ms.size(); ++j) {
          const size_t i = (j + static_cast<size_t>(t) * 3) % ms.size();  // different M at once
          std::vector<float> y(ms[i] * p.n);
          if (!RunLinear(linear, inputs[i].data(), ms[i], y.data()).ok()) ++errors[t];
          if (y != serial[i]) ++errors[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], 0) << "thread " << t;
  ExpectMatchesReference(p, inputs[2], ms[2], serial[2].data());
}

INSTANTIATE_TEST_SUITE_P(ComputeDTypes, PackedLinearTest,
                         testing::Values(DType::kF32, DType::kBF16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(PackedLinearSpecTest, InvalidSpecsAreErrorsNamingTheLayer) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  std::vector<float> data(64, 1.0f);
  const auto* bytes = reinterpret_cast<const std::byte*>(data.data());
  const WeightView good{DType::kF32, 4, 8, bytes};
  auto expect_invalid = [&](LinearPackSpec spec, const char* what) {
    SCOPED_TRACE(what);
    spec.name = "bad.layer";
    auto result = backend->PackLinear(spec);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(result.status().message().find("bad.layer"), std::string::npos) << result.status();
  };
  expect_invalid(LinearPackSpec{}, "no blocks");
  expect_invalid({"", {good, WeightView{DType::kF32, 4, 7, bytes}}, {}, DType::kF32},
                 "cols differ");
  expect_invalid({"", {good, WeightView{DType::kBF16, 4, 8, bytes}}, {}, DType::kF32},
                 "dtypes differ");
  expect_invalid({"", {good}, std::vector<float>(3, 0.0f), DType::kF32}, "bias length");
  expect_invalid({"", {good, good}, std::vector<float>(4, 0.0f), DType::kF32},
                 "bias covers one block");
  expect_invalid({"", {good}, {}, DType::kF16}, "f16 compute");
  expect_invalid({"", {good}, {}, static_cast<DType>(9)}, "unknown compute dtype");
  expect_invalid({"", {WeightView{DType::kF32, 0, 8, bytes}}, {}, DType::kF32}, "zero rows");
  expect_invalid({"", {WeightView{DType::kF32, 4, 0, bytes}}, {}, DType::kF32}, "zero cols");
  expect_invalid({"", {WeightView{DType::kF32, 4, 8, nullptr}}, {}, DType::kF32}, "null data");
  expect_invalid({"", {WeightView{static_cast<DType>(7), 4, 8, bytes}}, {}, DType::kF32},
                 "unknown source dtype");
}

// The decode-critical shape must run on oneDNN's brgemm kernels. Seen on this machine (oneDNN
// 2.6.3, AVX-512 + AMX), with blocked weights BA16a64b2a (bf16) / BA16a64b (f32):
//   bf16, M = 1: "brg:avx512_core_bf16" (oneDNN's first choice is "brg:avx512_core_amx_bf16";
//                the backend takes the AVX-512 brgemm for M <= 4, where it is faster);
//   bf16, M >= 5: "brg:avx512_core_amx_bf16";   f32: "brg:avx512_core".
TEST(PackedLinearKernelTest, TypicalLlmShapeUsesBrgemm) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq")) {
    GTEST_SKIP() << "oneDNN's brgemm matmul needs AVX-512 (avx512_core)";
  }
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  std::vector<DType> dtypes = {DType::kF32};
  if (__builtin_cpu_supports("avx512bf16")) {
    dtypes.push_back(DType::kBF16);
  }
  for (DType compute : dtypes) {
    Problem p = MakeProblem(compute, DType::kBF16, 896, {1152}, false, 3);
    auto linear = backend->PackLinear(p.Spec("test.brgemm"));
    ASSERT_TRUE(linear.ok()) << linear.status();
    EXPECT_EQ((*linear)->kernel_name().rfind("brg", 0), 0u)
        << DTypeName(compute) << ": " << (*linear)->kernel_name();
    CheckForward(**linear, p, {1});
  }
}

// ---- The small-M kernel (decode and speculative verification rows) --------------------------

bool HasAmx() { return __builtin_cpu_supports("amx-bf16"); }

// One call on an explicit kernel (RunAndCheck); returns y.
std::vector<float> RunPath(const PackedLinear& linear, const Problem& p, int64_t m,
                           cpu::LinearPath path) {
  std::vector<float> y;
  RunAndCheck(
      p, m, static_cast<uint32_t>(m * 13 + 5),
      [&](const float* x, int64_t rows, float* out) {
        return cpu::RunLinear(linear, x, rows, out, path);
      },
      &y);
  return y;
}

// Ragged K and N (K padding inside the 16-value layout block, partial last panels), K on both
// sides of brgemm's K blocks (512, 1024), with and without bias, M = 1..8: the small-M kernel
// matches the double reference, and where the dispatcher found brgemm's K blocking (always on
// AVX-512 BF16 CPUs without AMX) it equals brgemm bit for bit.
TEST_P(PackedLinearTest, SmallMKernelMatchesTheReferenceAndBrgemmBitForBit) {
  if (!cpu::SmallMKernelSupported(GetParam())) {
    GTEST_SKIP() << "this CPU lacks the AVX-512 instructions of the small-M kernel for "
                 << DTypeName(GetParam());
  }
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},     {33, 17},   {100, 200},
                                                           {384, 640}, {520, 64},  {896, 130},
                                                           {256, 448}, {1100, 70}, {2100, 96}};
  uint32_t seed = 500;
  int identical = 0;
  for (const auto& [k, n] : shapes) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(testing::Message() << "K=" << k << " N=" << n << " bias=" << bias);
      Problem p = MakeProblem(GetParam(), DType::kBF16, k, {n}, bias, seed++);
      auto linear = backend->PackLinear(p.Spec("test.small_m"));
      ASSERT_TRUE(linear.ok()) << linear.status();
      ASSERT_TRUE(cpu::HasSmallMKernel(**linear)) << (*linear)->kernel_name();
      const bool bit_identical = cpu::SmallMKernelIsBitIdentical(**linear);
      identical += bit_identical;
      for (int64_t m = 1; m <= cpu::kSmallMMaxRows; ++m) {
        SCOPED_TRACE(testing::Message() << "M=" << m);
        const std::vector<float> small = RunPath(**linear, p, m, cpu::LinearPath::kSmallM);
        const std::vector<float> brgemm = RunPath(**linear, p, m, cpu::LinearPath::kBrgemm);
        ASSERT_FALSE(testing::Test::HasFatalFailure());
        if (bit_identical) {
          ASSERT_EQ(std::memcmp(small.data(), brgemm.data(), small.size() * sizeof(float)), 0);
        }
      }
    }
  }
  if (!HasAmx()) {
    EXPECT_EQ(identical, 2 * static_cast<int>(shapes.size()))
        << "without AMX, oneDNN's brgemm blocks K in a way the small-M kernel reproduces";
  }
}

// How many panels a thread reads side by side (measured when packing, linear_dispatch.h) changes
// no bit of the result, at one and two rows; other counts, and linears without the bf16 decode
// kernel, are refused.
TEST(PackedLinearKernelTest, DecodeStreamsChangeNoResult) {
  if (!cpu::SmallMKernelSupported(DType::kBF16)) {
    GTEST_SKIP() << "this CPU lacks the AVX-512 BF16 instructions of the small-M kernel";
  }
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Problem p = MakeProblem(DType::kBF16, DType::kBF16, 896, {1000}, true, 77);
  auto linear = backend->PackLinear(p.Spec("test.streams"));
  ASSERT_TRUE(linear.ok()) << linear.status();
  const int chosen = cpu::DecodeStreams(**linear);
  EXPECT_TRUE(chosen == 1 || chosen == 2 || chosen == 4) << chosen;
  for (const int64_t m : {1, 2}) {
    std::vector<float> first;
    for (const int streams : {4, 2, 1}) {
      SCOPED_TRACE(testing::Message() << "M=" << m << " streams=" << streams);
      ASSERT_TRUE(cpu::SetDecodeStreams(**linear, streams).ok());
      EXPECT_EQ(cpu::DecodeStreams(**linear), streams);
      const std::vector<float> y = RunPath(**linear, p, m, cpu::LinearPath::kSmallM);
      ASSERT_FALSE(testing::Test::HasFatalFailure());
      if (first.empty()) {
        first = y;
      } else {
        ASSERT_EQ(std::memcmp(y.data(), first.data(), y.size() * sizeof(float)), 0);
      }
    }
  }
  const absl::Status three = cpu::SetDecodeStreams(**linear, 3);
  EXPECT_EQ(three.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(three.message().find("test.streams"), std::string::npos) << three;

  Problem f32 = MakeProblem(DType::kF32, DType::kF32, 64, {64}, false, 78);
  auto plain = backend->PackLinear(f32.Spec("test.f32"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(cpu::DecodeStreams(**plain), 0);
  EXPECT_EQ(cpu::SetDecodeStreams(**plain, 1).code(), absl::StatusCode::kInvalidArgument);
}

// Whatever kernel each M picks, a row's result is the same bits alone or among other rows, so
// greedy output does not change with the batch or with speculative verification.
TEST_P(PackedLinearTest, ARowGivesTheSameBitsAloneAndInAnyBatch) {
  if (HasAmx()) {
    GTEST_SKIP() << "oneDNN's AMX brgemm (M ≥ 5) sums in another order than its AVX-512 one";
  }
  if (!cpu::SmallMKernelSupported(GetParam())) {
    GTEST_SKIP() << "without the small-M kernel's AVX-512 instructions oneDNN alone runs every M, "
                    "with no promise of the same order across M";
  }
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{384, 640}, {1100, 200}}) {
    SCOPED_TRACE(testing::Message() << "K=" << k << " N=" << n);
    Problem p = MakeProblem(GetParam(), DType::kBF16, k, {n}, true, 77);
    auto linear = backend->PackLinear(p.Spec("test.invariance"));
    ASSERT_TRUE(linear.ok()) << linear.status();
    const std::vector<float> x = RandomInput(24 * k, 3);
    std::vector<float> alone(24 * n);
    for (int64_t r = 0; r < 24; ++r) {
      ASSERT_TRUE(RunLinear(**linear, x.data() + r * k, 1, alone.data() + r * n).ok());
    }
    for (int64_t m = 2; m <= 24; ++m) {
      std::vector<float> batch(m * n);
      ASSERT_TRUE(RunLinear(**linear, x.data(), m, batch.data()).ok());
      ASSERT_EQ(std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float)), 0)
          << "M=" << m;
    }
  }
}

// Inside a step team a linear runs the small-M kernel at every M it takes (oneDNN's own parallel
// region would be nested there, so serial), with the same bits, and reports the rows at which
// brgemm was chosen, so that the CPU context runs such steps without a team.
TEST_P(PackedLinearTest, InsideAStepTeamRowsChosenForBrgemmAreReported) {
  if (HasAmx() || !cpu::SmallMKernelSupported(GetParam())) {
    GTEST_SKIP() << "needs the small-M kernel, bit-identical to brgemm (AVX-512 without AMX)";
  }
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Problem p = MakeProblem(GetParam(), DType::kBF16, 896, {1152}, true, 41);
  auto linear = backend->PackLinear(p.Spec("test.team"));
  ASSERT_TRUE(linear.ok()) << linear.status();
  ASSERT_TRUE(cpu::SmallMKernelIsBitIdentical(**linear));
  for (int64_t m = 1; m <= cpu::kSmallMMaxRows; ++m) {
    SCOPED_TRACE(testing::Message() << "M=" << m);
    const std::vector<float> x = RandomInput(m * p.k, static_cast<uint32_t>(m));
    std::vector<float> outside(m * p.n);
    std::vector<float> inside(m * p.n);
    ASSERT_TRUE(RunLinear(**linear, x.data(), m, outside.data()).ok());
    cpu::StepTeam::Report report;
    absl::Status status = cpu::StepTeam::Hold(
        2, [&] { return RunLinear(**linear, x.data(), m, inside.data()); }, &report);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(std::memcmp(inside.data(), outside.data(), inside.size() * sizeof(float)), 0);
    EXPECT_FALSE(report.ran_serial_work);
    EXPECT_EQ(report.faster_without_team, !cpu::ChoosesSmallM(**linear, m));
  }
}

TEST(PackedLinearKernelTest, SmallMKernelRefusesMoreRowsThanItTakes) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  Problem p = MakeProblem(DType::kF32, DType::kF32, 64, {64}, false, 5);
  auto linear = backend->PackLinear(p.Spec("test.rows"));
  ASSERT_TRUE(linear.ok()) << linear.status();
  const int64_t m = cpu::kSmallMMaxRows + 1;
  std::vector<float> x(m * 64, 1.0f);
  std::vector<float> y(m * 64);
  const absl::Status status =
      cpu::RunLinear(**linear, x.data(), m, y.data(), cpu::LinearPath::kSmallM);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("test.rows"), std::string::npos) << status;
  EXPECT_NE(status.message().find(absl::StrCat("M=", m)), std::string::npos) << status;
}

}  // namespace
}  // namespace kiln
