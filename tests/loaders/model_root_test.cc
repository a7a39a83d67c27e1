#include "loaders/model_root.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

class ModelRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteBytes(root_ / "model.safetensors", "x");
    WriteBytes(root_ / "sub" / "shard.safetensors", "y");
    WriteBytes(outside_ / "secret.safetensors", "z");
  }
  void ExpectEscape(const std::string& relative) {
    absl::StatusOr<fs::path> resolved = ResolveInsideRoot(root_.path(), relative);
    ASSERT_FALSE(resolved.ok()) << relative << " resolved to " << *resolved;
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied) << resolved.status();
    EXPECT_CONTAINS(resolved.status().message(), relative);
    EXPECT_CONTAINS(resolved.status().message(), "leaves the model directory");
  }
  ScratchDir root_;
  ScratchDir outside_;
};

TEST_F(ModelRootTest, PlainAndNestedFilesResolve) {
  absl::StatusOr<fs::path> a = ResolveInsideRoot(root_.path(), "model.safetensors");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, fs::canonical(root_ / "model.safetensors"));
  absl::StatusOr<fs::path> b = ResolveInsideRoot(root_.path(), "sub/../sub/./shard.safetensors");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, fs::canonical(root_ / "sub" / "shard.safetensors"));
}

TEST_F(ModelRootTest, SymlinkInsideRootIsAccepted) {
  fs::create_symlink("sub/shard.safetensors", root_ / "link.safetensors");
  fs::create_directory_symlink("sub", root_ / "subdir_link");
  absl::StatusOr<fs::path> a = ResolveInsideRoot(root_.path(), "link.safetensors");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, fs::canonical(root_ / "sub" / "shard.safetensors"));
  absl::StatusOr<fs::path> b = ResolveInsideRoot(root_.path(), "subdir_link/shard.safetensors");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, fs::canonical(root_ / "sub" / "shard.safetensors"));
}

TEST_F(ModelRootTest, RootGivenThroughASymlinkStillWorks) {
  fs::create_directory_symlink(root_.path(), outside_ / "root_link");
  absl::StatusOr<fs::path> a = ResolveInsideRoot(outside_ / "root_link", "model.safetensors");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, fs::canonical(root_ / "model.safetensors"));
}

TEST_F(ModelRootTest, AbsolutePathIsRefused) {
  ExpectEscape((outside_ / "secret.safetensors").string());
  // Even an absolute path that happens to point inside the root: names are relative.
  ExpectEscape((root_ / "model.safetensors").string());
}

TEST_F(ModelRootTest, DotDotEscapeIsRefused) {
  ExpectEscape("../" + outside_.path().filename().string() + "/secret.safetensors");
  ExpectEscape("sub/../../x.safetensors");  // refused even though it does not exist
}

TEST_F(ModelRootTest, SymlinkLeavingRootIsRefused) {
  fs::create_symlink(outside_ / "secret.safetensors", root_ / "evil.safetensors");
  ExpectEscape("evil.safetensors");
  fs::create_symlink("../" + outside_.path().filename().string() + "/secret.safetensors",
                     root_ / "evil_relative.safetensors");
  ExpectEscape("evil_relative.safetensors");
  fs::create_directory_symlink(outside_.path(), root_ / "evil_dir");
  ExpectEscape("evil_dir/secret.safetensors");
  // `..` after a directory symlink is resolved physically, not lexically.
  ExpectEscape("evil_dir/../" + outside_.path().filename().string() + "/secret.safetensors");
}

TEST_F(ModelRootTest, SiblingWithTheRootNameAsPrefixIsOutside) {
  // /tmp/x_abc_evil is not inside /tmp/x_abc although the strings share a prefix.
  const fs::path sibling = root_.path().string() + "_evil";
  WriteBytes(sibling / "f.safetensors", "s");
  fs::create_symlink(sibling / "f.safetensors", root_ / "sibling.safetensors");
  ExpectEscape("sibling.safetensors");
  ExpectEscape("../" + sibling.filename().string() + "/f.safetensors");
  fs::remove_all(sibling);
}

TEST_F(ModelRootTest, DanglingSymlinkOutsideIsRefused) {
  fs::create_symlink(outside_ / "does_not_exist", root_ / "dangling.safetensors");
  ExpectEscape("dangling.safetensors");
}

TEST_F(ModelRootTest, MissingFileIsNotFound) {
  absl::StatusOr<fs::path> a = ResolveInsideRoot(root_.path(), "missing.safetensors");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(a.status().message(), "missing.safetensors");

  fs::create_symlink("nothing_here", root_ / "dangling_inside.safetensors");
  absl::StatusOr<fs::path> b = ResolveInsideRoot(root_.path(), "dangling_inside.safetensors");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(b.status().message(), "dangling_inside.safetensors");
}

TEST_F(ModelRootTest, MissingRootIsNotFound) {
  absl::StatusOr<fs::path> a = ResolveInsideRoot(root_ / "no_such_dir", "model.safetensors");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(a.status().message(), "no_such_dir");
}

TEST_F(ModelRootTest, EmptyNameIsRefused) {
  absl::StatusOr<fs::path> a = ResolveInsideRoot(root_.path(), "");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
