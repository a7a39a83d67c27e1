// Connection helpers shared by the gRPC commands of `kiln` (cli_grpc.cc, cli_models.cc).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

namespace kiln::cli {

// A channel to --server: TLS with --tls-ca (or --tls), otherwise plaintext.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel();

// Applies --timeout to a call.
void SetDeadline(grpc::ClientContext* context);

// Adds "authorization: Bearer TOKEN" from --admin-token or --admin-token-file, if given.
absl::Status AddAdminToken(grpc::ClientContext* context);

// gRPC and absl share status code numbers.
absl::Status FromGrpc(const grpc::Status& status);

// The message as indented JSON with the proto's field names.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

}  // namespace kiln::cli
