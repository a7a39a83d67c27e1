#include "loaders/loader_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kiln::loader_internal {
namespace {

std::string ErrnoText(int err) { return strerror(err); }

// A full disk or quota is ResourceExhausted: the caller may free space and retry.
absl::Status WriteError(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", ErrnoText(error));
  return error == ENOSPC || error == EDQUOT || error == EFBIG
             ? absl::ResourceExhaustedError(message)
             : absl::InternalError(message);
}

absl::Status WriteAll(int fd, std::span<const std::byte> bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return WriteError(errno, absl::StrCat("cannot write ", path));
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonStrict(absl::string_view text, absl::string_view what) {
  // One key set per open object; arrays need no entry since they have no keys.
  std::vector<absl::flat_hash_set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                      nlohmann::json& parsed) -> bool {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows it; a
  // raw NUL is never valid JSON, so refuse it here.
  if (size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON: NUL byte at offset ", nul));
  }
  nlohmann::json result;
  try {
    result = nlohmann::json::parse(text.data(), text.data() + text.size(), callback,
                                   /*allow_exceptions=*/true,
                                   /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has the key \"", duplicate, "\" more than once in one object"));
  }
  return result;
}

absl::string_view JsonTypeName(const nlohmann::json& value) {
  if (value.is_number_float()) return "floating-point number";
  if (value.is_number_unsigned()) return "non-negative integer";
  if (value.is_number_integer()) return "negative integer";
  return value.type_name();
}

absl::Status WriteFileAtomically(const std::filesystem::path& path,
                                 std::span<const std::span<const std::byte>> pieces) {
  const std::filesystem::path dir =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::string tmp_template = (dir / ("." + path.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> tmp_name(tmp_template.begin(), tmp_template.end());
  tmp_name.push_back('\0');
  int fd = ::mkostemp(tmp_name.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary file for ", path.string(), ": ", ErrnoText(errno)));
  }
  const std::string tmp(tmp_name.data());
  auto fail = [&](absl::Status status) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return status;
  };
  // mkostemp creates 0600; checkpoints are ordinary readable files.
  if (::fchmod(fd, 0644) != 0) {
    return fail(absl::InternalError(absl::StrCat("cannot chmod ", tmp, ": ", ErrnoText(errno))));
  }
  for (std::span<const std::byte> piece : pieces) {
    if (absl::Status status = WriteAll(fd, piece, tmp); !status.ok()) return fail(status);
  }
  if (::fsync(fd) != 0) return fail(WriteError(errno, absl::StrCat("cannot fsync ", tmp)));
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return WriteError(error, absl::StrCat("cannot close ", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path.string(), ": ", ErrnoText(err)));
  }
  // Make the rename itself durable; failure here does not undo a complete file.
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace kiln::loader_internal
