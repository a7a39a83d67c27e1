// gRPC answers a request message it cannot parse (malformed bytes, a string field that is not
// valid UTF-8) with INTERNAL and no message, before any kiln code runs. This interceptor turns
// that answer into INVALID_ARGUMENT naming the method and what is wrong with the message.
#pragma once

#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace kiln {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory();

}  // namespace kiln
