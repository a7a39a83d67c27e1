#include "server/openai_errors.h"

#include "absl/strings/ascii.h"
#include "nlohmann/json.hpp"

namespace kiln {

HttpErrorKind HttpErrorFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return {200, ""};
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return {400, "invalid_request_error"};
    case absl::StatusCode::kUnauthenticated:
      return {401, "authentication_error"};
    case absl::StatusCode::kPermissionDenied:
      return {403, "permission_error"};
    case absl::StatusCode::kNotFound:
      return {404, "not_found_error"};
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return {409, "conflict_error"};
    case absl::StatusCode::kResourceExhausted:
      return {429, "rate_limit_error"};
    case absl::StatusCode::kCancelled:
      return {499, "cancelled"};
    case absl::StatusCode::kUnimplemented:
      return {501, "not_implemented_error"};
    case absl::StatusCode::kUnavailable:
      return {503, "service_unavailable"};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "timeout_error"};
    default:
      return {500, "server_error"};
  }
}

std::string ErrorParam(absl::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return "";
  const absl::string_view head = message.substr(0, colon);
  for (char c : head) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '[' &&
        c != ']') {
      return "";
    }
  }
  return std::string(head);
}

std::string OpenAiErrorJson(const absl::Status& status, int http_status) {
  HttpErrorKind kind = HttpErrorFor(status.code());
  if (http_status > 0) kind.status = http_status;
  const std::string param = ErrorParam(status.message());
  nlohmann::ordered_json error = {{"message", std::string(status.message())},
                                  {"type", std::string(kind.type)},
                                  {"param", nullptr},
                                  {"code", kind.status}};
  if (!param.empty()) error["param"] = param;
  return nlohmann::ordered_json{{"error", std::move(error)}}.dump(
      -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

HttpResponse ErrorResponse(const absl::Status& status, int http_status) {
  HttpResponse response;
  response.status = http_status > 0 ? http_status : HttpErrorFor(status.code()).status;
  response.body = OpenAiErrorJson(status, http_status);
  return response;
}

}  // namespace kiln
