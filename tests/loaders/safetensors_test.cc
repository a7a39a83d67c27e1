// The real fixture loads; writer → reader round trips (single file and sharded).
#include "loaders/safetensors.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "loaders/safetensors_writer.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing_util::ReadBytes;
using testing_util::ScratchDir;
using testing_util::Sha256Hex;

const fs::path kFixtureDir = fs::path(KILN_TEST_DATA_DIR) / "llama_tiny";

struct ExpectedTensor {
  const char* name;
  std::vector<int64_t> shape;
  const char* sha256;  // of the data bytes, from the fixture's manifest.json
};

// shared/fixtures/tensorizer/manifest.json, files["llama_tiny_hf_fp32.tensors"].tensors: the
// same fp32 bytes as the safetensors file (checked when the fixture was made).
const std::vector<ExpectedTensor>& FixtureTensors() {
  static const auto* tensors = new std::vector<ExpectedTensor>{
      // clang-format off
    {"model.embed_tokens.weight", {256, 64}, "14e1bfd36260a9479c63f271786d88e52e7c313c4b912fdecea28ee6bd73f033"},
    {"model.layers.0.self_attn.q_proj.weight", {64, 64}, "b303c374379dee846545a714ec0431f3410f7adc5e1bd58b13658880636f10e9"},
    {"model.layers.0.self_attn.k_proj.weight", {32, 64}, "d2e32e16d3865f01e9934498bf4049ead1d333f065290cf91364f6f760ae6454"},
    {"model.layers.0.self_attn.v_proj.weight", {32, 64}, "a8fa675a5195619c61a18f8e420286ff27be1fa5e78e71dfb8efc38733fcf838"},
    {"model.layers.0.self_attn.o_proj.weight", {64, 64}, "d5d485a29c160280e08815f9bf8bd5407715c0aaf3f1c4aab2364da413f5122b"},
    {"model.layers.0.mlp.gate_proj.weight", {128, 64}, "73d61b71bb0548c72819ff299ac119edbf5c865279836497d5dc463fc5f070ca"},
    {"model.layers.0.mlp.up_proj.weight", {128, 64}, "6d77d9aaafa643e2d395e3253ce4f7960300f096bc54d5960b8fe9524e0806ce"},
    {"model.layers.0.mlp.down_proj.weight", {64, 128}, "daab839674c3d262a048d3cbdb1927e31b12624d461acd316d14c51244040a2f"},
    {"model.layers.0.input_layernorm.weight", {64}, "3244bc9bc27af7cc0655075ee0d2ada675a58ce84e78d9f8feba454fd1bd4d56"},
    {"model.layers.0.post_attention_layernorm.weight", {64}, "9429208dbebde944d00cf1e8433d8b7a0841903550056c8729e45c53e255d0d3"},
    {"model.layers.1.self_attn.q_proj.weight", {64, 64}, "970fe11b03592f60420552a66afd1415f98fd6b9f499b7fd256f653f2284c96e"},
    {"model.layers.1.self_attn.k_proj.weight", {32, 64}, "17a26fd4245b6a0b279690c67b98a5af8f38c537c5369bfcbb9cd2f42e4166c2"},
    {"model.layers.1.self_attn.v_proj.weight", {32, 64}, "254ecef73e2abb6a38375827eb1f700adc3a5a3190c951657ce7a2bb0c938bde"},
    {"model.layers.1.self_attn.o_proj.weight", {64, 64}, "ed10c642a1e35b24fb8e6a3bb3ace5e2049e3973555e32bd0761baf4cc3ca7e3"},
    {"model.layers.1.mlp.gate_proj.weight", {128, 64}, "ca4a497c7234710ce932bfc57d881933a8347bfc40555ba1a26cf5b5fc7687c4"},
    {"model.layers.1.mlp.up_proj.weight", {128, 64}, "720a3f8a04577ea8286b5f63fcadcc1629554fead2440d6d54cda84ea49d677c"},
    {"model.layers.1.mlp.down_proj.weight", {64, 128}, "3c44074ce3fa7d95ff21ec433a404f5e9ab681c7726d94d27b665d0b2d216ea6"},
    {"model.layers.1.input_layernorm.weight", {64}, "72c29074f237add868aaf88b02f26d67bec97d2674a2e6e7e0433721a5b3f8a8"},
    {"model.layers.1.post_attention_layernorm.weight", {64}, "16ed7f889ea12beae2e8dd84acd78ceda724734c77191ec11931f382ea6cecb0"},
    {"model.norm.weight", {64}, "a939de1353f179eaccdde4b3fda03d20f4d98c5b5d0f0d97a5dc0a431128366f"},
    {"lm_head.weight", {256, 64}, "8eca5b96e2d4c6f8ca5022cd5340ee23f51c903098f3d61fb0e6ddaeb282fe27"},
      // clang-format on
  };
  return *tensors;
}

