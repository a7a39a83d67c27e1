#include "models/kv_cache.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln {

absl::StatusOr<KvCache> KvCache::Create(Backend& backend, int64_t layers, int64_t kv_dim,
                                        int64_t capacity) {
  if (capacity <= 0) return absl::InvalidArgumentError("KV cache capacity must be positive");
  if (layers <= 0 || kv_dim <= 0) {
    return absl::InvalidArgumentError("a KV cache needs layers and kv_dim");
  }
  const size_t bytes = static_cast<size_t>(layers) * 2 * static_cast<size_t>(capacity) *
                       static_cast<size_t>(kv_dim) * sizeof(float);
  absl::StatusOr<DeviceBuffer> storage = backend.Allocate(bytes);
  if (!storage.ok()) {
    return KilnAnnotate(storage.status(), absl::StrCat("KV cache of ", bytes, " bytes"));
  }
  return KvCache(std::move(*storage), layers, capacity, kv_dim);
}

}  // namespace kiln
