// Checkpoint directories: index.json validation, shard/index consistency, symlinks that leave
// the model root (single file and shard), and the symlinks that stay inside it.
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loaders/safetensors.h"
#include "loaders/safetensors_writer.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

constexpr char kIndex[] = "model.safetensors.index.json";

class SafetensorsCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    values_a_.assign(4, 1.0f);
    values_b_.assign(2, 2.0f);
    values_c_.assign(3, 3.0f);
  }
  TensorToWrite A() const { return {"a", DType::kF32, {4}, std::as_bytes(std::span(values_a_))}; }
  TensorToWrite B() const { return {"b", DType::kF32, {2}, std::as_bytes(std::span(values_b_))}; }
  TensorToWrite C() const { return {"c", DType::kF32, {3}, std::as_bytes(std::span(values_c_))}; }
  // Writes `name` in `dir` holding `tensors`.
  void Shard(const fs::path& dir, const std::string& name, std::vector<TensorToWrite> tensors) {
    fs::create_directories((dir / name).parent_path());
    absl::Status status = WriteSafetensorsFile(dir / name, tensors);
    ASSERT_TRUE(status.ok()) << status;
  }
  absl::Status LoadWithIndex(std::string_view index_json) {
    WriteBytes(root_ / kIndex, index_json);
    return OpenSafetensorsCheckpoint(root_.path()).status();
  }
  void ExpectError(const absl::Status& status, absl::StatusCode code,
                   const std::vector<std::string>& parts) {
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), code) << status;
    for (const std::string& part : parts) EXPECT_CONTAINS(status.message(), part);
  }
  std::vector<float> values_a_, values_b_, values_c_;
  ScratchDir root_;
  ScratchDir outside_;
};

TEST_F(SafetensorsCheckpointTest, HandWrittenIndexLoads) {
  Shard(root_.path(), "s1.safetensors", {A(), B()});
  Shard(root_.path(), "sub/s2.safetensors", {C()});
  absl::Status status = LoadWithIndex(
      R"({"metadata":{"total_size":36},)"
      R"("weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"sub/s2.safetensors"}})");
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(SafetensorsCheckpointTest, NeitherIndexNorSingleFileIsNotFound) {
  absl::Status status = OpenSafetensorsCheckpoint(root_.path()).status();
  ExpectError(status, absl::StatusCode::kNotFound, {root_.path().string(), "model.safetensors"});
  ExpectError(OpenSafetensorsCheckpoint(root_ / "no_such_model").status(),
              absl::StatusCode::kNotFound, {"no_such_model"});
}

TEST_F(SafetensorsCheckpointTest, IndexMalformedJson) {
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors",})"),
              absl::StatusCode::kInvalidArgument, {kIndex, "not valid JSON"});
  ExpectError(LoadWithIndex(""), absl::StatusCode::kInvalidArgument, {kIndex, "not valid JSON"});
  ExpectError(LoadWithIndex("[]"), absl::StatusCode::kInvalidArgument, {kIndex, "JSON object"});
}

TEST_F(SafetensorsCheckpointTest, IndexWithDuplicateTensor) {
  Shard(root_.path(), "s1.safetensors", {A()});
  Shard(root_.path(), "s2.safetensors", {A()});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","a":"s2.safetensors"}})"),
              absl::StatusCode::kInvalidArgument, {kIndex, "\"a\" more than once"});
}

TEST_F(SafetensorsCheckpointTest, WeightMapMissingOrWrongType) {
  ExpectError(LoadWithIndex(R"({"metadata":{}})"), absl::StatusCode::kInvalidArgument,
              {kIndex, "no \"weight_map\""});
  ExpectError(LoadWithIndex(R"({"weight_map":["s1.safetensors"]})"),
              absl::StatusCode::kInvalidArgument, {kIndex, "\"weight_map\" must be an object"});
  ExpectError(LoadWithIndex(R"({"weight_map":{}})"), absl::StatusCode::kInvalidArgument,
              {kIndex, "no tensors"});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":1}})"), absl::StatusCode::kInvalidArgument,
              {kIndex, "tensor a", "string"});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":["s1.safetensors"]}})"),
              absl::StatusCode::kInvalidArgument, {kIndex, "tensor a", "string"});
}

