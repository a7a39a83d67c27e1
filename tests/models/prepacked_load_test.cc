// Native tensorized files that hold the linears packed (`kiln tensorize --prepack`): a load adopts
// the packed bytes (nothing is packed or quantized again) and gives the same logits, bit for bit,
// as preparing the original checkpoint the same way; a load that cannot adopt them (another
// compute dtype or quantization) unpacks and packs as usual; a damaged manifest or image fails
// the load naming what is wrong.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/synth.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quantized_linear.h"
#include "loaders/load_model.h"
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

// A small Qwen2-shaped model: tied embeddings (the packed LM head joins the file as
// lm_head.weight), q/k/v biases (kept plain beside the packed weight) and one MTP head (whose
// blocks' separate q/k/v stay plain: only linears from one tensor are stored packed).
ModelConfig SmallConfig() {
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("qwen2.5-0.5b");
  EXPECT_TRUE(config.ok()) << config.status();
  ModelConfig c = *config;
  c.hidden_size = 128, c.intermediate_size = 320, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 32;
  c.vocab_size = 384, c.max_position_embeddings = 256, c.eos_token_ids = {383};
  c.num_mtp_layers = 1;
  return c;
}

void WriteSmallCheckpoint(const fs::path& dir) {
  SynthOptions options;
  options.seed = 7;
  options.write_tokenizer = false;
  ASSERT_TRUE(WriteSynthCheckpoint(dir, SmallConfig(), options).ok());
}

std::vector<float> Logits(const PreparedModel& model) {
  const std::vector<int32_t> ids = {3, 17, 250, 9, 101, 77};
  absl::StatusOr<KvCache> cache = model.NewCache(8);
  EXPECT_TRUE(cache.ok()) << cache.status();
  SequenceChunk chunk{&*cache, ids, /*all_logits=*/true};
  std::vector<float> logits;
  absl::Status status = model.Forward({&chunk, 1}, &logits);
  EXPECT_TRUE(status.ok()) << status;
  return logits;
}

absl::StatusOr<std::unique_ptr<PreparedModel>> Load(const fs::path& path, LoadOptions options) {
  return LoadModel(path, CpuBackend(), options);
}

// Writes `dir`/m.safetensors' checkpoint as a prepacked native file.
absl::StatusOr<NativeTensorizeResult> WritePrepacked(const fs::path& checkpoint,
                                                     const fs::path& file, Quantization quantize) {
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(checkpoint);
  if (!opened.ok()) return opened.status();
  PostLoadOptions options;
  options.quantize = quantize;
  return WritePrepackedNativeTensorized(file, opened->source, opened->config, CpuBackend(), options,
                                        {});
}

class PrepackedLoadTest : public ::testing::TestWithParam<Quantization> {
 protected:
  void SetUp() override {
    if (GetParam() != Quantization::kNone && !cpu::QuantizedKernelSupported()) {
      GTEST_SKIP() << "this CPU has no AVX-512 VNNI: the quantized kernels do not run here";
    }
  }
};

