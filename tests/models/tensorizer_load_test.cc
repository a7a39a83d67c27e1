// Tensorizer files through the one lifecycle (design.md §1): raw/Hugging Face, vLLM-tensorized
// and native tensorized files give the fixture's expected logits, the same logits as
// safetensors, and run PostLoad exactly once each.
//
// Tolerances (max |Δlogit|; the fixture logits are O(1), max |logit| ≈ 4):
//   fp32 and fp16 weights, fp32 compute: 1e-4 (summation order only).
//   bf16 weights with fp32 compute: 1e-4 against expected_logits_bf16_weights (same weights).
//   The same weights through two loaders: bit-identical (the packer sees the same bytes).
#include <algorithm>
#include <cstring>
#include <fstream>

#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "loaders/safetensors_writer.h"
#include "loaders/tensorizer_checkpoint.h"
#include "loaders/tensorizer_reader.h"
#include "models/lifecycle.h"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing_util::CpuBackend;
using testing_util::ReadBytes;
using testing_util::ScratchDir;

const fs::path kData = fs::path(KILN_TEST_DATA_DIR);
const fs::path kTensorizer = kData / "tensorizer";
const fs::path kLlamaTiny = kData / "llama_tiny";
constexpr int64_t kVocab = 256;

// Logits of every position of [1, 2, 3, 4, 5], row-major [5, vocab].
std::vector<float> FixtureLogits(const PreparedModel& model) {
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  absl::StatusOr<KvCache> cache = model.NewCache(8);
  EXPECT_TRUE(cache.ok()) << cache.status();
  SequenceChunk chunk{&*cache, ids, /*all_logits=*/true};
  std::vector<float> logits;
  absl::Status status = model.Forward({&chunk, 1}, &logits);
  EXPECT_TRUE(status.ok()) << status;
  return logits;
}

std::vector<float> ExpectedLogits(const std::string& file) {
  const std::string bytes = ReadBytes(kLlamaTiny / file);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(5 * kVocab * 4)) << file;
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), values.size() * 4);
  return values;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = a.size() == b.size() ? 0.0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return worst;
}

LoadOptions FixtureOptions() {
  LoadOptions options;
  options.tensorizer.config_path = kLlamaTiny / "config.json";
  return options;
}

absl::StatusOr<std::unique_ptr<PreparedModel>> Load(const fs::path& path, LoadOptions options) {
  return LoadModel(path, CpuBackend(), options);
}

std::string KeyFromHex(absl::string_view hex) {
  std::string key;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    key.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return key;
}

struct FixtureCase {
  std::string file;
  std::string expected;
};

class TensorizerFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(TensorizerFixtureTest, GivesExpectedLogits) {
  LoadOptions options = FixtureOptions();
  options.compute_dtype = DType::kF32;  // the expected logits are fp32 math on these weights
  const uint64_t runs_before = PostLoadRunCount();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      Load(kTensorizer / GetParam().file, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(PostLoadRunCount(), runs_before + 1);
  EXPECT_EQ((*model)->provenance().format, "tensorizer");
  EXPECT_EQ((*model)->provenance().hash_check, "all");
  EXPECT_LE(MaxAbsDiff(FixtureLogits(**model), ExpectedLogits(GetParam().expected)), 1e-4);
  EXPECT_TRUE((*model)->report().unplaced.empty()) << (*model)->report().Summary();
}

INSTANTIATE_TEST_SUITE_P(
    Files, TensorizerFixtureTest,
    ::testing::Values(FixtureCase{"llama_tiny_hf_fp32.tensors", "expected_logits_fp32.f32"},
                      FixtureCase{"llama_tiny_hf_fp16.tensors", "expected_logits_fp16_weights.f32"},
                      FixtureCase{"llama_tiny_hf_bf16.tensors", "expected_logits_bf16_weights.f32"},
                      FixtureCase{"llama_tiny_vllm_bf16.tensors",
                                  "expected_logits_bf16_weights.f32"}),
    [](const ::testing::TestParamInfo<FixtureCase>& info) {
      std::string name = info.param.file.substr(0, info.param.file.find('.'));
      return name;
    });

TEST(TensorizerLoadTest, VllmFileEqualsHfFileAndReportsWhatItDropped) {
  LoadOptions options = FixtureOptions();
  absl::StatusOr<std::unique_ptr<PreparedModel>> hf =
      Load(kTensorizer / "llama_tiny_hf_bf16.tensors", options);
  absl::StatusOr<std::unique_ptr<PreparedModel>> vllm =
      Load(kTensorizer / "llama_tiny_vllm_bf16.tensors", options);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(vllm.ok()) << vllm.status();
  EXPECT_EQ(FixtureLogits(**hf), FixtureLogits(**vllm));
  EXPECT_EQ((*vllm)->provenance().layout, WeightLayout::kEngine);
  EXPECT_EQ((*hf)->provenance().layout, WeightLayout::kHuggingFace);
  std::vector<std::string> ignored;
  for (const TensorSummary& t : (*vllm)->report().ignored) ignored.push_back(t.name);
  std::sort(ignored.begin(), ignored.end());
  EXPECT_EQ(ignored,
            (std::vector<std::string>{".vllm_tensorized_marker",
                                      "model.layers.0.self_attn.rotary_emb.cos_sin_cache"}));
  EXPECT_TRUE((*vllm)->report().unplaced.empty());
  EXPECT_EQ((*vllm)->report().placed.size(), 15u);  // embed, 2 × 6 fused/plain, norm, lm_head
}

TEST(TensorizerLoadTest, EncryptedFileWithPassphraseOrKey) {
  const fs::path file = kTensorizer / "llama_tiny_hf_fp16_encrypted_passphrase.tensors";
  const std::vector<float> expected = ExpectedLogits("expected_logits_fp16_weights.f32");
  {
    LoadOptions options = FixtureOptions();
    options.tensorizer.encryption_passphrase = "tensorizer-fixture-passphrase";
    absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(file, options);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE((*model)->provenance().encrypted);
    EXPECT_EQ((*model)->provenance().load_mode, LoadMode::kRead);
    EXPECT_LE(MaxAbsDiff(FixtureLogits(**model), expected), 1e-4);
  }
  {
    LoadOptions options = FixtureOptions();
    options.tensorizer.encryption_key =
        KeyFromHex("63693b1dfaac2334aab8f73608e284ee2450d49f6c7dd34ad8cd8aa5ea6e81e0");
    absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(file, options);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_LE(MaxAbsDiff(FixtureLogits(**model), expected), 1e-4);
  }
}

TEST(TensorizerLoadTest, EncryptedFileWithoutOrWithWrongKeyIsAClearError) {
  const fs::path file = kTensorizer / "llama_tiny_hf_fp16_encrypted_passphrase.tensors";
  const uint64_t runs_before = PostLoadRunCount();
  absl::StatusOr<std::unique_ptr<PreparedModel>> missing = Load(file, FixtureOptions());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(missing.status().message(), "is encrypted");

  LoadOptions wrong = FixtureOptions();
  wrong.tensorizer.encryption_passphrase = "not the passphrase";
  absl::StatusOr<std::unique_ptr<PreparedModel>> bad = Load(file, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied) << bad.status();
  // The secret never appears in the error.
  EXPECT_EQ(std::string(bad.status().message()).find("not the passphrase"), std::string::npos);
  EXPECT_EQ(PostLoadRunCount(), runs_before);
}

TEST(TensorizerLoadTest, RawFileNeedsAConfig) {
  ScratchDir dir;
  fs::copy_file(kTensorizer / "llama_tiny_hf_fp32.tensors", dir / "model.tensors");
  absl::StatusOr<std::unique_ptr<PreparedModel>> without = Load(dir.path(), {});
  ASSERT_FALSE(without.ok());
  EXPECT_EQ(without.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(without.status().message(), "carries no model config");
  // config.json beside the file; the directory is sniffed to model.tensors.
  fs::copy_file(kLlamaTiny / "config.json", dir / "config.json");
  absl::StatusOr<std::unique_ptr<PreparedModel>> beside = Load(dir.path(), {});
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_LE(MaxAbsDiff(FixtureLogits(**beside), ExpectedLogits("expected_logits_fp32.f32")), 1e-4);
}

TEST(TensorizerLoadTest, SniffingNamesWhatItLookedFor) {
  ScratchDir dir;
  fs::copy_file(kTensorizer / "llama_tiny_hf_fp32.tensors", dir / "a.tensors");
  absl::StatusOr<CheckpointLocation> one = SniffCheckpoint(dir.path());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->format, CheckpointFormat::kTensorizer);
  EXPECT_EQ(one->file.filename(), "a.tensors");
  fs::copy_file(kTensorizer / "llama_tiny_hf_bf16.tensors", dir / "b.tensors");
  absl::StatusOr<CheckpointLocation> two = SniffCheckpoint(dir.path());
  ASSERT_FALSE(two.ok());
  EXPECT_CONTAINS(two.status().message(), "a.tensors, b.tensors");
  absl::StatusOr<CheckpointLocation> not_tensorizer = SniffCheckpoint(kLlamaTiny / "config.json");
  ASSERT_FALSE(not_tensorizer.ok());
  EXPECT_CONTAINS(not_tensorizer.status().message(), "not a Tensorizer file");
}

TEST(TensorizerLoadTest, TruncatedFileFailsBeforePostLoad) {
  ScratchDir dir;
  const std::string bytes = ReadBytes(kTensorizer / "llama_tiny_hf_fp32.tensors");
  const uint64_t runs_before = PostLoadRunCount();
  for (size_t cut : {size_t{10}, size_t{300000}, bytes.size() - 9}) {
    testing_util::WriteBytes(dir / "cut.tensors", std::string_view(bytes).substr(0, cut));
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        Load(dir / "cut.tensors", FixtureOptions());
    EXPECT_FALSE(model.ok()) << "cut at " << cut;
  }
  EXPECT_EQ(PostLoadRunCount(), runs_before);
}

TEST(TensorizerLoadTest, HashCheckModeReachesTheReaderAndTheReport) {
  ScratchDir dir;
  std::string bytes = ReadBytes(kTensorizer / "llama_tiny_hf_fp32.tensors");
  absl::StatusOr<tensorizer::TensorizerFile> file =
      tensorizer::TensorizerFile::Open(kTensorizer / "llama_tiny_hf_fp32.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const tensorizer::TensorInfo* up = file->Find("model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  bytes[up->data_offset + up->data_length - 1] ^= 0x01;
  testing_util::WriteBytes(dir / "flipped.tensors", bytes);
  const uint64_t runs_before = PostLoadRunCount();
  for (tensorizer::HashCheck check : {tensorizer::HashCheck::kAll, tensorizer::HashCheck::kCrc32}) {
    LoadOptions options = FixtureOptions();
    options.tensorizer.hash_check = check;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(dir / "flipped.tensors", options);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
    EXPECT_CONTAINS(model.status().message(),
                    "tensor \"model.layers.0.mlp.up_proj.weight\": CRC32 mismatch");
  }
  EXPECT_EQ(PostLoadRunCount(), runs_before);  // refused before PostLoad
  LoadOptions options = FixtureOptions();
  options.tensorizer.hash_check = tensorizer::HashCheck::kNone;
  absl::StatusOr<std::unique_ptr<PreparedModel>> unchecked = Load(dir / "flipped.tensors", options);
  ASSERT_TRUE(unchecked.ok()) << unchecked.status();
  EXPECT_EQ((*unchecked)->provenance().hash_check, "none");
  options.tensorizer.hash_check = tensorizer::HashCheck::kCrc32;
  absl::StatusOr<std::unique_ptr<PreparedModel>> crc32 =
      Load(kTensorizer / "llama_tiny_hf_fp32.tensors", options);
  ASSERT_TRUE(crc32.ok()) << crc32.status();
  EXPECT_EQ((*crc32)->provenance().hash_check, "crc32");
}

// ---- The same weights through every loader --------------------------------------------------

enum class Path { kSafetensors, kRawTensorizer, kVllmTensorizer, kNativeTensorized };

std::string PathName(Path path) {
  switch (path) {
    case Path::kSafetensors:
      return "safetensors";
    case Path::kRawTensorizer:
      return "raw_tensorizer";
    case Path::kVllmTensorizer:
      return "vllm_tensorizer";
    case Path::kNativeTensorized:
      return "native_tensorized";
  }
  return "?";
}

// The HF bf16 fixture's weights as a safetensors model directory (with config.json).
void WriteBf16Safetensors(const fs::path& dir) {
  absl::StatusOr<OpenedCheckpoint> opened =
      OpenCheckpoint(kTensorizer / "llama_tiny_hf_bf16.tensors", FixtureOptions());
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::vector<TensorToWrite> tensors;
  for (const TensorRecord& record : opened->source.records()) {
    tensors.push_back({record.name, record.dtype, record.shape, {record.data, record.byte_size}});
  }
  fs::create_directories(dir);
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir, tensors, uint64_t{1} << 30).ok());
  fs::copy_file(kLlamaTiny / "config.json", dir / "config.json");
}

