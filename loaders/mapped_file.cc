#include "loaders/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

absl::Status ErrnoError(int err, const std::filesystem::path& path, absl::string_view action) {
  std::string message = absl::StrCat("cannot ", action, " ", path.string(), ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Closes the descriptor on every path out of Open unless released to the MappedFile.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::filesystem::path& path,
                                                             bool keep_descriptor) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, path, "open");
  FdCloser closer(fd);

  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, path, "stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", path.string(), ": not a regular file"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", path.string(), ": size ", st.st_size, " is out of range"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  // mmap of length 0 is an error (EINVAL); an empty file is an empty span without a mapping.
  const std::byte* data = nullptr;
  if (size != 0) {
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) return ErrnoError(errno, path, "mmap");
    data = static_cast<const std::byte*>(mapped);
  }
  return std::shared_ptr<MappedFile>(
      new MappedFile(path, data, size, keep_descriptor ? closer.Release() : -1));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_ != 0) {
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln
