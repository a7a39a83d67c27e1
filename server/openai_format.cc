#include "server/openai_format.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

const char* Object(OpenAiApi api, bool chunk) {
  if (api == OpenAiApi::kChat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

Json Envelope(const OpenAiEnvelope& envelope, bool chunk) {
  return Json{{"id", envelope.id},
              {"object", Object(envelope.api, chunk)},
              {"created", envelope.created},
              {"model", envelope.model}};
}

// The token as text (a partial UTF-8 character shows as U+FFFD, as in Hugging Face's decode)
// and its exact bytes.
std::string TokenText(const Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return absl::StrCat("<", id, ">");
  absl::StatusOr<std::string> text = tokenizer->Decode({&id, 1}, /*skip_special_tokens=*/false);
  return text.ok() ? *std::move(text) : absl::StrCat("<", id, ">");
}

Json TokenBytes(const Tokenizer* tokenizer, int32_t id) {
  Json bytes = Json::array();
  if (tokenizer == nullptr) return bytes;
  absl::StatusOr<std::string> raw = tokenizer->DecodeBytes({&id, 1}, false);
  if (!raw.ok()) return bytes;
  for (unsigned char c : *raw) bytes.push_back(static_cast<int>(c));
  return bytes;
}

Json ChatTokenEntry(const Tokenizer* tokenizer, int32_t id, float logprob) {
  return Json{{"token", TokenText(tokenizer, id)},
              {"logprob", logprob},
              {"bytes", TokenBytes(tokenizer, id)}};
}

}  // namespace

Json FinishReasonJson(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
    case FinishReason::kEos:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return nullptr;
}

Json UsageJson(const OpenAiUsage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", usage.cached_prompt_tokens}}}};
}

std::string NewResponseId(OpenAiApi api) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return absl::StrCat(api == OpenAiApi::kChat ? "chatcmpl-" : "cmpl-",
                      absl::StrFormat("%016x%016x", generator(), generator()));
}

Json LogprobsJson(OpenAiApi api, const std::vector<SampledToken>& tokens,
                  const OpenAiLogprobs& settings, const Tokenizer* tokenizer, int64_t text_offset) {
  if (!settings.enabled) return nullptr;
  if (api == OpenAiApi::kChat) {
    Json content = Json::array();
    for (const SampledToken& sampled : tokens) {
      Json entry = ChatTokenEntry(tokenizer, sampled.token_id, sampled.logprob);
      Json top = Json::array();
      for (size_t i = 0; i < sampled.top.size() && static_cast<int32_t>(i) < settings.top; ++i) {
        top.push_back(ChatTokenEntry(tokenizer, sampled.top[i].token_id, sampled.top[i].logprob));
      }
      entry["top_logprobs"] = std::move(top);
      content.push_back(std::move(entry));
    }
    return Json{{"content", std::move(content)}};
  }
  Json texts = Json::array(), logprobs = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (const SampledToken& sampled : tokens) {
    const std::string text = TokenText(tokenizer, sampled.token_id);
    texts.push_back(text);
    logprobs.push_back(sampled.logprob);
    Json top = Json::object();
    for (size_t i = 0; i < sampled.top.size() && static_cast<int32_t>(i) < settings.top; ++i) {
      top[TokenText(tokenizer, sampled.top[i].token_id)] = sampled.top[i].logprob;
    }
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(text.size());
  }
  return Json{{"tokens", std::move(texts)},
              {"token_logprobs", std::move(logprobs)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

std::string CompletionResponseJson(const OpenAiEnvelope& envelope,
                                   const std::vector<OpenAiChoice>& choices,
                                   const OpenAiUsage& usage, const OpenAiLogprobs& logprobs,
                                   const Tokenizer* tokenizer) {
  Json response = Envelope(envelope, /*chunk=*/false);
  Json out = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const OpenAiChoice& choice = choices[i];
    Json entry = {{"index", i}};
    if (envelope.api == OpenAiApi::kChat) {
      entry["message"] = Json{{"role", "assistant"}, {"content", choice.text}};
    } else {
      entry["text"] = choice.text;
    }
    entry["logprobs"] = LogprobsJson(envelope.api, choice.logprobs, logprobs, tokenizer, 0);
    entry["finish_reason"] = FinishReasonJson(choice.finish);
    out.push_back(std::move(entry));
  }
  response["choices"] = std::move(out);
  response["usage"] = UsageJson(usage);
  return DumpJson(response);
}

std::string SseEvent(const Json& payload) {
  return absl::StrCat("data: ", DumpJson(payload), "\n\n");
}

Json ChoiceChunk(const OpenAiEnvelope& envelope, int64_t index, absl::string_view text, bool first,
                 Json logprobs, FinishReason finish, bool include_usage) {
  Json chunk = Envelope(envelope, /*chunk=*/true);
  Json choice = {{"index", index}};
  if (envelope.api == OpenAiApi::kChat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = std::string(text);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = FinishReasonJson(finish);
  chunk["choices"] = Json::array({std::move(choice)});
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

Json UsageChunk(const OpenAiEnvelope& envelope, const OpenAiUsage& usage) {
  Json chunk = Envelope(envelope, /*chunk=*/true);
  chunk["choices"] = Json::array();
  chunk["usage"] = UsageJson(usage);
  return chunk;
}

std::string DumpJson(const Json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace kiln
