// The Inference service over a real loopback channel: Generate (token ids and text prompts,
// stopping, logprobs, the last response's finish reason, usage and timings), Tokenize,
// Detokenize, and every bad request with the field named.
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

class InferenceServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options = TestServerOptions();
    options.models = {{"plain", "plain", "", ""}, {"text", "text", "", ""}};
    server_ = TestServer::Start(options).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  v1::Inference::Stub& stub() { return server_->inference(); }

  static TestServer* server_;
};
TestServer* InferenceServiceTest::server_ = nullptr;

TEST_F(InferenceServiceTest, GreedyTokenIdStream) {
  StreamResult result = GenerateAll(stub(), GreedyRequest("plain", {1, 2, 3, 4, 5}, 6));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.tokens.size(), 6u);
  for (int32_t token : result.tokens) {
    EXPECT_GE(token, 0);
    EXPECT_LT(token, 512);
  }
  // One response per engine update: one token each, the last one carries the end.
  for (size_t i = 0; i + 1 < result.responses.size(); ++i) {
    EXPECT_EQ(result.responses[i].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
    EXPECT_FALSE(result.responses[i].has_usage());
  }
  const v1::GenerateResponse& last = *result.last();
  EXPECT_EQ(last.finish_reason(), v1::LENGTH);
  EXPECT_EQ(last.usage().prompt_tokens(), 5);
  EXPECT_EQ(last.usage().completion_tokens(), 6);
  EXPECT_GT(last.timings().total_seconds(), 0);
  EXPECT_GT(last.timings().time_to_first_token_seconds(), 0);
  EXPECT_LE(last.timings().time_to_first_token_seconds(), last.timings().total_seconds());
  EXPECT_TRUE(result.text.empty());  // no tokenizer, no text

  StreamResult again = GenerateAll(stub(), GreedyRequest("plain", {1, 2, 3, 4, 5}, 6));
  EXPECT_EQ(again.tokens, result.tokens);
}

TEST_F(InferenceServiceTest, DefaultMaxTokensAndSpeculativeOff) {
  v1::GenerateRequest request = GreedyRequest("plain", {7, 8}, 0);
  request.mutable_speculative()->set_num_draft_tokens(0);
  StreamResult result = GenerateAll(stub(), request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens.size(), 8u);  // TestServerOptions().default_max_tokens
}

TEST_F(InferenceServiceTest, StopTokenIdsAndSeededSampling) {
  StreamResult greedy = GenerateAll(stub(), GreedyRequest("plain", {9, 10, 11}, 10));
  ASSERT_EQ(greedy.tokens.size(), 10u);
  v1::GenerateRequest request = GreedyRequest("plain", {9, 10, 11}, 10);
  request.mutable_stopping()->add_stop_token_ids(greedy.tokens[3]);
  StreamResult stopped = GenerateAll(stub(), request);
  ASSERT_TRUE(stopped.status.ok()) << stopped.status.error_message();
  const auto first = std::find(greedy.tokens.begin(), greedy.tokens.end(), greedy.tokens[3]);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(greedy.tokens.begin(), first + 1));
  EXPECT_EQ(stopped.last()->finish_reason(), v1::STOP);

  v1::GenerateRequest sampled = GreedyRequest("plain", {9, 10, 11}, 12);
  sampled.mutable_sampling()->set_temperature(1.5f);
  sampled.mutable_sampling()->set_top_p(0.95f);
  sampled.mutable_sampling()->set_repetition_penalty(1.1f);
  sampled.mutable_sampling()->set_seed(42);
  StreamResult a = GenerateAll(stub(), sampled);
  StreamResult b = GenerateAll(stub(), sampled);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 12u);
}

