// kiln-loadgen's OpenAI HTTP target: the --protocol/--api/--api-key flags, and the HTTP runner
// against a fake OpenAI-compatible server written here with Beast, whose chunks come at a known
// pace and which can refuse (429), cut a stream short, send an error event, close its
// connections or stall, and which tells a client's orderly close from a reset. (The pieces
// without I/O are in loadgen_openai_test.cc.)
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "clients/loadgen/http_runner.h"
#include "clients/loadgen/openai.h"
#include "clients/loadgen/options.h"
#include "clients/loadgen/report.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kiln::loadgen {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;
using Json = nlohmann::json;

// ---- flags --------------------------------------------------------------------------------------

absl::StatusOr<LoadgenOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "kiln-loadgen");
  return ParseOptions(static_cast<int>(args.size()), args.data());
}

TEST(LoadgenHttpOptionsTest, ProtocolApiAndKey) {
  absl::StatusOr<LoadgenOptions> o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->protocol, Protocol::kGrpc);
  EXPECT_EQ(o->target, "127.0.0.1:50051");

  o = Parse({"--protocol", "openai"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->protocol, Protocol::kOpenAi);
  EXPECT_EQ(o->target, "http://127.0.0.1:8000");
  EXPECT_EQ(o->api, OpenAiApi::kCompletions);

  // The README's example.
  o = Parse({"--protocol", "openai", "--target", "http://127.0.0.1:8000", "--api", "chat",
             "--concurrency", "8", "--duration", "20s"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->api, OpenAiApi::kChat);
  EXPECT_EQ(o->concurrency, 8);
  EXPECT_EQ(o->duration, absl::Seconds(20));

  o = Parse({"--protocol=openai", "--target=http://gpu:8080/v1", "--api=completions",
             "--api_key=sk-1", "--rates=1,2", "--threads=4", "--model=llama"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->api_key, "sk-1");
  EXPECT_EQ(o->rates, (std::vector<double>{1, 2}));
  EXPECT_EQ(o->threads, 4);

  absl::StatusOr<LoadgenOptions> https =
      Parse({"--protocol", "openai", "--target", "https://api.example.com"});
  ASSERT_FALSE(https.ok());
  EXPECT_TRUE(absl::StrContains(https.status().message(), "--target")) << https.status();
  EXPECT_TRUE(absl::StrContains(https.status().message(), "no TLS")) << https.status();

  for (std::vector<const char*> bad :
       {std::vector<const char*>{"--protocol", "websocket"},
        {"--api", "chat"},  // grpc has no --api
        {"--api-key", "k"},
        {"--target", "http://127.0.0.1:8000"},  // a URL wants --protocol openai
        {"--protocol", "openai", "--api", "embeddings"},
        {"--protocol", "openai", "--target", "127.0.0.1:8000"},
        {"--protocol", "openai", "--tls"},
        {"--protocol", "openai", "--tls-ca", "ca.pem"},
        {"--protocol", "openai", "--connections", "2"},
        {"--protocol", "openai", "--api-key="}}) {
    EXPECT_FALSE(Parse(bad).ok()) << bad[0] << " " << (bad.size() > 1 ? bad[1] : "");
  }
}

TEST(LoadgenHttpOptionsTest, HelpDocumentsTheHttpFlags) {
  const std::string help = HelpText();
  for (const char* part :
       {"--protocol grpc|openai", "--api completions|chat", "--api-key KEY", "http://HOST:PORT",
        "https is refused", "no TLS", "http_429", "truncated", "include_usage", "ignore_eos"}) {
    EXPECT_TRUE(absl::StrContains(help, part)) << part;
  }
}

// ---- a fake OpenAI-compatible server ----------------------------------------------------------

constexpr auto kFirstDelay = std::chrono::milliseconds(30);  // before the first token
constexpr auto kPace = std::chrono::milliseconds(20);        // between tokens

struct SeenRequest {
  std::string path, authorization;
  Json body;
};

// Blocking Beast, a thread per connection. The request's "model" picks the behaviour:
//   paced        max_tokens content chunks (one token each), kFirstDelay then kPace apart,
//                a finish chunk, a usage chunk and [DONE], chunked;
//   reasoning    the same, the first two chunks as delta.reasoning_content (chat);
//   multi        two tokens per chunk, the final usage saying how many;
//   continuous   two tokens per chunk, each chunk carrying the running usage;
//   split        every event in two writes, CRLF line ends, a comment, data on two lines;
//   close        "Connection: close" and a body that ends with the connection;
//   drop-idle    keep-alive promised, then the connection closed after each response;
//   429          a 429 with OpenAI's error body;
//   cut          the connection closed after two chunks (no chunked terminator);
//   no-done      a clean end without a finish_reason or [DONE];
//   error-event  one chunk, then data: {"error": ...}, then [DONE];
//   stall        the header, then nothing for 2 s.
class FakeOpenAiServer {
 public:
  FakeOpenAiServer() : acceptor_(io_) {
    ErrorCode ec;
    const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      ADD_FAILURE() << "cannot listen: " << ec.message();
      return;
    }
    port_ = acceptor_.local_endpoint(ec).port();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeOpenAiServer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (accept_thread_.joinable()) {
      asio::io_context io;  // a connection wakes the blocked accept
      tcp::socket socket(io);
      ErrorCode ec;
      socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ec);
      accept_thread_.join();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const std::shared_ptr<tcp::socket>& socket : sockets_) {
        ::shutdown(socket->native_handle(), SHUT_RDWR);  // wakes a blocked read
      }
    }
    for (std::thread& thread : threads_) thread.join();
  }

  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int connections() const { return connections_.load(); }
  // Streams that the client ended before their end, as seen between two tokens: by an orderly
  // close (the connection reads as ended) or by a reset.
  int peer_closes() const { return peer_closes_.load(); }
  int peer_resets() const { return peer_resets_.load(); }
  std::vector<SeenRequest> requests() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      auto socket = std::make_shared<tcp::socket>(io_);
      ErrorCode ec;
      acceptor_.accept(*socket, ec);
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      if (ec) continue;
      ++connections_;
      sockets_.push_back(socket);
      threads_.emplace_back([this, socket] { Serve(*socket); });
    }
  }

  void Serve(tcp::socket& socket) {
    ErrorCode ignored;  // each event goes out when written, as real servers do it
    socket.set_option(tcp::no_delay(true), ignored);
    beast::flat_buffer buffer;
    while (true) {
      http::request<http::string_body> request;
      ErrorCode ec;
      http::read(socket, buffer, request, ec);
      if (ec) {  // the client closed (or reset) its side: close ours, as servers do
        ::shutdown(socket.native_handle(), SHUT_RDWR);
        return;
      }
      SeenRequest seen;
      seen.path = std::string(request.target().data(), request.target().size());
      const auto authorization = request[http::field::authorization];
      seen.authorization = std::string(authorization.data(), authorization.size());
      seen.body = Json::parse(request.body(), nullptr, false);
      if (!seen.body.is_object()) seen.body = Json::object();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        requests_.push_back(seen);
      }
      if (!Respond(socket, seen)) {
        ::shutdown(socket.native_handle(), SHUT_RDWR);  // closed by the destructor
        return;
      }
    }
  }

  static bool Write(tcp::socket& socket, const std::string& bytes) {
    ErrorCode ec;
    asio::write(socket, asio::buffer(bytes), ec);
    return !ec;
  }

  // Whether the client ended the connection (counted): a peek reads 0 bytes after its FIN, and
  // fails with ECONNRESET after its RST.
  bool PeerGone(tcp::socket& socket) {
    char byte = 0;
    const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) {
      ++peer_closes_;
      return true;
    }
    if (n < 0 && errno == ECONNRESET) {
      ++peer_resets_;
      return true;
    }
    return false;
  }

  // Sleeps unless the server stops first; false then.
  bool Sleep(std::chrono::milliseconds duration) {
    std::unique_lock<std::mutex> lock(mutex_);
    return !wake_.wait_for(lock, duration, [this] { return stopping_; });
  }

  // Answers one request; false when the connection is to end.
  bool Respond(tcp::socket& socket, const SeenRequest& request) {
    const std::string model = request.body.value("model", "");
    const bool chat = absl::EndsWith(request.path, "/chat/completions");
    const int max_tokens = request.body.value("max_tokens", 1);
    const Json& prompt = request.body.contains("prompt") ? request.body["prompt"] : Json();
    const int prompt_tokens = prompt.is_array() ? static_cast<int>(prompt.size()) + 1 : 10;
    if (model == "429") {
      const std::string body =
          R"({"error":{"message":"slow down","type":"rate_limit_exceeded","code":429}})";
      return Write(socket, absl::StrCat("HTTP/1.1 429 Too Many Requests\r\n"
                                        "Content-Type: application/json\r\nContent-Length: ",
                                        body.size(), "\r\n\r\n", body));
    }
    const bool close = model == "close";
    if (!Write(socket, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n",
                                    close ? "Connection: close\r\n\r\n"
                                          : "Transfer-Encoding: chunked\r\n\r\n"))) {
      return false;
    }
    auto send = [&](const std::string& bytes) {
      return Write(socket, close ? bytes : absl::StrFormat("%x\r\n%s\r\n", bytes.size(), bytes));
    };
    auto event = [&](const Json& data) { return send("data: " + data.dump() + "\n\n"); };
    if (model == "stall") {
      Sleep(std::chrono::seconds(2));
      return false;
    }
    if (!Sleep(kFirstDelay)) return false;
    if (chat)
      event({{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}}}}});
    const int per_chunk = model == "multi" || model == "continuous" ? 2 : 1;
    int sent = 0;
    for (int i = 0; sent < max_tokens; ++i) {
      if (i > 0 && (!Sleep(kPace) || PeerGone(socket))) return false;
      const int tokens = std::min(per_chunk, max_tokens - sent);
      sent += tokens;
      const std::string text(tokens, 'x');
      Json choice = {{"index", 0}, {"finish_reason", nullptr}};
      if (!chat) {
        choice["text"] = text;
      } else {
        choice["delta"] = {{model == "reasoning" && i < 2 ? "reasoning_content" : "content", text}};
      }
      Json chunk = {{"choices", {choice}}};
      if (model == "continuous") {
        chunk["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", sent}};
      }
      if (model == "split") {
        // `{"choices":` on one data line and the rest on the next; the event in two writes.
        const std::string json = chunk.dump();
        const size_t colon = json.find(':') + 1;
        const std::string bytes = absl::StrCat(": keep-alive\r\ndata: ", json.substr(0, colon),
                                               "\r\ndata: ", json.substr(colon), "\r\n\r\n");
        if (!send(bytes.substr(0, bytes.size() / 2))) return false;
        if (!Sleep(std::chrono::milliseconds(2))) return false;
        if (!send(bytes.substr(bytes.size() / 2))) return false;
      } else if (!event(chunk)) {
        return false;
      }
      if (model == "cut" && i == 1) return false;
      if (model == "error-event") {
        event({{"error", {{"message", "boom"}, {"type", "internal_error"}, {"code", 500}}}});
        break;
      }
    }
    if (model != "no-done") {
      if (model != "error-event") {
        Json finish = {{"index", 0}, {"finish_reason", "length"}};
        finish[chat ? "delta" : "text"] = chat ? Json::object() : Json("");
        event({{"choices", {finish}}});
        event({{"choices", Json::array()},
               {"usage",
                {{"prompt_tokens", prompt_tokens},
                 {"completion_tokens", sent},
                 {"total_tokens", prompt_tokens + sent}}}});
      }
      send("data: [DONE]\n\n");
    }
    if (close) return false;
    if (!Write(socket, "0\r\n\r\n")) return false;
    return model != "drop-idle";
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::atomic<int> connections_{0};
  std::atomic<int> peer_closes_{0}, peer_resets_{0};
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::vector<std::thread> threads_;
  std::vector<SeenRequest> requests_;
};

