// kiln's forward pass against the independent libtorch reference (tests/reference/), for every
// architecture variant kiln supports, with fp32 and bf16 weights.
//
// Tolerances (max |Δlogit| relative to max(1, max |reference logit|)):
//   fp32 weights, fp32 compute: 1e-4 (kiln and the reference differ only in summation order).
//   bf16 weights, bf16 compute: 3e-2. kiln rounds each GEMM's input activations to bf16 (as
//     oneDNN's bf16 kernels need); the reference keeps fp32 activations on the same bf16 weights,
//     so ~2⁻⁹ relative error per GEMM input accumulates over the layers.
#include <torch/types.h>

#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "models/lifecycle.h"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"
#include "tests/reference/torch_reference.h"

namespace kiln {
namespace {

using testing_util::CpuBackend;
using testing_util::ScratchDir;

struct Variant {
  std::string name;
  std::function<void(ModelConfig&)> customize;
};

ModelConfig BaseConfig() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 64, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
  c.vocab_size = 300, c.max_position_embeddings = 256, c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  return c;
}

std::vector<Variant> Variants() {
  return {
      {"llama_gqa2_untied", [](ModelConfig&) {}},
      {"llama_mha_tied",
       [](ModelConfig& c) {
         c.num_key_value_heads = 4;
         c.tie_word_embeddings = true;
       }},
      {"llama3_rope_scaling",
       [](ModelConfig& c) {
         c.rope_theta = 500000.0;
         c.rope_scaling = {.llama3 = true,
                           .factor = 8.0,
                           .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0,
                           .original_max_position_embeddings = 64.0};
       }},
      {"llama_attention_bias",
       [](ModelConfig& c) {
         c.qkv_bias = true;
         c.o_proj_bias = true;
       }},
      {"mistral_gqa4_head_dim_override",
       [](ModelConfig& c) {
         c.architecture = Architecture::kMistral;
         c.architecture_name = "MistralForCausalLM";
         c.num_attention_heads = 8, c.num_key_value_heads = 2, c.head_dim = 32;
       }},
      {"qwen2_biases_gqa7_tied",
       [](ModelConfig& c) {
         c.architecture = Architecture::kQwen2;
         c.architecture_name = "Qwen2ForCausalLM";
         c.hidden_size = 112, c.num_attention_heads = 7, c.num_key_value_heads = 1;
         c.head_dim = 16, c.qkv_bias = true, c.tie_word_embeddings = true;
         c.rope_theta = 1000000.0;
       }},
      {"qwen3_qk_norm",
       [](ModelConfig& c) {
         c.architecture = Architecture::kQwen3;
         c.architecture_name = "Qwen3ForCausalLM";
         c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 32;
         c.qk_norm = true, c.tie_word_embeddings = true, c.rms_norm_eps = 1e-6;
       }},
  };
}

struct ForwardCase {
  Variant variant;
  DType dtype;
};

std::string CaseName(const ::testing::TestParamInfo<ForwardCase>& info) {
  return info.param.variant.name + (info.param.dtype == DType::kBF16 ? "_bf16" : "_fp32");
}

void PrintTo(const ForwardCase& c, std::ostream* os) {
  *os << c.variant.name << " " << DTypeName(c.dtype);
}

// kiln against itself when only the chunking of the same tokens changes. fp32: summation order
// only. bf16: a last-bit difference in an fp32 activation can flip its rounding to bf16 before
// the next GEMM (2⁻⁸ relative), so agreement is to a few bf16 ulps of the logits.
double SelfConsistencyTolerance(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-5; }

std::vector<ForwardCase> AllCases() {
  std::vector<ForwardCase> cases;
  for (const Variant& variant : Variants()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) cases.push_back({variant, dtype});
  }
  return cases;
}

// Runs `model` over the chunks of one sequence (sizes `splits`) and returns the logits of every
// position, [sum(splits), vocab].
torch::Tensor RunInChunks(const PreparedModel& model, const std::vector<int32_t>& ids,
                          const std::vector<size_t>& splits) {
  absl::StatusOr<KvCache> cache = model.NewCache(static_cast<int64_t>(ids.size()));
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits;
  size_t offset = 0;
  for (size_t n : splits) {
    SequenceChunk chunk{&*cache, std::span<const int32_t>(ids).subspan(offset, n), true};
    absl::Status status = model.Forward({&chunk, 1}, &logits);
    EXPECT_TRUE(status.ok()) << status;
    offset += n;
  }
  return torch::from_blob(logits.data(), {static_cast<int64_t>(offset), model.config().vocab_size},
                          torch::kFloat32)
      .clone();
}

class ForwardTest : public ::testing::TestWithParam<ForwardCase> {
 protected:
  void SetUp() override {
    config_ = BaseConfig();
    GetParam().variant.customize(config_);
    weights_ = RandomHfWeights(config_, /*seed=*/1234, GetParam().dtype);
    // A small shard limit makes every checkpoint sharded, so the index path is covered too.
    ASSERT_TRUE(WriteHfCheckpoint(dir_.path(), config_, weights_, 64 * 1024).ok());
    absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir_.path(), CpuBackend());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    for (int i = 0; i < 11; ++i)
      ids_.push_back((i * 37 + 5) % static_cast<int>(config_.vocab_size));
  }

  double Tolerance() const { return GetParam().dtype == DType::kBF16 ? 3e-2 : 1e-4; }

  ScratchDir dir_;
  ModelConfig config_;
  std::map<std::string, torch::Tensor> weights_;
  std::unique_ptr<PreparedModel> model_;
  std::vector<int32_t> ids_;
};