class SameWeightsEveryLoaderTest : public ::testing::TestWithParam<Path> {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new ScratchDir();
    WriteBf16Safetensors(scratch_->path() / "st");
    absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(scratch_->path() / "st");
    ASSERT_TRUE(opened.ok()) << opened.status();
    absl::StatusOr<NativeTensorizeResult> written = WriteNativeTensorized(
        scratch_->path() / "native.tensors", opened->source, opened->config, {});
    ASSERT_TRUE(written.ok()) << written.status();
  }
  static void TearDownTestSuite() { delete scratch_; }
  static ScratchDir* scratch_;
};
ScratchDir* SameWeightsEveryLoaderTest::scratch_ = nullptr;

TEST_P(SameWeightsEveryLoaderTest, IdenticalLogitsAndOnePostLoad) {
  fs::path path;
  LoadOptions options = FixtureOptions();
  switch (GetParam()) {
    case Path::kSafetensors:
      path = scratch_->path() / "st";
      break;
    case Path::kRawTensorizer:
      path = kTensorizer / "llama_tiny_hf_bf16.tensors";
      break;
    case Path::kVllmTensorizer:
      path = kTensorizer / "llama_tiny_vllm_bf16.tensors";
      break;
    case Path::kNativeTensorized:
      path = scratch_->path() / "native.tensors";
      options.tensorizer.config_path.reset();  // the file carries its own config
      break;
  }
  absl::StatusOr<std::unique_ptr<PreparedModel>> reference = Load(scratch_->path() / "st", {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  const uint64_t runs_before = PostLoadRunCount();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(path, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(PostLoadRunCount(), runs_before + 1) << "PostLoad must run exactly once per load";
  EXPECT_EQ((*model)->compute_dtype(), DType::kBF16);
  EXPECT_EQ(FixtureLogits(**model), FixtureLogits(**reference));
  EXPECT_EQ((*model)->report().placed_bytes() > 0, true);
}

INSTANTIATE_TEST_SUITE_P(Loaders, SameWeightsEveryLoaderTest,
                         ::testing::Values(Path::kSafetensors, Path::kRawTensorizer,
                                           Path::kVllmTensorizer, Path::kNativeTensorized),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return PathName(info.param);
                         });

// ---- Native round trip ---------------------------------------------------------------------

TEST(NativeTensorizedTest, SafetensorsRoundTripIsIdenticalAndSelfContained) {
  ScratchDir dir;
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(kLlamaTiny);
  ASSERT_TRUE(opened.ok()) << opened.status();
  NativeTensorizeOptions write_options;
  write_options.embedded_files["tokenizer.json"] = "{\"not\": \"checked here\"}";
  absl::StatusOr<NativeTensorizeResult> written =
      WriteNativeTensorized(dir / "m.tensors", opened->source, opened->config, write_options);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->tensors, 15);  // 21 HF tensors, q/k/v and gate/up fused per layer

  absl::StatusOr<std::unique_ptr<PreparedModel>> original = Load(kLlamaTiny, {});
  absl::StatusOr<std::unique_ptr<PreparedModel>> native = Load(dir / "m.tensors", {});
  ASSERT_TRUE(original.ok()) << original.status();
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_EQ(FixtureLogits(**native), FixtureLogits(**original));
  EXPECT_EQ((*native)->config().num_hidden_layers, 2);
  EXPECT_EQ((*native)->provenance().layout, WeightLayout::kEngine);
  absl::StatusOr<OpenedCheckpoint> reopened = OpenCheckpoint(dir / "m.tensors");
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(reopened->side_files.at("tokenizer.json"),
            write_options.embedded_files["tokenizer.json"]);
  EXPECT_TRUE((*native)->report().unplaced.empty()) << (*native)->report().Summary();
  EXPECT_EQ((*native)->provenance().load_mode, LoadMode::kMmapZeroCopy);

  // Weight data is 64-byte aligned in the file (so the packer reads it in place), through
  // padding tensors that the loader drops and reports as one entry.
  absl::StatusOr<tensorizer::TensorizerFile> file =
      tensorizer::TensorizerFile::Open(dir / "m.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  int weights = 0;
  for (const tensorizer::TensorInfo& info : file->tensors()) {
    if (info.name.rfind(".kiln", 0) == 0) continue;
    ++weights;
    EXPECT_EQ(info.data_offset % 64, 0u) << info.name;
  }
  EXPECT_EQ(weights, 15);
  bool padding_reported = false;
  for (const TensorSummary& t : (*native)->report().ignored) {
    padding_reported |= t.name == ".kiln_pad/*";
  }
  EXPECT_TRUE(padding_reported) << (*native)->report().Summary();
}

TEST(NativeTensorizedTest, Bf16ExportMatchesBf16Weights) {
  ScratchDir dir;
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(kLlamaTiny);
  ASSERT_TRUE(opened.ok()) << opened.status();
  NativeTensorizeOptions write_options;
  write_options.dtype = DType::kBF16;
  ASSERT_TRUE(
      WriteNativeTensorized(dir / "bf16.tensors", opened->source, opened->config, write_options)
          .ok());
  LoadOptions options;
  options.compute_dtype = DType::kF32;
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(dir / "bf16.tensors", options);
  ASSERT_TRUE(model.ok()) << model.status();
  // Rounding to bf16 is torch's (round to nearest even), so these are the fixture's bf16 weights.
  EXPECT_LE(MaxAbsDiff(FixtureLogits(**model), ExpectedLogits("expected_logits_bf16_weights.f32")),
            1e-4);
}

TEST(NativeTensorizedTest, CarriedTensorsSurviveTheRoundTrip) {
  ScratchDir dir;
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(kLlamaTiny);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const std::vector<float> extra = {1.0f, 2.0f, 3.0f};
  TensorRecord stray;
  stray.name = "model.layers.2.eh_proj.extra";
  stray.dtype = DType::kF32;
  stray.shape = {3};
  stray.data = reinterpret_cast<const std::byte*>(extra.data());
  stray.byte_size = 12;
  stray.origin = "test";
  ASSERT_TRUE(opened->source.Add(stray).ok());
  ASSERT_TRUE(WriteNativeTensorized(dir / "m.tensors", opened->source, opened->config, {}).ok());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(dir / "m.tensors", {});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->report().unplaced.size(), 1u);
  EXPECT_EQ((*model)->report().unplaced[0].name, "model.layers.2.eh_proj.extra");
  EXPECT_EQ((*model)->report().unplaced[0].bytes, 12u);
}

TEST(NativeTensorizedTest, NewerNativeVersionIsRefused) {
  ScratchDir dir;
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(kLlamaTiny);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(WriteNativeTensorized(dir / "m.tensors", opened->source, opened->config, {}).ok());
  // The marker's value is the native format version: make it 3 and skip the hashes it breaks.
  std::string bytes = ReadBytes(dir / "m.tensors");
  absl::StatusOr<tensorizer::TensorizerFile> file =
      tensorizer::TensorizerFile::Open(dir / "m.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const tensorizer::TensorInfo* marker = file->Find(".kiln_tensorized_marker");
  ASSERT_NE(marker, nullptr);
  bytes[marker->data_offset] = 3;
  testing_util::WriteBytes(dir / "v3.tensors", bytes);
  LoadOptions options;
  options.tensorizer.hash_check = tensorizer::HashCheck::kNone;
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(dir / "v3.tensors", options);
  ASSERT_FALSE(model.ok());
  EXPECT_CONTAINS(model.status().message(), "format version 3");
}

}  // namespace
}  // namespace kiln
