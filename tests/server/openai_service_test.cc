// The OpenAI HTTP API of an in-process server: chat and completions, whole and streamed, n > 1,
// stop strings and ids, logprobs, the same tokens as gRPC Generate, errors with their HTTP
// codes, API keys, chat templates (a model without one, one given at load), the side
// endpoints, metrics, a client that leaves, shutdown, and 256 concurrent streams.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/synth.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/http/http_test_client.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using http_test::Post;
using http_test::Response;

// <root>/chat: kiln-tiny with its synthesized tokenizer, which carries a ChatML template.
const fs::path& ChatModelDir() {
  static const fs::path* dir = [] {
    auto* path = new fs::path(Models().root / "chat");
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    EXPECT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    SynthOptions options;
    options.dtype = DType::kF32;
    options.seed = 5;
    EXPECT_TRUE(WriteSynthCheckpoint(*path, *config, options).ok());
    return path;
  }();
  return *dir;
}

ServerOptions HttpOptions() {
  ServerOptions options = TestServerOptions();
  options.http_listen = "127.0.0.1:0";
  options.models.push_back({.name = "chat", .path = ChatModelDir().string()});
  options.models.push_back({.name = "text", .path = Models().text.string()});
  options.models.push_back({.name = "plain", .path = Models().plain.string()});
  return options;
}

Json UserChat(const std::string& content, int max_tokens) {
  return Json{{"model", "chat"},
              {"messages", Json::array({Json{{"role", "user"}, {"content", content}}})},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true}};
}

// The JSON payloads of a streamed body, [DONE] excluded; `done` tells whether it came last.
std::vector<Json> StreamEvents(const Response& response, bool* done) {
  std::vector<Json> events;
  const std::vector<std::string> data = http_test::SseData(response.body);
  *done = !data.empty() && data.back() == "[DONE]";
  for (const std::string& payload : data) {
    if (payload != "[DONE]") events.push_back(Json::parse(payload));
  }
  return events;
}

// Every choice's streamed text (chat deltas or completion text), by index.
std::vector<std::string> StreamedTexts(const std::vector<Json>& events, size_t choices) {
  std::vector<std::string> texts(choices);
  for (const Json& event : events) {
    for (const Json& choice : event["choices"]) {
      const size_t index = choice["index"].get<size_t>();
      if (choice.contains("delta") && choice["delta"].contains("content")) {
        texts.at(index) += choice["delta"]["content"].get<std::string>();
      } else if (choice.contains("text")) {
        texts.at(index) += choice["text"].get<std::string>();
      }
    }
  }
  return texts;
}

class OpenAiServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start(HttpOptions());
    ASSERT_NE(server_, nullptr);
    port_ = server_->server().http_port();
    ASSERT_GT(port_, 0);
  }

  Response MustPost(const std::string& target, const Json& body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
    absl::StatusOr<Response> response = Post(port_, target, body, std::move(headers));
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *std::move(response) : Response{};
  }
  Response MustGet(const std::string& target) {
    absl::StatusOr<Response> response = http_test::Request(port_, "GET", target);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *std::move(response) : Response{};
  }

  std::unique_ptr<TestServer> server_;
  int port_ = 0;
};

void ExpectError(const Response& response, int status, const std::string& type,
                 const std::string& needle, const Json& param = nullptr) {
  EXPECT_EQ(response.status, status) << response.body;
  const Json body = response.Json();
  ASSERT_TRUE(body.contains("error")) << response.body;
  EXPECT_EQ(body["error"]["type"], type) << response.body;
  EXPECT_EQ(body["error"]["code"], status) << response.body;
  EXPECT_TRUE(absl::StrContains(body["error"]["message"].get<std::string>(), needle))
      << response.body;
  EXPECT_EQ(body["error"]["param"], param) << response.body;
}

