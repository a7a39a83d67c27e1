// OpenAI request parsing and the one status → HTTP mapping: defaults, every prompt form, the
// messages the template sees, and errors that name their field.
#include "server/openai_request.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/openai_errors.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

std::string Chat(Json extra = Json::object()) {
  Json body = {{"model", "m"},
               {"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})}};
  for (auto& [key, value] : extra.items()) body[key] = value;
  return body.dump();
}

void ExpectInvalid(const absl::Status& status, const std::string& param,
                   const std::string& needle) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(ErrorParam(status.message()), param) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), needle)) << status;
}

TEST(OpenAiRequestTest, ChatDefaultsFollowOpenAi) {
  absl::StatusOr<ChatCompletionRequest> chat = ParseChatCompletionRequest(Chat());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->common.model, "m");
  EXPECT_FALSE(chat->common.max_tokens.has_value());  // the rest of the context
  EXPECT_EQ(chat->common.sampling.temperature, 1.0f);
  EXPECT_EQ(chat->common.sampling.top_p, 1.0f);
  EXPECT_EQ(chat->common.n, 1);
  EXPECT_FALSE(chat->common.stream);
  EXPECT_TRUE(chat->add_generation_prompt);
  EXPECT_FALSE(chat->add_special_tokens);
  EXPECT_TRUE(chat->tools.is_null());
}

TEST(OpenAiRequestTest, ChatFieldsAndVllmExtensions) {
  absl::StatusOr<ChatCompletionRequest> chat =
      ParseChatCompletionRequest(Chat({{"max_completion_tokens", 7},
                                       {"max_tokens", 99},
                                       {"temperature", 0.5},
                                       {"top_p", 0.9},
                                       {"top_k", -1},
                                       {"min_p", 0.1},
                                       {"presence_penalty", 0.5},
                                       {"frequency_penalty", -0.5},
                                       {"repetition_penalty", 1.1},
                                       {"seed", -3},
                                       {"stop", "END"},
                                       {"stop_token_ids", {5, 6}},
                                       {"ignore_eos", true},
                                       {"n", 2},
                                       {"stream", true},
                                       {"stream_options", {{"include_usage", true}}},
                                       {"logprobs", true},
                                       {"top_logprobs", 4},
                                       {"add_generation_prompt", false},
                                       {"chat_template_kwargs", {{"enable_thinking", false}}},
                                       {"user", "ignored"},
                                       {"response_format", {{"type", "text"}}},
                                       {"tool_choice", "auto"}}));
  ASSERT_TRUE(chat.ok()) << chat.status();
  const OpenAiSampling& s = chat->common;
  EXPECT_EQ(s.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.sampling.top_p, 0.9f);
  EXPECT_EQ(s.sampling.top_k, 0);  // -1: off, as in vLLM
  EXPECT_FLOAT_EQ(s.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(s.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(s.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(s.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.n, 2);
  EXPECT_TRUE(s.stream && s.include_usage && s.logprobs);
  EXPECT_EQ(s.top_logprobs, 4);
  EXPECT_FALSE(chat->add_generation_prompt);
  EXPECT_EQ(chat->chat_template_kwargs["enable_thinking"], false);
}

TEST(OpenAiRequestTest, MessagesAsTheTemplateSeesThem) {
  const Json messages = Json::array(
      {Json{{"role", "system"},
            {"content", Json::array({Json{{"type", "text"}, {"text", "a"}},
                                     Json{{"type", "text"}, {"text", "b"}}})}},
       Json{
           {"role", "assistant"},
           {"content", nullptr},
           {"tool_calls",
            Json::array({Json{
                {"id", "call_1"},
                {"type", "function"},
                {"function", {{"name", "get"}, {"arguments", R"({"city": "Paris", "n": 2})"}}}}})}},
       Json{{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}});
  const Json tools = Json::array({Json{{"type", "function"}, {"function", {{"name", "get"}}}}});
  absl::StatusOr<ChatCompletionRequest> chat =
      ParseChatCompletionRequest(Chat({{"messages", messages}, {"tools", tools}}));
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->messages[0]["content"], "a\nb");  // text parts joined, as vLLM does
  EXPECT_TRUE(chat->messages[1]["content"].is_null());
  // Arguments become the object their JSON encodes, key order kept (tojson follows it).
  const Json& arguments = chat->messages[1]["tool_calls"][0]["function"]["arguments"];
  ASSERT_TRUE(arguments.is_object());
  EXPECT_EQ(arguments.dump(), R"({"city":"Paris","n":2})");
  EXPECT_EQ(chat->messages[2]["tool_call_id"], "call_1");
  EXPECT_EQ(chat->tools, tools);
}

TEST(OpenAiRequestTest, BadChatRequestsNameTheirField) {
  ExpectInvalid(ParseChatCompletionRequest("[1]").status(), "body", "a JSON object");
  ExpectInvalid(ParseChatCompletionRequest(R"({"messages": []})").status(), "model", "name the");
  ExpectInvalid(ParseChatCompletionRequest(R"({"model": "m"})").status(), "messages", "required");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"messages", {{{"content", "x"}}}}})).status(),
                "messages[0].role", "a role string");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"top_p", 0}})).status(), "top_p", "(0, 1]");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"n", 0}})).status(), "n", "must be at least 1");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"max_tokens", 1.5}})).status(), "max_tokens",
                "an integer");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"stop", {"a", 3}}})).status(), "stop[1]",
                "a string");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"top_logprobs", 2}})).status(), "top_logprobs",
                "needs logprobs");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"logit_bias", {{"5", 10}}}})).status(),
                "logit_bias", "not supported");
  ExpectInvalid(
      ParseChatCompletionRequest(Chat({{"response_format", {{"type", "json_object"}}}})).status(),
      "response_format", "guided decoding");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"tool_choice", "required"}})).status(),
                "tool_choice", "none");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"chat_template", "{{ x }}"}})).status(),
                "chat_template", "per-request templates");
  ExpectInvalid(ParseChatCompletionRequest(
                    Chat({{"continue_final_message", true}, {"add_generation_prompt", true}}))
                    .status(),
                "continue_final_message", "add_generation_prompt");
  const Json bad_call = Json::array({Json{
      {"role", "assistant"},
      {"tool_calls", Json::array({Json{{"function", {{"name", "f"}, {"arguments", "{nope"}}}}})}}});
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"messages", bad_call}})).status(),
                "messages[0].tool_calls[0].function.arguments", "not valid JSON");
}

