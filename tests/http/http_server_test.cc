// HttpServer on its own: whole responses and keep-alive, chunked streams written from other
// threads, a departing client reported, limits and malformed requests answered, hundreds of
// concurrent streams on two I/O threads, and shutdown.
#include "http/http_server.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/http/http_test_client.h"

namespace kiln {
namespace {

using http_test::PostBytes;
using http_test::RawConnection;

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::unique_ptr<HttpServer> StartOrDie(HttpHandler handler, HttpServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1:0", std::move(handler), options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

void Echo(HttpRequest request, std::shared_ptr<ResponseStream> response) {
  HttpResponse out;
  out.content_type = "text/plain";
  out.body = absl::StrCat(request.method, " ", request.path, " ?", request.query, " ",
                          request.body.size(), " ", request.Header("x-test"));
  response->Respond(std::move(out));
}

TEST(HttpServerTest, AnswersAndKeepsTheConnectionAlive) {
  std::unique_ptr<HttpServer> server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<http_test::Response> response =
      http_test::Request(server->port(), "POST", "/a/b?x=1", "hello", {{"X-Test", "yes"}});
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "POST /a/b ?x=1 5 yes");
  EXPECT_EQ(response->Header("server"), "kiln");

  // Two requests on one connection, the second sent only after the first's answer.
  absl::StatusOr<RawConnection> connection = RawConnection::Open(server->port());
  ASSERT_TRUE(connection.ok());
  ASSERT_TRUE(connection->Send(PostBytes("/one", "{}")));
  EXPECT_TRUE(absl::StrContains(connection->ReadUntil("POST /one"), "POST /one ? 2"));
  ASSERT_TRUE(connection->Send(PostBytes("/two", "{}", /*keep_alive=*/false)));
  const std::string both = connection->ReadAll();
  EXPECT_TRUE(absl::StrContains(both, "POST /two ? 2")) << both;
  EXPECT_TRUE(absl::StrContains(both, "Connection: close")) << both;
}

TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  std::unique_ptr<HttpServer> server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<RawConnection> connection = RawConnection::Open(server->port());
  ASSERT_TRUE(connection.ok());
  ASSERT_TRUE(connection->Send(PostBytes("/first", "1") + PostBytes("/second", "22", false)));
  const std::string all = connection->ReadAll();
  const size_t first = all.find("POST /first ? 1");
  const size_t second = all.find("POST /second ? 2");
  ASSERT_NE(first, std::string::npos) << all;
  ASSERT_NE(second, std::string::npos) << all;
  EXPECT_LT(first, second);
}

TEST(HttpServerTest, StreamsChunksWrittenFromAnotherThread) {
  std::vector<std::thread> writers;
  std::mutex mutex;
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](HttpRequest, std::shared_ptr<ResponseStream> response) {
        response->StartStream(200, "text/event-stream");
        std::lock_guard<std::mutex> lock(mutex);
        writers.emplace_back([response] {
          for (int i = 0; i < 5; ++i) {
            response->Write(absl::StrCat("data: ", i, "\n\n"));
            absl::SleepFor(absl::Milliseconds(5));
          }
          response->Write("");  // skipped: an empty chunk would end the body
          response->End();
          response->Write("data: after the end\n\n");  // ignored
        });
      });
  ASSERT_NE(server, nullptr);
  absl::StatusOr<http_test::Response> response =
      http_test::Request(server->port(), "GET", "/stream");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->Header("transfer-encoding"), "chunked");
  EXPECT_EQ(response->Header("content-type"), "text/event-stream");
  EXPECT_EQ(response->body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  std::lock_guard<std::mutex> lock(mutex);
  for (std::thread& writer : writers) writer.join();
}