// ---- the runner against it -----------------------------------------------------------------

OpenAiTarget Target(const FakeOpenAiServer& server, OpenAiApi api = OpenAiApi::kCompletions,
                    const std::string& path = "") {
  OpenAiTarget target;
  target.url = *ParseHttpUrl(server.url() + path);
  target.api = api;
  target.api_key = "sekrit";
  return target;
}

PhaseConfig Closed(const std::string& model, int concurrency, int requests) {
  PhaseConfig config;
  config.model = model;
  config.concurrency = concurrency;
  config.requests = requests;
  return config;
}

PromptSource Prompts(int32_t input, int32_t output) {
  WorkloadOptions workload;
  workload.input = LengthDistribution::Fixed(input);
  workload.output = LengthDistribution::Fixed(output);
  return *PromptSource::Create(workload);
}

PhaseSummary Summary(const PhaseResult& result) {
  return SummarizePhase(result.records, result.measured_seconds, {});
}

int64_t Errors(const PhaseSummary& summary, const std::string& label) {
  auto it = summary.errors_by_code.find(label);
  return it == summary.errors_by_code.end() ? 0 : it->second;
}

TEST(LoadgenHttpRunnerTest, CompletionsMeasureThePacedTokens) {
  FakeOpenAiServer server;
  constexpr int kRequests = 8, kMaxTokens = 5, kInput = 4;
  PromptSource prompts = Prompts(kInput, kMaxTokens);
  LiveCounters live;
  absl::StatusOr<PhaseResult> result =
      RunHttpPhase(Target(server), Closed("paced", 4, kRequests), prompts, &live);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->records.size(), static_cast<size_t>(kRequests));
  EXPECT_EQ(live.completed.load(), kRequests);
  EXPECT_EQ(live.in_flight.load(), 0);
  EXPECT_EQ(live.errors.load(), 0);
  EXPECT_EQ(live.output_tokens.load(), kRequests * kMaxTokens);

  const PhaseSummary s = Summary(*result);
  EXPECT_EQ(s.succeeded, kRequests);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.output_tokens, kRequests * kMaxTokens);
  EXPECT_EQ(s.input_tokens, kRequests * (kInput + 1));  // the server's usage.prompt_tokens
  const double first = std::chrono::duration<double>(kFirstDelay).count();
  const double pace = std::chrono::duration<double>(kPace).count();
  // The machine is noisy: tight lower bounds, loose upper ones.
  EXPECT_GE(s.ttft.min, first);
  EXPECT_LT(s.ttft.p50, first + 10 * pace);
  EXPECT_EQ(s.itl.count, kRequests * (kMaxTokens - 1));
  EXPECT_GE(s.itl.p50, 0.9 * pace);
  EXPECT_LT(s.itl.p50, 3 * pace);
  EXPECT_GE(s.e2e.min, first + (kMaxTokens - 1) * pace);
  EXPECT_GE(s.tpot.p50, 0.9 * pace);
  for (const RequestRecord& r : result->records) {
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.code_name(), "OK");
  }
  // Each of the four slots kept its connection alive for its next requests.
  EXPECT_EQ(server.connections(), 4);

  const std::vector<SeenRequest> seen = server.requests();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kRequests));
  for (const SeenRequest& request : seen) {
    EXPECT_EQ(request.path, "/v1/completions");
    EXPECT_EQ(request.authorization, "Bearer sekrit");
    EXPECT_EQ(request.body["model"], "paced");
    EXPECT_EQ(request.body["stream"], true);
    EXPECT_EQ(request.body["stream_options"]["include_usage"], true);
    EXPECT_EQ(request.body["max_tokens"], kMaxTokens);
    EXPECT_EQ(request.body["ignore_eos"], true);
    EXPECT_EQ(request.body["temperature"], 0);
    ASSERT_TRUE(request.body["prompt"].is_array());
    EXPECT_EQ(request.body["prompt"].size(), static_cast<size_t>(kInput));
  }
}

