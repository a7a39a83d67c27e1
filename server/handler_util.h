// What every RPC handler shares: exceptions never cross into gRPC, and every error goes through
// ToGrpcStatus.
#pragma once

#include <exception>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "grpcpp/support/status.h"
#include "server/grpc_status.h"

namespace kiln {

template <typename Body>
grpc::Status RunHandler(const char* rpc, Body&& body) {
  absl::Status status;
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError(absl::StrCat(rpc, ": out of memory"));
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat(rpc, ": ", e.what()));
  } catch (...) {
    status = absl::InternalError(absl::StrCat(rpc, ": unknown exception"));
  }
  if (!status.ok()) VLOG(1) << rpc << " failed: " << status;
  if (status.code() == absl::StatusCode::kInternal) LOG(ERROR) << rpc << " failed: " << status;
  return ToGrpcStatus(status);
}

}  // namespace kiln
