// What one request may ask for, shared by the gRPC and HTTP front ends. Every refusal is
// InvalidArgument naming the field, the limit and the flag that sets it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln {

// The engine's bound on top logprobs per token (OpenAI's too).
inline constexpr int32_t kMaxLogprobs = 20;
// The largest --max-choices: choices of one request are sequences of one engine step.
inline constexpr int32_t kMaxChoicesPerRequest = 128;

struct RequestLimits {
  int32_t max_stop_strings = 16;        // --max-stop-strings
  int32_t max_stop_string_bytes = 512;  // --max-stop-string-bytes
  int32_t max_choices = 16;             // --max-choices: OpenAI's n (× prompts for completions)
  int32_t max_logprobs = kMaxLogprobs;  // --max-logprobs: logprobs, top_logprobs
  // --max-request-bytes: an HTTP body (413 above it) and a gRPC message (RESOURCE_EXHAUSTED).
  int64_t max_request_bytes = int64_t{8} << 20;
  // --http-read-timeout: an HTTP request's body must arrive within this of its header (408).
  absl::Duration http_read_timeout = absl::Seconds(30);
};

// InvalidArgument naming the flag of a limit out of its range.
absl::Status ValidateRequestLimits(const RequestLimits& limits);

// `field` names the stop list in the request ("stop", "stopping.stop").
absl::Status CheckStopStrings(const std::vector<std::string>& stop, absl::string_view field,
                              const RequestLimits& limits);
absl::Status CheckLogprobs(int64_t count, absl::string_view field, const RequestLimits& limits);
// `choices`: the sequences one request asks for; `how` says how they were counted ("n = 20",
// "3 prompts x n = 8").
absl::Status CheckChoices(int64_t choices, absl::string_view how, const RequestLimits& limits);

}  // namespace kiln