TEST(LoadgenHttpRunnerTest, ChatCountsContentAndReasoningDeltas) {
  FakeOpenAiServer server;
  PromptSource prompts = Prompts(6, 4);
  // A base URL ending in /v1 gets no second one.
  absl::StatusOr<PhaseResult> result =
      RunHttpPhase(Target(server, OpenAiApi::kChat, "/v1"), Closed("reasoning", 2, 3), prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  const PhaseSummary s = Summary(*result);
  EXPECT_EQ(s.succeeded, 3) << (result->records.empty() ? std::string() : result->records[0].error);
  EXPECT_EQ(s.output_tokens, 12);
  EXPECT_EQ(s.itl.count, 9);
  // The role chunk (empty content) comes at once; the first token, a reasoning one, later.
  EXPECT_GE(s.ttft.min, std::chrono::duration<double>(kFirstDelay).count());
  for (const SeenRequest& request : server.requests()) {
    EXPECT_EQ(request.path, "/v1/chat/completions");
    ASSERT_EQ(request.body["messages"].size(), 1u);
    EXPECT_EQ(request.body["messages"][0]["role"], "user");
    const std::string content = request.body["messages"][0]["content"];
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(content, ' ')).size(), 6u) << content;
  }
}

TEST(LoadgenHttpRunnerTest, ChunksOfSeveralTokens) {
  FakeOpenAiServer server;
  for (const char* model : {"multi", "continuous"}) {
    PromptSource prompts = Prompts(3, 6);
    LiveCounters live;
    absl::StatusOr<PhaseResult> result =
        RunHttpPhase(Target(server), Closed(model, 2, 4), prompts, &live);
    ASSERT_TRUE(result.ok()) << result.status();
    const PhaseSummary s = Summary(*result);
    EXPECT_EQ(s.succeeded, 4) << model;
    EXPECT_EQ(s.output_tokens, 24) << model;  // the usage's count, not the 3 chunks
    EXPECT_EQ(live.output_tokens.load(), 24) << model;
    // multi: 6 − 1 latencies (the first chunk taken as one token); continuous: 6 − 2 (the
    // running usage says the first chunk carried two).
    EXPECT_EQ(s.itl.count, 4 * (std::string(model) == "multi" ? 5 : 4)) << model;
    const double pace = std::chrono::duration<double>(kPace).count();
    for (const RequestRecord& r : result->records) {
      const double sum = std::accumulate(r.itl_seconds.begin(), r.itl_seconds.end(), 0.0);
      // The two gaps between the three chunks are 2 × pace at the server, but a chunk read
      // late on a loaded machine shortens the client's span (CI saw 35 ms of 40): one pace
      // still tells gaps measured apart from one chunk split into tokens (sum 0).
      EXPECT_GE(sum, pace) << model;
    }
  }
}

