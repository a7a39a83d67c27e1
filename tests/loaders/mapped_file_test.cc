#include "loaders/mapped_file.h"

#include <cstdint>
#include <cstring>
#include <span>
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

// A file of 2 MiB or more lies at a 2 MiB-aligned address, so that the kernel can map it in 2 MiB
// pages where the page cache holds large folios; Populate makes it resident.
TEST(MappedFileTest, LargeFileIsMappedAtA2MiBBoundaryAndPopulates) {
  ScratchDir dir;
  std::string content(size_t{5} << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 131 % 251);
  WriteBytes(dir / "big.bin", content);
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir / "big.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::span<const std::byte> bytes = (*file)->bytes();
  ASSERT_EQ(bytes.size(), content.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes.data()) % (uintptr_t{2} << 20), 0u);
  (*file)->Populate(bytes.subspan(3, bytes.size() - 7));
  const double share = (*file)->ResidentShareInHugePages();
  EXPECT_GE(share, 0.0);
  EXPECT_LE(share, 1.0);
  EXPECT_EQ(std::memcmp(bytes.data(), content.data(), content.size()), 0);
}

TEST(MappedFileTest, SmallFileHasNoHugePages) {
  ScratchDir dir;
  WriteBytes(dir / "f.bin", std::string(10000, 'x'));
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(dir / "f.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  (*file)->Populate((*file)->bytes());
  EXPECT_EQ((*file)->ResidentShareInHugePages(), 0.0);
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
