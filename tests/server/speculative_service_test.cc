// Speculative decoding over gRPC: models with MTP heads draft with them (the request's
// speculative.num_draft_tokens, or the server default), Generate reports speculative_stats, the
// output equals plain greedy output, and models without heads refuse drafts with a clear error.
#include <filesystem>
#include <fstream>

#include "clients/synth.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

namespace fs = std::filesystem;

// <root>/mtp: kiln-tiny with one DeepSeek-style MTP head; <root>/mtp-missing: a config that
// advertises one, without the tensors.
void WriteMtpModels() {
  static const bool written = [] {
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    EXPECT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    SynthOptions options;
    options.dtype = DType::kF32;
    options.write_tokenizer = false;
    config->num_mtp_layers = 1;
    EXPECT_TRUE(WriteSynthCheckpoint(Models().root / "mtp", *config, options).ok());
    config->max_position_embeddings = 64;
    EXPECT_TRUE(WriteSynthCheckpoint(Models().root / "mtp-short", *config, options).ok());
    config->max_position_embeddings = 2048;
    config->num_mtp_layers = 0;
    EXPECT_TRUE(WriteSynthCheckpoint(Models().root / "mtp-missing", *config, options).ok());
    config->num_mtp_layers = 1;
    std::ofstream(Models().root / "mtp-missing" / "config.json", std::ios::trunc)
        << ModelConfigToJson(*config);
    return true;
  }();
  (void)written;
}

grpc::Status Load(TestServer& server, const std::string& name, const std::string& dir,
                  v1::ModelInfo* info) {
  v1::LoadModelRequest request;
  request.set_name(name);
  request.set_path((Models().root / dir).string());
  return server.models().LoadModel(Context().get(), request, info);
}

TEST(SpeculativeServiceTest, MtpModelDraftsAndMatchesPlainGreedy) {
  WriteMtpModels();
  ServerOptions options = TestServerOptions();
  options.engine.default_num_draft_tokens = 2;
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  ASSERT_TRUE(Load(*server, "mtp", "mtp", &info).ok());
  ASSERT_TRUE(Load(*server, "plain", "plain", &info).ok());
  int restored = 0;
  ASSERT_TRUE(Load(*server, "mtp2", "mtp", &info).ok());
  for (const v1::TensorInfo& t : info.load_report().restored()) restored += !t.head().empty();
  EXPECT_GT(restored, 0);

  v1::GenerateRequest off = GreedyRequest("mtp", {1, 2, 3, 4}, 10);
  off.mutable_speculative()->set_num_draft_tokens(0);
  StreamResult plain = GenerateAll(server->inference(), off);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  EXPECT_EQ(plain.last()->speculative_stats().drafted(), 0);

  v1::GenerateRequest by_default = GreedyRequest("mtp", {1, 2, 3, 4}, 10);  // no speculative
  StreamResult defaulted = GenerateAll(server->inference(), by_default);
  ASSERT_TRUE(defaulted.status.ok()) << defaulted.status.error_message();
  EXPECT_EQ(defaulted.tokens, plain.tokens);
  EXPECT_GT(defaulted.last()->speculative_stats().drafted(), 0);

  v1::GenerateRequest four = GreedyRequest("mtp", {1, 2, 3, 4}, 10);
  four.mutable_speculative()->set_num_draft_tokens(4);
  StreamResult drafted = GenerateAll(server->inference(), four);
  ASSERT_TRUE(drafted.status.ok()) << drafted.status.error_message();
  EXPECT_EQ(drafted.tokens, plain.tokens);
  const v1::SpeculativeStats& stats = drafted.last()->speculative_stats();
  EXPECT_GT(stats.drafted(), 0);
  EXPECT_LE(stats.accepted(), stats.drafted());

  // A model without heads ignores the server default and refuses explicit drafts.
  StreamResult no_heads = GenerateAll(server->inference(), GreedyRequest("plain", {1, 2}, 4));
  ASSERT_TRUE(no_heads.status.ok()) << no_heads.status.error_message();
  EXPECT_EQ(no_heads.last()->speculative_stats().drafted(), 0);
  v1::GenerateRequest refused = GreedyRequest("plain", {1, 2}, 4);
  refused.mutable_speculative()->set_num_draft_tokens(2);
  StreamResult error = GenerateAll(server->inference(), refused);
  EXPECT_EQ(error.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_CONTAINS(error.status.error_message(), "no MTP heads");

  v1::GenerateRequest too_many = GreedyRequest("mtp", {1, 2}, 4);
  too_many.mutable_speculative()->set_num_draft_tokens(17);
  EXPECT_EQ(GenerateAll(server->inference(), too_many).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A speculative request that ends within 16 positions of the model's context limit used to fail
// starting its MTP session, and the failure deadlocked the model's engine.
TEST(SpeculativeServiceTest, SpeculationUpToTheContextLimitWorksAndTheModelKeepsServing) {
  WriteMtpModels();
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  ASSERT_TRUE(Load(*server, "short", "mtp-short", &info).ok());
  EXPECT_EQ(info.max_context(), 64);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 29 + 1) % 500);
  v1::GenerateRequest plain_request = GreedyRequest("short", prompt, 23);
  plain_request.mutable_speculative()->set_num_draft_tokens(0);
  StreamResult plain = GenerateAll(server->inference(), plain_request);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_EQ(plain.tokens.size(), 23u);
  for (int drafts : {1, 3}) {
    v1::GenerateRequest request = GreedyRequest("short", prompt, 23);
    request.mutable_speculative()->set_num_draft_tokens(drafts);
    StreamResult result = GenerateAll(server->inference(), request);
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.tokens, plain.tokens) << drafts << " drafts";
    EXPECT_GT(result.last()->speculative_stats().drafted(), 0);
  }
  // Past the context: a clear error, and the model goes on serving.
  v1::GenerateRequest too_long = GreedyRequest("short", std::vector<int32_t>(64, 7), 4);
  too_long.mutable_speculative()->set_num_draft_tokens(2);
  StreamResult refused = GenerateAll(server->inference(), too_long);
  EXPECT_CODE(refused.status, INVALID_ARGUMENT, "context");
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("short", {1, 2}, 4)).status.ok());
  EXPECT_TRUE(WaitFor([&] { return StatsOf(server->registry(), "short").kv_cache_bytes == 0; }));
}

TEST(SpeculativeServiceTest, AdvertisedButMissingHeadsWarnAndRefuseDrafts) {
  WriteMtpModels();
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  ASSERT_TRUE(Load(*server, "missing", "mtp-missing", &info).ok());
  ASSERT_GT(info.load_report().warnings_size(), 0);
  EXPECT_CONTAINS(info.load_report().warnings(0), "MTP");
  v1::GenerateRequest request = GreedyRequest("missing", {1, 2}, 4);
  request.mutable_speculative()->set_num_draft_tokens(2);
  StreamResult result = GenerateAll(server->inference(), request);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_CONTAINS(result.status.error_message(), "advertises 1 MTP layers");
  // Without drafts it serves normally.
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("missing", {1, 2}, 4)).status.ok());
}

}  // namespace
}  // namespace kiln::server_test
