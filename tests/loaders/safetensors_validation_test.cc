// Every validation rule of the safetensors reader, each with crafted bytes: the load fails with
// the right code and a message that names the file and, where relevant, the tensor.
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loaders/safetensors.h"
#include "loaders/safetensors_writer.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing_util::Safetensors;
using testing_util::ScratchDir;
using testing_util::U64Le;
using testing_util::WriteBytes;

constexpr char kFile[] = "bad.safetensors";
const std::string kEightBytes(8, '\x01');

class SafetensorsValidationTest : public ::testing::Test {
 protected:
  absl::Status LoadRaw(std::string_view bytes) {
    WriteBytes(dir_ / kFile, bytes);
    return OpenSafetensorsFile(dir_.path(), kFile).status();
  }
  absl::Status Load(std::string_view header, std::string_view data = kEightBytes) {
    return LoadRaw(Safetensors(header, data));
  }
  // Fails with `code`, and the message names the file and every one of `parts`.
  void ExpectError(const absl::Status& status, absl::StatusCode code,
                   const std::vector<std::string>& parts = {}) {
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_CONTAINS(status.message(), (dir_ / kFile).string());
    for (const std::string& part : parts) EXPECT_CONTAINS(status.message(), part);
  }
  ScratchDir dir_;
};

TEST_F(SafetensorsValidationTest, ValidBaselineLoads) {
  absl::Status status = Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})");
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(SafetensorsValidationTest, FileShorterThanEightBytes) {
  ExpectError(LoadRaw(""), absl::StatusCode::kDataLoss, {"shorter than"});
  ExpectError(LoadRaw(std::string("\x05\x00\x00", 3)), absl::StatusCode::kDataLoss,
              {"shorter than"});
  ExpectError(LoadRaw(std::string(7, '\0')), absl::StatusCode::kDataLoss, {"shorter than"});
}

TEST_F(SafetensorsValidationTest, HeaderLengthZero) {
  ExpectError(LoadRaw(U64Le(0) + "{}"), absl::StatusCode::kInvalidArgument, {"header length"});
}

TEST_F(SafetensorsValidationTest, HeaderLengthBeyondSaneBound) {
  ExpectError(LoadRaw(U64Le(100ull << 30) + "{}"), absl::StatusCode::kInvalidArgument,
              {"header length", "limit"});
  ExpectError(LoadRaw(U64Le(~0ull) + "{}"), absl::StatusCode::kInvalidArgument, {"header length"});
}

TEST_F(SafetensorsValidationTest, HeaderLengthPastEndOfFile) {
  ExpectError(LoadRaw(U64Le(3) + "{}"), absl::StatusCode::kDataLoss, {"past the end"});
  ExpectError(LoadRaw(U64Le(1000) + "{}"), absl::StatusCode::kDataLoss, {"past the end"});
}

TEST_F(SafetensorsValidationTest, HeaderNotValidJson) {
  ExpectError(Load(R"({"w":{"dtype":"F32",)"), absl::StatusCode::kInvalidArgument,
              {"not valid JSON"});
  ExpectError(Load(std::string("{\"w\":1}\0\0\0", 10)), absl::StatusCode::kInvalidArgument,
              {"not valid JSON"});
  // Text after a NUL must not be silently ignored.
  ExpectError(Load(std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"
                               "\0garbage",
                               62)),
              absl::StatusCode::kInvalidArgument, {"NUL byte at offset 54"});
  ExpectError(Load("{\"\xff\xfe\":{}}"), absl::StatusCode::kInvalidArgument, {"not valid JSON"});
}

TEST_F(SafetensorsValidationTest, HeaderNotAnObject) {
  ExpectError(Load("[1,2]"), absl::StatusCode::kInvalidArgument, {"must be a JSON object"});
  ExpectError(Load("\"w\""), absl::StatusCode::kInvalidArgument, {"must be a JSON object"});
}

TEST_F(SafetensorsValidationTest, EntryMissingFields) {
  ExpectError(Load(R"({"w":{"shape":[2],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "\"dtype\""});
  ExpectError(Load(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "\"shape\""});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2]}})"), absl::StatusCode::kInvalidArgument,
              {"tensor w", "\"data_offsets\""});
}

