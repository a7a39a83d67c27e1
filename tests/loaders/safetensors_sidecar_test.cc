// Off-index sidecar files (docs/mtp.md): other *.safetensors files in a model directory are read
// as additional weights, except files named like main weight shards; no tensor twice; symlinks
// that leave the model directory are refused.
#include <algorithm>
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

class SafetensorsSidecarTest : public ::testing::Test {
 protected:
  TensorToWrite T(const std::string& name) const {
    return {name, DType::kF32, {4}, std::as_bytes(std::span(values_))};
  }
  void File(const fs::path& path, std::vector<TensorToWrite> tensors) {
    absl::Status status = WriteSafetensorsFile(path, tensors);
    ASSERT_TRUE(status.ok()) << status;
  }
  static bool Has(const std::vector<std::string>& files, const std::string& name) {
    return std::find(files.begin(), files.end(), name) != files.end();
  }

  std::vector<float> values_ = {1, 2, 3, 4};
  ScratchDir root_;
  ScratchDir outside_;
};

TEST_F(SafetensorsSidecarTest, SidecarNextToASingleFileIsRead) {
  File(root_ / "model.safetensors", {T("main.weight")});
  File(root_ / "mtp.safetensors", {T("model.layers.2.eh_proj.weight")});
  WriteBytes(root_ / "notes.txt", "not weights");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_NE(source->Find("model.layers.2.eh_proj.weight"), nullptr);
  EXPECT_EQ(source->Find("model.layers.2.eh_proj.weight")->origin, "mtp.safetensors");
  EXPECT_NE(source->Find("main.weight"), nullptr);
  EXPECT_EQ(source->records().size(), 2u);
  EXPECT_TRUE(Has(source->provenance().files, "mtp.safetensors"));
  EXPECT_TRUE(Has(source->provenance().files, "model.safetensors"));
}

TEST_F(SafetensorsSidecarTest, SidecarMissingFromTheIndexIsRead) {
  File(root_ / "model-00001-of-00002.safetensors", {T("a")});
  File(root_ / "model-00002-of-00002.safetensors", {T("b")});
  File(root_ / "mtp.safetensors", {T("m")});
  WriteBytes(root_ / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                "b": "model-00002-of-00002.safetensors"}})");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->records().size(), 3u);
  EXPECT_NE(source->Find("m"), nullptr);
  EXPECT_TRUE(Has(source->provenance().files, "mtp.safetensors"));
}

TEST_F(SafetensorsSidecarTest, FileTheIndexNamesIsReadOnce) {
  File(root_ / "model-00001-of-00001.safetensors", {T("a")});
  File(root_ / "mtp.safetensors", {T("m")});
  WriteBytes(root_ / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00001.safetensors",
                                "m": "mtp.safetensors"}})");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->records().size(), 2u);
  EXPECT_EQ(std::count(source->provenance().files.begin(), source->provenance().files.end(),
                       "mtp.safetensors"),
            1);
}

TEST_F(SafetensorsSidecarTest, MainShardNamedFilesAreNeverSidecars) {
  File(root_ / "model-00001-of-00001.safetensors", {T("a")});
  // Left over from another download: named like main shards, not in the index.
  File(root_ / "model-00002-of-00004.safetensors", {T("stale")});
  File(root_ / "model.safetensors", {T("stale_single")});
  WriteBytes(root_ / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->records().size(), 1u);
  EXPECT_EQ(source->Find("stale"), nullptr);
  EXPECT_EQ(source->Find("stale_single"), nullptr);

  // Same with a single main file: a stray shard-named file is not read.
  ScratchDir single;
  File(single / "model.safetensors", {T("a")});
  File(single / "model-00001-of-00002.safetensors", {T("stale")});
  absl::StatusOr<WeightSource> one = OpenSafetensorsCheckpoint(single.path());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->records().size(), 1u);
}

TEST_F(SafetensorsSidecarTest, TensorInTwoFilesIsAnErrorNamingBoth) {
  File(root_ / "model.safetensors", {T("a"), T("shared")});
  File(root_ / "mtp.safetensors", {T("shared")});
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_FALSE(source.ok());
  EXPECT_CONTAINS(source.status().message(), "shared");
  EXPECT_CONTAINS(source.status().message(), "model.safetensors");
  EXPECT_CONTAINS(source.status().message(), "mtp.safetensors");
}

TEST_F(SafetensorsSidecarTest, SymlinkLeavingTheDirectoryIsRefused) {
  File(root_ / "model.safetensors", {T("a")});
  File(outside_ / "secret.safetensors", {T("secret")});
  fs::create_symlink(outside_ / "secret.safetensors", root_ / "mtp.safetensors");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kPermissionDenied) << source.status();
  EXPECT_CONTAINS(source.status().message(), "mtp.safetensors");
}

TEST_F(SafetensorsSidecarTest, SymlinkInsideTheDirectoryIsRead) {
  File(root_ / "model.safetensors", {T("a")});
  fs::create_directories(root_ / "extra");
  File(root_ / "extra" / "mtp_weights.safetensors", {T("m")});
  fs::create_symlink("extra/mtp_weights.safetensors", root_ / "mtp.safetensors");
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_NE(source->Find("m"), nullptr);
}

TEST_F(SafetensorsSidecarTest, CorruptSidecarIsAnErrorNamingIt) {
  File(root_ / "model.safetensors", {T("a")});
  WriteBytes(root_ / "mtp.safetensors", "short");  // shorter than the header length
  absl::StatusOr<WeightSource> source = OpenSafetensorsCheckpoint(root_.path());
  ASSERT_FALSE(source.ok());
  EXPECT_CONTAINS(source.status().message(), "mtp.safetensors");
}

}  // namespace
}  // namespace kiln
