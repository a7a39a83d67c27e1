// Path confinement: every file kiln opens for a model, and every model path a client names,
// must resolve (symlinks and `..` followed) inside a directory it is allowed to read. One rule,
// Confine, decides for both the files inside a model directory and the model roots of a server.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Where a path leads. `roots` are canonical directories.
struct Confinement {
  enum Result { kInside, kOutside, kMissing } result = kMissing;
  // kInside: the canonical path; kOutside: where it leads (lexically, through symlinks, or a
  // dangling symlink's target); kMissing: the path as given.
  std::filesystem::path path;
  std::string reason;  // kMissing: why it cannot be resolved
};
// Refuses a path whose lexical form (`..` removed) or symlink-resolved form leaves every root,
// even when its target does not exist; else it is inside once it exists.
Confinement Confine(std::span<const std::filesystem::path> roots,
                    const std::filesystem::path& candidate);

// Canonical path of `relative` under `root`, following symlinks; PermissionDenied if it leaves
// the root (absolute path, `..`, symlink to outside), NotFound if it does not exist.
absl::StatusOr<std::filesystem::path> ResolveInsideRoot(const std::filesystem::path& root,
                                                        const std::string& relative);

// The directories a server's models must resolve into.
class ModelRoots {
 public:
  // Fails if a root does not exist or is not a directory. Empty roots are skipped; duplicates
  // (after resolving) are kept once.
  static absl::StatusOr<ModelRoots> Create(const std::vector<std::string>& roots);

  // The canonical model directory or file for `path`: absolute, or relative to a root (tried in
  // order). PermissionDenied when it resolves outside every root or no root is configured;
  // NotFound when it does not exist. `what` names the field in errors.
  absl::StatusOr<std::filesystem::path> Resolve(const std::string& path,
                                                absl::string_view what) const;
  // A file that need not exist yet (an output): its directory must resolve inside a root, and the
  // file itself must not be a symlink.
  absl::StatusOr<std::filesystem::path> ResolveNewFile(const std::string& path,
                                                       absl::string_view what) const;

  const std::vector<std::filesystem::path>& paths() const { return roots_; }
  bool empty() const { return roots_.empty(); }
  std::string List() const;  // "a, b"

 private:
  std::vector<std::filesystem::path> roots_;
};

}  // namespace kiln
