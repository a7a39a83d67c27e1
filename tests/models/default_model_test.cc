// The trained default model (checkpoints/kiln-brown, made by tools/default_model): kiln's own
// perplexity on held-out Brown Corpus text equals the training script's evaluation of the same
// text (tests/data/kiln-brown/heldout_reference.json: the first windows of heldout.txt, evaluated
// by tools/default_model/evaluate.py from the committed weights), in fp32 and in bf16; its MTP head
// is restored with nothing left unplaced; and a native tensorized copy gives the same logits.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "eval/perplexity.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quantized_linear.h"
#include "loaders/load_model.h"
#include "loaders/tensorizer_checkpoint.h"
#include "models/lifecycle.h"
#include "nlohmann/json.hpp"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing_util::CpuBackend;

const fs::path kModel = fs::path(KILN_DEFAULT_MODEL_DIR);
const fs::path kReference = fs::path(KILN_TEST_DATA_DIR) / "kiln-brown";

// kiln's perplexity must be within this fraction of the training script's (the bound).
constexpr double kRelativeTolerance = 0.005;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Reference {
  std::vector<int32_t> ids;
  int64_t context = 0;
  int64_t windows = 0;
  double perplexity = 0;
  double mtp_perplexity = 0;
};

Reference ReadReference() {
  const nlohmann::json json =
      nlohmann::json::parse(ReadText(kReference / "heldout_reference.json"));
  Reference reference;
  reference.ids = json.at("ids").get<std::vector<int32_t>>();
  reference.context = json.at("context").get<int64_t>();
  reference.windows = json.at("windows").get<int64_t>();
  reference.perplexity = json.at("perplexity").get<double>();
  reference.mtp_perplexity = json.at("mtp_perplexity").get<double>();
  return reference;
}

absl::StatusOr<std::unique_ptr<PreparedModel>> Load(const fs::path& path,
                                                    std::optional<DType> dtype,
                                                    Quantization quantize = Quantization::kNone) {
  LoadOptions options;
  options.compute_dtype = dtype;
  options.quantize = quantize;
  return LoadModel(path, CpuBackend(), options);
}

TEST(DefaultModelTest, LoadsWithItsMtpHeadRestoredAndNothingUnplaced) {
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(kModel, std::nullopt);
  ASSERT_TRUE(model.ok()) << model.status();
  const LoadReport& report = (*model)->report();
  EXPECT_EQ((*model)->num_mtp_heads(), 1);
  EXPECT_EQ((*model)->config().num_mtp_layers, 1);
  EXPECT_EQ((*model)->compute_dtype(), DType::kBF16);
  EXPECT_TRUE(report.missing.empty());
  EXPECT_TRUE(report.unplaced.empty()) << report.Summary();
  EXPECT_TRUE(report.warnings.empty()) << report.Summary();
  // Every carried tensor (the head's block, norms and projection) went to the head.
  EXPECT_FALSE(report.restored.empty());
  EXPECT_EQ(report.restored.size(), report.carried.size()) << report.Summary();
}

TEST(DefaultModelTest, TokenizerEncodesTheHeldOutTextAsTheTrainingScriptDid) {
  const Reference reference = ReadReference();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(kModel);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::vector<int32_t>> ids =
      EncodeDocuments(**tokenizer, ReadText(kReference / "heldout.txt"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_GE(ids->size(), reference.ids.size());
  ids->resize(reference.ids.size());
  EXPECT_EQ(*ids, reference.ids);
}

// kiln's perplexity of `model` on the reference windows of the held-out text.
absl::StatusOr<PerplexityResult> ReferenceWindowsPerplexity(const PreparedModel& model,
                                                            const Reference& reference) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromDirectory(kModel));
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        EncodeDocuments(*tokenizer, ReadText(kReference / "heldout.txt")));
  PerplexityOptions options;
  options.context = reference.context;
  options.max_windows = reference.windows;
  return Perplexity(model, ids, options);
}

class DefaultModelPerplexityTest : public ::testing::TestWithParam<DType> {};

TEST_P(DefaultModelPerplexityTest, EqualsTheTrainingScriptsEvaluation) {
  const Reference reference = ReadReference();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(kModel, GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->compute_dtype(), GetParam());
  absl::StatusOr<PerplexityResult> result = ReferenceWindowsPerplexity(**model, reference);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->windows, reference.windows);
  EXPECT_EQ(result->scored, reference.windows * reference.context);
  EXPECT_NEAR(result->perplexity / reference.perplexity, 1.0, kRelativeTolerance)
      << "kiln " << result->perplexity << ", training script " << reference.perplexity;
  // The MTP head as the draft step runs it, against the script's t+2 evaluation.
  EXPECT_EQ(result->mtp_scored, reference.windows * (reference.context - 1));
  EXPECT_NEAR(result->mtp_perplexity / reference.mtp_perplexity, 1.0, kRelativeTolerance)
      << "kiln " << result->mtp_perplexity << ", training script " << reference.mtp_perplexity;
  // A trained model and head: far below the vocabulary's uniform perplexity.
  EXPECT_LT(result->perplexity, 0.1 * static_cast<double>((*model)->config().vocab_size));
  EXPECT_LT(result->mtp_perplexity, 0.1 * static_cast<double>((*model)->config().vocab_size));
}

