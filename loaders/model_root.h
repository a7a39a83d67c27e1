// Files of a model are opened only after they resolve inside the model's root directory.
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace kiln {

// Canonical path of `relative` under `root`, following symlinks; PermissionDenied if it leaves
// the root (absolute path, `..`, symlink to outside), NotFound if it does not exist.
absl::StatusOr<std::filesystem::path> ResolveInsideRoot(const std::filesystem::path& root,
                                                        const std::string& relative);

}  // namespace kiln
