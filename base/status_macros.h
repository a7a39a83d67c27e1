// Early-return helpers for absl::Status / absl::StatusOr.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define KILN_STATUS_CONCAT_INNER(a, b) a##b
#define KILN_STATUS_CONCAT(a, b) KILN_STATUS_CONCAT_INNER(a, b)

#define KILN_RETURN_IF_ERROR(expr)                                \
  do {                                                            \
    if (::absl::Status kiln_status = (expr); !kiln_status.ok()) { \
      return kiln_status;                                         \
    }                                                             \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = *std::move(tmp)

// KILN_ASSIGN_OR_RETURN(auto x, MakeX()); declares x or returns the error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_STATUS_CONCAT(kiln_statusor_, __LINE__), lhs, expr)

// The same status with `prefix: ` in front of its message (keeps the code).
inline absl::Status KilnAnnotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), std::string(prefix) + ": " + std::string(status.message()));
}
