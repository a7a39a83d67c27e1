// Private helpers shared by the safetensors reader and writer (not part of the loaders API).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kiln::loader_internal {

// Parses `text` as one JSON value. Unlike nlohmann's default (last key wins), an object with a
// repeated key at any depth is refused, naming the key. `what` names the source in errors
// (e.g. "header of /m/model.safetensors"). Never throws.
absl::StatusOr<nlohmann::json> ParseJsonStrict(absl::string_view text, absl::string_view what);

// Short description of a JSON value's type for errors ("string", "array", ...).
absl::string_view JsonTypeName(const nlohmann::json& value);

// Writes the concatenation of `pieces` to `path` via a temporary file in the same directory
// that is fsynced and renamed over `path`, so a crash never leaves a partial file at `path`.
absl::Status WriteFileAtomically(const std::filesystem::path& path,
                                 std::span<const std::span<const std::byte>> pieces);

}  // namespace kiln::loader_internal