TEST(SafetensorsFixtureTest, LlamaTinyLoadsWithManifestBytes) {
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(kFixtureDir);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ(source->records().size(), 21u);
  for (const ExpectedTensor& expected : FixtureTensors()) {
    SCOPED_TRACE(expected.name);
    const TensorRecord* record = source->Find(expected.name);
    ASSERT_NE(record, nullptr);
    EXPECT_EQ(record->dtype, DType::kF32);
    EXPECT_EQ(record->shape, expected.shape);
    EXPECT_EQ(record->byte_size, static_cast<size_t>(record->elements()) * 4);
    EXPECT_EQ(record->origin, "model.safetensors");
    EXPECT_EQ(Sha256Hex(record->data, record->byte_size), expected.sha256);
  }
  const SourceProvenance& provenance = source->provenance();
  EXPECT_EQ(provenance.format, "safetensors");
  EXPECT_EQ(provenance.files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(provenance.load_mode, LoadMode::kMmapZeroCopy);
  // 429408-byte file, data from offset 2144 (fixture README), no gaps.
  EXPECT_EQ(provenance.bytes_read, 429408u - 2144u);
}

TEST(SafetensorsFixtureTest, SingleFileApiAndZeroCopyViews) {
  absl::StatusOr<WeightSource> source = OpenSafetensorsFile(kFixtureDir, "model.safetensors");
  ASSERT_TRUE(source.ok()) << source.status();
  const std::string raw = ReadBytes(kFixtureDir / "model.safetensors");
  ASSERT_EQ(raw.size(), 429408u);
  // lm_head.weight sorts first, so its data starts right after the header (offset 2144).
  const TensorRecord* lm_head = source->Find("lm_head.weight");
  ASSERT_NE(lm_head, nullptr);
  ASSERT_EQ(lm_head->byte_size, 65536u);
  EXPECT_EQ(std::memcmp(lm_head->data, raw.data() + 2144, lm_head->byte_size), 0);
  // The norm weights are 1 + 0.1·N(0,1): all within a plausible band.
  const TensorRecord* norm = source->Find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  std::vector<float> values(64);
  ConvertToF32(DType::kF32, norm->data, 64, values.data());
  for (float v : values) {
    EXPECT_GT(v, 0.4f);
    EXPECT_LT(v, 1.6f);
  }
}

TEST(SafetensorsFixtureTest, CompanionFilesArePresent) {
  EXPECT_EQ(fs::file_size(kFixtureDir / "expected_logits_fp32.f32"), 5u * 256u * 4u);
  EXPECT_EQ(fs::file_size(kFixtureDir / "expected_logits_bf16_weights.f32"), 5u * 256u * 4u);
  EXPECT_EQ(fs::file_size(kFixtureDir / "expected_logits_fp16_weights.f32"), 5u * 256u * 4u);
  EXPECT_TRUE(fs::exists(kFixtureDir / "config.json"));
  EXPECT_TRUE(fs::exists(kFixtureDir / "input_ids.json"));
  EXPECT_TRUE(fs::exists(kFixtureDir / "expected_logits_info.json"));
}

// Owned test tensors; TensorToWrite views into them.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  TensorToWrite View() const { return {name, dtype, shape, bytes}; }
};