TEST(HttpServerTest, AClientThatLeavesIsReportedOnce) {
  std::atomic<int> disconnects{0};
  std::shared_ptr<ResponseStream> kept;
  std::mutex mutex;
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](HttpRequest, std::shared_ptr<ResponseStream> response) {
        response->StartStream(200, "text/event-stream");
        response->Write("data: first\n\n");
        response->OnDisconnect([&] { disconnects.fetch_add(1); });
        std::lock_guard<std::mutex> lock(mutex);
        kept = response;
      });
  ASSERT_NE(server, nullptr);
  {
    absl::StatusOr<RawConnection> connection = RawConnection::Open(server->port());
    ASSERT_TRUE(connection.ok());
    ASSERT_TRUE(connection->Send(PostBytes("/", "{}")));
    EXPECT_TRUE(absl::StrContains(connection->ReadUntil("data: first"), "data: first"));
  }  // closed mid-stream
  EXPECT_TRUE(WaitFor([&] { return disconnects.load() == 1; }));
  EXPECT_TRUE(WaitFor([&] { return server->active_requests() == 0; }));
  // Writing to a departed client is harmless; a callback set afterwards runs at once.
  std::lock_guard<std::mutex> lock(mutex);
  kept->Write("data: nobody\n\n");
  kept->End();
  kept->OnDisconnect([&] { disconnects.fetch_add(10); });
  EXPECT_EQ(disconnects.load(), 11);
}

TEST(HttpServerTest, LimitsAndMalformedRequestsAreAnswered) {
  HttpServerOptions options;
  options.max_body_bytes = 100;
  std::unique_ptr<HttpServer> server = StartOrDie(Echo, options);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<http_test::Response> large =
      http_test::Request(server->port(), "POST", "/", std::string(1000, 'x'));
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->status, 413);
  EXPECT_TRUE(absl::StrContains(large->body, "100-byte body limit")) << large->body;

  absl::StatusOr<RawConnection> connection = RawConnection::Open(server->port());
  ASSERT_TRUE(connection.ok());
  ASSERT_TRUE(connection->Send("THIS IS NOT HTTP\r\n\r\n"));
  const std::string answer = connection->ReadAll();
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 400")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "malformed HTTP request")) << answer;
}

TEST(HttpServerTest, ABodyThatStallsPastTheReadTimeoutGets408) {
  HttpServerOptions options;
  options.read_timeout = absl::Milliseconds(300);
  std::unique_ptr<HttpServer> server = StartOrDie(Echo, options);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<RawConnection> slow = RawConnection::Open(server->port());
  ASSERT_TRUE(slow.ok());
  ASSERT_TRUE(slow->Send("POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"));
  const absl::Time sent = absl::Now();
  const std::string answer = slow->ReadAll(absl::Seconds(10));
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 408")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "read timeout of 300ms")) << answer;
  EXPECT_GE(absl::Now() - sent, absl::Milliseconds(250));
  EXPECT_LT(absl::Now() - sent, absl::Seconds(5));

  // A body that arrives in pieces within the timeout is read whole.
  absl::StatusOr<RawConnection> steady = RawConnection::Open(server->port());
  ASSERT_TRUE(steady.ok());
  ASSERT_TRUE(steady->Send(
      "POST /steady HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\nConnection: close\r\n\r\nab"));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(steady->Send("cdef"));
  EXPECT_TRUE(absl::StrContains(steady->ReadAll(), "POST /steady ? 6"));
}

TEST(HttpServerTest, ExpectContinueGetsItsInterimAnswer) {
  std::unique_ptr<HttpServer> server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<RawConnection> connection = RawConnection::Open(server->port());
  ASSERT_TRUE(connection.ok());
  ASSERT_TRUE(connection->Send(
      "POST /big HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n"
      "Connection: close\r\n\r\n"));
  EXPECT_TRUE(absl::StrContains(connection->ReadUntil("100 Continue", absl::Seconds(5)),
                                "HTTP/1.1 100 Continue"));
  ASSERT_TRUE(connection->Send("abcd"));
  EXPECT_TRUE(absl::StrContains(connection->ReadAll(), "POST /big ? 4"));
}

TEST(HttpServerTest, ARequestDroppedWithoutAnAnswerGets500) {
  std::unique_ptr<HttpServer> server =
      StartOrDie([](HttpRequest, std::shared_ptr<ResponseStream>) {});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<http_test::Response> response = http_test::Request(server->port(), "GET", "/");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 500);
  EXPECT_TRUE(absl::StrContains(response->body, "without an answer"));
}