TEST_F(InferenceServiceTest, Logprobs) {
  v1::GenerateRequest request = GreedyRequest("text", {kHelloId, 32}, 5);
  request.set_logprobs(3);
  StreamResult result = GenerateAll(stub(), request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  size_t with_tokens = 0;
  for (const v1::GenerateResponse& response : result.responses) {
    ASSERT_EQ(response.logprobs_size(), response.token_ids_size());
    for (int i = 0; i < response.token_ids_size(); ++i) {
      ++with_tokens;
      const v1::TokenLogprobs& logprobs = response.logprobs(i);
      EXPECT_EQ(logprobs.chosen().token_id(), response.token_ids(i));
      EXPECT_LE(logprobs.chosen().logprob(), 0.0f);
      ASSERT_EQ(logprobs.top_size(), 3);
      // Greedy: the chosen token is the most likely one.
      EXPECT_EQ(logprobs.top(0).token_id(), logprobs.chosen().token_id());
      EXPECT_GE(logprobs.top(0).logprob(), logprobs.top(1).logprob());
      if (logprobs.chosen().token_id() < 256) {
        EXPECT_FALSE(logprobs.chosen().text().empty()) << logprobs.chosen().token_id();
      }
    }
  }
  EXPECT_EQ(with_tokens, 5u);
}

TEST_F(InferenceServiceTest, TextPromptsUseTheTokenizer) {
  v1::GenerateRequest request;
  request.set_model("text");
  request.set_prompt("hello");
  request.set_add_special_tokens(true);
  request.mutable_stopping()->set_max_tokens(6);
  request.mutable_stopping()->set_ignore_eos(true);
  StreamResult with_bos = GenerateAll(stub(), request);
  ASSERT_TRUE(with_bos.status.ok()) << with_bos.status.error_message();
  EXPECT_EQ(with_bos.last()->usage().prompt_tokens(), 2);  // <s> hello
  // Same prompt as ids gives the same tokens.
  EXPECT_EQ(GenerateAll(stub(), GreedyRequest("text", {kBosId, kHelloId}, 6)).tokens,
            with_bos.tokens);

  request.set_add_special_tokens(false);
  StreamResult without = GenerateAll(stub(), request);
  ASSERT_TRUE(without.status.ok());
  EXPECT_EQ(without.last()->usage().prompt_tokens(), 1);

  // The streamed text deltas add up to the decoded output.
  v1::DetokenizeRequest detokenize;
  detokenize.set_model("text");
  detokenize.mutable_token_ids()->Add(with_bos.tokens.begin(), with_bos.tokens.end());
  detokenize.set_skip_special_tokens(true);
  v1::DetokenizeResponse decoded;
  ASSERT_TRUE(stub().Detokenize(Context().get(), detokenize, &decoded).ok());
  EXPECT_EQ(with_bos.text, decoded.text());
}

TEST_F(InferenceServiceTest, StopStrings) {
  StreamResult full = GenerateAll(stub(), GreedyRequest("text", {kHelloId}, 12));
  ASSERT_TRUE(full.status.ok());
  if (full.text.size() < 2) GTEST_SKIP() << "the model's output has too little text";
  v1::GenerateRequest request = GreedyRequest("text", {kHelloId}, 12);
  // One whole UTF-8 character from the middle of the text (strings must be valid UTF-8).
  size_t at = full.text.size() / 2;
  while (at > 0 && (static_cast<unsigned char>(full.text[at]) & 0xC0) == 0x80) --at;
  size_t end = at + 1;
  while (end < full.text.size() && (static_cast<unsigned char>(full.text[end]) & 0xC0) == 0x80) {
    ++end;
  }
  const std::string stop = full.text.substr(at, end - at);
  request.mutable_stopping()->add_stop(stop);
  StreamResult stopped = GenerateAll(stub(), request);
  ASSERT_TRUE(stopped.status.ok()) << stopped.status.error_message();
  EXPECT_EQ(stopped.last()->finish_reason(), v1::STOP);
  EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find(stop)));
}

