#include "loaders/mapped_file.h"

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

using testing_util::ScratchDir;
using testing_util::WriteBytes;

TEST(MappedFileTest, MapsWholeFile) {
  ScratchDir dir;
  const std::string content = "hello, mapped world";
  WriteBytes(dir / "f.bin", content);
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir / "f.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->bytes().size(), content.size());
  EXPECT_EQ(std::memcmp((*file)->bytes().data(), content.data(), content.size()), 0);
  EXPECT_EQ((*file)->path(), dir / "f.bin");
}

TEST(MappedFileTest, MappingOutlivesTheDirectoryEntry) {
  ScratchDir dir;
  WriteBytes(dir / "f.bin", "abcdef");
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir / "f.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  std::filesystem::remove(dir / "f.bin");
  EXPECT_EQ(std::memcmp((*file)->bytes().data(), "abcdef", 6), 0);
}

TEST(MappedFileTest, EmptyFileIsAnEmptySpan) {
  ScratchDir dir;
  WriteBytes(dir / "empty", "");
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir / "empty");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->bytes().empty());
}

TEST(MappedFileTest, MissingFileIsNotFoundWithPathAndReason) {
  ScratchDir dir;
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir / "nope.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(file.status().message(), (dir / "nope.bin").string());
  EXPECT_CONTAINS(file.status().message(), std::strerror(ENOENT));
}

TEST(MappedFileTest, DirectoryIsRefused) {
  ScratchDir dir;
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(file.status().message(), dir.path().string());
}

}  // namespace
}  // namespace kiln
