// Writers under faults: a writer killed mid-write leaves no file under the final name (only its
// temporary), and a full disk gives a clear error and removes the temporary. Both run the real
// tensorizer writer (what `kiln tensorize` and the server's Tensorize call) in a child process.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "loaders/tensorizer_writer.h"
#include "tests/loaders/test_util.h"

namespace kiln::tensorizer {
namespace {

namespace fs = std::filesystem;
using testing_util::ScratchDir;

// Read-only zero pages: a large tensor that costs no memory.
class ZeroBytes {
 public:
  explicit ZeroBytes(size_t size) : size_(size) {
    void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = address == MAP_FAILED ? nullptr : static_cast<const std::byte*>(address);
  }
  ~ZeroBytes() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  ZeroBytes(const ZeroBytes&) = delete;
  ZeroBytes& operator=(const ZeroBytes&) = delete;
  const std::byte* data() const { return data_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

WriteTensor ZeroTensor(const ZeroBytes& bytes, int64_t elements) {
  WriteTensor tensor;
  tensor.name = "weight";
  tensor.element_type = ElementType::kF32;
  tensor.shape = {elements};
  tensor.data = bytes.data();
  tensor.size = static_cast<size_t>(elements) * 4;
  return tensor;
}

// Names in `dir` that start with `prefix`.
std::vector<std::string> EntriesStartingWith(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> names;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix)) names.push_back(name);
  }
  return names;
}

TEST(WriteFaultsTest, AWriterKilledMidWriteLeavesNoFileUnderTheFinalName) {
  ScratchDir dir;
  const fs::path path = dir.path() / "model.tensors";
  const std::string temporary_prefix = ".model.tensors.tmp-";
  constexpr int64_t kElements = int64_t{96} << 20;  // 384 MiB: writing takes a while
  ZeroBytes zeros(static_cast<size_t>(kElements) * 4);
  ASSERT_NE(zeros.data(), nullptr);
  const WriteTensor tensor = ZeroTensor(zeros, kElements);

  bool killed_mid_write = false;
  for (int attempt = 0; attempt < 3 && !killed_mid_write; ++attempt) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << std::strerror(errno);
    if (child == 0) {
      const absl::Status status = WriteTensorizerFile(path, {&tensor, 1});
      ::_exit(status.ok() ? 0 : 1);
    }
    // Kill it as soon as its temporary holds some bytes.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      bool writing = false;
      for (const std::string& name : EntriesStartingWith(dir.path(), temporary_prefix)) {
        std::error_code error;
        if (fs::file_size(dir.path() / name, error) > 0 && !error) writing = true;
      }
      int status = 0;
      if (writing || ::waitpid(child, &status, WNOHANG) == child) {
        if (writing) ::kill(child, SIGKILL);
        if (writing) ::waitpid(child, &status, 0);
        killed_mid_write = writing && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        break;
      }
      absl::SleepFor(absl::Microseconds(200));
    }
    EXPECT_FALSE(fs::exists(path) && killed_mid_write)
        << "a partial file is under the final name " << path;
    std::error_code ignored;
    fs::remove(path, ignored);
    for (const std::string& name : EntriesStartingWith(dir.path(), temporary_prefix)) {
      if (killed_mid_write) {
        EXPECT_LT(fs::file_size(dir.path() / name), tensor.size) << "the kill came too late";
      }
      fs::remove(dir.path() / name, ignored);
    }
  }
  ASSERT_TRUE(killed_mid_write) << "the writer finished before it could be killed, 3 times";

  // The next write completes, under the final name only.
  ASSERT_TRUE(WriteTensorizerFile(path, {&tensor, 1}).ok());
  EXPECT_GT(fs::file_size(path), tensor.size);
  EXPECT_TRUE(EntriesStartingWith(dir.path(), temporary_prefix).empty());
}

// Exit codes of the full-disk child.
constexpr int kChildPassed = 0;
constexpr int kChildNoTmpfs = 3;  // could not mount a small tmpfs: the test skips

TEST(WriteFaultsTest, AFullDiskIsAClearErrorAndRemovesTheTemporary) {
  ScratchDir dir;
  const fs::path mount_point = dir.path() / "small";
  const fs::path report = dir.path() / "report.txt";
  fs::create_directories(mount_point);
  constexpr int64_t kElements = int64_t{1} << 20;  // 4 MiB onto a 1 MiB file system
  ZeroBytes zeros(static_cast<size_t>(kElements) * 4);
  ASSERT_NE(zeros.data(), nullptr);
  const WriteTensor tensor = ZeroTensor(zeros, kElements);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // A mount namespace of its own (with a user namespace when not root), so that the tmpfs
    // is gone with the child.
    const bool root = ::geteuid() == 0;
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(root ? CLONE_NEWNS : (CLONE_NEWUSER | CLONE_NEWNS)) != 0) ::_exit(kChildNoTmpfs);
    if (!root) {
      std::ofstream("/proc/self/setgroups") << "deny";
      std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
      std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("kiln-full", mount_point.c_str(), "tmpfs", 0, "size=1m") != 0) {
      ::_exit(kChildNoTmpfs);
    }
    const absl::Status status = WriteTensorizerFile(mount_point / "model.tensors", {&tensor, 1});
    std::ofstream out(report);
    out << static_cast<int>(status.code()) << "\n" << status.message() << "\n";
    for (const fs::directory_entry& entry : fs::directory_iterator(mount_point)) {
      out << "left: " << entry.path().filename().string() << "\n";
    }
    out.close();
    ::_exit(kChildPassed);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kChildNoTmpfs) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root or unprivileged user "
                    "namespaces); the full-disk case is not exercised";
  }
  ASSERT_EQ(WEXITSTATUS(status), kChildPassed);
  std::ifstream in(report);
  std::string code_line, message, line;
  std::getline(in, code_line);
  std::getline(in, message);
  EXPECT_EQ(code_line, std::to_string(static_cast<int>(absl::StatusCode::kResourceExhausted)))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "No space left on device")) << message;
  EXPECT_TRUE(absl::StrContains(message, "model.tensors")) << message;
  while (std::getline(in, line)) ADD_FAILURE() << "the writer left " << line;
}

}  // namespace
}  // namespace kiln::tensorizer