TEST(LoadgenHttpRunnerTest, SplitEventsCrlfAndComments) {
  FakeOpenAiServer server;
  PromptSource prompts = Prompts(3, 4);
  absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), Closed("split", 2, 4), prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  const PhaseSummary s = Summary(*result);
  EXPECT_EQ(s.succeeded, 4) << result->records[0].error;
  EXPECT_EQ(s.output_tokens, 16);
  EXPECT_EQ(s.itl.count, 12);
}

TEST(LoadgenHttpRunnerTest, HttpErrorsAreCountedByLabel) {
  FakeOpenAiServer server;
  PromptSource prompts = Prompts(3, 2);
  absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), Closed("429", 2, 5), prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  const PhaseSummary s = Summary(*result);
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.failed, 5);
  ASSERT_EQ(s.errors_by_code.size(), 1u) << s.errors_by_code.begin()->first;
  ASSERT_EQ(Errors(s, "http_429"), 5)
      << s.errors_by_code.begin()->first << ": " << s.error_examples.begin()->second;
  EXPECT_EQ(s.error_examples.at("http_429"), "slow down");
  EXPECT_EQ(StatusCodeName(result->records[0].code), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(server.connections(), 2);  // an error with a body keeps the connection

  RunReport report;
  report.target = server.url();
  report.model = "429";
  report.summaries.push_back(s);
  report.summaries.back().label = "concurrency 2";
  report.phases.push_back(*result);
  std::ostringstream text;
  PrintSummary(report, text);
  EXPECT_TRUE(absl::StrContains(text.str(), "Errors http_429:")) << text.str();
  EXPECT_TRUE(absl::StrContains(text.str(), "slow down")) << text.str();
}