TEST_F(SafetensorsCheckpointTest, NamedFileMissing) {
  Shard(root_.path(), "s1.safetensors", {A()});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"),
              absl::StatusCode::kNotFound, {"s2.safetensors", kIndex});
}

TEST_F(SafetensorsCheckpointTest, NamedFileIsCorrupt) {
  WriteBytes(root_ / "s1.safetensors", "garbage");
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors"}})"),
              absl::StatusCode::kDataLoss, {"s1.safetensors", kIndex});
}

TEST_F(SafetensorsCheckpointTest, TensorNamedByIndexMissingFromItsFile) {
  Shard(root_.path(), "s1.safetensors", {A()});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})"),
              absl::StatusCode::kInvalidArgument, {kIndex, "tensor b", "s1.safetensors"});
}

TEST_F(SafetensorsCheckpointTest, FileHoldsTensorTheIndexAssignsElsewhere) {
  Shard(root_.path(), "s1.safetensors", {A(), B()});
  Shard(root_.path(), "s2.safetensors", {B()});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"),
              absl::StatusCode::kInvalidArgument,
              {kIndex, "tensor b", "s1.safetensors", "s2.safetensors"});
}

TEST_F(SafetensorsCheckpointTest, FileHoldsTensorTheIndexDoesNotList) {
  Shard(root_.path(), "s1.safetensors", {A(), C()});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors"}})"),
              absl::StatusCode::kInvalidArgument, {kIndex, "tensor c", "s1.safetensors"});
}

TEST_F(SafetensorsCheckpointTest, ShardNamedByIndexOutsideRootIsRefused) {
  Shard(root_.path(), "s1.safetensors", {A()});
  Shard(outside_.path(), "evil.safetensors", {B()});
  const std::string outside_name = outside_.path().filename().string();
  // Symlink to a file outside.
  fs::create_symlink(outside_ / "evil.safetensors", root_ / "s2.safetensors");
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"),
              absl::StatusCode::kPermissionDenied, {"s2.safetensors", "leaves the model"});
  // Symlinked directory leading outside.
  fs::create_directory_symlink(outside_.path(), root_ / "linked_dir");
  ExpectError(
      LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":"linked_dir/evil.safetensors"}})"),
      absl::StatusCode::kPermissionDenied, {"linked_dir/evil.safetensors", "leaves the model"});
  // `..` and absolute names in the weight map.
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":"../)" + outside_name +
                            R"(/evil.safetensors"}})"),
              absl::StatusCode::kPermissionDenied, {"evil.safetensors", "leaves the model"});
  ExpectError(LoadWithIndex(R"({"weight_map":{"a":"s1.safetensors","b":")" +
                            (outside_ / "evil.safetensors").string() + R"("}})"),
              absl::StatusCode::kPermissionDenied, {"evil.safetensors", "leaves the model"});
}

TEST_F(SafetensorsCheckpointTest, IndexItselfOutsideRootIsRefused) {
  Shard(root_.path(), "s1.safetensors", {A()});
  WriteBytes(outside_ / kIndex, R"({"weight_map":{"a":"s1.safetensors"}})");
  fs::create_symlink(outside_ / kIndex, root_ / kIndex);
  ExpectError(OpenSafetensorsCheckpoint(root_.path()).status(), absl::StatusCode::kPermissionDenied,
              {kIndex, "leaves the model"});
}

TEST_F(SafetensorsCheckpointTest, SingleFileOutsideRootIsRefused) {
  Shard(outside_.path(), "model.safetensors", {A()});
  fs::create_symlink(outside_ / "model.safetensors", root_ / "model.safetensors");
  ExpectError(OpenSafetensorsCheckpoint(root_.path()).status(), absl::StatusCode::kPermissionDenied,
              {"model.safetensors", "leaves the model"});
  ExpectError(OpenSafetensorsFile(root_.path(), "model.safetensors").status(),
              absl::StatusCode::kPermissionDenied, {"model.safetensors", "leaves the model"});
  ExpectError(OpenSafetensorsFile(root_.path(), (outside_ / "model.safetensors").string()).status(),
              absl::StatusCode::kPermissionDenied, {"model.safetensors", "leaves the model"});
}