TEST_P(ForwardTest, MatchesReference) {
  EXPECT_EQ(model_->compute_dtype(), GetParam().dtype);
  const std::vector<int64_t> ids64(ids_.begin(), ids_.end());
  torch::Tensor expected = ReferenceLogits(config_, weights_, ids64);
  torch::Tensor actual = RunInChunks(*model_, ids_, {ids_.size()});
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  const double diff = MaxAbsDiff(actual, expected);
  EXPECT_LE(diff, Tolerance() * scale) << "max |Δ| " << diff << " at logit scale " << scale;
  // Greedy choices agree wherever the reference is not near a tie.
  torch::Tensor top2 = std::get<0>(expected.topk(2, 1));
  torch::Tensor margin = top2.select(1, 0) - top2.select(1, 1);
  torch::Tensor same = actual.argmax(1) == expected.argmax(1);
  EXPECT_TRUE((same | (margin < 2 * Tolerance() * scale)).all().item<bool>());
}

TEST_P(ForwardTest, PrefillThenDecodeEqualsOnePrefill) {
  torch::Tensor whole = RunInChunks(*model_, ids_, {ids_.size()});
  torch::Tensor split = RunInChunks(*model_, ids_, {6, 1, 1, 3});
  torch::Tensor decode = RunInChunks(*model_, ids_, std::vector<size_t>(ids_.size(), 1));
  const double tolerance = SelfConsistencyTolerance(GetParam().dtype);
  const double scale = std::max(1.0, whole.abs().max().item<double>());
  EXPECT_LE(MaxAbsDiff(split, whole), tolerance * scale);
  EXPECT_LE(MaxAbsDiff(decode, whole), tolerance * scale);
}

TEST_P(ForwardTest, BatchedSequencesMatchSeparateRuns) {
  const std::vector<int32_t> a(ids_.begin(), ids_.begin() + 7);
  const std::vector<int32_t> b(ids_.rbegin(), ids_.rbegin() + 4);
  torch::Tensor alone_a = RunInChunks(*model_, a, {a.size()});
  torch::Tensor alone_b = RunInChunks(*model_, b, {b.size()});

  absl::StatusOr<KvCache> cache_a = model_->NewCache(16);
  absl::StatusOr<KvCache> cache_b = model_->NewCache(16);
  ASSERT_TRUE(cache_a.ok() && cache_b.ok());
  const SequenceChunk chunks[] = {{&*cache_a, a, true}, {&*cache_b, b, false}};
  std::vector<float> logits;
  ASSERT_TRUE(model_->Forward(chunks, &logits).ok());
  const int64_t vocab = config_.vocab_size;
  ASSERT_EQ(logits.size(), static_cast<size_t>((a.size() + 1) * vocab));
  torch::Tensor batched =
      torch::from_blob(logits.data(), {static_cast<int64_t>(a.size()) + 1, vocab});
  const double tolerance = SelfConsistencyTolerance(GetParam().dtype) *
                           std::max(1.0, alone_a.abs().max().item<double>());
  EXPECT_LE(MaxAbsDiff(batched.slice(0, 0, static_cast<int64_t>(a.size())), alone_a), tolerance);
  EXPECT_LE(MaxAbsDiff(batched.slice(0, static_cast<int64_t>(a.size())), alone_b.slice(0, -1)),
            tolerance);
  EXPECT_EQ(cache_a->length(), 7);
  EXPECT_EQ(cache_b->length(), 4);
}

INSTANTIATE_TEST_SUITE_P(Architectures, ForwardTest, ::testing::ValuesIn(AllCases()), CaseName);

// The fixture written by the Tensorizer authors' tooling: expected logits for [1, 2, 3, 4, 5]
// computed with plain torch ops (tests/data/README.md).
TEST(FixtureTest, LlamaTinyFp32MatchesExpectedLogits) {
  const std::filesystem::path dir = std::filesystem::path(KILN_TEST_DATA_DIR) / "llama_tiny";
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir, CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  torch::Tensor actual = RunInChunks(**model, ids, {ids.size()});
  absl::StatusOr<torch::Tensor> expected = LoadF32File(dir / "expected_logits_fp32.f32", 5, 256);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_LE(MaxAbsDiff(actual, *expected), 1e-4);
  const std::vector<int64_t> argmax = {12, 131, 168, 193, 4};
  for (size_t i = 0; i < argmax.size(); ++i) {
    EXPECT_EQ(actual[static_cast<int64_t>(i)].argmax().item<int64_t>(), argmax[i]);
  }
  // Decoding token by token gives the same logits.
  EXPECT_LE(MaxAbsDiff(RunInChunks(**model, ids, {2, 1, 1, 1}), *expected), 1e-4);
}

}  // namespace
}  // namespace kiln
