// kiln-loadgen's OpenAI pieces without I/O: the server-sent event parser (events split across
// reads, every line ending, comments), base URLs, request and error bodies, and the accounting
// of one streamed response (TTFT, inter-token latencies, token counts, failures).
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "clients/loadgen/openai.h"
#include "clients/loadgen/sse.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kiln::loadgen {
namespace {

using Json = nlohmann::json;

// ---- server-sent events ---------------------------------------------------------------------

std::vector<SseEvent> ParseInPieces(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser parser;
  std::vector<SseEvent> events;
  size_t at = 0;
  for (size_t cut : cuts) {
    parser.Feed(std::string_view(stream).substr(at, cut - at), &events);
    at = cut;
  }
  parser.Feed(std::string_view(stream).substr(at), &events);
  parser.Finish(&events);
  return events;
}

std::vector<std::string> Data(const std::vector<SseEvent>& events) {
  std::vector<std::string> data;
  for (const SseEvent& event : events) data.push_back(event.data);
  return data;
}

TEST(SseParserTest, EventsSplitAnywhereAndEveryLineEnding) {
  // LF, CRLF and lone CR line ends, comments, a two-line data field, event and id fields.
  const std::string stream =
      ": keep-alive\n"
      "data: {\"a\":1}\n\n"
      "data: {\"b\":\r\n"
      "data: 2}\r\n\r\n"
      ":ping\r"
      "event: error\rid: 7\rdata: oops\r\r"
      "data: [DONE]\n\n";
  const std::vector<std::string> expected = {"{\"a\":1}", "{\"b\":\n2}", "oops", "[DONE]"};
  const std::vector<SseEvent> whole = ParseInPieces(stream, {});
  EXPECT_EQ(Data(whole), expected);
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_EQ(whole[2].event, "error");
  EXPECT_EQ(whole[2].id, "7");
  EXPECT_EQ(whole[0].event, "");

  // Byte by byte, and at every single cut (a CRLF split between reads among them).
  std::vector<size_t> every(stream.size() - 1);
  std::iota(every.begin(), every.end(), 1);
  EXPECT_EQ(Data(ParseInPieces(stream, every)), expected);
  for (size_t cut = 1; cut < stream.size(); ++cut) {
    EXPECT_EQ(Data(ParseInPieces(stream, {cut})), expected) << "cut at " << cut;
  }
  std::mt19937 rng(5);
  for (int round = 0; round < 50; ++round) {
    std::vector<size_t> cuts;
    for (size_t at = 0; (at += 1 + rng() % 9) < stream.size();) cuts.push_back(at);
    EXPECT_EQ(Data(ParseInPieces(stream, cuts)), expected);
  }
}

TEST(SseParserTest, FieldsFollowTheFormat) {
  std::vector<SseEvent> events = ParseInPieces(
      "\xEF\xBB\xBF"       // a byte-order mark
      "data:no space\n"    // the space after the colon is optional
      "data:  two\n\n"     // only one space is removed
      "data\n\n"           // a field without a colon: an empty data line
      "event: lonely\n\n"  // no data: nothing dispatched
      "retry: 10\n"        // ignored
      "unknown: x\n"
      "data: last\n\n",
      {1, 2});
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].data, "no space\n two");
  EXPECT_EQ(events[1].data, "");
  EXPECT_EQ(events[2].data, "last");
  EXPECT_EQ(events[2].event, "");  // "lonely" did not carry over
}

TEST(SseParserTest, FinishKeepsCompleteLinesOnly) {
  SseParser parser;
  std::vector<SseEvent> events;
  parser.Feed("data: [DONE]\n", &events);  // no closing blank line
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(parser.pending());
  parser.Finish(&events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "[DONE]");

  SseParser cut;
  events.clear();
  cut.Feed("data: {\"choi", &events);  // a line cut short is dropped
  cut.Finish(&events);
  EXPECT_TRUE(events.empty());
}

// ---- URLs, bodies, errors ----------------------------------------------------------------------

TEST(OpenAiTest, BaseUrls) {
  absl::StatusOr<HttpUrl> url = ParseHttpUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, 8000);
  EXPECT_EQ(url->base_path, "");
  EXPECT_EQ(url->HostHeader(), "127.0.0.1:8000");
  EXPECT_EQ(RequestPath(*url, OpenAiApi::kCompletions), "/v1/completions");
  EXPECT_EQ(RequestPath(*url, OpenAiApi::kChat), "/v1/chat/completions");

  url = ParseHttpUrl("HTTP://example.com/v1/");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->port, 80);
  EXPECT_EQ(url->HostHeader(), "example.com");
  EXPECT_EQ(RequestPath(*url, OpenAiApi::kChat), "/v1/chat/completions");  // no second /v1

  url = ParseHttpUrl("http://[::1]:9000/proxy/kiln");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->HostHeader(), "[::1]:9000");
  EXPECT_EQ(RequestPath(*url, OpenAiApi::kCompletions), "/proxy/kiln/v1/completions");
  EXPECT_EQ(url->ToString(), "http://[::1]:9000/proxy/kiln");

  absl::StatusOr<HttpUrl> https = ParseHttpUrl("https://api.example.com");
  ASSERT_FALSE(https.ok());
  EXPECT_TRUE(absl::StrContains(https.status().message(), "no TLS")) << https.status();
  for (const char* bad :
       {"127.0.0.1:8000", "http://", "http://:80", "http://h:0", "http://h:x", "http://h:70000",
        "http://h/?q=1", "http://u:p@h", "http://::1:80", "http://[::1"}) {
    EXPECT_FALSE(ParseHttpUrl(bad).ok()) << bad;
  }
}

