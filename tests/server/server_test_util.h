// Shared by the server tests: tiny synthesized models (with and without a tokenizer), an
// in-process server on 127.0.0.1:0 and a loopback channel to it, and small stream helpers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "kiln/v1/kiln.grpc.pb.h"
#include "server/server.h"
#include "tests/loaders/test_util.h"

// The gRPC status has `code_value` (a grpc::StatusCode name) and its message contains `needle`.
#define EXPECT_CODE(status, code_value, needle)                                     \
  do {                                                                              \
    const grpc::Status& s_ = (status);                                              \
    EXPECT_EQ(s_.error_code(), grpc::StatusCode::code_value) << s_.error_message(); \
    EXPECT_CONTAINS(s_.error_message(), needle);                                    \
  } while (0)

namespace kiln::server_test {

// Model directories written once per test process, under one model root:
//   <root>/plain   kiln-tiny (2 layers, vocab 512, f32), seed 1, no tokenizer
//   <root>/other   the same shape, seed 2, no tokenizer
//   <root>/text    seed 3, with the test tokenizer (WriteTestTokenizer)
//   <root>/empty   a directory with no checkpoint
struct TestModels {
  std::filesystem::path root;
  std::filesystem::path plain, other, text, empty;
  std::filesystem::path outside;  // a valid model directory outside the root
};
const TestModels& Models();

// A byte-level BPE tokenizer.json (+ tokenizer_config.json) into `dir`: ids 0..255 are the bytes,
// then the merges below, then <s> (BOS, added by add_special_tokens) and </s> (EOS), then reserved
// special tokens up to kTestVocab.
void WriteTestTokenizer(const std::filesystem::path& dir);
inline constexpr int32_t kTestVocab = 512;  // of every test model
inline constexpr int32_t kHelloId = 259;    // "hello"
inline constexpr int32_t kBosId = 261;
inline constexpr int32_t kEosId = 262;

// The options every test server starts from: listen on 127.0.0.1:0, Models().root as the model
// root, small engine limits and a short shutdown grace.
ServerOptions TestServerOptions();

// A started server and stubs over a loopback channel.
class TestServer {
 public:
  static std::unique_ptr<TestServer> Start(ServerOptions options);
  ~TestServer();

  RunningServer& server() { return *server_; }
  ModelRegistry& registry() { return server_->registry(); }
  const std::shared_ptr<grpc::Channel>& channel() { return channel_; }
  v1::Inference::Stub& inference() { return *inference_; }
  v1::Models::Stub& models() { return *models_; }

 private:
  std::unique_ptr<RunningServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> inference_;
  std::unique_ptr<v1::Models::Stub> models_;
};

// A client context with a deadline (every test call has one).
std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(30));

// The whole stream of one Generate call.
struct StreamResult {
  grpc::Status status;
  std::vector<v1::GenerateResponse> responses;
  std::vector<int32_t> tokens;  // every response's token_ids, in order
  std::string text;             // every response's text, in order
  const v1::GenerateResponse* last() const {
    return responses.empty() ? nullptr : &responses.back();
  }
};
StreamResult GenerateAll(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout = absl::Seconds(30));

// A greedy request for token-id prompts.
v1::GenerateRequest GreedyRequest(const std::string& model, const std::vector<int32_t>& prompt,
                                  int32_t max_tokens, bool ignore_eos = true);

// Polls `condition` every 5 ms until it holds or `timeout` passes; returns whether it held.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(10));

// The engine statistics of a READY model.
EngineStats StatsOf(ModelRegistry& registry, const std::string& name);

}  // namespace kiln::server_test
