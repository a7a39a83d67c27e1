// Many streams at once, client cancellation, deadlines, the queue limit and unloading a model
// while its streams are in flight. Every wait is bounded.
#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

ServerOptions TwoModels(int32_t max_running = 16, int32_t max_queued = 64) {
  ServerOptions options = TestServerOptions();
  options.models = {{"plain", "plain", "", ""}, {"other", "other", "", ""}};
  options.engine.max_running = max_running;
  options.engine.max_queued = max_queued;
  options.engine.max_context = 2048;
  return options;
}

// A stream that has started: its first response was read.
struct OpenStream {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  v1::GenerateResponse first;
  bool started = false;
};

std::unique_ptr<OpenStream> Open(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                                 absl::Duration timeout = absl::Seconds(30)) {
  auto stream = std::make_unique<OpenStream>();
  stream->context = Context(timeout);
  stream->reader = stub.Generate(stream->context.get(), request);
  stream->started = stream->reader->Read(&stream->first);
  return stream;
}

// Reads the rest of the stream; returns its status and sets `last` to its last response.
grpc::Status Drain(OpenStream& stream, v1::GenerateResponse* last) {
  v1::GenerateResponse response;
  *last = stream.first;
  while (stream.reader->Read(&response)) *last = response;
  return stream.reader->Finish();
}

TEST(ConcurrencyTest, SixtyFourStreamsOnTwoModelsMatchSerialRuns) {
  auto server = TestServer::Start(TwoModels());
  ASSERT_NE(server, nullptr);
  constexpr int kStreams = 64;  // the sync server needs a thread per stream
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> serial;
  for (int r = 0; r < kStreams; ++r) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 2 + (r * 5) % 23; ++i) prompt.push_back((r * 37 + i * 11) % 512);
    requests.push_back(GreedyRequest(r % 2 == 0 ? "plain" : "other", prompt, 4 + r % 5));
    StreamResult result = GenerateAll(server->inference(), requests.back());
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    serial.push_back(result.tokens);
  }

  std::vector<StreamResult> results(kStreams);
  absl::Barrier* barrier = new absl::Barrier(kStreams);  // deletes itself (Block returns true)
  std::vector<std::thread> threads;
  for (int r = 0; r < kStreams; ++r) {
    threads.emplace_back([&, r] {
      if (barrier->Block()) delete barrier;
      results[r] = GenerateAll(server->inference(), requests[r]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < kStreams; ++r) {
    ASSERT_TRUE(results[r].status.ok()) << r << ": " << results[r].status.error_message();
    EXPECT_EQ(results[r].tokens, serial[r]) << "stream " << r;
    EXPECT_EQ(results[r].last()->finish_reason(), v1::LENGTH);
  }
  EXPECT_EQ(StatsOf(server->registry(), "plain").kv_cache_bytes, 0u);
  EXPECT_EQ(StatsOf(server->registry(), "other").kv_cache_bytes, 0u);
}

// The default configuration queues what it cannot run: 256 streams at once all complete (a
// 64-sequence batch, the rest waiting), none is refused.
TEST(ConcurrencyTest, TwoHundredFiftySixStreamsOnTheDefaultConfigurationAllComplete) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.model_roots = {Models().root.string()};
  options.models = {{"plain", "plain", "", ""}};
  options.shutdown_grace = absl::Milliseconds(500);
  ASSERT_EQ(options.engine.max_running, 64);
  ASSERT_GE(options.engine.max_queued, 1024);
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  constexpr int kStreams = 256;
  std::vector<StreamResult> results(kStreams);
  absl::Barrier* barrier = new absl::Barrier(kStreams);
  std::vector<std::thread> threads;
  for (int r = 0; r < kStreams; ++r) {
    threads.emplace_back([&, r] {
      if (barrier->Block()) delete barrier;
      results[r] = GenerateAll(server->inference(), GreedyRequest("plain", {1 + r % 300, 2, 3}, 4),
                               absl::Seconds(120));
    });
  }
  for (std::thread& thread : threads) thread.join();
  int ok = 0;
  for (int r = 0; r < kStreams; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << r << ": " << results[r].status.error_message();
    ok += results[r].status.ok() && results[r].tokens.size() == 4;
  }
  EXPECT_EQ(ok, kStreams);
  EXPECT_TRUE(WaitFor([&] { return StatsOf(server->registry(), "plain").kv_cache_bytes == 0; }));
}

TEST(ConcurrencyTest, ClientCancelFreesTheSequence) {
  auto server = TestServer::Start(TwoModels());
  ASSERT_NE(server, nullptr);
  const uint64_t steps_before = StatsOf(server->registry(), "plain").steps;
  std::unique_ptr<OpenStream> stream =
      Open(server->inference(), GreedyRequest("plain", {1, 2, 3}, 2000));
  ASSERT_TRUE(stream->started);
  EXPECT_GT(StatsOf(server->registry(), "plain").kv_cache_bytes, 0u);
  stream->context->TryCancel();
  v1::GenerateResponse last;
  EXPECT_EQ(Drain(*stream, &last).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([&] {
    const EngineStats stats = StatsOf(server->registry(), "plain");
    return stats.running == 0 && stats.waiting == 0 && stats.kv_cache_bytes == 0;
  }));
  // It stopped early rather than running to its end.
  EXPECT_LT(StatsOf(server->registry(), "plain").steps - steps_before, 2000u);
  // The model keeps serving.
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("plain", {1}, 2)).status.ok());
}

