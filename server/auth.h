// The admin token that guards the Models service: "authorization: Bearer <token>" metadata.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace kiln {

// Compares in time that depends only on the lengths, never on where the strings differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The token in `path`, surrounding whitespace removed; an error naming `what` and the path if
// unreadable or empty. (The HTTP API's key file is read the same way.)
absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path,
                                               absl::string_view what = "admin token file");

// OK when `expected` is empty (no token configured) or the call carries it. Unauthenticated when
// the call has no bearer token; PermissionDenied when it has the wrong one.
absl::Status CheckAdminToken(const grpc::ServerContext& context, absl::string_view expected);

}  // namespace kiln