TEST_P(PrepackedLoadTest, LoadAdoptsThePackedLinearsAndGivesTheSameLogits) {
  ScratchDir dir;
  WriteSmallCheckpoint(dir / "ckpt");
  absl::StatusOr<NativeTensorizeResult> written =
      WritePrepacked(dir / "ckpt", dir / "m.tensors", GetParam());
  ASSERT_TRUE(written.ok()) << written.status();
  // Per layer qkv, o, gate_up, down; the LM head; the MTP head's proj, o and down (one tensor
  // each; its q/k/v and gate/up are separate tensors, stored plain).
  EXPECT_EQ(written->packed, 2 * 4 + 1 + 3);

  LoadOptions options;
  options.quantize = GetParam();
  absl::StatusOr<std::unique_ptr<PreparedModel>> original = Load(dir / "ckpt", options);
  ASSERT_TRUE(original.ok()) << original.status();
  const uint64_t runs = PostLoadRunCount();
  // No quantize option: the file's quantization is kept.
  absl::StatusOr<std::unique_ptr<PreparedModel>> prepacked = Load(dir / "m.tensors", {});
  ASSERT_TRUE(prepacked.ok()) << prepacked.status();
  EXPECT_EQ(PostLoadRunCount(), runs + 1);

  const PreparedModel& model = **prepacked;
  EXPECT_EQ(model.adopted_linears(), written->packed);
  // The MTP head's q/k/v and gate/up were packed (and quantized, as the file says) at load.
  EXPECT_EQ(model.linear_count(), (*original)->linear_count());
  EXPECT_EQ(model.quantization(), (*original)->quantization());
  EXPECT_EQ(model.quantized_linears(), (*original)->quantized_linears());
  EXPECT_EQ(model.parameter_count(), (*original)->parameter_count());
  EXPECT_EQ(Logits(model), Logits(**original));
  EXPECT_EQ(model.provenance().load_mode, LoadMode::kMmapZeroCopy);
  // A file's images are all read where they lie or all copied, as its pages are mapped.
  EXPECT_TRUE(model.adopted_in_place_linears() == 0 ||
              model.adopted_in_place_linears() == model.adopted_linears());
}

