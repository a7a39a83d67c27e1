#include "server/request_limits.h"

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status ValidateRequestLimits(const RequestLimits& limits) {
  if (limits.max_stop_strings < 0) {
    return absl::InvalidArgumentError("max_stop_strings must not be negative");
  }
  if (limits.max_stop_string_bytes < 1) {
    return absl::InvalidArgumentError("max_stop_string_bytes must be at least 1");
  }
  if (limits.max_choices < 1 || limits.max_choices > kMaxChoicesPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_choices must be in [1, ", kMaxChoicesPerRequest, "]"));
  }
  if (limits.max_logprobs < 0 || limits.max_logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_logprobs must be in [0, ", kMaxLogprobs, "]"));
  }
  // gRPC takes the message bound as an int.
  if (limits.max_request_bytes < 1024 || limits.max_request_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("max_request_bytes must be in [1 KiB, 1 GiB]");
  }
  if (limits.http_read_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("http_read_timeout must be positive");
  }
  return absl::OkStatus();
}

absl::Status CheckStopStrings(const std::vector<std::string>& stop, absl::string_view field,
                              const RequestLimits& limits) {
  if (stop.size() > static_cast<size_t>(limits.max_stop_strings)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", stop.size(), " stop strings are more than this server's limit of ",
        limits.max_stop_strings, " (--max-stop-strings)"));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: must not be empty"));
    }
    if (stop[i].size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "]: ", stop[i].size(), " bytes are more than this server's limit of ",
          limits.max_stop_string_bytes, " (--max-stop-string-bytes)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLogprobs(int64_t count, absl::string_view field, const RequestLimits& limits) {
  if (count < 0 || count > limits.max_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be in [0, ", limits.max_logprobs,
                                                   "], got ", count, " (--max-logprobs)"));
  }
  return absl::OkStatus();
}

absl::Status CheckChoices(int64_t choices, absl::string_view how, const RequestLimits& limits) {
  if (choices > limits.max_choices) {
    return absl::InvalidArgumentError(absl::StrCat("n: ", how, " asks for ", choices,
                                                   " choices, more than this server's limit of ",
                                                   limits.max_choices, " (--max-choices)"));
  }
  return absl::OkStatus();
}

}  // namespace kiln