TEST_F(SafetensorsValidationTest, EntryWithWrongJsonTypes) {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  ExpectError(Load(R"({"w":[1,2]})"), kInvalid, {"tensor w", "object"});
  ExpectError(Load(R"({"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})"), kInvalid,
              {"tensor w", "\"dtype\" must be a string"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})"), kInvalid,
              {"tensor w", "\"shape\" must be an array"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})"), kInvalid,
              {"tensor w", "\"shape\"[0]"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})"), kInvalid,
              {"tensor w", "\"shape\"[0]"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[null],"data_offsets":[0,8]}})"), kInvalid,
              {"tensor w", "\"shape\"[0]"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}})"), kInvalid,
              {"tensor w", "data_offsets"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})"), kInvalid,
              {"tensor w", "data_offsets"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})"), kInvalid,
              {"tensor w", "data_offsets"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})"), kInvalid,
              {"tensor w", "data_offsets"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})"), kInvalid,
              {"tensor w", "data_offsets"});
}

TEST_F(SafetensorsValidationTest, NegativeDimension) {
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "negative dimension -2"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[-2,-1],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "negative dimension"});
}

TEST_F(SafetensorsValidationTest, MetadataNotAnObjectOfStrings) {
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  ExpectError(Load("{\"__metadata__\":[\"pt\"]," + w + "}"), absl::StatusCode::kInvalidArgument,
              {"__metadata__", "must be an object"});
  ExpectError(Load("{\"__metadata__\":{\"format\":1}," + w + "}"),
              absl::StatusCode::kInvalidArgument, {"__metadata__", "\"format\"", "string"});
  ExpectError(Load("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}," + w + "}"),
              absl::StatusCode::kInvalidArgument, {"__metadata__", "\"a\""});
  EXPECT_TRUE(Load("{\"__metadata__\":{\"format\":\"pt\"}," + w + "}").ok());
}

TEST_F(SafetensorsValidationTest, UnsupportedDtype) {
  for (const char* dtype : {"I64", "F64", "U8", "BOOL", "F8_E4M3", "f32", ""}) {
    SCOPED_TRACE(dtype);
    ExpectError(
        Load(std::string(R"({"w":{"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,8]}})"),
        absl::StatusCode::kInvalidArgument,
        {std::string("unsupported dtype ") + dtype + " in tensor w"});
  }
}

TEST_F(SafetensorsValidationTest, OffsetsBeginAfterEnd) {
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "begin after end"});
}

TEST_F(SafetensorsValidationTest, OffsetsBeyondDataRegion) {
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})"),
              absl::StatusCode::kDataLoss, {"tensor w", "past the end of the data region"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[9,9]}})"),
              absl::StatusCode::kDataLoss, {"tensor w", "past the end"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,)"
                   R"(18446744073709551615]}})"),
              absl::StatusCode::kDataLoss, {"tensor w"});
}

TEST_F(SafetensorsValidationTest, ByteCountDiffersFromShapeTimesDtype) {
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "needs 12"});
  ExpectError(Load(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "needs 4"});
  ExpectError(Load(R"({"w":{"dtype":"F16","shape":[],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "needs 2"});
}

TEST_F(SafetensorsValidationTest, HugeShapesDoNotOverflow) {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  // 2^32 · 2^32 overflows uint64 elements.
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})"),
              kInvalid, {"tensor w", "too many"});
  // 2^62 elements fit, × 4 bytes does not.
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})"),
              kInvalid, {"tensor w", "too many"});
  // 2^61 · 4 = 2^63 bytes fits uint64 but not the 8-byte region.
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,8]}})"),
              kInvalid, {"tensor w", "needs"});
  // A dimension above int64 max, and one above uint64 max (parsed as a float).
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})"),
              kInvalid, {"tensor w"});
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})"),
              kInvalid, {"tensor w"});
  // A zero dimension after an overflowing prefix is still refused (downstream multiplies).
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],)"
                   R"("data_offsets":[0,0]}})"),
              kInvalid, {"tensor w", "too many"});
}

TEST_F(SafetensorsValidationTest, OverlappingTensors) {
  const std::string data(16, '\0');
  ExpectError(Load(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   data),
              absl::StatusCode::kInvalidArgument, {"tensors a", "b [4, 12)", "overlap"});
  // Identical ranges; listed in reverse order in the header.
  ExpectError(Load(R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                   R"("y":{"dtype":"F16","shape":[4],"data_offsets":[8,16]}})",
                   data),
              absl::StatusCode::kInvalidArgument, {"y", "z", "overlap"});
  // One inside another.
  ExpectError(Load(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                   R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
                   data),
              absl::StatusCode::kInvalidArgument, {"a", "b", "overlap"});
}

