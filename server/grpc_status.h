// The one place where kiln's absl::Status errors become gRPC statuses (design.md §2). Every
// handler returns through ToGrpcStatus, so a code means the same thing on every RPC:
//   INVALID_ARGUMENT     a bad request; the message names the field
//   NOT_FOUND            unknown model (or a model path that does not exist)
//   FAILED_PRECONDITION  the model is not READY (loading, unloading, failed) or lacks what the
//                        request needs (e.g. a tokenizer)
//   RESOURCE_EXHAUSTED   the model's queue is full
//   PERMISSION_DENIED    wrong admin token; model path outside the model roots
//   UNAUTHENTICATED      no admin token sent where one is required
//   ALREADY_EXISTS       LoadModel of a name that is already registered
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kiln {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kiln
