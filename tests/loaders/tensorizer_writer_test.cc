// Tensorizer writer: rewriting the tensorizer-written fixtures reproduces them byte for byte
// (tensorizer's unencrypted output is deterministic), the data version follows the features
// used, and invalid input is refused before anything is written.
#include "loaders/tensorizer_writer.h"

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "loaders/tensorizer_reader.h"
#include "tests/loaders/test_util.h"

namespace kiln::tensorizer {
namespace {

namespace fs = std::filesystem;
using testing_util::ReadBytes;
using testing_util::ScratchDir;

const fs::path kDir = fs::path(KILN_TEST_DATA_DIR) / "tensorizer";

const std::byte* Bytes(const std::string& s) {
  return reinterpret_cast<const std::byte*>(s.data());
}

WriteTensor Tensor(std::string name, ElementType type, std::vector<int64_t> shape,
                   const std::string& data) {
  WriteTensor t;
  t.name = std::move(name);
  t.element_type = type;
  t.shape = std::move(shape);
  t.data = Bytes(data);
  t.size = data.size();
  return t;
}

class TensorizerWriterTest : public ::testing::Test {
 protected:
  fs::path Out() const { return dir_ / "out.tensors"; }
  absl::Status Write(const std::vector<WriteTensor>& tensors) {
    return WriteTensorizerFile(Out(), tensors);
  }
  // Opens what was written and returns every tensor's bytes (hashes verified).
  std::vector<std::string> ReadBack(std::optional<TensorizerFile>* opened = nullptr) {
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(Out());
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return {};
    absl::StatusOr<std::vector<TensorBytes>> bytes = file->ReadAll(ReadOptions{});
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    std::vector<std::string> out;
    if (bytes.ok()) {
      for (const TensorBytes& b : *bytes) {
        out.emplace_back(reinterpret_cast<const char*>(b.data), b.size);
      }
    }
    if (opened != nullptr) opened->emplace(*std::move(file));
    return out;
  }
  uint32_t VersionOfOutput() {
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(Out());
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? file->version() : 0;
  }
  ScratchDir dir_;
};

class TensorizerRewriteTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorizerRewriteTest, RewritingAFixtureIsByteIdentical) {
  const fs::path source = kDir / GetParam();
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(source);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<TensorBytes>> bytes = file->ReadAll(ReadOptions{});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::vector<WriteTensor> tensors;
  for (size_t i = 0; i < file->tensors().size(); ++i) {
    const TensorInfo& info = file->tensors()[i];
    WriteTensor t;
    t.name = info.name;
    t.type = info.type;
    t.module_idx = info.module_idx;
    t.element_type = info.element_type;
    t.shape = info.shape;
    t.meta = info.meta;
    if (!info.meta) {
      t.data = (*bytes)[i].data;
      t.size = (*bytes)[i].size;
    }
    tensors.push_back(std::move(t));
  }
  ScratchDir dir;
  const fs::path out = dir / "rewritten.tensors";
  ASSERT_TRUE(WriteTensorizerFile(out, tensors).ok());
  const std::string expected = ReadBytes(source);
  const std::string actual = ReadBytes(out);
  ASSERT_EQ(actual.size(), expected.size());
  if (actual != expected) {
    size_t first = 0;
    while (actual[first] == expected[first]) ++first;
    FAIL() << "first differing byte at offset " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(TensorizerFixtures, TensorizerRewriteTest,
                         ::testing::Values("llama_tiny_hf_fp32.tensors",
                                           "llama_tiny_hf_fp16.tensors",
                                           "llama_tiny_hf_bf16.tensors",
                                           "llama_tiny_vllm_bf16.tensors", "edge_cases.tensors"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string out;
                           for (char c : info.param.substr(0, info.param.find('.'))) {
                             out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
                           }
                           return out;
                         });

TEST_F(TensorizerWriterTest, VersionFollowsTheFeaturesUsed) {
  const std::string f32(16, '\x01');
  const std::string bf16(8, '\x02');
  ASSERT_TRUE(Write({Tensor("a", ElementType::kF32, {4}, f32)}).ok());
  EXPECT_EQ(VersionOfOutput(), 1u);
  ASSERT_TRUE(
      Write({Tensor("a", ElementType::kF32, {4}, f32), Tensor("b", ElementType::kBF16, {4}, bf16)})
          .ok());
  EXPECT_EQ(VersionOfOutput(), 2u);
  WriteTensor meta = Tensor("m", ElementType::kF32, {2, 3}, "");
  meta.meta = true;
  ASSERT_TRUE(Write({meta, Tensor("b", ElementType::kBF16, {4}, bf16)}).ok());
  EXPECT_EQ(VersionOfOutput(), 4u);
  // uint16 is written in the numpy spelling, which needs no opaque version bump.
  ASSERT_TRUE(Write({Tensor("u", ElementType::kU16, {4}, bf16)}).ok());
  EXPECT_EQ(VersionOfOutput(), 1u);
}

TEST_F(TensorizerWriterTest, MetaTensorReadsBackAsZeros) {
  WriteTensor meta = Tensor(".vllm_tensorized_marker", ElementType::kI64, {1}, "");
  meta.type = TensorType::kParam;
  meta.meta = true;
  const std::string data = "\x01\x02\x03\x04";
  WriteTensor other = Tensor("w", ElementType::kU8, {2, 2}, data);
  other.type = TensorType::kBuffer;
  other.module_idx = 7;
  ASSERT_TRUE(Write({meta, other}).ok());
  std::optional<TensorizerFile> file;
  const std::vector<std::string> back = ReadBack(&file);
  ASSERT_TRUE(file.has_value());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(file->version(), 4u);
  EXPECT_TRUE(file->tensors()[0].meta);
  EXPECT_EQ(file->tensors()[0].data_length, 0u);
  EXPECT_EQ(back[0], std::string(8, '\0'));
  EXPECT_EQ(back[1], data);
  EXPECT_EQ(file->tensors()[1].type, TensorType::kBuffer);
  EXPECT_EQ(file->tensors()[1].module_idx, 7);
  EXPECT_EQ(file->tensors()[0].type, TensorType::kParam);
}

TEST_F(TensorizerWriterTest, EdgeShapesAndNamesRoundTrip) {
  const std::string scalar("\x00\x00\x60\x40", 4);  // 3.5f
  const std::string nested = "\x1e[\"a\",0]";
  const std::string bf16(12, '\x7f');
  WriteTensor empty = Tensor("empty", ElementType::kF32, {0, 3}, "");
  ASSERT_TRUE(Write({Tensor("scalar", ElementType::kF32, {}, scalar), empty,
                     Tensor(nested, ElementType::kBF16, {2, 3}, bf16),
                     Tensor("\xe5\x90\x8d", ElementType::kBool, {1}, "\x01")})
                  .ok());
  std::optional<TensorizerFile> file;
  const std::vector<std::string> back = ReadBack(&file);
  ASSERT_TRUE(file.has_value());
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[0], scalar);
  EXPECT_EQ(file->tensors()[0].elements, 1);
  EXPECT_EQ(back[1], "");
  EXPECT_FALSE(file->tensors()[1].meta);
  EXPECT_EQ(back[2], bf16);
  EXPECT_NE(file->Find(nested), nullptr);
  EXPECT_EQ(back[3], "\x01");
}

TEST_F(TensorizerWriterTest, NoTensorsGivesAnEmptyButValidFile) {
  ASSERT_TRUE(Write({}).ok());
  EXPECT_EQ(ReadBytes(Out()).size(), kFileHeaderSize + kStandardIndexSize + 8);
  std::optional<TensorizerFile> file;
  EXPECT_TRUE(ReadBack(&file).empty());
  ASSERT_TRUE(file.has_value());
  EXPECT_TRUE(file->tensors().empty());
}

TEST_F(TensorizerWriterTest, InvalidInputIsRefusedAndNothingIsWritten) {
  const std::string four(4, '\0');
  WriteTensor meta_with_data = Tensor("m", ElementType::kF32, {1}, four);
  meta_with_data.meta = true;
  WriteTensor wrong_dtype = Tensor("d", ElementType::kF32, {1}, four);
  wrong_dtype.dtype_string = "<i4";
  WriteTensor null_data = Tensor("n", ElementType::kF32, {1}, four);
  null_data.data = nullptr;
  const std::vector<std::pair<std::vector<WriteTensor>, std::string>> cases = {
      {{Tensor("x", ElementType::kF32, {1}, four), Tensor("x", ElementType::kF32, {1}, four)},
       "more than once"},
      {{Tensor("short", ElementType::kF32, {2}, four)}, "needs 8"},
      {{Tensor("neg", ElementType::kF32, {-1}, four)}, "dimension -1"},
      {{Tensor("huge", ElementType::kF32, {int64_t{1} << 32}, four)}, "dimension"},
      {{Tensor("rank", ElementType::kF32, std::vector<int64_t>(256, 1), four)}, "256 dimensions"},
      {{Tensor(std::string(65536, 'n'), ElementType::kF32, {1}, four)}, "65536 bytes"},
      {{meta_with_data}, "meta tensor"},
      {{wrong_dtype}, "int32"},
      {{null_data}, "null"},
  };
  for (const auto& [tensors, part] : cases) {
    const absl::Status status = WriteTensorizerFile(Out(), tensors);
    ASSERT_FALSE(status.ok()) << part;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(status.message(), Out().string());
    EXPECT_CONTAINS(status.message(), part);
    EXPECT_FALSE(fs::exists(Out())) << part;
  }
  EXPECT_TRUE(fs::is_empty(dir_.path()));  // no temporary file left behind either
}

TEST_F(TensorizerWriterTest, IndexOverflowIsRefused) {
  // 300 entries of ~1 KiB names overflow the 256 KiB index, as tensorizer's "Metadata overflow".
  const std::string one = "\x01";
  std::vector<WriteTensor> tensors;
  for (int i = 0; i < 300; ++i) {
    tensors.push_back(
        Tensor(std::to_string(i) + std::string(1000, 'x'), ElementType::kU8, {1}, one));
  }
  const absl::Status status = WriteTensorizerFile(Out(), tensors);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(status.message(), "metadata overflow");
  EXPECT_FALSE(fs::exists(Out()));
  tensors.resize(250);  // 250 x 1029 bytes fits
  ASSERT_TRUE(WriteTensorizerFile(Out(), tensors).ok());
  EXPECT_EQ(ReadBack().size(), 250u);
}

TEST_F(TensorizerWriterTest, ExplicitDTypeStringIsKept) {
  const std::string data(8, '\x05');
  WriteTensor t = Tensor("u16", ElementType::kU16, {4}, data);
  t.dtype_string = std::string("<V2\0torch.uint16", 16);
  ASSERT_TRUE(Write({t}).ok());
  std::optional<TensorizerFile> file;
  ASSERT_EQ(ReadBack(&file).size(), 1u);
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->tensors()[0].dtype_string, t.dtype_string);
  EXPECT_EQ(file->tensors()[0].element_type, ElementType::kU16);
  EXPECT_EQ(file->version(), 2u);  // opaque spelling
}

}  // namespace
}  // namespace kiln::tensorizer
