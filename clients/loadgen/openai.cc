#include "clients/loadgen/openai.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace kiln::loadgen {
namespace {

using Json = nlohmann::json;

std::string Shorten(absl::string_view text, size_t limit = 300) {
  if (text.size() <= limit) return std::string(text);
  return absl::StrCat(text.substr(0, limit), "...");
}

bool NonEmptyString(const Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

// An "error" member's message: {"message": ...} (OpenAI), or a plain string.
std::string ErrorMessage(const Json& error) {
  if (error.is_string()) return error.get<std::string>();
  if (error.is_object()) {
    if (auto it = error.find("message"); it != error.end() && it->is_string()) {
      return it->get<std::string>();
    }
  }
  return Shorten(error.dump());
}

int CodeForLabel(absl::string_view label) {
  int status = 0;
  if (absl::ConsumePrefix(&label, "http_") && absl::SimpleAtoi(label, &status)) {
    return GrpcCodeForHttpStatus(status);
  }
  if (label == kTimeout) return static_cast<int>(absl::StatusCode::kDeadlineExceeded);
  if (label == ClientFaultLabel(ClientFault::kCancel) ||
      label == ClientFaultLabel(ClientFault::kDisconnect)) {
    return static_cast<int>(absl::StatusCode::kCancelled);
  }
  if (label == kStreamError || label == kBadResponse) {
    return static_cast<int>(absl::StatusCode::kInternal);
  }
  return static_cast<int>(absl::StatusCode::kUnavailable);  // truncated, connect, connection
}

}  // namespace

std::string HttpUrl::HostHeader() const {
  const std::string host_part = absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host;
  return port == 80 ? host_part : absl::StrCat(host_part, ":", port);
}

std::string HttpUrl::ToString() const {
  const std::string host_part = absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host;
  return absl::StrCat("http://", host_part, ":", port, base_path);
}

absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url) {
  auto bad = [url](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "': ", why));
  };
  const std::string lower = absl::AsciiStrToLower(url);
  if (absl::StartsWith(lower, "https://")) {
    return bad(
        "https is not supported (no TLS for HTTP in this version): use an http:// URL, or a "
        "TLS-terminating proxy");
  }
  if (!absl::StartsWith(lower, "http://")) {
    return bad("not an http:// URL (e.g. http://127.0.0.1:8000)");
  }
  absl::string_view rest = url.substr(7);
  if (rest.find_first_of("?#") != absl::string_view::npos) {
    return bad("a base URL takes no query or fragment");
  }
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? "" : rest.substr(slash);
  if (authority.find('@') != absl::string_view::npos) {
    return bad("credentials go in --api-key, not in the URL");
  }
  HttpUrl out;
  absl::string_view port;
  if (absl::ConsumePrefix(&authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return bad("an IPv6 host lacks its ']'");
    out.host = std::string(authority.substr(0, close));
    authority.remove_prefix(close + 1);
    if (!authority.empty() && !absl::ConsumePrefix(&authority, ":")) {
      return bad("junk after the IPv6 host");
    }
    port = authority;
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port = authority.substr(colon + 1);
    if (out.host.find(':') != std::string::npos) return bad("write an IPv6 host in brackets");
  }
  if (out.host.empty()) return bad("no host");
  if (!port.empty()) {
    int number = 0;
    if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
      return bad(absl::StrCat("'", port, "' is not a port"));
    }
    out.port = static_cast<uint16_t>(number);
  }
  while (absl::ConsumeSuffix(&path, "/")) {
  }
  out.base_path = std::string(path);
  return out;
}

std::string RequestPath(const HttpUrl& url, OpenAiApi api) {
  return absl::StrCat(url.base_path, absl::EndsWith(url.base_path, "/v1") ? "" : "/v1",
                      api == OpenAiApi::kChat ? "/chat/completions" : "/completions");
}