TEST(OpenAiTest, RequestBodies) {
  RequestSpec ids;
  ids.ids = {5, 6, 70};
  ids.max_tokens = 9;
  Json body = Json::parse(BuildRequestBody(OpenAiApi::kCompletions, "m", ids, true, 0.7f));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["prompt"], Json::array({5, 6, 70}));
  EXPECT_EQ(body["max_tokens"], 9);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["temperature"], 0.7);  // not 0.699999988
  EXPECT_FALSE(body.contains("messages"));

  // Chat: token ids become words, one per id.
  body = Json::parse(BuildRequestBody(OpenAiApi::kChat, "m", ids, false, 0));
  EXPECT_FALSE(body.contains("ignore_eos"));  // only sent when true
  EXPECT_FALSE(body.contains("prompt"));
  ASSERT_EQ(body["messages"].size(), 1u);
  EXPECT_EQ(body["messages"][0]["role"], "user");
  const std::string content = body["messages"][0]["content"];
  EXPECT_EQ(content, WordsForIds(ids.ids));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(content, ' ')).size(), 3u);
  EXPECT_EQ(WordsForIds({1}), WordsForIds({65}));  // id mod 64

  RequestSpec text;
  text.is_text = true;
  text.text = "hello there";
  text.max_tokens = 2;
  EXPECT_EQ(Json::parse(BuildRequestBody(OpenAiApi::kCompletions, "m", text, true, 0))["prompt"],
            "hello there");
  EXPECT_EQ(
      Json::parse(BuildRequestBody(OpenAiApi::kChat, "m", text, true, 0))["messages"][0]["content"],
      "hello there");
}

TEST(OpenAiTest, ErrorBodiesAndCodes) {
  EXPECT_EQ(ErrorBodyMessage(R"({"error":{"message":"slow down","type":"x","code":429}})"),
            "slow down");
  EXPECT_EQ(ErrorBodyMessage(R"({"error":"plain"})"), "plain");
  EXPECT_EQ(ErrorBodyMessage(R"({"detail":"Not Found"})"), "Not Found");
  EXPECT_EQ(ErrorBodyMessage(R"({"message":"m"})"), "m");
  EXPECT_EQ(ErrorBodyMessage("  upstream gone \n"), "upstream gone");
  EXPECT_EQ(ErrorBodyMessage(std::string(1000, 'x')).size(), 303u);
  EXPECT_EQ(StatusCodeName(GrpcCodeForHttpStatus(429)), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(GrpcCodeForHttpStatus(404)), "NOT_FOUND");
  EXPECT_EQ(StatusCodeName(GrpcCodeForHttpStatus(503)), "UNAVAILABLE");
  EXPECT_EQ(StatusCodeName(GrpcCodeForHttpStatus(418)), "UNKNOWN");
  EXPECT_EQ(HttpStatusLabel(429), "http_429");
}

// ---- the accounting of one stream ----------------------------------------------------------

std::string ChatDelta(const std::string& key, const std::string& text) {
  return Json{{"choices", {{{"index", 0}, {"delta", {{key, text}}}, {"finish_reason", nullptr}}}}}
      .dump();
}

TEST(OpenAiStreamTest, ChatChunksGiveTtftItlAndUsage) {
  OpenAiStream stream;
  EXPECT_EQ(stream.OnEvent(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
                           0.05),
            0);  // an empty delta is no token
  EXPECT_EQ(stream.OnEvent(ChatDelta("reasoning_content", "hmm"), 0.10), 1);
  EXPECT_EQ(stream.OnEvent(ChatDelta("content", "a"), 0.15), 1);
  EXPECT_EQ(stream.OnEvent(ChatDelta("content", "b"), 0.20), 1);
  EXPECT_EQ(stream.OnEvent(ChatDelta("reasoning", "c"), 0.30), 1);
  stream.OnEvent(R"({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})", 0.31);
  stream.OnEvent(
      R"({"choices":[],"usage":{"prompt_tokens":17,"completion_tokens":4,"total_tokens":21}})",
      0.32);
  stream.OnEvent(" [DONE]", 0.33);
  EXPECT_TRUE(stream.done());
  RequestRecord record;
  record.input_tokens = 3;
  stream.Finish(&record);
  EXPECT_TRUE(record.ok()) << record.error;
  EXPECT_EQ(record.code_name(), "OK");
  EXPECT_DOUBLE_EQ(record.ttft_seconds, 0.10);
  ASSERT_EQ(record.itl_seconds.size(), 3u);
  EXPECT_NEAR(record.itl_seconds[0], 0.05, 1e-9);
  EXPECT_NEAR(record.itl_seconds[2], 0.10, 1e-9);
  EXPECT_EQ(record.output_tokens, 4);
  EXPECT_EQ(record.input_tokens, 17);  // the server's count
  EXPECT_EQ(record.finish_reason, "length");
}