TEST_F(OpenAiServiceTest, ChatCompletionWholeAndStreamedAgree) {
  const Response whole = MustPost("/v1/chat/completions", UserChat("Hello there", 12));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = whole.Json();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "chatcmpl-"));
  EXPECT_EQ(body["model"], "chat");
  EXPECT_GT(body["created"].get<int64_t>(), 1600000000);
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  EXPECT_GT(body["usage"]["prompt_tokens"].get<int>(), 5);
  EXPECT_EQ(body["usage"]["total_tokens"].get<int>(),
            body["usage"]["prompt_tokens"].get<int>() + 12);
  EXPECT_TRUE(body["usage"]["prompt_tokens_details"].contains("cached_tokens"));

  Json streamed_request = UserChat("Hello there", 12);
  streamed_request["stream"] = true;
  streamed_request["stream_options"] = {{"include_usage", true}};
  const Response streamed = MustPost("/v1/chat/completions", streamed_request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.Header("content-type"), "text/event-stream");
  bool done = false;
  const std::vector<Json> events = StreamEvents(streamed, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(StreamedTexts(events, 1)[0], body["choices"][0]["message"]["content"]);
  const Json& finish_chunk = events[events.size() - 2];
  EXPECT_EQ(finish_chunk["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(finish_chunk["usage"].is_null());
  const Json& usage_chunk = events.back();
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 12);
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], body["usage"]["prompt_tokens"]);
  for (const Json& event : events) EXPECT_EQ(event["id"], events.front()["id"]);
}