// Every stream is a queue on a strand, not a thread: 300 open streams on 2 I/O threads.
TEST(HttpServerTest, HoldsHundredsOfConcurrentStreams) {
  constexpr int kStreams = 300;
  std::mutex mutex;
  std::vector<std::shared_ptr<ResponseStream>> streams;
  HttpServerOptions options;
  options.io_threads = 2;
  options.handler_threads = 1;
  std::unique_ptr<HttpServer> server = StartOrDie(
      [&](HttpRequest, std::shared_ptr<ResponseStream> response) {
        response->StartStream(200, "text/event-stream");
        std::lock_guard<std::mutex> lock(mutex);
        streams.push_back(std::move(response));
      },
      options);
  ASSERT_NE(server, nullptr);
  std::vector<RawConnection> clients;
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<RawConnection> connection = RawConnection::Open(server->port());
    ASSERT_TRUE(connection.ok()) << i;
    ASSERT_TRUE(connection->Send(PostBytes("/", "{}")));
    clients.push_back(*std::move(connection));
  }
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return static_cast<int>(streams.size()) == kStreams;
  }));
  EXPECT_EQ(server->open_connections(), kStreams);
  EXPECT_EQ(server->active_requests(), kStreams);
  for (int round = 0; round < 3; ++round) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& stream : streams) stream->Write(absl::StrCat("data: ", round, "\n\n"));
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& stream : streams) stream->End();
  }
  for (int i = 0; i < kStreams; ++i) {
    const std::string received = clients[i].ReadUntil("0\r\n\r\n");
    ASSERT_TRUE(absl::StrContains(received, "data: 2")) << i << ": " << received;
    ASSERT_TRUE(absl::EndsWith(received, "0\r\n\r\n")) << i;
  }
  EXPECT_TRUE(WaitFor([&] { return server->active_requests() == 0; }));
}

TEST(HttpServerTest, ShutdownClosesIdleConnectionsAndWaitsForAnswers) {
  std::mutex mutex;
  std::shared_ptr<ResponseStream> open_stream;
  std::unique_ptr<HttpServer> server =
      StartOrDie([&](HttpRequest request, std::shared_ptr<ResponseStream> response) {
        if (request.path == "/echo") return Echo(std::move(request), std::move(response));
        response->StartStream(200, "text/event-stream");
        std::lock_guard<std::mutex> lock(mutex);
        open_stream = std::move(response);
      });
  ASSERT_NE(server, nullptr);
  absl::StatusOr<RawConnection> idle = RawConnection::Open(server->port());
  ASSERT_TRUE(idle.ok());
  ASSERT_TRUE(idle->Send(PostBytes("/echo", "{}")));
  idle->ReadUntil("POST /echo");
  absl::StatusOr<RawConnection> streaming = RawConnection::Open(server->port());
  ASSERT_TRUE(streaming.ok());
  ASSERT_TRUE(streaming->Send(PostBytes("/stream", "{}")));
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return open_stream != nullptr;
  }));

  std::thread shutdown([&] { server->Shutdown(absl::Seconds(10)); });
  // The idle connection closes at once; the stream goes on until its end.
  const std::string idle_rest = idle->ReadAll(absl::Seconds(5));
  EXPECT_FALSE(absl::StrContains(idle_rest, "HTTP/1.1 5"));
  EXPECT_FALSE(http_test::Request(server->port(), "GET", "/echo", "", {}, absl::Seconds(2)).ok());
  {
    std::lock_guard<std::mutex> lock(mutex);
    open_stream->Write("data: last\n\n");
    open_stream->End();
  }
  const std::string streamed = streaming->ReadAll(absl::Seconds(10));
  EXPECT_TRUE(absl::StrContains(streamed, "data: last")) << streamed;
  EXPECT_TRUE(absl::EndsWith(streamed, "0\r\n\r\n")) << streamed;
  shutdown.join();
  EXPECT_EQ(server->open_connections(), 0);
}

TEST(HttpServerTest, BadListenAddresses) {
  EXPECT_EQ(HttpServer::Start("nonsense", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("example.com:80", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::unique_ptr<HttpServer> first = StartOrDie(Echo);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(HttpServer::Start(absl::StrCat("127.0.0.1:", first->port()), Echo).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kiln