std::string TextChunk(const std::string& text, int running_usage = -1) {
  Json chunk = {{"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}};
  if (running_usage >= 0)
    chunk["usage"] = {{"prompt_tokens", 2}, {"completion_tokens", running_usage}};
  return chunk.dump();
}

TEST(OpenAiStreamTest, ChunksOfSeveralTokensShareTheirGap) {
  // Three chunks, six tokens by the final usage: the first chunk counts one token (the TTFT),
  // the other five are spread over the two later chunks (2 and 3), each getting an equal share
  // of its chunk's gap.
  OpenAiStream spread;
  spread.OnEvent(TextChunk("ab"), 0.1);
  spread.OnEvent(TextChunk("cd"), 0.2);
  spread.OnEvent(TextChunk("ef"), 0.4);
  spread.OnEvent(R"({"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":6}})", 0.41);
  spread.OnEvent("[DONE]", 0.42);
  RequestRecord record;
  spread.Finish(&record);
  ASSERT_TRUE(record.ok()) << record.error;
  EXPECT_EQ(record.output_tokens, 6);
  ASSERT_EQ(record.itl_seconds.size(), 5u);
  EXPECT_NEAR(record.itl_seconds[0], 0.05, 1e-9);
  EXPECT_NEAR(record.itl_seconds[1], 0.05, 1e-9);
  EXPECT_NEAR(record.itl_seconds[2], 0.2 / 3, 1e-9);
  EXPECT_NEAR(std::accumulate(record.itl_seconds.begin(), record.itl_seconds.end(), 0.0), 0.3,
              1e-9);

  // A running usage in every chunk says what each carried: 2 each, the first chunk's two being
  // the TTFT's.
  OpenAiStream running;
  EXPECT_EQ(running.OnEvent(TextChunk("ab", 2), 0.1), 2);
  EXPECT_EQ(running.OnEvent(TextChunk("cd", 4), 0.2), 2);
  EXPECT_EQ(running.OnEvent(TextChunk("ef", 6), 0.4), 2);
  running.OnEvent(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})", 0.41);
  RequestRecord known;
  running.Finish(&known);  // a finish_reason without [DONE] is a complete stream
  ASSERT_TRUE(known.ok()) << known.error;
  EXPECT_EQ(known.output_tokens, 6);
  ASSERT_EQ(known.itl_seconds.size(), 4u);
  EXPECT_NEAR(known.itl_seconds[0], 0.05, 1e-9);
  EXPECT_NEAR(known.itl_seconds[3], 0.1, 1e-9);

  // Without usage, each content chunk is a token.
  OpenAiStream plain;
  for (int i = 0; i < 4; ++i) plain.OnEvent(TextChunk("x"), 0.1 * (i + 1));
  plain.OnEvent("[DONE]", 0.5);  // [DONE] without a finish_reason is complete too
  RequestRecord counted;
  plain.Finish(&counted);
  ASSERT_TRUE(counted.ok()) << counted.error;
  EXPECT_EQ(counted.output_tokens, 4);
  EXPECT_EQ(counted.itl_seconds.size(), 3u);
}

TEST(OpenAiStreamTest, Failures) {
  OpenAiStream error;
  error.OnEvent(TextChunk("a"), 0.1);
  error.OnEvent(R"({"error":{"message":"boom","type":"internal","code":500}})", 0.2);
  error.OnEvent(TextChunk("b"), 0.3);  // ignored after the error
  error.OnEvent("[DONE]", 0.4);
  RequestRecord record;
  error.Finish(&record);
  EXPECT_FALSE(record.ok());
  EXPECT_EQ(record.code_name(), "stream_error");
  EXPECT_EQ(record.error, "boom");

  OpenAiStream cut;
  cut.OnEvent(TextChunk("a"), 0.1);
  RequestRecord truncated;
  cut.Finish(&truncated, "application/json");
  EXPECT_EQ(truncated.code_name(), "truncated");
  EXPECT_EQ(StatusCodeName(truncated.code), "UNAVAILABLE");
  EXPECT_TRUE(absl::StrContains(truncated.error, "application/json")) << truncated.error;

  OpenAiStream garbage;
  garbage.OnEvent("{not json", 0.1);
  RequestRecord bad;
  garbage.Finish(&bad);
  EXPECT_EQ(bad.code_name(), "bad_response");

  OpenAiStream io;
  io.OnEvent(TextChunk("a"), 0.1);
  io.Fail(kTimeout, "past the deadline");
  io.Fail(kTruncated, "second");  // the first failure is kept
  RequestRecord late;
  io.Finish(&late);
  EXPECT_EQ(late.code_name(), "timeout");
  EXPECT_EQ(StatusCodeName(late.code), "DEADLINE_EXCEEDED");
  EXPECT_EQ(late.error, "past the deadline");
}

}  // namespace
}  // namespace kiln::loadgen
