// OpenAI request bodies → typed requests. Pure parsing and validation: every error is
// InvalidArgument (or Unimplemented for a feature kiln does not serve) and starts with the field
// at fault ("temperature: must be at least 0, got -1"), which the error body's `param` repeats.
// Fields kiln does not know are ignored, as vLLM ignores them; fields whose meaning kiln cannot
// honour (logit_bias, response_format json, echo, suffix, ...) are refused rather than ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/sampling.h"
#include "nlohmann/json.hpp"
#include "server/request_limits.h"

namespace kiln {

// What chat and completion requests share.
struct OpenAiSampling {
  std::string model;
  std::optional<int32_t> max_tokens;  // max_tokens or max_completion_tokens; unset: the default
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t n = 1;  // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities: chat's logprobs/top_logprobs, completions' logprobs = N.
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

struct ChatCompletionRequest {
  OpenAiSampling common;
  // The messages as the template sees them: content parts joined into one string, tool call
  // arguments parsed from their JSON strings (as vLLM does), other fields as sent.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null when none
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = false;  // the template writes BOS itself
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
};

using CompletionPrompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  OpenAiSampling common;
  std::vector<CompletionPrompt> prompts;
  bool add_special_tokens = true;
};

// vLLM's /tokenize: a prompt, or messages rendered through the chat template.
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;
  std::optional<ChatCompletionRequest> chat;  // set when `messages` is
  bool add_special_tokens = true;             // default false with messages
  bool return_token_strs = false;
};

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

// `body` is the raw request body; it must be a JSON object. `limits` bound stop strings,
// choices (prompts × n) and logprobs (default: the server's defaults).
absl::StatusOr<ChatCompletionRequest> ParseChatCompletionRequest(absl::string_view body,
                                                                 const RequestLimits& limits = {});
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body,
                                                         const RequestLimits& limits = {});
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body,
                                                     const RequestLimits& limits = {});
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);

}  // namespace kiln
