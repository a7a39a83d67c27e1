// The OpenAI-compatible side of kiln-loadgen, free of any I/O: base URLs, request bodies for
// /v1/completions and /v1/chat/completions, error bodies, and the accounting of one streamed
// response (time to first token, inter-token latencies, token counts, failures) from its
// server-sent events.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"

namespace kiln::loadgen {

enum class OpenAiApi { kCompletions, kChat };

// http://HOST[:PORT][/PREFIX]: where an OpenAI-compatible server listens.
struct HttpUrl {
  std::string host;  // an IPv6 host without its brackets
  uint16_t port = 80;
  std::string base_path;  // "" or "/prefix" (no trailing '/')
  // "host:port" as a Host header writes it (IPv6 hosts in brackets).
  std::string HostHeader() const;
  std::string ToString() const;  // http://host:port/prefix
};

// InvalidArgument for anything but an http URL with a host (https is refused: this client has
// no TLS), a query or a fragment.
absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url);

// The request path: BASE/v1/completions or BASE/v1/chat/completions; a base already ending in
// /v1 (as OpenAI clients' base URLs usually do) gets no second one.
std::string RequestPath(const HttpUrl& url, OpenAiApi api);

// Everything the HTTP runner needs besides the phase: where, which API, credentials.
struct OpenAiTarget {
  HttpUrl url;
  OpenAiApi api = OpenAiApi::kCompletions;
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  absl::Duration connect_timeout = absl::Seconds(10);
};

// The streamed request's JSON body: model, the prompt (completions: a string, or token ids as an
// array of ints; chat: one user message, token ids becoming words by WordsForIds), max_tokens,
// stream with usage, temperature, and ignore_eos (a vLLM and llama.cpp extension, sent only when
// true so that servers which reject unknown fields can still be loaded with --ignore-eos=false).
std::string BuildRequestBody(OpenAiApi api, const std::string& model, const RequestSpec& spec,
                             bool ignore_eos, float temperature);

// The message of an error body: OpenAI's {"error": {"message": ...}}, {"error": "text"},
// FastAPI's {"detail": ...}, {"message": ...}, else the body itself (shortened).
std::string ErrorBodyMessage(absl::string_view body);

// The gRPC code closest to an HTTP status (429 → RESOURCE_EXHAUSTED, 503 → UNAVAILABLE, ...),
// so that RequestRecord::ok() and the code column mean the same for both protocols.
int GrpcCodeForHttpStatus(int status);

// Failure labels of HTTP requests, shown where gRPC requests show their status code's name.
inline constexpr absl::string_view kTruncated = "truncated";       // ended before it finished
inline constexpr absl::string_view kStreamError = "stream_error";  // a data: {"error": ...}
inline constexpr absl::string_view kBadResponse = "bad_response";  // not HTTP, not JSON
inline constexpr absl::string_view kTimeout = "timeout";           // past --request-timeout
inline constexpr absl::string_view kConnectFailed = "connect_failed";
inline constexpr absl::string_view kConnectionError = "connection_error";  // before a response
std::string HttpStatusLabel(int status);                                   // "http_429"

// Measures one streamed completion from its events. Times are seconds since the request was
// sent. A content chunk is one whose choices[0].text (completions) or choices[0].delta.content /
// .reasoning_content / .reasoning (chat) is not empty; the first one gives the time to first
// token.
class OpenAiStream {
 public:
  // One event's data ("[DONE]" or a JSON chunk) that arrived at `seconds`. Returns the tokens it
  // is taken to carry (for the live counter): a usage-reported count, else 1 per content chunk.
  int OnEvent(absl::string_view data, double seconds);
  // A failure seen outside the events (I/O, timeout); the first failure is the one kept.
  void Fail(absl::string_view label, std::string message);
  bool failed() const { return !failure_.empty(); }
  bool done() const { return done_; }  // [DONE] arrived
  // Fills the record's outcome (ttft, itl, tokens, finish reason, code) once the body ended.
  // Without a failure, a stream that ended without [DONE] or a finish_reason is kTruncated;
  // `content_type` goes into that message when it is not text/event-stream.
  void Finish(RequestRecord* record, absl::string_view content_type = "text/event-stream") const;

 private:
  struct Chunk {
    double seconds;
    int64_t tokens;  // from a usage in the chunk itself; -1: unknown
  };
  std::vector<Chunk> chunks_;
  bool done_ = false;
  std::string finish_reason_;
  int64_t prompt_tokens_ = -1, completion_tokens_ = -1;
  std::string failure_, message_;
};

}  // namespace kiln::loadgen
