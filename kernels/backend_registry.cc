#include "kernels/backend_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(KILN_HAVE_CUDA)
#include "kernels/cuda/cuda_status.h"
#endif

namespace kiln {
namespace {

struct Entry {
  absl::string_view name;
  // Empty when available.
  std::string (*unavailable)();
  absl::StatusOr<std::unique_ptr<Backend>> (*create)();
};

std::string AlwaysAvailable() { return ""; }
std::string NoCudaBackend() {
#if defined(KILN_HAVE_CUDA)
  // The probe runs once: without a driver the runtime's error is sticky anyway.
  static const std::string reason = [] {
    const std::string no_device = cuda::NoDeviceReason();
    if (!no_device.empty()) return no_device;
    return absl::StrCat("found ", cuda::DeviceDescription(),
                        ", but this build's CUDA backend has no kernels yet");
  }();
  return reason;
#else
  return "this build of kiln has no CUDA backend (configured without the CUDA toolkit)";
#endif
}
absl::StatusOr<std::unique_ptr<Backend>> NoBackend() {
  return absl::FailedPreconditionError("backend not built");
}

const Entry kEntries[] = {
    {"cpu", &AlwaysAvailable, &CreateCpuBackend},
    {"cuda", &NoCudaBackend, &NoBackend},
};

const Entry* Find(absl::string_view name) {
  for (const Entry& entry : kEntries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

}  // namespace

std::vector<BackendInfo> ListBackends() {
  std::vector<BackendInfo> list;
  for (const Entry& entry : kEntries) {
    std::string reason = entry.unavailable();
    list.push_back({std::string(entry.name), reason.empty(), std::move(reason)});
  }
  return list;
}

std::string AvailableBackendNames() {
  std::vector<std::string> names;
  for (const BackendInfo& info : ListBackends()) {
    if (info.available) names.push_back(info.name);
  }
  return absl::StrJoin(names, ", ");
}

absl::Status CheckBackendAvailable(absl::string_view name) {
  const Entry* entry = Find(name);
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("backend: '", name, "' is not a backend (",
                                                   "available: ", AvailableBackendNames(), ")"));
  }
  if (std::string reason = entry->unavailable(); !reason.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("backend: '", name, "' is not available: ", reason,
                     " (available: ", AvailableBackendNames(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name) {
  if (absl::Status status = CheckBackendAvailable(name); !status.ok()) return status;
  return Find(name)->create();
}

}  // namespace kiln
