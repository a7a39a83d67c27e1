#include "tests/server/server_test_util.h"

#include <array>
#include <fstream>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "clients/synth.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"

namespace kiln::server_test {
namespace {

namespace fs = std::filesystem;

void WriteModel(const fs::path& dir, uint64_t seed, bool tokenizer) {
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  config->num_hidden_layers = 2;
  config->vocab_size = kTestVocab;
  config->max_position_embeddings = 2048;
  SynthOptions options;
  options.dtype = DType::kF32;
  options.seed = seed;
  options.write_tokenizer = false;  // these tests decide about tokenizers themselves
  absl::Status status = WriteSynthCheckpoint(dir, *config, options);
  ASSERT_TRUE(status.ok()) << status;
  if (tokenizer) WriteTestTokenizer(dir);
}

}  // namespace

void WriteTestTokenizer(const fs::path& dir) {
  const std::array<std::string, 256>& bytes = tokenizer_internal::ByteToUnicode();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes[b]] = b;
  const std::string space = bytes[' '];
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {space, "w"}};
  nlohmann::json merge_list = nlohmann::json::array();
  int32_t id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back(a + " " + b);
  }
  auto added = [](int32_t token_id, const std::string& content) {
    return nlohmann::json{{"id", token_id},  {"content", content}, {"single_word", false},
                          {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                          {"special", true}};
  };
  nlohmann::json tokenizer = {{"version", "1.0"},
                              {"truncation", nullptr},
                              {"padding", nullptr},
                              {"added_tokens", {added(kBosId, "<s>"), added(kEosId, "</s>")}},
                              {"normalizer", nullptr},
                              {"pre_tokenizer",
                               {{"type", "ByteLevel"},
                                {"add_prefix_space", false},
                                {"trim_offsets", true},
                                {"use_regex", true}}},
                              {"post_processor", nullptr},
                              {"decoder",
                               {{"type", "ByteLevel"},
                                {"add_prefix_space", true},
                                {"trim_offsets", true},
                                {"use_regex", true}}},
                              {"model",
                               {{"type", "BPE"},
                                {"dropout", nullptr},
                                {"unk_token", nullptr},
                                {"continuing_subword_prefix", nullptr},
                                {"end_of_word_suffix", nullptr},
                                {"fuse_unk", false},
                                {"byte_fallback", false},
                                {"vocab", vocab},
                                {"merges", merge_list}}}};
  nlohmann::json config = {{"bos_token", "<s>"},
                           {"eos_token", "</s>"},
                           {"add_bos_token", true},
                           {"add_eos_token", false}};
  // Reserved special tokens fill the model's vocabulary, so every id the model can produce
  // decodes (to nothing when special tokens are skipped).
  for (int32_t reserved = kEosId + 1; reserved < kTestVocab; ++reserved) {
    tokenizer["added_tokens"].push_back(
        added(reserved, "<|reserved_" + std::to_string(reserved) + "|>"));
  }
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
}

const TestModels& Models() {
  static const TestModels* models = [] {
    static testing_util::ScratchDir scratch;  // removed at exit
    auto* m = new TestModels();
    m->root = scratch / "root";
    m->plain = m->root / "plain";
    m->other = m->root / "other";
    m->text = m->root / "text";
    m->empty = m->root / "empty";
    m->outside = scratch / "outside";
    fs::create_directories(m->empty);
    WriteModel(m->plain, 1, false);
    WriteModel(m->other, 2, false);
    WriteModel(m->text, 3, true);
    WriteModel(m->outside, 4, false);
    return m;
  }();
  return *models;
}

ServerOptions TestServerOptions() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.model_roots = {Models().root.string()};
  options.engine.max_running = 16;
  options.engine.max_queued = 64;
  options.engine.max_context = 512;
  options.default_max_tokens = 8;
  options.shutdown_grace = absl::Milliseconds(500);
  return options;
}

std::unique_ptr<TestServer> TestServer::Start(ServerOptions options) {
  absl::StatusOr<std::unique_ptr<RunningServer>> server = StartServer(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  auto test_server = std::unique_ptr<TestServer>(new TestServer());
  test_server->server_ = *std::move(server);
  test_server->channel_ =
      grpc::CreateChannel(test_server->server_->address(), grpc::InsecureChannelCredentials());
  test_server->inference_ = v1::Inference::NewStub(test_server->channel_);
  test_server->models_ = v1::Models::NewStub(test_server->channel_);
  return test_server;
}

TestServer::~TestServer() {
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  return context;
}

StreamResult GenerateAll(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout) {
  StreamResult result;
  std::unique_ptr<grpc::ClientContext> context = Context(timeout);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub.Generate(context.get(), request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    result.tokens.insert(result.tokens.end(), response.token_ids().begin(),
                         response.token_ids().end());
    result.text += response.text();
    result.responses.push_back(response);
  }
  result.status = reader->Finish();
  return result;
}

v1::GenerateRequest GreedyRequest(const std::string& model, const std::vector<int32_t>& prompt,
                                  int32_t max_tokens, bool ignore_eos) {
  v1::GenerateRequest request;
  request.set_model(model);
  request.mutable_prompt_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_stopping()->set_max_tokens(max_tokens);
  request.mutable_stopping()->set_ignore_eos(ignore_eos);
  return request;
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

EngineStats StatsOf(ModelRegistry& registry, const std::string& name) {
  absl::StatusOr<ModelSnapshot> snapshot = registry.GetReady(name);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return snapshot.ok() ? snapshot->engine->stats() : EngineStats{};
}

}  // namespace kiln::server_test