TEST(LoadgenHttpRunnerTest, StreamsThatDoNotFinishFail) {
  FakeOpenAiServer server;
  for (const auto& [model, label] : std::vector<std::pair<std::string, std::string>>{
           {"cut", "truncated"}, {"no-done", "truncated"}, {"error-event", "stream_error"}}) {
    PromptSource prompts = Prompts(3, 5);
    absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), Closed(model, 2, 3), prompts);
    ASSERT_TRUE(result.ok()) << result.status();
    const PhaseSummary s = Summary(*result);
    EXPECT_EQ(s.failed, 3) << model;
    EXPECT_EQ(Errors(s, label), 3) << model;
    if (model == "error-event") {
      EXPECT_EQ(s.error_examples.at(label), "boom");
    }
  }
}

TEST(LoadgenHttpRunnerTest, ConnectionCloseAndStaleConnections) {
  for (const char* model : {"close", "drop-idle"}) {
    FakeOpenAiServer server;
    PromptSource prompts = Prompts(3, 3);
    absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), Closed(model, 1, 4), prompts);
    ASSERT_TRUE(result.ok()) << result.status();
    const PhaseSummary s = Summary(*result);
    // close: the body ends with the connection; drop-idle: the kept connection is found closed
    // when reused, and the request goes again on a fresh one. Either way nothing fails.
    EXPECT_EQ(s.succeeded, 4) << model << ": " << result->records[0].error;
    EXPECT_EQ(s.output_tokens, 12) << model;
    EXPECT_EQ(server.connections(), 4) << model;
    EXPECT_EQ(server.requests().size(), 4u) << model;
  }
}