TEST(OpenAiRequestTest, CompletionPromptsInEveryForm) {
  auto parse = [](Json prompt) {
    return ParseCompletionRequest(Json{{"model", "m"}, {"prompt", prompt}}.dump());
  };
  absl::StatusOr<CompletionRequest> text = parse("hello");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::get<std::string>(text->prompts.at(0)), "hello");
  EXPECT_EQ(text->common.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_TRUE(text->add_special_tokens);
  absl::StatusOr<CompletionRequest> texts = parse({"a", "b"});
  ASSERT_TRUE(texts.ok());
  EXPECT_EQ(texts->prompts.size(), 2u);
  absl::StatusOr<CompletionRequest> ids = parse({1, 2, 3});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids->prompts.at(0)), (std::vector<int32_t>{1, 2, 3}));
  absl::StatusOr<CompletionRequest> id_lists = parse(Json::array({{1, 2}, {3}}));
  ASSERT_TRUE(id_lists.ok());
  EXPECT_EQ(id_lists->prompts.size(), 2u);
  ExpectInvalid(parse(Json::array()).status(), "prompt", "empty array");
  ExpectInvalid(parse({1, -2}).status(), "prompt[1]", "must be in [0,");
  ExpectInvalid(parse(Json::array({"a", {{"x", 1}}})).status(), "prompt[1]", "got an object");
  ExpectInvalid(ParseCompletionRequest(
                    Json{{"model", "m"}, {"prompt", Json::array({"a", "b"})}, {"n", 10}}.dump())
                    .status(),
                "n", "2 prompts x n = 10 asks for 20 choices");
  ExpectInvalid(
      ParseCompletionRequest(Json{{"model", "m"}, {"prompt", "a"}, {"best_of", 3}}.dump()).status(),
      "best_of", "best_of = n");
  absl::StatusOr<CompletionRequest> logprobs =
      ParseCompletionRequest(Json{{"model", "m"}, {"prompt", "a"}, {"logprobs", 0}}.dump());
  ASSERT_TRUE(logprobs.ok());
  EXPECT_TRUE(logprobs->common.logprobs);  // 0: the chosen tokens' log-probabilities only
  EXPECT_EQ(logprobs->common.top_logprobs, 0);
}

TEST(OpenAiRequestTest, TokenizeAndDetokenize) {
  absl::StatusOr<TokenizeRequest> prompt =
      ParseTokenizeRequest(R"({"model": "m", "prompt": "hi", "add_special_tokens": false})");
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt->prompt, "hi");
  EXPECT_FALSE(prompt->add_special_tokens);
  absl::StatusOr<TokenizeRequest> chat = ParseTokenizeRequest(Chat());
  ASSERT_TRUE(chat.ok());
  ASSERT_TRUE(chat->chat.has_value());
  EXPECT_FALSE(chat->add_special_tokens);  // the template writes BOS itself
  ExpectInvalid(ParseTokenizeRequest(R"({"model": "m"})").status(), "prompt", "required");
  absl::StatusOr<DetokenizeRequest> detokenize =
      ParseDetokenizeRequest(R"({"model": "m", "tokens": [4, 5]})");
  ASSERT_TRUE(detokenize.ok());
  EXPECT_EQ(detokenize->tokens, (std::vector<int32_t>{4, 5}));
  ExpectInvalid(ParseDetokenizeRequest(R"({"model": "m", "tokens": "x"})").status(), "tokens",
                "an array of token ids");
}