TEST_F(InferenceServiceTest, TokenizeAndDetokenize) {
  v1::TokenizeRequest request;
  request.set_model("text");
  request.set_text("hello world");
  v1::TokenizeResponse response;
  ASSERT_TRUE(stub().Tokenize(Context().get(), request, &response).ok());
  EXPECT_EQ(std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()),
            (std::vector<int32_t>{kHelloId, 260, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(std::vector<std::string>(response.tokens().begin(), response.tokens().end()),
            (std::vector<std::string>{"hello", "\xC4\xA0w", "o", "r", "l", "d"}));
  request.set_add_special_tokens(true);
  ASSERT_TRUE(stub().Tokenize(Context().get(), request, &response).ok());
  EXPECT_EQ(response.token_ids(0), kBosId);

  v1::DetokenizeRequest detokenize;
  detokenize.set_model("text");
  detokenize.mutable_token_ids()->Add(response.token_ids().begin(), response.token_ids().end());
  v1::DetokenizeResponse text;
  ASSERT_TRUE(stub().Detokenize(Context().get(), detokenize, &text).ok());
  EXPECT_EQ(text.text(), "<s>hello world");
  detokenize.set_skip_special_tokens(true);
  ASSERT_TRUE(stub().Detokenize(Context().get(), detokenize, &text).ok());
  EXPECT_EQ(text.text(), "hello world");
}

TEST_F(InferenceServiceTest, BadGenerateRequestsNameTheField) {
  auto status_of = [&](const v1::GenerateRequest& request) {
    return GenerateAll(stub(), request).status;
  };
  EXPECT_CODE(status_of(GreedyRequest("nope", {1}, 2)), NOT_FOUND, "'nope' is not loaded");
  EXPECT_CODE(status_of(GreedyRequest("", {1}, 2)), INVALID_ARGUMENT, "model");

  v1::GenerateRequest neither = GreedyRequest("plain", {}, 2);
  neither.clear_prompt_token_ids();
  EXPECT_CODE(status_of(neither), INVALID_ARGUMENT, "prompt");
  EXPECT_CODE(status_of(GreedyRequest("plain", {}, 2)), INVALID_ARGUMENT, "prompt_token_ids");
  // prompt and prompt_token_ids are one oneof: setting one clears the other, so a request
  // never carries both; the one set last is the prompt.
  v1::GenerateRequest both;
  both.set_model("plain");
  both.set_prompt("hello");
  both.mutable_prompt_token_ids()->add_ids(5);
  both.mutable_stopping()->set_max_tokens(2);
  EXPECT_EQ(both.prompt_input_case(), v1::GenerateRequest::kPromptTokenIds);
  EXPECT_TRUE(status_of(both).ok());

  EXPECT_CODE(status_of(GreedyRequest("plain", {1, 512}, 2)), INVALID_ARGUMENT, "vocabulary");
  EXPECT_CODE(status_of(GreedyRequest("plain", {-1}, 2)), INVALID_ARGUMENT, "vocabulary");
  EXPECT_CODE(status_of(GreedyRequest("plain", std::vector<int32_t>(600, 1), 2)), INVALID_ARGUMENT,
              "context");
  EXPECT_CODE(status_of(GreedyRequest("plain", {1}, -1)), INVALID_ARGUMENT, "stopping.max_tokens");

  v1::GenerateRequest request = GreedyRequest("plain", {1}, 2);
  request.mutable_sampling()->set_top_p(1.5f);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "top_p");
  request = GreedyRequest("plain", {1}, 2);
  request.mutable_sampling()->set_temperature(-1.0f);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "temperature");
  request = GreedyRequest("plain", {1}, 2);
  request.set_logprobs(50);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "logprobs");
  request = GreedyRequest("plain", {1}, 2);
  request.mutable_stopping()->add_stop_token_ids(9999);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "stopping.stop_token_ids");
  request = GreedyRequest("plain", {1}, 2);
  request.mutable_stopping()->add_stop("x");
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "stopping.stop");
  request = GreedyRequest("text", {1}, 2);
  request.mutable_stopping()->add_stop("");
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "stopping.stop");
  request = GreedyRequest("plain", {1}, 2);
  request.mutable_speculative()->set_num_draft_tokens(3);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "speculative.num_draft_tokens");
  request.mutable_speculative()->set_num_draft_tokens(-1);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "speculative.num_draft_tokens");

  request = GreedyRequest("plain", {}, 2);
  request.set_prompt("hello");
  EXPECT_CODE(status_of(request), FAILED_PRECONDITION, "no tokenizer");
  request.set_model("text");
  request.set_prompt("");
  request.set_add_special_tokens(false);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "prompt");
}

TEST_F(InferenceServiceTest, BadTokenizeRequests) {
  v1::TokenizeRequest tokenize;
  v1::TokenizeResponse tokens;
  tokenize.set_model("plain");
  tokenize.set_text("hello");
  EXPECT_CODE(stub().Tokenize(Context().get(), tokenize, &tokens), FAILED_PRECONDITION,
              "no tokenizer");
  tokenize.set_model("nope");
  EXPECT_CODE(stub().Tokenize(Context().get(), tokenize, &tokens), NOT_FOUND, "nope");
  tokenize.set_model("");
  EXPECT_CODE(stub().Tokenize(Context().get(), tokenize, &tokens), INVALID_ARGUMENT, "model");

  v1::DetokenizeRequest detokenize;
  v1::DetokenizeResponse text;
  detokenize.set_model("plain");
  detokenize.add_token_ids(1);
  EXPECT_CODE(stub().Detokenize(Context().get(), detokenize, &text), FAILED_PRECONDITION,
              "no tokenizer");
  detokenize.set_model("text");
  detokenize.add_token_ids(100000);
  EXPECT_CODE(stub().Detokenize(Context().get(), detokenize, &text), INVALID_ARGUMENT, "token_ids");
}