TEST(LoadgenHttpRunnerTest, TimeoutsAndRefusedConnections) {
  FakeOpenAiServer server;
  PhaseConfig config = Closed("stall", 2, 2);
  config.request_timeout = absl::Milliseconds(200);
  PromptSource prompts = Prompts(3, 3);
  absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  PhaseSummary s = Summary(*result);
  EXPECT_EQ(Errors(s, "timeout"), 2);
  for (const RequestRecord& r : result->records) {
    EXPECT_GE(r.e2e_seconds, 0.2);
    EXPECT_LT(r.e2e_seconds, 1.5);
  }
  EXPECT_TRUE(ProbeHttpTarget(*ParseHttpUrl(server.url()), absl::Seconds(5)).ok());

  // A port with nothing listening.
  uint16_t port = 0;
  {
    asio::io_context io;
    tcp::acceptor acceptor(io);
    ErrorCode ec;
    const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
    acceptor.open(endpoint.protocol(), ec);
    acceptor.bind(endpoint, ec);
    ASSERT_FALSE(ec) << ec.message();
    port = acceptor.local_endpoint(ec).port();
  }
  OpenAiTarget nowhere = Target(server);
  nowhere.url.port = port;
  const absl::Status probe = ProbeHttpTarget(nowhere.url, absl::Seconds(5));
  EXPECT_EQ(probe.code(), absl::StatusCode::kUnavailable) << probe;
  result = RunHttpPhase(nowhere, Closed("paced", 1, 2), prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  s = Summary(*result);
  EXPECT_EQ(Errors(s, "connect_failed"), 2);

  // Bad configs are refused before anything is sent.
  config.rate = 1;
  EXPECT_EQ(RunHttpPhase(Target(server), config, prompts).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Waits up to 5 s for `done`: the fake server notices a client's close only at its next token.
template <typename Done>
bool Eventually(Done done) {
  for (int i = 0; i < 500 && !done(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

TEST(LoadgenHttpRunnerTest, CancelsCloseInOrderAndDisconnectsReset) {
  constexpr int kRequests = 6, kMaxTokens = 8;
  for (const ClientFault fault : {ClientFault::kCancel, ClientFault::kDisconnect}) {
    const bool cancel = fault == ClientFault::kCancel;
    FakeOpenAiServer server;
    PhaseConfig config = Closed("paced", 3, kRequests);
    (cancel ? config.cancel_fraction : config.disconnect_fraction) = 1;
    PromptSource prompts = Prompts(3, kMaxTokens);
    LiveCounters live;
    absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), config, prompts, &live);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->records.size(), static_cast<size_t>(kRequests));
    for (const RequestRecord& r : result->records) {
      EXPECT_EQ(r.planned_fault, fault);
      EXPECT_EQ(r.fault, fault) << r.code_name() << ": " << r.error;
      EXPECT_GE(r.fault_after_tokens, 1);
      EXPECT_LT(r.fault_after_tokens, kMaxTokens);
      // One token a chunk: the client stops at exactly its count.
      EXPECT_EQ(r.output_tokens, r.fault_after_tokens);
      EXPECT_EQ(r.code_name(), cancel ? "cancelled" : "disconnected");
      EXPECT_EQ(StatusCodeName(r.code), "CANCELLED");
      EXPECT_FALSE(r.failed());
      EXPECT_FALSE(r.succeeded());
    }
    const PhaseSummary s = Summary(*result);
    EXPECT_EQ(s.requests, kRequests);
    EXPECT_EQ(s.failed, 0);
    EXPECT_EQ(s.succeeded, 0);
    EXPECT_EQ(cancel ? s.cancelled : s.disconnected, kRequests);
    EXPECT_TRUE(s.errors_by_code.empty()) << s.errors_by_code.begin()->first;
    EXPECT_EQ(live.errors.load(), 0);
    EXPECT_EQ((cancel ? live.cancelled : live.disconnected).load(), kRequests);
    // A cancel is an orderly close (FIN), a disconnect a reset (RST); neither connection is
    // used again.
    EXPECT_TRUE(Eventually([&] {
      return server.peer_closes() + server.peer_resets() == kRequests;
    })) << server.peer_closes()
        << " closes, " << server.peer_resets() << " resets";
    EXPECT_EQ(cancel ? server.peer_closes() : server.peer_resets(), kRequests);
    EXPECT_EQ(server.connections(), kRequests);
  }

  // Over HTTP a token is known by its content chunk. Two tokens a chunk (the count only in the
  // final usage): a request planned to be cancelled after more tokens than its stream has
  // chunks ends normally, and counts as a success.
  FakeOpenAiServer server;
  PhaseConfig config = Closed("multi", 2, 12);
  config.cancel_fraction = 1;
  PromptSource prompts = Prompts(3, 6);  // 3 chunks
  absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  int cancelled = 0;
  for (const RequestRecord& r : result->records) {
    EXPECT_EQ(r.planned_fault, ClientFault::kCancel);
    if (r.fault_after_tokens <= 3) {
      EXPECT_EQ(r.fault, ClientFault::kCancel) << r.fault_after_tokens;
      ++cancelled;
    } else {
      EXPECT_EQ(r.fault, ClientFault::kNone) << r.fault_after_tokens;
      EXPECT_TRUE(r.succeeded()) << r.code_name() << ": " << r.error;
      EXPECT_EQ(r.output_tokens, 6);
    }
  }
  const PhaseSummary s = Summary(*result);
  EXPECT_EQ(s.cancelled, cancelled);
  EXPECT_EQ(s.succeeded, 12 - cancelled);
}

TEST(LoadgenHttpRunnerTest, OpenLoopAndWarmup) {
  FakeOpenAiServer server;
  PhaseConfig config;
  config.model = "paced";
  config.rate = 40;
  config.requests = 6;
  config.warmup = absl::Milliseconds(100);
  config.seed = 3;
  config.threads = 3;
  PromptSource prompts = Prompts(3, 2);
  absl::StatusOr<PhaseResult> result = RunHttpPhase(Target(server), config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  int counted = 0;
  for (const RequestRecord& r : result->records) {
    EXPECT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.output_tokens, 2);
    if (!r.warmup) ++counted;
  }
  EXPECT_EQ(counted, 6);
  EXPECT_EQ(Summary(*result).requests, 6);
}

}  // namespace
}  // namespace kiln::loadgen