TEST_F(SafetensorsCheckpointTest, SymlinksInsideRootAreAccepted) {
  // A blob-store layout like the Hugging Face cache: names are links to files kept elsewhere in
  // the same tree.
  Shard(root_.path(), "blobs/1111", {A(), B()});
  Shard(root_.path(), "blobs/2222", {C()});
  fs::create_symlink("blobs/1111", root_ / "s1.safetensors");
  fs::create_symlink(root_ / "blobs" / "2222", root_ / "s2.safetensors");  // absolute target
  absl::StatusOr<WeightSource> source;
  {
    WriteBytes(
        root_ / kIndex,
        R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})");
    source = OpenSafetensorsCheckpoint(root_.path());
  }
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->records().size(), 3u);
  EXPECT_EQ(source->Find("c")->origin, "s2.safetensors");

  ScratchDir single;
  Shard(single.path(), "blobs/abc", {A()});
  fs::create_symlink("blobs/abc", single / "model.safetensors");
  absl::StatusOr<WeightSource> single_source = OpenSafetensorsCheckpoint(single.path());
  ASSERT_TRUE(single_source.ok()) << single_source.status();
  EXPECT_EQ(single_source->records().size(), 1u);
}

TEST_F(SafetensorsCheckpointTest, IndexTakesPrecedenceOverSingleFile) {
  Shard(root_.path(), "model.safetensors", {A()});
  Shard(root_.path(), "s1.safetensors", {B()});
  WriteBytes(root_ / kIndex, R"({"weight_map":{"b":"s1.safetensors"}})");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->Find("a"), nullptr);
  EXPECT_NE(source->Find("b"), nullptr);
}

TEST_F(SafetensorsCheckpointTest, WriterRejectsBadTensors) {
  std::vector<float> three(3, 0.0f);
  const auto bytes = std::as_bytes(std::span(three));
  const std::vector<std::pair<std::vector<TensorToWrite>, std::string>> cases = {
      {{{"w", DType::kF32, {2}, bytes}}, "tensor w has 12 bytes"},
      {{{"w", DType::kBF16, {3}, bytes}}, "tensor w has 12 bytes"},
      {{{"w", DType::kF32, {-3}, bytes}}, "negative dimension"},
      {{{"w", DType::kF32, {3}, bytes}, {"w", DType::kF32, {3}, bytes}}, "more than once"},
      {{{"__metadata__", DType::kF32, {3}, bytes}}, "__metadata__"},
      {{{"", DType::kF32, {3}, bytes}}, "empty name"},
      {{{"w", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, bytes}}, "too many"},
  };
  for (const auto& [tensors, expected] : cases) {
    SCOPED_TRACE(expected);
    absl::Status file_status = WriteSafetensorsFile(root_ / "w.safetensors", tensors);
    ASSERT_FALSE(file_status.ok());
    EXPECT_EQ(file_status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(file_status.message(), expected);
    EXPECT_CONTAINS(file_status.message(), "w.safetensors");
    absl::Status dir_status = WriteSafetensorsCheckpoint(root_ / "ckpt", tensors, 8);
    ASSERT_FALSE(dir_status.ok());
    EXPECT_CONTAINS(dir_status.message(), expected);
  }
  // Nothing was written, not even temporary files.
  EXPECT_TRUE(fs::is_empty(root_.path()));
}

TEST_F(SafetensorsCheckpointTest, WriterReportsUnwritableDirectory) {
  const std::vector<TensorToWrite> tensors = {A()};
  absl::Status status = WriteSafetensorsFile(root_ / "missing_dir" / "w.safetensors", tensors);
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "w.safetensors");
}

}  // namespace
}  // namespace kiln
