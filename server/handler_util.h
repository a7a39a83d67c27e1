// What every handler shares: exceptions never cross into gRPC or HTTP, and every gRPC error goes
// through ToGrpcStatus (HTTP ones through openai_errors.h).
#pragma once

#include <exception>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "grpcpp/support/status.h"
#include "server/grpc_status.h"

namespace kiln {

// Runs `body` (returning absl::Status); an exception becomes a status naming `what`. Failures
// are logged: INTERNAL ones as errors, others at VLOG(1).
template <typename Body>
absl::Status RunCatching(const char* what, Body&& body) {
  absl::Status status;
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    status = absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
  if (status.code() == absl::StatusCode::kInternal) {
    LOG(ERROR) << what << " failed: " << status;
  } else if (!status.ok()) {
    VLOG(1) << what << " failed: " << status;
  }
  return status;
}

template <typename Body>
grpc::Status RunHandler(const char* rpc, Body&& body) {
  return ToGrpcStatus(RunCatching(rpc, std::forward<Body>(body)));
}

}  // namespace kiln
