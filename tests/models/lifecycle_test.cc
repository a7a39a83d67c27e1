// The load lifecycle: Bind accounting, PostLoad exactly once, no model without PostLoad.
#include "models/lifecycle.h"

#include <functional>
#include <type_traits>

#include "clients/synth.h"
#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "loaders/safetensors_writer.h"
#include "models/bind.h"
#include "models/manifest.h"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"

namespace kiln {
namespace {

using testing_util::CpuBackend;
using testing_util::ScratchDir;

// Compile-time half of invariant 1: only PreparedModel has Forward, and nothing outside the
// lifecycle can construct or copy one.
template <typename T>
concept HasForward = requires(const T& model, std::span<const SequenceChunk> chunks,
                              std::vector<float>* logits) {
  model.Forward(chunks, logits);
};
static_assert(HasForward<PreparedModel>);
static_assert(!HasForward<BoundModel>);
static_assert(!HasForward<WeightSource>);
static_assert(!std::is_default_constructible_v<PreparedModel>);
static_assert(!std::is_copy_constructible_v<PreparedModel>);
static_assert(!std::is_move_constructible_v<PreparedModel>);
static_assert(!std::is_copy_constructible_v<WeightSource>);

ModelConfig TinyConfig() {
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  EXPECT_TRUE(config.ok());
  config->num_hidden_layers = 2;
  config->vocab_size = 512;
  return *config;
}

// Writes a checkpoint of `config` with constant weights; `edit` may drop, add or reshape
// tensors first.
void WriteCheckpoint(const std::filesystem::path& dir, const ModelConfig& config,
                     const std::function<void(std::vector<TensorToWrite>&)>& edit = {}) {
  static std::vector<std::byte> zeros(64 << 20);
  std::vector<TensorToWrite> tensors;
  for (const ParamSpec& spec : BuildParamManifest(config)) {
    if (!spec.required) continue;
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    tensors.push_back({spec.name, DType::kF32, spec.shape,
                       std::span<const std::byte>(zeros.data(), static_cast<size_t>(n) * 4)});
  }
  if (edit) edit(tensors);
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir, tensors, uint64_t{1} << 30).ok());
  std::ofstream(dir / "config.json") << ModelConfigToJson(config);
}

TEST(LifecycleTest, EveryLoadRunsPostLoadExactlyOnce) {
  ScratchDir dir;
  const ModelConfig config = TinyConfig();
  SynthOptions options;
  options.dtype = DType::kF32;
  ASSERT_TRUE(WriteSynthCheckpoint(dir.path(), config, options).ok());
  auto backend = CpuBackend();
  for (int i = 0; i < 2; ++i) {
    const uint64_t before = PostLoadRunCount();
    absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), backend);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(PostLoadRunCount(), before + 1);
    // And the model it returned runs.
    absl::StatusOr<KvCache> cache = (*model)->NewCache(8);
    ASSERT_TRUE(cache.ok());
    const int32_t tokens[] = {1, 2, 3};
    SequenceChunk chunk{&*cache, tokens, false};
    std::vector<float> logits;
    ASSERT_TRUE((*model)->Forward({&chunk, 1}, &logits).ok());
    EXPECT_EQ(logits.size(), static_cast<size_t>(config.vocab_size));
  }
}

TEST(LifecycleTest, MissingTensorsFailTheLoadAndAreNamed) {
  ScratchDir dir;
  const ModelConfig config = TinyConfig();
  WriteCheckpoint(dir.path(), config, [](std::vector<TensorToWrite>& tensors) {
    std::erase_if(tensors, [](const TensorToWrite& t) {
      return t.name == "model.layers.1.mlp.up_proj.weight" || t.name == "model.norm.weight";
    });
  });
  const uint64_t before = PostLoadRunCount();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  const std::string message(model.status().message());
  EXPECT_NE(message.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("model.norm.weight"), std::string::npos) << message;
  EXPECT_EQ(PostLoadRunCount(), before) << "PostLoad must not run for a model that failed Bind";
}

TEST(LifecycleTest, ShapeMismatchNamesTensorAndShapes) {
  ScratchDir dir;
  const ModelConfig config = TinyConfig();
  WriteCheckpoint(dir.path(), config, [](std::vector<TensorToWrite>& tensors) {
    for (TensorToWrite& t : tensors) {
      if (t.name == "model.layers.0.self_attn.k_proj.weight") {
        t.shape = {t.shape[1], t.shape[0]};
      }
    }
  });
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_FALSE(model.ok());
  const std::string message(model.status().message());
  EXPECT_NE(message.find("model.layers.0.self_attn.k_proj.weight has shape [256, 64]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("expects [64, 256]"), std::string::npos) << message;
}

TEST(LifecycleTest, UnexpectedTensorsAreCarriedAndReported) {
  ScratchDir dir;
  const ModelConfig config = TinyConfig();
  static const float extra[6] = {1, 2, 3, 4, 5, 6};
  WriteCheckpoint(dir.path(), config, [](std::vector<TensorToWrite>& tensors) {
    tensors.push_back({"model.layers.7.mystery.weight",
                       DType::kF32,
                       {2, 3},
                       std::as_bytes(std::span<const float>(extra))});
  });
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  const LoadReport& report = (*model)->report();
  ASSERT_EQ(report.carried.size(), 1u);
  EXPECT_EQ(report.carried[0].name, "model.layers.7.mystery.weight");
  EXPECT_EQ(report.carried[0].bytes, 24u);
  ASSERT_EQ(report.unplaced.size(), 1u);
  EXPECT_EQ(report.unplaced[0].name, "model.layers.7.mystery.weight");
  EXPECT_EQ(report.placed.size(), BuildParamManifest(config).size());
  EXPECT_TRUE(report.missing.empty());
  EXPECT_NE(report.Summary().find("unplaced model.layers.7.mystery.weight (24 bytes"),
            std::string::npos);
}

TEST(LifecycleTest, BadInputLeavesOtherModelsWorking) {
  ScratchDir good_dir, bad_dir;
  const ModelConfig config = TinyConfig();
  ASSERT_TRUE(WriteSynthCheckpoint(good_dir.path(), config, {}).ok());
  auto backend = CpuBackend();
  absl::StatusOr<std::unique_ptr<PreparedModel>> good = LoadModel(good_dir.path(), backend);
  ASSERT_TRUE(good.ok()) << good.status();

  std::ofstream(bad_dir / "config.json") << R"({"architectures": ["BertModel"]})";
  std::ofstream(bad_dir / "model.safetensors") << "garbage";
  absl::StatusOr<std::unique_ptr<PreparedModel>> bad = LoadModel(bad_dir.path(), backend);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("BertModel"), std::string::npos);
  EXPECT_FALSE(LoadModel(good_dir / "nonexistent", backend).ok());

  absl::StatusOr<KvCache> cache = (*good)->NewCache(4);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  const int32_t out_of_vocab[] = {1, 9999};
  SequenceChunk chunk{&*cache, out_of_vocab, false};
  absl::Status status = (*good)->Forward({&chunk, 1}, &logits);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("9999"), std::string::npos);
  EXPECT_EQ(cache->length(), 0);

  const int32_t too_long[] = {1, 2, 3, 4, 5};
  chunk.tokens = too_long;
  EXPECT_EQ((*good)->Forward({&chunk, 1}, &logits).code(), absl::StatusCode::kOutOfRange);

  const int32_t fine[] = {1, 2};
  chunk.tokens = fine;
  ASSERT_TRUE((*good)->Forward({&chunk, 1}, &logits).ok());
  EXPECT_EQ(cache->length(), 2);
}

}  // namespace
}  // namespace kiln