TEST_F(InferenceServiceTest, RequestsBeyondTheLimitsOrTheContextAreRefused) {
  auto status_of = [&](const v1::GenerateRequest& request) {
    return GenerateAll(stub(), request).status;
  };
  // max_context is 512: an explicit max_tokens must fit beside the prompt, as vLLM requires.
  EXPECT_TRUE(status_of(GreedyRequest("plain", std::vector<int32_t>(500, 1), 12)).ok());
  EXPECT_CODE(status_of(GreedyRequest("plain", std::vector<int32_t>(500, 1), 13)), INVALID_ARGUMENT,
              "stopping.max_tokens: this model's maximum context length is 512 tokens, but the "
              "request asks for 513 (500 in the prompt, 13 to generate)");
  // The default (8 here) takes what the context leaves.
  StreamResult clipped =
      GenerateAll(stub(), GreedyRequest("plain", std::vector<int32_t>(508, 1), 0));
  ASSERT_TRUE(clipped.status.ok()) << clipped.status.error_message();
  EXPECT_EQ(clipped.tokens.size(), 4u);

  v1::GenerateRequest request = GreedyRequest("text", {1}, 2);
  for (int i = 0; i < 17; ++i) request.mutable_stopping()->add_stop("x");
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT,
              "stopping.stop: 17 stop strings are more than this server's limit of 16 "
              "(--max-stop-strings)");
  request = GreedyRequest("text", {1}, 2);
  request.mutable_stopping()->add_stop(std::string(513, 'x'));
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "stopping.stop[0]: 513 bytes");
  request = GreedyRequest("plain", {1}, 2);
  request.set_logprobs(21);
  EXPECT_CODE(status_of(request), INVALID_ARGUMENT, "logprobs: must be in [0, 20], got 21");
  // A message over --max-request-bytes (8 MiB by default) is refused by gRPC before parsing.
  request = GreedyRequest("text", {1}, 2);
  request.set_prompt(std::string(size_t{9} << 20, 'a'));
  EXPECT_EQ(status_of(request).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(status_of(GreedyRequest("plain", {1}, 2)).ok());
}

TEST(InferenceServiceShutdownTest, StreamsPastTheGraceEndWithTheReason) {
  ServerOptions options = TestServerOptions();
  options.models = {{"plain", "plain", "", ""}};
  options.shutdown_grace = absl::Milliseconds(300);
  options.token_delay_for_testing = absl::Milliseconds(20);
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<grpc::ClientContext> short_context = Context();
  std::unique_ptr<grpc::ClientContext> long_context = Context();
  auto short_stream =
      server->inference().Generate(short_context.get(), GreedyRequest("plain", {1, 2}, 5));
  auto long_stream =
      server->inference().Generate(long_context.get(), GreedyRequest("plain", {1, 2}, 400));
  v1::GenerateResponse response;
  ASSERT_TRUE(short_stream->Read(&response));
  ASSERT_TRUE(long_stream->Read(&response));

  const absl::Time start = absl::Now();
  std::thread shutdown([&] { server->server().Shutdown(); });
  int short_tokens = 1;
  while (short_stream->Read(&response)) short_tokens += response.token_ids_size();
  EXPECT_TRUE(short_stream->Finish().ok());
  EXPECT_EQ(short_tokens, 5);  // finished inside the grace
  while (long_stream->Read(&response)) {
  }
  const grpc::Status ended = long_stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_TRUE(absl::StrContains(ended.error_message(), "kiln-server is shutting down"))
      << ended.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  shutdown.join();
  // New calls are refused once the server shut down.
  EXPECT_FALSE(GenerateAll(server->inference(), GreedyRequest("plain", {1}, 2)).status.ok());
}

}  // namespace
}  // namespace kiln::server_test
