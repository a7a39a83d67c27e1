// Parses tokens into a syntax tree (internal to template/). Unsupported tags, filters and tests
// are InvalidArgument errors that name them and their line:column.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "template/ast.h"

namespace kiln::jinja {

absl::StatusOr<Body> ParseTemplate(absl::string_view source, int max_nesting);

// The filters and tests the evaluator implements (builtins.cc).
bool IsKnownFilter(absl::string_view name);
bool IsKnownTest(absl::string_view name);

}  // namespace kiln::jinja
