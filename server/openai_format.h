// The JSON shapes of OpenAI responses: chat.completion and its chat.completion.chunk stream,
// text_completion (whole and streamed), usage and both log-probability formats. Only builds
// JSON; the service decides what to send when.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace kiln {

enum class OpenAiApi { kChat, kCompletion };

// What every response and chunk of one request repeats.
struct OpenAiEnvelope {
  OpenAiApi api = OpenAiApi::kChat;
  std::string id;  // "chatcmpl-…" or "cmpl-…"
  int64_t created = 0;
  std::string model;
};

struct OpenAiUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;
};

// Log-probability settings of a request: none, or the chosen token's and `top` alternatives.
struct OpenAiLogprobs {
  bool enabled = false;
  int32_t top = 0;
};

// "stop" (a stop string, a stop token, EOS), "length", "abort" (cancelled, as vLLM says), or
// null while generating.
nlohmann::ordered_json FinishReasonJson(FinishReason reason);

nlohmann::ordered_json UsageJson(const OpenAiUsage& usage);

// A random id with the API's prefix: "chatcmpl-" or "cmpl-" and 32 hex digits.
std::string NewResponseId(OpenAiApi api);

// Log-probabilities of `tokens` in the API's shape: chat's {"content": [{token, logprob, bytes,
// top_logprobs}]}, or completions' {tokens, token_logprobs, top_logprobs, text_offset} with
// offsets counted from `text_offset` (the length of the text before these tokens).
nlohmann::ordered_json LogprobsJson(OpenAiApi api, const std::vector<SampledToken>& tokens,
                                    const OpenAiLogprobs& settings, const Tokenizer* tokenizer,
                                    int64_t text_offset);

// One finished choice of a whole (non-streamed) response.
struct OpenAiChoice {
  std::string text;
  std::vector<SampledToken> logprobs;
  FinishReason finish = FinishReason::kNone;
};

// The whole response: chat.completion or text_completion.
std::string CompletionResponseJson(const OpenAiEnvelope& envelope,
                                   const std::vector<OpenAiChoice>& choices,
                                   const OpenAiUsage& usage, const OpenAiLogprobs& logprobs,
                                   const Tokenizer* tokenizer);

// One server-sent event: "data: <json>\n\n".
std::string SseEvent(const nlohmann::ordered_json& payload);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// A streamed chunk for one choice. Chat: the first chunk of a choice carries the role
// (`first`); the delta carries `text` when there is any. `logprobs` is the already shaped JSON
// (or null). `include_usage` adds "usage": null, as OpenAI does on every chunk but the last.
nlohmann::ordered_json ChoiceChunk(const OpenAiEnvelope& envelope, int64_t index,
                                   absl::string_view text, bool first,
                                   nlohmann::ordered_json logprobs, FinishReason finish,
                                   bool include_usage);

// The last chunk when stream_options.include_usage: no choices, the whole request's usage.
nlohmann::ordered_json UsageChunk(const OpenAiEnvelope& envelope, const OpenAiUsage& usage);

// A JSON dump that never throws: invalid UTF-8 becomes U+FFFD.
std::string DumpJson(const nlohmann::ordered_json& json);

}  // namespace kiln