TEST(ConcurrencyTest, DeadlineEndsTheServerSideSequence) {
  auto server = TestServer::Start(TwoModels());
  ASSERT_NE(server, nullptr);
  const uint64_t steps_before = StatsOf(server->registry(), "plain").steps;
  StreamResult result = GenerateAll(server->inference(), GreedyRequest("plain", {1, 2, 3}, 2000),
                                    absl::Milliseconds(150));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << result.status.error_message();
  EXPECT_TRUE(WaitFor([&] {
    const EngineStats stats = StatsOf(server->registry(), "plain");
    return stats.running == 0 && stats.waiting == 0 && stats.kv_cache_bytes == 0;
  }));
  EXPECT_LT(StatsOf(server->registry(), "plain").steps - steps_before, 2000u);
}

TEST(ConcurrencyTest, FullQueueIsResourceExhausted) {
  auto server = TestServer::Start(TwoModels(/*max_running=*/1, /*max_queued=*/1));
  ASSERT_NE(server, nullptr);
  // One request runs, one waits; while they do, more are refused.
  std::unique_ptr<OpenStream> running =
      Open(server->inference(), GreedyRequest("plain", {1, 2}, 2000));
  ASSERT_TRUE(running->started);
  std::thread waiting_thread;
  std::unique_ptr<OpenStream> waiting;
  waiting_thread = std::thread([&] {
    waiting = Open(server->inference(), GreedyRequest("plain", {3, 4}, 2000));
  });
  EXPECT_TRUE(WaitFor([&] { return StatsOf(server->registry(), "plain").waiting == 1; }));
  int refused = 0;
  for (int i = 0; i < 4; ++i) {
    StreamResult result = GenerateAll(server->inference(), GreedyRequest("plain", {5, 6}, 2000));
    if (result.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_CONTAINS(result.status.error_message(), "queue");
    }
  }
  EXPECT_EQ(refused, 4);
  // The other model has its own queue.
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("other", {1}, 2)).status.ok());

  running->context->TryCancel();
  waiting_thread.join();
  ASSERT_NE(waiting, nullptr);
  waiting->context->TryCancel();
  v1::GenerateResponse last;
  Drain(*running, &last);
  Drain(*waiting, &last);
  EXPECT_TRUE(WaitFor([&] { return StatsOf(server->registry(), "plain").kv_cache_bytes == 0; }));
}

TEST(ConcurrencyTest, UnloadWhileStreamsAreInFlight) {
  auto server = TestServer::Start(TwoModels());
  ASSERT_NE(server, nullptr);
  constexpr int kDoomed = 8;
  std::vector<std::unique_ptr<OpenStream>> doomed;
  for (int i = 0; i < kDoomed; ++i) {
    doomed.push_back(Open(server->inference(), GreedyRequest("plain", {1, 2, i}, 1500)));
    ASSERT_TRUE(doomed.back()->started);
  }
  // Streams on the other model run through the unload.
  std::vector<StreamResult> others(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      others[i] = GenerateAll(server->inference(), GreedyRequest("other", {3, i}, 40));
    });
  }
  v1::UnloadModelRequest unload;
  unload.set_name("plain");
  v1::UnloadModelResponse unloaded;
  ASSERT_TRUE(server->models().UnloadModel(Context().get(), unload, &unloaded).ok());

  // A stream cut off by the unload hears why, rather than ending OK with part of its output.
  for (auto& stream : doomed) {
    v1::GenerateResponse last;
    grpc::Status status = Drain(*stream, &last);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_EQ(status.error_message(), "model 'plain' was unloaded while this request ran");
  }
  for (std::thread& thread : threads) thread.join();
  for (const StreamResult& result : others) {
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.tokens.size(), 40u);
    EXPECT_EQ(result.last()->finish_reason(), v1::LENGTH);
  }
  EXPECT_EQ(GenerateAll(server->inference(), GreedyRequest("plain", {1}, 2)).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("other", {1}, 2)).status.ok());
}

TEST(ConcurrencyTest, ShutdownEndsStreamsInFlight) {
  auto server = TestServer::Start(TwoModels());
  ASSERT_NE(server, nullptr);
  std::unique_ptr<OpenStream> stream =
      Open(server->inference(), GreedyRequest("plain", {1, 2}, 2000));
  ASSERT_TRUE(stream->started);
  std::thread stopper([&] { server->server().Shutdown(); });
  v1::GenerateResponse last;
  grpc::Status status = Drain(*stream, &last);
  stopper.join();
  // The stream outlives the grace and hears why it ends, or it finished within the grace.
  EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAVAILABLE ||
              (status.ok() && last.finish_reason() == v1::LENGTH))
      << status.error_code() << " " << status.error_message();
  if (!status.ok()) {
    EXPECT_TRUE(absl::StrContains(status.error_message(), "kiln-server is shutting down"))
        << status.error_message();
  }
}

}  // namespace
}  // namespace kiln::server_test
