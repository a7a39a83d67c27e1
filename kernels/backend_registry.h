// Backends by name: what LoadModel's `backend` field and kiln-server's --backend choose from.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace kiln {

inline constexpr absl::string_view kDefaultBackend = "cpu";

struct BackendInfo {
  std::string name;
  bool available = false;
  std::string unavailable_reason;  // why not, when !available
};

// Every backend kiln knows, in a fixed order ("cpu" first).
std::vector<BackendInfo> ListBackends();
// The available ones, comma-separated: "cpu".
std::string AvailableBackendNames();

// InvalidArgument for an unknown name, FailedPrecondition for a known one that this build or
// machine cannot run; both name the available backends.
absl::Status CheckBackendAvailable(absl::string_view name);
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name);

}  // namespace kiln
