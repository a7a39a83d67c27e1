#include "loaders/model_root.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// True if `path` is `root` or lies below it; both are absolute and normalized, compared by
// whole components (so /models/a2 is not inside /models/a).
bool IsWithin(const fs::path& root, const fs::path& path) {
  return std::mismatch(root.begin(), root.end(), path.begin(), path.end()).first == root.end();
}

absl::Status Escapes(const fs::path& root, const std::string& relative, const fs::path& target) {
  return absl::PermissionDeniedError(
      absl::StrCat("model file '", relative, "' resolves to ", target.string(),
                   ", which leaves the model directory ", root.string()));
}

}  // namespace

absl::StatusOr<fs::path> ResolveInsideRoot(const fs::path& root, const std::string& relative) {
  if (relative.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty file name in model directory ", root.string()));
  }
  const fs::path rel(relative);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    return absl::PermissionDeniedError(
        absl::StrCat("model file '", relative, "' is an absolute path, which leaves the model ",
                     "directory ", root.string()));
  }

  std::error_code ec;
  const fs::path canonical_root = fs::canonical(root, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("model directory ", root.string(), " cannot be resolved: ", ec.message()));
  }

  const fs::path joined = canonical_root / rel;
  // Lexical check first: `..` escapes are refused even when the target does not exist.
  const fs::path lexical = joined.lexically_normal();
  if (!IsWithin(canonical_root, lexical)) return Escapes(canonical_root, relative, lexical);

  // Follows every symlink along the way (a directory symlink included).
  const fs::path weak = fs::weakly_canonical(joined, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("model file '", relative, "' in ", root.string(),
                                            " cannot be resolved: ", ec.message()));
  }
  if (!IsWithin(canonical_root, weak)) return Escapes(canonical_root, relative, weak);

  // A dangling symlink: report where it points if that is outside, else it is just missing.
  if (fs::is_symlink(fs::symlink_status(joined, ec)) && !fs::exists(joined, ec)) {
    fs::path link_target = fs::read_symlink(joined, ec);
    if (!ec) {
      fs::path absolute_target =
          (link_target.is_absolute() ? link_target : joined.parent_path() / link_target)
              .lexically_normal();
      if (!IsWithin(canonical_root, absolute_target)) {
        return Escapes(canonical_root, relative, absolute_target);
      }
    }
  }

  const fs::path resolved = fs::canonical(joined, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("model file '", relative, "' not found in ",
                                            root.string(), ": ", ec.message()));
  }
  if (!IsWithin(canonical_root, resolved)) return Escapes(canonical_root, relative, resolved);
  return resolved;
}

}  // namespace kiln