// The loader hands each image the file's mapping as its backing, so that a backend may read it in
// place; a file under 2 MiB is mapped in 4 KiB pages, so its images are not marked in huge pages
// and the backend copies them.
TEST_P(PrepackedLoadTest, ImagesCarryTheMappingAndWhetherItIsInHugePages) {
  ScratchDir dir;
  WriteSmallCheckpoint(dir / "ckpt");
  ASSERT_TRUE(WritePrepacked(dir / "ckpt", dir / "m.tensors", GetParam()).ok());
  ASSERT_LT(fs::file_size(dir / "m.tensors"), uintmax_t{2} << 20);
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(dir / "m.tensors");
  ASSERT_TRUE(opened.ok()) << opened.status();
  int images = 0;
  for (const TensorRecord& record : opened->source.records()) {
    if (record.packed == nullptr) continue;
    ++images;
    EXPECT_NE(record.packed->backing, nullptr) << record.name;
    EXPECT_FALSE(record.packed->in_huge_pages) << record.name;
  }
  EXPECT_EQ(images, 2 * 4 + 1 + 3);
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = Load(dir / "m.tensors", {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->adopted_linears(), images);
  EXPECT_EQ((*model)->adopted_in_place_linears(), 0);
}

TEST_P(PrepackedLoadTest, AnotherComputeDTypeUnpacksAndPacksAsUsual) {
  ScratchDir dir;
  WriteSmallCheckpoint(dir / "ckpt");
  ASSERT_TRUE(WritePrepacked(dir / "ckpt", dir / "m.tensors", GetParam()).ok());
  LoadOptions options;
  options.compute_dtype = DType::kF32;
  // Quantized images are adopted whatever the compute dtype; bf16 ones are unpacked to f32.
  absl::StatusOr<std::unique_ptr<PreparedModel>> prepacked = Load(dir / "m.tensors", options);
  ASSERT_TRUE(prepacked.ok()) << prepacked.status();
  if (GetParam() == Quantization::kNone) {
    EXPECT_EQ((*prepacked)->adopted_linears(), 0);
    options.quantize = GetParam();
    absl::StatusOr<std::unique_ptr<PreparedModel>> original = Load(dir / "ckpt", options);
    ASSERT_TRUE(original.ok()) << original.status();
    EXPECT_EQ(Logits(**prepacked), Logits(**original));
  } else {
    EXPECT_GT((*prepacked)->adopted_linears(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Quantizations, PrepackedLoadTest,
                         ::testing::Values(Quantization::kNone, Quantization::kInt8,
                                           Quantization::kInt4),
                         [](const ::testing::TestParamInfo<Quantization>& info) {
                           return std::string(QuantizationName(info.param));
                         });

TEST(PrepackedFallbackTest, AskingForAnotherQuantizationRequantizesTheUnpackedWeights) {
  if (!cpu::QuantizedKernelSupported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  ScratchDir dir;
  WriteSmallCheckpoint(dir / "ckpt");
  ASSERT_TRUE(WritePrepacked(dir / "ckpt", dir / "bf16.tensors", Quantization::kNone).ok());
  LoadOptions options;
  options.quantize = Quantization::kInt8;
  // bf16 packed → unpacked exactly → int8: as quantizing the checkpoint's bf16 weights.
  absl::StatusOr<std::unique_ptr<PreparedModel>> from_packed = Load(dir / "bf16.tensors", options);
  absl::StatusOr<std::unique_ptr<PreparedModel>> original = Load(dir / "ckpt", options);
  ASSERT_TRUE(from_packed.ok()) << from_packed.status();
  ASSERT_TRUE(original.ok()) << original.status();
  EXPECT_EQ((*from_packed)->adopted_linears(), 0);
  EXPECT_EQ((*from_packed)->quantization(), Quantization::kInt8);
  EXPECT_EQ(Logits(**from_packed), Logits(**original));
}

TEST(PrepackedFileTest, APackedFileCannotBeTensorizedAgain) {
  ScratchDir dir;
  WriteSmallCheckpoint(dir / "ckpt");
  ASSERT_TRUE(WritePrepacked(dir / "ckpt", dir / "m.tensors", Quantization::kNone).ok());
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(dir / "m.tensors");
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<NativeTensorizeResult> again =
      WriteNativeTensorized(dir / "again.tensors", opened->source, opened->config, {});
  ASSERT_FALSE(again.ok());
  EXPECT_CONTAINS(again.status().message(), "stored packed");
}

// Writes the small model prepacked (bf16), overwrites the first occurrence of `from` in the file
// with `to` (same length) and loads it without hash checks (the patch breaks them): the status.
absl::Status LoadPatched(const std::string& from, const std::string& to) {
  ScratchDir dir;
  WriteSmallCheckpoint(dir / "ckpt");
  absl::Status written =
      WritePrepacked(dir / "ckpt", dir / "m.tensors", Quantization::kNone).status();
  if (!written.ok()) return written;
  EXPECT_EQ(from.size(), to.size());
  std::string bytes = ReadBytes(dir / "m.tensors");
  const size_t at = bytes.find(from);
  if (at == std::string::npos) return absl::NotFoundError(absl::StrCat("no ", from, " to patch"));
  bytes.replace(at, from.size(), to);
  testing_util::WriteBytes(dir / "m.tensors", bytes);
  LoadOptions options;
  options.tensorizer.hash_check = tensorizer::HashCheck::kNone;
  return Load(dir / "m.tensors", options).status();
}

TEST(PrepackedFileTest, AManifestThatIsNotJsonFailsTheLoadNamingIt) {
  const absl::Status status = LoadPatched("{\"tensors\":[", "{\"tensors\":}");
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), ".kiln_packed_manifest");
  EXPECT_CONTAINS(status.message(), "not a JSON object");
}

TEST(PrepackedFileTest, AMissingPartFailsTheLoadNamingTheTensor) {
  // The manifest's first part name no longer matches its tensor.
  const absl::Status status = LoadPatched("\"parts\":[\"weights\"]", "\"parts\":[\"weightz\"]");
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "part weightz is not in the file");
}

TEST(PrepackedFileTest, AnImageOfTheWrongSizeFailsTheLoadNamingTheLinear) {
  // The LM head's logical shape [384, 128] becomes [385, 128]: its bytes no longer fit.
  const absl::Status status = LoadPatched("\"shape\":[384,128]", "\"shape\":[385,128]");
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "lm_head.weight");
}

TEST(PrepackedFileTest, AnUnknownLayoutFailsTheLoadNamingIt) {
  const absl::Status status = LoadPatched("cpu.onednn.BA16a64b2a.v1", "cpu.onednn.BA16a64b2a.v9");
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "cpu.onednn.BA16a64b2a.v9");
}

}  // namespace
}  // namespace kiln