std::string BuildRequestBody(OpenAiApi api, const std::string& model, const RequestSpec& spec,
                             bool ignore_eos, float temperature) {
  Json body = Json::object();
  body["model"] = model;
  if (api == OpenAiApi::kChat) {
    body["messages"] = Json::array(
        {{{"role", "user"}, {"content", spec.is_text ? spec.text : WordsForIds(spec.ids)}}});
  } else if (spec.is_text) {
    body["prompt"] = spec.text;
  } else {
    body["prompt"] = spec.ids;
  }
  body["max_tokens"] = spec.max_tokens;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  // Through its decimal form, so that 0.7f goes out as 0.7 rather than 0.699999988.
  double t = 0;
  if (!absl::SimpleAtod(absl::StrCat(temperature), &t)) t = temperature;
  body["temperature"] = t;
  if (ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

std::string ErrorBodyMessage(absl::string_view body) {
  const Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!json.is_discarded() && json.is_object()) {
    if (auto it = json.find("error"); it != json.end() && !it->is_null()) return ErrorMessage(*it);
    for (const char* key : {"detail", "message"}) {
      if (auto it = json.find(key); it != json.end()) {
        return it->is_string() ? it->get<std::string>() : Shorten(it->dump());
      }
    }
  }
  return Shorten(absl::StripAsciiWhitespace(body));
}

int GrpcCodeForHttpStatus(int status) {
  using absl::StatusCode;
  StatusCode code = StatusCode::kUnknown;
  switch (status) {
    case 400:
    case 413:
    case 422:
      code = StatusCode::kInvalidArgument;
      break;
    case 401:
      code = StatusCode::kUnauthenticated;
      break;
    case 403:
      code = StatusCode::kPermissionDenied;
      break;
    case 404:
      code = StatusCode::kNotFound;
      break;
    case 408:
    case 504:
      code = StatusCode::kDeadlineExceeded;
      break;
    case 409:
      code = StatusCode::kAborted;
      break;
    case 429:
      code = StatusCode::kResourceExhausted;
      break;
    case 499:
      code = StatusCode::kCancelled;
      break;
    case 500:
      code = StatusCode::kInternal;
      break;
    case 501:
      code = StatusCode::kUnimplemented;
      break;
    case 502:
    case 503:
      code = StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  return static_cast<int>(code);
}

std::string HttpStatusLabel(int status) { return absl::StrCat("http_", status); }

int OpenAiStream::OnEvent(absl::string_view data, double seconds) {
  if (failed() || done_) return 0;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(data);
  if (trimmed == "[DONE]") {
    done_ = true;
    return 0;
  }
  const Json chunk = Json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded() || !chunk.is_object()) {
    Fail(kBadResponse, absl::StrCat("an event that is not a JSON object: ", Shorten(trimmed)));
    return 0;
  }
  if (auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
    Fail(kStreamError, ErrorMessage(*error));
    return 0;
  }
  int64_t usage_completion = -1;
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    if (auto it = usage->find("prompt_tokens"); it != usage->end() && it->is_number_integer()) {
      prompt_tokens_ = it->get<int64_t>();
    }
    if (auto it = usage->find("completion_tokens"); it != usage->end() && it->is_number_integer()) {
      usage_completion = std::max<int64_t>(0, it->get<int64_t>());
    }
  }
  bool content = false;
  if (auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array() &&
                                            !choices->empty() && choices->front().is_object()) {
    const Json& choice = choices->front();
    content = NonEmptyString(choice, "text");
    if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
      content = content || NonEmptyString(*delta, "content") ||
                NonEmptyString(*delta, "reasoning_content") || NonEmptyString(*delta, "reasoning");
    }
    if (NonEmptyString(choice, "finish_reason")) {
      finish_reason_ = choice["finish_reason"].get<std::string>();
    }
  }
  int tokens = 0;
  if (content) {
    // A usage in a content chunk (vLLM's continuous_usage_stats) is a running total: its growth
    // is what this chunk carried.
    const int64_t carried =
        usage_completion >= 0
            ? std::max<int64_t>(0, usage_completion - std::max<int64_t>(0, completion_tokens_))
            : -1;
    chunks_.push_back({seconds, carried});
    tokens = carried >= 0 ? static_cast<int>(std::min<int64_t>(carried, 1 << 20)) : 1;
  }
  if (usage_completion >= 0) completion_tokens_ = usage_completion;
  return tokens;
}

void OpenAiStream::Fail(absl::string_view label, std::string message) {
  if (failed()) return;
  failure_ = std::string(label);
  message_ = std::move(message);
}

void OpenAiStream::Finish(RequestRecord* record, absl::string_view content_type) const {
  record->finish_reason = finish_reason_;
  if (prompt_tokens_ > 0) record->input_tokens = static_cast<int32_t>(prompt_tokens_);
  const int64_t chunks = static_cast<int64_t>(chunks_.size());
  const int64_t output = completion_tokens_ >= 0 ? completion_tokens_ : chunks;
  record->output_tokens = static_cast<int32_t>(std::min<int64_t>(output, INT32_MAX));
  if (!chunks_.empty()) record->ttft_seconds = chunks_.front().seconds;

  std::string failure = failure_, message = message_;
  if (failure.empty() && !done_ && finish_reason_.empty()) {
    failure = std::string(kTruncated);
    message = "the stream ended without [DONE] or a finish_reason";
    if (!absl::StartsWithIgnoreCase(content_type, "text/event-stream")) {
      absl::StrAppend(&message, " (Content-Type: ", content_type, ", not text/event-stream)");
    }
  }
  if (!failure.empty()) {
    record->code = CodeForLabel(failure);
    record->code_label = std::move(failure);
    record->error = std::move(message);
    return;
  }

  // Inter-token latencies. A chunk may carry several tokens (a server that batches its stream
  // output); like the gRPC runner, each token of a chunk gets an equal share of the gap before
  // it, and the tokens arriving with the first chunk get none (they are the TTFT). How many
  // tokens a chunk carried is known when every content chunk reported a running usage; else the
  // final usage's count, less the first chunk's assumed one token, is spread evenly (in whole
  // tokens) over the later chunks, so that there are output − 1 latencies summing to the time
  // from the first to the last content chunk. A chunk given no token passes its gap on to the
  // next.
  if (chunks < 2) return;
  const bool known = std::all_of(chunks_.begin(), chunks_.end(),
                                 [](const Chunk& chunk) { return chunk.tokens >= 0; });
  // Bounded, so that an absurd usage cannot allocate without end.
  const int64_t rest = std::clamp<int64_t>(output - 1, 0, int64_t{1} << 24);
  double gap = 0;
  for (int64_t i = 1; i < chunks; ++i) {
    gap += chunks_[i].seconds - chunks_[i - 1].seconds;
    const int64_t tokens = known ? std::min<int64_t>(chunks_[i].tokens, int64_t{1} << 24)
                                 : rest * i / (chunks - 1) - rest * (i - 1) / (chunks - 1);
    if (tokens <= 0) continue;
    record->itl_seconds.insert(record->itl_seconds.end(), tokens, gap / tokens);
    gap = 0;
  }
}

}  // namespace kiln::loadgen
