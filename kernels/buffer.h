// Memory that a backend owns: where it lives (Device), the allocator that made it
// (MemoryResource) and a move-only RAII handle (DeviceBuffer) that gives it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace kiln {

enum class DeviceKind : uint8_t { kHost, kCuda };

// Where bytes live. Host memory is what the CPU reads and writes directly.
struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int32_t ordinal = 0;  // which GPU, for kCuda

  bool is_host() const { return kind == DeviceKind::kHost; }
  std::string ToString() const;  // "host", "cuda:0"
  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.ordinal == b.ordinal;
  }
};

// A backend's allocator. Buffers keep their resource alive, so memory can outlive the backend
// object that handed it out without dangling.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual Device device() const = 0;
  // `bytes` > 0. ResourceExhausted when the device has no room.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* data, size_t bytes) noexcept = 0;
};

// Bytes allocated by a backend, freed by the resource that allocated them. Move-only, so memory
// is never shared or freed twice by accident.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // For backends: takes ownership of `data` (`bytes` long) allocated by `resource`.
  DeviceBuffer(std::shared_ptr<MemoryResource> resource, void* data, size_t bytes)
      : resource_(std::move(resource)), data_(data), bytes_(bytes) {}
  // Allocates `bytes` from `resource`; an empty buffer for 0 bytes.
  static absl::StatusOr<DeviceBuffer> Allocate(std::shared_ptr<MemoryResource> resource,
                                               size_t bytes);
  ~DeviceBuffer() { Reset(); }

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : resource_(std::move(other.resource_)),
        data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      resource_ = std::move(other.resource_);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  size_t size() const { return bytes_; }
  Device device() const { return resource_ ? resource_->device() : Device{}; }
  explicit operator bool() const { return data_ != nullptr; }
  // True if [p, p + bytes) lies inside this buffer.
  bool Contains(const void* p, size_t bytes) const {
    const auto* b = static_cast<const std::byte*>(p);
    return data_ != nullptr && b >= data() && b + bytes <= data() + bytes_;
  }

  void Reset() noexcept {
    if (data_ != nullptr) resource_->Deallocate(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
    resource_.reset();
  }

 private:
  std::shared_ptr<MemoryResource> resource_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kiln