// The same prompt ids over HTTP and over gRPC Generate give the same greedy tokens.
TEST_F(OpenAiServiceTest, GreedyOutputEqualsGrpcGenerate) {
  const std::vector<int32_t> ids = {72, 101, 108, 108, 111, 32, 119};
  Json request = {{"model", "chat"},  {"prompt", ids},      {"max_tokens", 16},
                  {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 0}};
  const Response http = MustPost("/v1/completions", request);
  ASSERT_EQ(http.status, 200) << http.body;
  const Json choice = http.Json()["choices"][0];
  StreamResult grpc = GenerateAll(server_->inference(), GreedyRequest("chat", ids, 16));
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  EXPECT_EQ(choice["text"], grpc.text);
  ASSERT_EQ(choice["logprobs"]["tokens"].size(), grpc.tokens.size());

  // Chat: the rendered prompt (/tokenize with messages) generated over gRPC.
  const Response tokenized = MustPost(
      "/tokenize", Json{{"model", "chat"},
                        {"messages", Json::array({Json{{"role", "user"}, {"content", "Hi"}}})}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  const std::vector<int32_t> chat_ids = tokenized.Json()["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(tokenized.Json()["count"], chat_ids.size());
  const Response chat = MustPost("/v1/chat/completions", UserChat("Hi", 10));
  ASSERT_EQ(chat.status, 200) << chat.body;
  StreamResult grpc_chat = GenerateAll(server_->inference(), GreedyRequest("chat", chat_ids, 10));
  ASSERT_TRUE(grpc_chat.status.ok());
  EXPECT_EQ(chat.Json()["choices"][0]["message"]["content"], grpc_chat.text);
  EXPECT_EQ(chat.Json()["usage"]["prompt_tokens"], chat_ids.size());
}

TEST_F(OpenAiServiceTest, SeveralChoicesPromptsAndSeeds) {
  Json request = {{"model", "chat"},    {"prompt", Json::array({"One", "Two"})},
                  {"max_tokens", 6},    {"n", 3},
                  {"temperature", 1.0}, {"seed", 7},
                  {"ignore_eos", true}};
  const Response first = MustPost("/v1/completions", request);
  ASSERT_EQ(first.status, 200) << first.body;
  const Json body = first.Json();
  ASSERT_EQ(body["choices"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(body["choices"][i]["index"], i);
  EXPECT_EQ(body["usage"]["completion_tokens"], 36);
  // The prompt counts once per prompt, not once per choice.
  const Response one = MustPost("/tokenize", Json{{"model", "chat"}, {"prompt", "One"}});
  const Response two = MustPost("/tokenize", Json{{"model", "chat"}, {"prompt", "Two"}});
  EXPECT_EQ(body["usage"]["prompt_tokens"],
            one.Json()["count"].get<int>() + two.Json()["count"].get<int>());
  // A seed makes the whole request reproducible; streamed or not.
  const Response again = MustPost("/v1/completions", request);
  ASSERT_EQ(again.status, 200);
  request["stream"] = true;
  const Response streamed = MustPost("/v1/completions", request);
  bool done = false;
  const std::vector<std::string> texts = StreamedTexts(StreamEvents(streamed, &done), 6);
  EXPECT_TRUE(done);
  std::set<std::string> distinct;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(again.Json()["choices"][i]["text"], body["choices"][i]["text"]);
    EXPECT_EQ(texts[i], body["choices"][i]["text"].get<std::string>());
    distinct.insert(texts[i]);
  }
  EXPECT_GT(distinct.size(), 1u);  // the choices are not copies of one another
}

TEST_F(OpenAiServiceTest, StopStringsAndStopTokenIds) {
  // The test tokenizer's model: greedy text to pick a stop string from.
  Json request = {{"model", "text"},  {"prompt", "hello"},  {"max_tokens", 24},
                  {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 0}};
  const Json free_run = MustPost("/v1/completions", request).Json();
  const std::string text = free_run["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u) << text;
  const std::string stop = text.substr(3, 2);
  request["stop"] = stop;
  const Json stopped = MustPost("/v1/completions", request).Json();
  EXPECT_EQ(stopped["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");

  // The third generated token as a stop id: generation ends with it (included).
  request.erase("stop");
  request["prompt"] = Json::array({kBosId, kHelloId});
  StreamResult same =
      GenerateAll(server_->inference(), GreedyRequest("text", {kBosId, kHelloId}, 24));
  ASSERT_GE(same.tokens.size(), 3u);
  const int32_t third = same.tokens[2];
  request["stop_token_ids"] = Json::array({third});
  const Json by_id = MustPost("/v1/completions", request).Json();
  EXPECT_EQ(by_id["choices"][0]["finish_reason"], "stop");
  size_t expected = 0;
  while (same.tokens[expected] != third) ++expected;
  EXPECT_EQ(by_id["usage"]["completion_tokens"], expected + 1);
}

TEST_F(OpenAiServiceTest, LogprobsInBothShapes) {
  Json chat = UserChat("Hi", 4);
  chat["logprobs"] = true;
  chat["top_logprobs"] = 3;
  const Json body = MustPost("/v1/chat/completions", chat).Json();
  const Json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << body.dump();
  for (const Json& entry : content) {
    EXPECT_TRUE(entry["token"].is_string());
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(entry["bytes"].is_array());
    ASSERT_EQ(entry["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_DOUBLE_EQ(entry["top_logprobs"][0]["logprob"].get<double>(),
                     entry["logprob"].get<double>());
  }
  chat["top_logprobs"] = 0;
  const Json chosen_only = MustPost("/v1/chat/completions", chat).Json();
  EXPECT_TRUE(chosen_only["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());

  const Json completion = MustPost("/v1/completions", Json{{"model", "chat"},
                                                           {"prompt", "Hi"},
                                                           {"max_tokens", 3},
                                                           {"temperature", 0},
                                                           {"logprobs", 2}})
                              .Json();
  const Json& legacy = completion["choices"][0]["logprobs"];
  EXPECT_EQ(legacy["tokens"].size(), 3u);
  EXPECT_EQ(legacy["token_logprobs"].size(), 3u);
  EXPECT_EQ(legacy["text_offset"][0], 0);
  ASSERT_EQ(legacy["top_logprobs"].size(), 3u);
  EXPECT_LE(legacy["top_logprobs"][0].size(), 2u);
  EXPECT_GE(legacy["top_logprobs"][0].size(), 1u);
}

TEST_F(OpenAiServiceTest, ErrorsHaveOpenAiShapesAndCodes) {
  ExpectError(MustPost("/v1/chat/completions",
                       Json{{"model", "nope"},
                            {"messages", Json::array({Json{{"role", "user"}, {"content", "x"}}})}}),
              404, "not_found_error", "model 'nope' is not loaded");
  Json bad = UserChat("x", 4);
  bad["temperature"] = -1;
  ExpectError(MustPost("/v1/chat/completions", bad), 400, "invalid_request_error",
              "must be at least 0", "temperature");
  bad = UserChat("x", 4);
  bad["messages"] = Json::array();
  ExpectError(MustPost("/v1/chat/completions", bad), 400, "invalid_request_error",
              "must not be empty", "messages");
  bad = UserChat("x", 4);
  bad["messages"][0]["content"] = Json::array({Json{{"type", "image_url"}, {"image_url", "u"}}});
  ExpectError(MustPost("/v1/chat/completions", bad), 400, "invalid_request_error",
              "'image_url' is not supported", "messages[0].content[0].type");
  bad = UserChat("x", 4000);
  ExpectError(MustPost("/v1/chat/completions", bad), 400, "invalid_request_error",
              "maximum context length is 512 tokens", "max_tokens");
  ExpectError(MustPost("/v1/completions", Json{{"model", "chat"}, {"prompt", "x"}, {"echo", true}}),
              400, "invalid_request_error", "not supported", "echo");
  ExpectError(MustPost("/v1/completions", Json{{"model", "chat"}, {"prompt", 3}}), 400,
              "invalid_request_error", "got a number", "prompt");
  ExpectError(MustPost("/v1/completions", Json{{"model", "chat"},
                                               {"prompt", "x"},
                                               {"stream_options", {{"include_usage", true}}}}),
              400, "invalid_request_error", "only allowed when stream is true", "stream_options");
  absl::StatusOr<Response> not_json = http_test::Request(port_, "POST", "/v1/completions", "{oops");
  ASSERT_TRUE(not_json.ok());
  ExpectError(*not_json, 400, "invalid_request_error", "not valid JSON", "body");
  absl::StatusOr<Response> wrong_method = http_test::Request(port_, "GET", "/v1/completions");
  ASSERT_TRUE(wrong_method.ok());
  ExpectError(*wrong_method, 405, "invalid_request_error", "GET is not allowed", "method");
  EXPECT_EQ(wrong_method->Header("allow"), "POST");
  ExpectError(MustGet("/v1/nothing"), 404, "not_found_error", "is not served here", "path");
  // A model without a tokenizer serves token-id prompts only.
  ExpectError(MustPost("/v1/completions", Json{{"model", "plain"}, {"prompt", "x"}}), 400,
              "invalid_request_error", "has no tokenizer", "model");
  EXPECT_EQ(
      MustPost("/v1/completions", Json{{"model", "plain"}, {"prompt", {1, 2}}, {"max_tokens", 2}})
          .status,
      200);
}

TEST_F(OpenAiServiceTest, AModelWithoutAChatTemplateRefusesChatButServesCompletions) {
  Json chat = UserChat("Hi", 4);
  chat["model"] = "text";
  ExpectError(MustPost("/v1/chat/completions", chat), 400, "invalid_request_error",
              "model 'text' has no chat template", "messages");
  EXPECT_EQ(MustPost("/v1/completions", Json{{"model", "text"}, {"prompt", "hello"}}).status, 200);

  // Loaded again with a template file, it serves chat, rendered through that template.
  const fs::path template_file = Models().root / "simple.jinja";
  std::ofstream(template_file) << "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n"
                                  "{% endfor %}{% if add_generation_prompt %}[assistant] "
                                  "{% endif %}";
  ServerOptions options = TestServerOptions();
  options.http_listen = "127.0.0.1:0";
  ModelSpec spec{.name = "text", .path = Models().text.string()};
  spec.chat_template_file = template_file.string();
  options.models.push_back(spec);
  std::unique_ptr<TestServer> with_template = TestServer::Start(options);
  ASSERT_NE(with_template, nullptr);
  const int port = with_template->server().http_port();
  absl::StatusOr<Response> served = Post(port, "/v1/chat/completions", chat);
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(served->status, 200) << served->body;
  absl::StatusOr<Response> tokens =
      Post(port, "/tokenize",
           Json{{"model", "text"}, {"messages", chat["messages"]}, {"return_token_strs", true}});
  ASSERT_TRUE(tokens.ok());
  const Json ids = tokens->Json()["tokens"];
  absl::StatusOr<Response> text =
      Post(port, "/detokenize", Json{{"model", "text"}, {"tokens", ids}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->Json()["prompt"], "[user] Hi\n[assistant] ");
  EXPECT_EQ(tokens->Json()["token_strs"].size(), ids.size());
}

TEST_F(OpenAiServiceTest, AGivenTemplateThatDoesNotParseFailsTheLoad) {
  ModelSpec spec{.name = "bad", .path = ChatModelDir().string()};
  spec.chat_template = "{% for m in messages %}{{ m.content }}";  // no endfor
  absl::StatusOr<ModelSnapshot> loaded = server_->registry().LoadAtStartup(spec);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "chat template")) << loaded.status();
  spec.name = "missing";
  spec.chat_template.clear();
  spec.chat_template_file = (Models().root / "no-such.jinja").string();
  loaded = server_->registry().LoadAtStartup(spec);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "no-such.jinja cannot be read"))
      << loaded.status();
  // The other models keep serving.
  EXPECT_EQ(MustPost("/v1/chat/completions", UserChat("Hi", 2)).status, 200);
}

TEST_F(OpenAiServiceTest, ApiKeyGuardsTheV1Endpoints) {
  ServerOptions options = HttpOptions();
  options.api_key = "sesame";
  std::unique_ptr<TestServer> guarded = TestServer::Start(options);
  ASSERT_NE(guarded, nullptr);
  const int port = guarded->server().http_port();
  absl::StatusOr<Response> missing = Post(port, "/v1/chat/completions", UserChat("x", 2));
  ASSERT_TRUE(missing.ok());
  ExpectError(*missing, 401, "authentication_error", "no API key");
  absl::StatusOr<Response> wrong =
      Post(port, "/v1/chat/completions", UserChat("x", 2), {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong.ok());
  ExpectError(*wrong, 401, "authentication_error", "not the server's --api-key");
  absl::StatusOr<Response> models = http_test::Request(port, "GET", "/v1/models");
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(models->status, 401);
  absl::StatusOr<Response> right =
      Post(port, "/v1/chat/completions", UserChat("x", 2), {{"Authorization", "Bearer sesame"}});
  ASSERT_TRUE(right.ok());
  EXPECT_EQ(right->status, 200) << right->body;
  // As vLLM: /health and the rest outside /v1 stay open.
  absl::StatusOr<Response> health = http_test::Request(port, "GET", "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
}

TEST_F(OpenAiServiceTest, AFullQueueIs429AndAModelNotReadyIs503) {
  ServerOptions options = HttpOptions();
  options.engine.max_queued = 0;  // every request is refused as if the queue were full
  options.models.push_back({.name = "broken", .path = Models().empty.string()});
  std::unique_ptr<TestServer> full = TestServer::Start(options);
  ASSERT_NE(full, nullptr);
  const int port = full->server().http_port();
  absl::StatusOr<Response> refused = Post(port, "/v1/chat/completions", UserChat("x", 2));
  ASSERT_TRUE(refused.ok());
  ExpectError(*refused, 429, "rate_limit_error", "queue of this model is full");
  Json streamed = UserChat("x", 2);
  streamed["stream"] = true;
  refused = Post(port, "/v1/chat/completions", streamed);
  ASSERT_TRUE(refused.ok());
  ExpectError(*refused, 429, "rate_limit_error", "queue of this model is full");
  Json broken = UserChat("x", 2);
  broken["model"] = "broken";
  absl::StatusOr<Response> failed = Post(port, "/v1/chat/completions", broken);
  ASSERT_TRUE(failed.ok());
  ExpectError(*failed, 503, "service_unavailable", "broken");
  // /v1/models lists READY models only.
  absl::StatusOr<Response> models = http_test::Request(port, "GET", "/v1/models");
  ASSERT_TRUE(models.ok());
  const Json listed = models->Json();
  ASSERT_FALSE(listed["data"].empty());
  for (const Json& model : listed["data"]) EXPECT_NE(model["id"], "broken");
}

TEST_F(OpenAiServiceTest, ModelsHealthVersionTokenize) {
  const Json models = MustGet("/v1/models").Json();
  EXPECT_EQ(models["object"], "list");
  std::set<std::string> ids;
  for (const Json& model : models["data"]) {
    ids.insert(model["id"]);
    EXPECT_EQ(model["object"], "model");
    EXPECT_EQ(model["owned_by"], "kiln");
    EXPECT_EQ(model["max_model_len"], 512);
  }
  EXPECT_EQ(ids, (std::set<std::string>{"chat", "text", "plain"}));
  EXPECT_EQ(MustGet("/v1/models/chat").Json()["id"], "chat");
  ExpectError(MustGet("/v1/models/nope"), 404, "not_found_error", "nope");
  const Response health = MustGet("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_FALSE(MustGet("/version").Json()["version"].get<std::string>().empty());

  const Json tokenized = MustPost("/tokenize", Json{{"model", "text"}, {"prompt", "hello"}}).Json();
  EXPECT_EQ(tokenized["tokens"], Json::array({kBosId, kHelloId}));
  EXPECT_EQ(tokenized["count"], 2);
  EXPECT_EQ(tokenized["max_model_len"], 512);
  const Json plain =
      MustPost("/tokenize",
               Json{{"model", "text"}, {"prompt", "hello"}, {"add_special_tokens", false}})
          .Json();
  EXPECT_EQ(plain["tokens"], Json::array({kHelloId}));
  EXPECT_EQ(
      MustPost("/detokenize", Json{{"model", "text"}, {"tokens", {kHelloId}}}).Json()["prompt"],
      "hello");
  ExpectError(MustPost("/detokenize", Json{{"model", "text"}, {"tokens", {100000}}}), 400,
              "invalid_request_error", "not in the vocabulary", "tokens");
}

TEST_F(OpenAiServiceTest, HttpRequestsAreInTheSameMetricsWithAProtocolLabel) {
  ASSERT_EQ(MustPost("/v1/chat/completions", UserChat("Hi", 3)).status, 200);
  const Response metrics = MustGet("/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_TRUE(absl::StrContains(metrics.body,
                                "kiln_requests_total{model=\"chat\",code=\"OK\",finish_reason="
                                "\"length\",protocol=\"http\"} 1"))
      << metrics.body;
  EXPECT_TRUE(absl::StrContains(metrics.body, "kiln_generation_tokens_total{model=\"chat\"} 3"));
  // What the Gateway API Inference Extension's endpoint picker reads.
  for (const char* series :
       {"kiln_requests_waiting{model=\"chat\"}", "kiln_requests_running{model=\"chat\"}",
        "kiln_kv_cache_usage_ratio{model=\"chat\"}"}) {
    EXPECT_TRUE(absl::StrContains(metrics.body, series)) << series;
  }
}

TEST_F(OpenAiServiceTest, AClientThatLeavesCancelsItsGeneration) {
  Json request = UserChat("Tell me everything", 480);
  request["stream"] = true;
  {
    absl::StatusOr<http_test::RawConnection> connection = http_test::RawConnection::Open(port_);
    ASSERT_TRUE(connection.ok());
    ASSERT_TRUE(connection->Send(http_test::PostBytes("/v1/chat/completions", request.dump())));
    const std::string first = connection->ReadUntil("\"content\":\"");
    ASSERT_TRUE(absl::StrContains(first, "chat.completion.chunk")) << first;
  }  // gone mid-stream
  ASSERT_TRUE(WaitFor([&] { return StatsOf(server_->registry(), "chat").running == 0; }));
  const EngineStats stats = StatsOf(server_->registry(), "chat");
  EXPECT_LT(stats.generated_tokens, 480u);
  EXPECT_EQ(stats.kv_cache_bytes, 0u);  // its blocks went back to the pool
  // Counted once the engine's last update (the cancellation) reached the request.
  const std::string cancelled =
      "code=\"CANCELLED\",finish_reason=\"cancelled\",protocol=\"http\"} 1";
  EXPECT_TRUE(WaitFor([&] { return absl::StrContains(MustGet("/metrics").body, cancelled); }));
}

TEST_F(OpenAiServiceTest, ShutdownEndsStreamsCleanly) {
  Json request = UserChat("Go on", 480);
  request["stream"] = true;
  absl::StatusOr<http_test::RawConnection> connection = http_test::RawConnection::Open(port_);
  ASSERT_TRUE(connection.ok());
  ASSERT_TRUE(connection->Send(http_test::PostBytes("/v1/chat/completions", request.dump())));
  connection->ReadUntil("\"content\":\"");
  std::thread shutdown([&] { server_->server().Shutdown(); });
  const std::string all = connection->ReadAll(absl::Seconds(20));
  shutdown.join();
  // Either the stream finished within the grace or it was ended: an error event, then [DONE]
  // and the last chunk of the chunked body, never a cut connection.
  EXPECT_TRUE(absl::EndsWith(all, "data: [DONE]\n\n\r\n0\r\n\r\n")) << all.substr(all.size() - 300);
  if (!absl::StrContains(all, "\"finish_reason\":\"length\"")) {
    EXPECT_TRUE(absl::StrContains(all, "\"code\":503")) << all.substr(all.size() - 300);
  }
  EXPECT_FALSE(http_test::Request(port_, "GET", "/health", "", {}, absl::Seconds(2)).ok());
}

// 256 concurrent streams on this server's two I/O threads, each to its [DONE].
TEST_F(OpenAiServiceTest, HoldsTwoHundredFiftySixConcurrentStreams) {
  ServerOptions options = HttpOptions();
  options.engine.max_running = 64;
  options.engine.max_queued = 1024;
  std::unique_ptr<TestServer> busy = TestServer::Start(options);
  ASSERT_NE(busy, nullptr);
  const int port = busy->server().http_port();
  constexpr int kStreams = 256;
  Json request = UserChat("Hi", 8);
  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  std::vector<http_test::RawConnection> clients;
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<http_test::RawConnection> connection = http_test::RawConnection::Open(port);
    ASSERT_TRUE(connection.ok()) << i;
    ASSERT_TRUE(connection->Send(http_test::PostBytes("/v1/chat/completions", request.dump())));
    clients.push_back(*std::move(connection));
  }
  int complete = 0;
  for (int i = 0; i < kStreams; ++i) {
    const std::string received = clients[i].ReadUntil("data: [DONE]", absl::Seconds(120));
    if (absl::StrContains(received, "\"completion_tokens\":8") &&
        absl::StrContains(received, "data: [DONE]")) {
      ++complete;
    }
  }
  EXPECT_EQ(complete, kStreams);
}

}  // namespace
}  // namespace kiln::server_test