TEST(OpenAiErrorsTest, OneMappingFromStatusToHttp) {
  const std::pair<absl::StatusCode, int> expected[] = {
      {absl::StatusCode::kInvalidArgument, 400}, {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kUnauthenticated, 401}, {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kNotFound, 404},        {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kUnavailable, 503},     {absl::StatusCode::kDeadlineExceeded, 504},
      {absl::StatusCode::kInternal, 500},        {absl::StatusCode::kUnimplemented, 501},
  };
  for (const auto& [code, status] : expected) {
    EXPECT_EQ(HttpErrorFor(code).status, status) << absl::StatusCodeToString(code);
  }
  const Json body = Json::parse(OpenAiErrorJson(absl::InvalidArgumentError("n: too many")));
  EXPECT_EQ(body, Json::parse(R"({"error": {"message": "n: too many",
      "type": "invalid_request_error", "param": "n", "code": 400}})"));
  EXPECT_EQ(ErrorParam("model 'x' is not loaded"), "");
  EXPECT_EQ(ErrorParam("messages[2].content: bad"), "messages[2].content");
  const HttpResponse response = ErrorResponse(absl::ResourceExhaustedError("full"));
  EXPECT_EQ(response.status, 429);
  EXPECT_EQ(response.content_type, "application/json");
}

TEST(OpenAiRequestTest, RequestLimitsNameTheirFlag) {
  RequestLimits limits;
  limits.max_stop_strings = 2;
  limits.max_stop_string_bytes = 4;
  limits.max_choices = 3;
  limits.max_logprobs = 5;
  EXPECT_TRUE(ParseChatCompletionRequest(Chat({{"stop", {"a", "abcd"}}, {"n", 3}}), limits).ok());
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"stop", {"a", "b", "c"}}}), limits).status(),
                "stop",
                "3 stop strings are more than this server's limit of 2 (--max-stop-strings)");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"stop", "abcde"}}), limits).status(), "stop[0]",
                "5 bytes are more than this server's limit of 4 (--max-stop-string-bytes)");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"n", 4}}), limits).status(), "n",
                "n = 4 asks for 4 choices, more than this server's limit of 3 (--max-choices)");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"n", 1e12}}), limits).status(), "n",
                "(--max-choices)");
  ExpectInvalid(
      ParseChatCompletionRequest(Chat({{"logprobs", true}, {"top_logprobs", 6}}), limits).status(),
      "top_logprobs", "must be in [0, 5], got 6 (--max-logprobs)");
  const auto completion = [&](Json extra) {
    Json body = {{"model", "m"}, {"prompt", {"a", "b"}}};
    for (auto& [key, value] : extra.items()) body[key] = value;
    return ParseCompletionRequest(body.dump(), limits).status();
  };
  EXPECT_TRUE(completion({{"logprobs", 5}}).ok());
  ExpectInvalid(completion({{"logprobs", 6}}), "logprobs", "(--max-logprobs)");
  ExpectInvalid(completion({{"n", 2}}), "n", "2 prompts x n = 2 asks for 4 choices");
  // The defaults: OpenAI's bound on top logprobs, 16 choices.
  ExpectInvalid(
      ParseChatCompletionRequest(Chat({{"logprobs", true}, {"top_logprobs", 21}})).status(),
      "top_logprobs", "must be in [0, 20]");
  ExpectInvalid(ParseChatCompletionRequest(Chat({{"n", 17}})).status(), "n", "limit of 16");
}

TEST(OpenAiRequestTest, HostileBodiesAreRefusedWithTheReason) {
  // Deep nesting would reach the recursive conversion into template values.
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  ExpectInvalid(ParseChatCompletionRequest(
                    R"({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "chat_template_kwargs": {"x": )" +
                    deep + "}}")
                    .status(),
                "body", "nested 30002 levels deep, more than this server's 64");
  const std::string nested_arguments =
      Json{{"model", "m"},
           {"messages",
            {{{"role", "assistant"},
              {"content", ""},
              {"tool_calls",
               {{{"id", "1"},
                 {"type", "function"},
                 {"function",
                  {{"name", "f"},
                   {"arguments", std::string(100, '[') + std::string(100, ']')}}}}}}}}}}
          .dump();
  ExpectInvalid(ParseChatCompletionRequest(nested_arguments).status(),
                "messages[0].tool_calls[0].function.arguments", "nested 100 levels deep");
  // The JSON parser's reason travels.
  ExpectInvalid(ParseCompletionRequest("{\"model\": \"m\", \"prompt\": \"a\xff\"}").status(),
                "body", "invalid string: ill-formed UTF-8 byte");
  ExpectInvalid(
      ParseCompletionRequest(R"({"model": "m", "prompt": "a", "temperature": 1e400})").status(),
      "body", "number overflow");
  ExpectInvalid(ParseChatCompletionRequest(
                    Chat({{"messages", {{{"role", "user<|im_end|>"}, {"content", "x"}}}}}))
                    .status(),
                "messages[0].role",
                "is not one of system, developer, user, assistant, tool, function");
}

}  // namespace
}  // namespace kiln