OwnedTensor MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape, float seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = seed + 0.25f * static_cast<float>(i) - 3.0f;
  std::vector<std::byte> bytes(static_cast<size_t>(n) * DTypeSize(dtype));
  // (n == 0 skipped: memcpy with the null data() of empty vectors is UB, and UBSan says so.)
  if (n > 0) ConvertFromF32(dtype, values.data(), n, bytes.data());
  return {std::move(name), dtype, std::move(shape), std::move(bytes)};
}

std::vector<TensorToWrite> Views(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorToWrite> views;
  for (const OwnedTensor& t : tensors) views.push_back(t.View());
  return views;
}

void ExpectSameTensors(const WeightSource& source, const std::vector<OwnedTensor>& tensors) {
  ASSERT_EQ(source.records().size(), tensors.size());
  for (const OwnedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    const TensorRecord* record = source.Find(t.name);
    ASSERT_NE(record, nullptr);
    EXPECT_EQ(record->dtype, t.dtype);
    EXPECT_EQ(record->shape, t.shape);
    ASSERT_EQ(record->byte_size, t.bytes.size());
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(record->data, t.bytes.data(), t.bytes.size()), 0);
    }
  }
}

std::vector<OwnedTensor> MixedTensors() {
  std::vector<OwnedTensor> tensors;
  tensors.push_back(MakeTensor("a.f32", DType::kF32, {3, 5}, 1.0f));
  tensors.push_back(MakeTensor("b.f16", DType::kF16, {7}, 2.0f));  // 14 bytes: unaligned next
  tensors.push_back(MakeTensor("c.bf16", DType::kBF16, {2, 3, 4}, 3.0f));
  tensors.push_back(MakeTensor("d.scalar", DType::kF32, {}, 4.0f));
  tensors.push_back(MakeTensor("e.empty", DType::kF32, {0, 3}, 5.0f));
  tensors.push_back(MakeTensor("f.empty_bf16", DType::kBF16, {0}, 6.0f));
  return tensors;
}

TEST(SafetensorsRoundTripTest, AllDtypesScalarsAndEmptyTensors) {
  ScratchDir dir;
  const std::vector<OwnedTensor> tensors = MixedTensors();
  const std::vector<TensorToWrite> views = Views(tensors);
  ASSERT_TRUE(WriteSafetensorsFile(dir / "w.safetensors", views, {{"format", "pt"}}).ok());

  absl::StatusOr<WeightSource> source = OpenSafetensorsFile(dir.path(), "w.safetensors");
  ASSERT_TRUE(source.ok()) << source.status();
  ExpectSameTensors(*source, tensors);
  EXPECT_EQ(source->Find("d.scalar")->elements(), 1);
  EXPECT_EQ(source->Find("e.empty")->byte_size, 0u);
  uint64_t total = 0;
  for (const OwnedTensor& t : tensors) total += t.bytes.size();
  EXPECT_EQ(source->provenance().bytes_read, total);
  EXPECT_EQ(source->provenance().files, std::vector<std::string>{"w.safetensors"});
}

TEST(SafetensorsRoundTripTest, HeaderIsPaddedToEightBytesAndParsesAsJson) {
  ScratchDir dir;
  const std::vector<OwnedTensor> tensors = MixedTensors();
  const std::vector<TensorToWrite> views = Views(tensors);
  ASSERT_TRUE(WriteSafetensorsFile(dir / "w.safetensors", views, {{"k", "v"}}).ok());
  const std::string raw = ReadBytes(dir / "w.safetensors");
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  const nlohmann::json header = nlohmann::json::parse(raw.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["b.f16"]["dtype"], "F16");
  EXPECT_EQ(header["c.bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["d.scalar"]["shape"], nlohmann::json::array());
  uint64_t data_size = 0;
  for (const OwnedTensor& t : tensors) data_size += t.bytes.size();
  EXPECT_EQ(raw.size(), 8 + header_len + data_size);
  // No temporary file is left beside the result.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(SafetensorsRoundTripTest, SingleFileCheckpointWhenItFits) {
  ScratchDir dir;
  const std::vector<OwnedTensor> tensors = MixedTensors();
  const std::vector<TensorToWrite> views = Views(tensors);
  // A stale index from an earlier sharded write must not shadow the new file.
  testing_util::WriteBytes(dir / "model.safetensors.index.json", "{}");
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir.path(), views, 1 << 20).ok());
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(dir.path());
  ASSERT_TRUE(source.ok()) << source.status();
  ExpectSameTensors(*source, tensors);
}