INSTANTIATE_TEST_SUITE_P(ComputeDTypes, DefaultModelPerplexityTest,
                         ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// Quantized weights cost little perplexity on the trained model: the goals, int8 within
// 1 % of the unquantized model and int4 within 5 %, on the reference windows.
class QuantizedDefaultModelTest : public ::testing::TestWithParam<Quantization> {};

TEST_P(QuantizedDefaultModelTest, PerplexityStaysNearTheUnquantizedModel) {
  if (!cpu::QuantizedKernelSupported()) {
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI: linears would not be quantized here";
  }
  const Reference reference = ReadReference();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(kModel, std::nullopt, GetParam());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->quantization(), GetParam());
  EXPECT_EQ((*model)->quantized_linears(), (*model)->linear_count()) << "every linear, MTP too";
  absl::StatusOr<PerplexityResult> result = ReferenceWindowsPerplexity(**model, reference);
  ASSERT_TRUE(result.ok()) << result.status();
  const double bound = GetParam() == Quantization::kInt8 ? 0.01 : 0.05;
  EXPECT_LT(result->perplexity / reference.perplexity - 1.0, bound)
      << QuantizationName(GetParam()) << " " << result->perplexity << ", unquantized "
      << reference.perplexity;
  EXPECT_LT(result->mtp_perplexity / reference.mtp_perplexity - 1.0, 2 * bound)
      << "MTP head " << result->mtp_perplexity << ", unquantized " << reference.mtp_perplexity;
}

INSTANTIATE_TEST_SUITE_P(Kinds, QuantizedDefaultModelTest,
                         ::testing::Values(Quantization::kInt8, Quantization::kInt4),
                         [](const ::testing::TestParamInfo<Quantization>& info) {
                           return std::string(QuantizationName(info.param));
                         });

TEST(DefaultModelTest, PerplexityRefusesTooShortAStream) {
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(kModel, std::nullopt);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids(100, 7);
  absl::StatusOr<PerplexityResult> result = Perplexity(**model, ids, {.context = 512});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(result.status().message(), "at least 514 tokens");
  result = Perplexity(**model, ids, {.context = 1 << 20});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(result.status().message(), "exceeds the model's limit");
}

// Greedy tokens and all logits of a short held-out prompt.
std::vector<float> PromptLogits(const PreparedModel& model, const std::vector<int32_t>& ids) {
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 48);
  absl::StatusOr<KvCache> cache = model.NewCache(static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(cache.ok()) << cache.status();
  std::vector<float> logits;
  SequenceChunk chunk{&*cache, prompt, /*all_logits=*/true};
  EXPECT_TRUE(model.Forward({&chunk, 1}, &logits).ok());
  return logits;
}

TEST(DefaultModelTest, NativeTensorizedFileGivesTheSameLogits) {
  testing_util::ScratchDir scratch;
  const fs::path file = scratch / "kiln-brown.tensors";
  {
    absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(kModel);
    ASSERT_TRUE(opened.ok()) << opened.status();
    NativeTensorizeOptions options;
    options.embedded_files = opened->side_files;
    absl::StatusOr<NativeTensorizeResult> written =
        WriteNativeTensorized(file, opened->source, opened->config, options);
    ASSERT_TRUE(written.ok()) << written.status();
  }
  absl::StatusOr<std::unique_ptr<PreparedModel>> safetensors = Load(kModel, std::nullopt);
  ASSERT_TRUE(safetensors.ok()) << safetensors.status();
  absl::StatusOr<std::unique_ptr<PreparedModel>> tensorized = Load(file, std::nullopt);
  ASSERT_TRUE(tensorized.ok()) << tensorized.status();
  EXPECT_EQ((*tensorized)->provenance().layout, WeightLayout::kEngine);
  EXPECT_EQ((*tensorized)->num_mtp_heads(), 1);
  EXPECT_TRUE((*tensorized)->report().unplaced.empty()) << (*tensorized)->report().Summary();
  EXPECT_FALSE((*tensorized)->report().restored.empty());
  const Reference reference = ReadReference();
  EXPECT_EQ(PromptLogits(**tensorized, reference.ids), PromptLogits(**safetensors, reference.ids));
  // The embedded tokenizer travels with the file.
  absl::StatusOr<OpenedCheckpoint> reopened = OpenCheckpoint(file);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(reopened->side_files.count("tokenizer.json"), 1u);
}

}  // namespace
}  // namespace kiln
