// The model tests' backend: one oneDNN CPU backend shared by every test in the binary (its
// primitive cache then serves them all).
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "kernels/backend_registry.h"

namespace kiln::testing_util {

inline std::shared_ptr<Backend> CpuBackend() {
  static const std::shared_ptr<Backend> backend = [] {
    absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend("cpu");
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? std::shared_ptr<Backend>(std::move(*created)) : nullptr;
  }();
  return backend;
}

}  // namespace kiln::testing_util
