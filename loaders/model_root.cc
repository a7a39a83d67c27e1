#include "loaders/model_root.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// True if `path` is `root` or lies below it; both are absolute and normalized, compared by
// whole components (so /models/a2 is not inside /models/a).
bool IsWithin(const fs::path& root, const fs::path& path) {
  return std::mismatch(root.begin(), root.end(), path.begin(), path.end()).first == root.end();
}

bool InsideAny(std::span<const fs::path> roots, const fs::path& path) {
  return std::any_of(roots.begin(), roots.end(),
                     [&](const fs::path& root) { return IsWithin(root, path); });
}

absl::Status Escapes(const fs::path& root, const std::string& relative, const fs::path& target) {
  return absl::PermissionDeniedError(
      absl::StrCat("model file '", relative, "' resolves to ", target.string(),
                   ", which leaves the model directory ", root.string()));
}

}  // namespace

Confinement Confine(std::span<const fs::path> roots, const fs::path& candidate) {
  auto outside = [](fs::path where) { return Confinement{Confinement::kOutside, where, ""}; };
  // Lexical check first: `..` escapes are refused even when the target does not exist.
  const fs::path lexical = candidate.lexically_normal();
  if (!InsideAny(roots, lexical)) return outside(lexical);
  // Follows every symlink along the way (a directory symlink included).
  std::error_code ec;
  const fs::path weak = fs::weakly_canonical(candidate, ec);
  if (ec) return {Confinement::kMissing, candidate, ec.message()};
  if (!InsideAny(roots, weak)) return outside(weak);
  // A dangling symlink: where it points, if that is outside; else it is just missing.
  if (fs::is_symlink(fs::symlink_status(candidate, ec)) && !fs::exists(candidate, ec)) {
    const fs::path target = fs::read_symlink(candidate, ec);
    if (!ec) {
      const fs::path absolute_target =
          (target.is_absolute() ? target : candidate.parent_path() / target).lexically_normal();
      if (!InsideAny(roots, absolute_target)) return outside(absolute_target);
    }
  }
  const fs::path resolved = fs::canonical(candidate, ec);
  if (ec) return {Confinement::kMissing, candidate, ec.message()};
  if (!InsideAny(roots, resolved)) return outside(resolved);  // canonical follows every link
  return {Confinement::kInside, resolved, ""};
}

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
  const Confinement confined = Confine({&canonical_root, 1}, canonical_root / rel);
  switch (confined.result) {
    case Confinement::kInside:
      return confined.path;
    case Confinement::kOutside:
      return Escapes(canonical_root, relative, confined.path);
    case Confinement::kMissing:
      break;
  }
  return absl::NotFoundError(absl::StrCat("model file '", relative, "' not found in ",
                                          root.string(), ": ", confined.reason));
}

absl::StatusOr<ModelRoots> ModelRoots::Create(const std::vector<std::string>& roots) {
  ModelRoots result;
  for (const std::string& root : roots) {
    if (root.empty()) continue;
    std::error_code ec;
    fs::path canonical = fs::canonical(root, ec);
    if (ec || !fs::is_directory(canonical, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model root ", root, " is not an existing directory"));
    }
    if (std::find(result.roots_.begin(), result.roots_.end(), canonical) == result.roots_.end()) {
      result.roots_.push_back(std::move(canonical));
    }
  }
  return result;
}

std::string ModelRoots::List() const {
  std::vector<std::string> names;
  for (const fs::path& root : roots_) names.push_back(root.string());
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<fs::path> ModelRoots::Resolve(const std::string& path,
                                             absl::string_view what) const {
  if (roots_.empty()) {
    return absl::PermissionDeniedError(
        "no model roots are configured, so no model may be loaded: start kiln-server with "
        "--model-root DIR (or model_roots in --config)");
  }
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": a path is required"));
  const fs::path requested(path);
  std::vector<fs::path> candidates;
  if (requested.is_absolute()) {
    candidates.push_back(requested);
  } else {
    for (const fs::path& root : roots_) candidates.push_back(root / requested);
  }
  absl::Status denied, not_found;
  for (const fs::path& candidate : candidates) {
    const Confinement confined = Confine(roots_, candidate);
    if (confined.result == Confinement::kOutside) {
      if (denied.ok()) {
        denied = absl::PermissionDeniedError(
            absl::StrCat(what, ": '", path, "' resolves to ", confined.path.string(),
                         ", which is outside the model roots (", List(), ")"));
      }
      continue;
    }
    if (confined.result == Confinement::kMissing) {
      if (not_found.ok()) {
        not_found =
            absl::NotFoundError(absl::StrCat(what, ": '", path, "' does not exist (looked in ",
                                             requested.is_absolute() ? path : List(), ")"));
      }
      continue;
    }
    std::error_code ec;
    if (!fs::is_directory(confined.path, ec) && !fs::is_regular_file(confined.path, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", confined.path.string(), " is neither a directory nor a file"));
    }
    return confined.path;
  }
  return !denied.ok() ? denied : not_found;
}

absl::StatusOr<fs::path> ModelRoots::ResolveNewFile(const std::string& path,
                                                    absl::string_view what) const {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": a file is required"));
  const fs::path requested(path);
  if (!requested.has_filename() || requested.filename() == "." || requested.filename() == "..") {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' does not name a file"));
  }
  const fs::path parent = requested.parent_path().empty() ? fs::path(".") : requested.parent_path();
  KILN_ASSIGN_OR_RETURN(fs::path dir, Resolve(parent.string(), what));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", dir.string(), " is not a directory"));
  }
  const fs::path file = dir / requested.filename();
  if (fs::is_symlink(file, ec)) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": ", file.string(), " is a symlink; kiln does not write through one"));
  }
  return file;
}

}  // namespace kiln