TEST_F(SafetensorsValidationTest, GapsAndEmptyTensorsAreAllowed) {
  const std::string data(24, '\0');
  absl::Status status = Load(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                             data);
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(SafetensorsValidationTest, DeeplyNestedJsonIsRefusedWithoutStackOverflow) {
  const size_t depth = 100000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":)" + nested + R"(,"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"tensor w", "\"shape\"[0]"});
  ExpectError(Load(std::string(depth, '{')), absl::StatusCode::kInvalidArgument,
              {"not valid JSON"});
}

TEST_F(SafetensorsValidationTest, DuplicateTensorNames) {
  ExpectError(Load(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("w":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"\"w\" more than once"});
  // A repeated key inside one entry is just as ambiguous.
  ExpectError(Load(R"({"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"\"dtype\" more than once"});
  ExpectError(Load(R"({"__metadata__":{},"__metadata__":{},)"
                   R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"),
              absl::StatusCode::kInvalidArgument, {"__metadata__"});
}

// Truncating a valid file anywhere must give an error, never a crash or a bogus success.
TEST_F(SafetensorsValidationTest, TruncationSweepFailsCleanly) {
  std::vector<float> a(5, 1.5f), b(3, -2.0f);
  std::vector<std::byte> c(6, std::byte{0x3c});
  const std::vector<TensorToWrite> tensors = {
      {"a", DType::kF32, {5}, std::as_bytes(std::span(a))},
      {"b", DType::kF32, {3, 1}, std::as_bytes(std::span(b))},
      {"c", DType::kF16, {3}, c},
  };
  ASSERT_TRUE(WriteSafetensorsFile(dir_ / "good.safetensors", tensors, {{"format", "pt"}}).ok());
  const std::string good = testing_util::ReadBytes(dir_ / "good.safetensors");
  ASSERT_TRUE(OpenSafetensorsFile(dir_.path(), "good.safetensors").ok());
  for (size_t length = 0; length < good.size(); ++length) {
    SCOPED_TRACE(length);
    absl::Status status = LoadRaw(std::string_view(good).substr(0, length));
    ASSERT_FALSE(status.ok());
    EXPECT_TRUE(status.code() == absl::StatusCode::kDataLoss ||
                status.code() == absl::StatusCode::kInvalidArgument)
        << status;
    EXPECT_CONTAINS(status.message(), (dir_ / kFile).string());
  }
}

TEST_F(SafetensorsValidationTest, TruncationSweepOfTheFixture) {
  const std::string fixture =
      testing_util::ReadBytes(fs::path(KILN_TEST_DATA_DIR) / "llama_tiny" / "model.safetensors");
  ASSERT_EQ(fixture.size(), 429408u);
  std::vector<size_t> lengths;
  // Every cut near the length prefix and the header/data boundary (header is 2136 bytes, data
  // starts at 2144), a sample of cuts through the header, then through the data.
  for (size_t n = 0; n < 64; ++n) lengths.push_back(n);
  for (size_t n = 64; n < 2128; n += 17) lengths.push_back(n);
  for (size_t n = 2128; n < 2160; ++n) lengths.push_back(n);
  for (size_t n = 2160; n < fixture.size(); n += 4099) lengths.push_back(n);
  lengths.push_back(fixture.size() - 1);
  for (size_t length : lengths) {
    SCOPED_TRACE(length);
    absl::Status status = LoadRaw(std::string_view(fixture).substr(0, length));
    ASSERT_FALSE(status.ok());
    EXPECT_CONTAINS(status.message(), (dir_ / kFile).string());
  }
}

// Random byte flips in the header: any outcome but a crash (ASan/UBSan builds check that).
TEST_F(SafetensorsValidationTest, RandomHeaderCorruptionNeverCrashes) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
  const std::string good = Safetensors(header, std::string(16, '\x7f'));
  std::mt19937 rng(20240601);
  int failures = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % (8 + header.size())] = static_cast<char>(rng() % 256);
    }
    absl::Status status = LoadRaw(bytes);
    if (!status.ok()) {
      ++failures;
      EXPECT_CONTAINS(status.message(), kFile);
    }
  }
  EXPECT_GT(failures, 0);
}

}  // namespace
}  // namespace kiln