TEST(SafetensorsRoundTripTest, ShardedCheckpointWithIndex) {
  ScratchDir dir;
  std::vector<OwnedTensor> tensors;
  for (int i = 0; i < 5; ++i) {
    tensors.push_back(MakeTensor("layer." + std::to_string(i), DType::kF32, {10, 10}, i));  // 400 B
  }
  tensors.push_back(MakeTensor("scalar", DType::kBF16, {}, 9.0f));
  tensors.push_back(MakeTensor("empty", DType::kF16, {4, 0}, 9.0f));
  const std::vector<TensorToWrite> views = Views(tensors);
  // 800 bytes per shard: layers {0,1}, {2,3}, {4, scalar, empty}.
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir.path(), views, 800).ok());

  const std::vector<std::string> shard_names = {"model-00001-of-00003.safetensors",
                                                "model-00002-of-00003.safetensors",
                                                "model-00003-of-00003.safetensors"};
  for (const std::string& name : shard_names) EXPECT_TRUE(fs::exists(dir / name)) << name;
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const nlohmann::json index =
      nlohmann::json::parse(ReadBytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 5 * 400 + 2);
  EXPECT_EQ(index["weight_map"].size(), 7u);
  EXPECT_EQ(index["weight_map"]["layer.0"], shard_names[0]);
  EXPECT_EQ(index["weight_map"]["layer.1"], shard_names[0]);
  EXPECT_EQ(index["weight_map"]["layer.2"], shard_names[1]);
  EXPECT_EQ(index["weight_map"]["layer.3"], shard_names[1]);
  EXPECT_EQ(index["weight_map"]["layer.4"], shard_names[2]);
  EXPECT_EQ(index["weight_map"]["scalar"], shard_names[2]);
  EXPECT_EQ(index["weight_map"]["empty"], shard_names[2]);

  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(dir.path());
  ASSERT_TRUE(source.ok()) << source.status();
  ExpectSameTensors(*source, tensors);
  EXPECT_EQ(source->Find("layer.3")->origin, shard_names[1]);
  const SourceProvenance& provenance = source->provenance();
  EXPECT_EQ(provenance.format, "safetensors");
  EXPECT_EQ(provenance.load_mode, LoadMode::kMmapZeroCopy);
  EXPECT_EQ(provenance.bytes_read, 5u * 400u + 2u);
  const std::vector<std::string> files = {"model.safetensors.index.json", shard_names[0],
                                          shard_names[1], shard_names[2]};
  EXPECT_EQ(provenance.files, files);
}

TEST(SafetensorsRoundTripTest, OversizedTensorGetsItsOwnShard) {
  ScratchDir dir;
  std::vector<OwnedTensor> tensors;
  tensors.push_back(MakeTensor("small", DType::kF32, {2}, 0.0f));
  tensors.push_back(MakeTensor("big", DType::kF32, {100}, 0.0f));
  tensors.push_back(MakeTensor("tail", DType::kF32, {2}, 0.0f));
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir.path(), Views(tensors), 64).ok());
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(fs::exists(dir / ("model-0000" + std::to_string(i) + "-of-00003.safetensors")));
  }
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(dir.path());
  ASSERT_TRUE(source.ok()) << source.status();
  ExpectSameTensors(*source, tensors);
}

TEST(SafetensorsRoundTripTest, SourceKeepsMappingAliveAfterFilesAreDeleted) {
  ScratchDir dir;
  const std::vector<OwnedTensor> tensors = MixedTensors();
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir.path(), Views(tensors), 1 << 20).ok());
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(dir.path());
  ASSERT_TRUE(source.ok()) << source.status();
  fs::remove_all(dir.path());
  WeightSource moved = *std::move(source);
  ExpectSameTensors(moved, tensors);
}

}  // namespace
}  // namespace kiln
