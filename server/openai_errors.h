// The one place where kiln's absl::Status errors become HTTP statuses and OpenAI error bodies
// (design.md §2; grpc_status.h is its gRPC twin). Every OpenAI handler answers errors through
// ErrorResponse, so a status code means the same thing on every endpoint:
//   400 invalid_request_error  InvalidArgument, OutOfRange, FailedPrecondition (the request
//                              cannot be served as sent: a bad field, which the message and
//                              `param` name; no chat template; no tokenizer)
//   401 authentication_error   Unauthenticated (missing or wrong API key)
//   403 permission_error       PermissionDenied
//   404 not_found_error        NotFound (unknown model or route)
//   409 conflict_error         AlreadyExists, Aborted
//   413 invalid_request_error  (the HTTP layer: a request body over the limit)
//   429 rate_limit_error       ResourceExhausted (the model's queue is full)
//   499 cancelled              Cancelled (the client went away; nobody reads it)
//   501 not_implemented_error  Unimplemented
//   503 service_unavailable    Unavailable (model loading or unloading, server shutting down)
//   504 timeout_error          DeadlineExceeded
//   500 server_error           everything else
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "http/http_server.h"

namespace kiln {

struct HttpErrorKind {
  int status = 500;
  absl::string_view type;  // OpenAI's error `type`
};

HttpErrorKind HttpErrorFor(absl::StatusCode code);

// {"error": {"message", "type", "param", "code"}}. `param` is the field the message names
// ("temperature: must be ..." → "temperature"), else null; `code` is the HTTP status, as vLLM
// sends it.
std::string OpenAiErrorJson(const absl::Status& status, int http_status = 0);

// The whole error response (status, JSON body). `http_status` > 0 overrides the mapping (405
// for a method a path does not take, say).
HttpResponse ErrorResponse(const absl::Status& status, int http_status = 0);

// The field an error message starts with ("messages[2].content: ..." → "messages[2].content"),
// or "" when it starts with none.
std::string ErrorParam(absl::string_view message);

}  // namespace kiln
