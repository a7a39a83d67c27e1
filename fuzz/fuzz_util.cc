#include "fuzz/fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include "glog/logging.h"

namespace kiln::fuzz {
namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "fuzz target setup: %s\n", message.c_str());
  std::abort();
}

}  // namespace

const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path dir = [] {
    std::error_code ec;
    std::filesystem::path base = "/dev/shm";
    if (access(base.c_str(), W_OK) != 0) base = std::filesystem::temp_directory_path();
    std::filesystem::path path = base / ("kiln-fuzz-" + std::to_string(getpid()));
    std::filesystem::remove_all(path, ec);
    std::filesystem::create_directories(path, ec);
    if (ec) Die("cannot create " + path.string() + ": " + ec.message());
    // Removed at exit so that repeated runs do not fill the RAM disk.
    static const std::string to_remove = path.string();
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(to_remove, ignored);
    });
    return path;
  }();
  return dir;
}

void WriteFileOrDie(const std::filesystem::path& path, absl::string_view bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Die("cannot open " + path.string());
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) Die("cannot write " + path.string());
    written += static_cast<size_t>(n);
  }
  close(fd);
}

void ClearDir(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::filesystem::remove_all(entry.path(), ec);
  }
}

std::filesystem::path SourcePath(const std::string& relative_path) {
  return std::filesystem::path(KILN_FUZZ_SOURCE_DIR) / relative_path;
}

std::string ReadSourceFileOrDie(const std::string& relative_path) {
  const std::filesystem::path path = SourcePath(relative_path);
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<absl::string_view> SplitParts(absl::string_view data, absl::string_view separator) {
  std::vector<absl::string_view> parts;
  while (true) {
    const size_t at = data.find(separator);
    if (at == absl::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + separator.size());
  }
  parts.push_back(data);
  return parts;
}

void TouchBytes(std::span<const std::byte> bytes) {
  unsigned sum = 0;
  for (std::byte b : bytes) sum += static_cast<unsigned>(b);
  // Keeps the loop from being optimized away.
  asm volatile("" : : "r"(sum) : "memory");
}

}  // namespace kiln::fuzz

// Called by libFuzzer once before the first input: the loaders log every load, which would
// drown libFuzzer's own output; a crash is reported by the sanitizers, not by logs.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  FLAGS_minloglevel = google::GLOG_FATAL;
  return 0;
}
