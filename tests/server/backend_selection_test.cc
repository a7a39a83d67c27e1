// Choosing a model's compute backend: LoadModel's backend field, the server's default
// (--backend, default_backend), errors that list the available backends, and GetModel /
// ListModels reporting the backend each model runs on.
#include <filesystem>

#include "gtest/gtest.h"
#include "server/config.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

namespace fs = std::filesystem;

grpc::Status LoadOn(v1::Models::Stub& stub, const std::string& name, const std::string& path,
                    const std::string& backend, v1::ModelInfo* info) {
  v1::LoadModelRequest request;
  request.set_name(name);
  request.set_path(path);
  request.set_backend(backend);
  return stub.LoadModel(Context().get(), request, info);
}

TEST(BackendSelectionTest, ModelsReportTheBackendTheyRunOn) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo implicit, named;
  ASSERT_TRUE(LoadOn(server->models(), "implicit", "plain", "", &implicit).ok());
  ASSERT_TRUE(LoadOn(server->models(), "named", "other", "cpu", &named).ok());
  for (const v1::ModelInfo* info : {&implicit, &named}) {
    EXPECT_EQ(info->backend(), "cpu") << info->name();
    EXPECT_CONTAINS(info->backend_description(), "oneDNN");
  }
  v1::ListModelsResponse list;
  ASSERT_TRUE(server->models().ListModels(Context().get(), v1::ListModelsRequest(), &list).ok());
  ASSERT_EQ(list.models_size(), 2);
  for (const v1::ModelInfo& info : list.models()) EXPECT_EQ(info.backend(), "cpu");
  StreamResult generated = GenerateAll(server->inference(), GreedyRequest("named", {1, 2}, 3));
  EXPECT_TRUE(generated.status.ok()) << generated.status.error_message();
}

TEST(BackendSelectionTest, UnknownAndUnavailableBackendsAreRefusedNamingTheAvailableOnes) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  grpc::Status unknown = LoadOn(server->models(), "m", "plain", "tpu", &info);
  EXPECT_CODE(unknown, INVALID_ARGUMENT, "backend: 'tpu' is not a backend");
  EXPECT_CONTAINS(unknown.error_message(), "available: cpu");
  grpc::Status unavailable = LoadOn(server->models(), "m", "plain", "cuda", &info);
  EXPECT_CODE(unavailable, FAILED_PRECONDITION, "backend: 'cuda' is not available");
  EXPECT_CONTAINS(unavailable.error_message(), "available: cpu");

  // Nothing was left behind, and the server still loads and serves.
  v1::ListModelsResponse list;
  ASSERT_TRUE(server->models().ListModels(Context().get(), v1::ListModelsRequest(), &list).ok());
  EXPECT_EQ(list.models_size(), 0);
  ASSERT_TRUE(LoadOn(server->models(), "m", "plain", "", &info).ok());
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("m", {3}, 2)).status.ok());
}

TEST(BackendSelectionTest, TheServerDefaultMustBeAvailable) {
  ServerOptions cpu = TestServerOptions();
  cpu.default_backend = "cpu";
  EXPECT_NE(TestServer::Start(cpu), nullptr);

  ServerOptions unknown = TestServerOptions();
  unknown.default_backend = "tpu";
  absl::StatusOr<std::unique_ptr<RunningServer>> refused = StartServer(unknown);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(refused.status().message(), "default backend");
  EXPECT_CONTAINS(refused.status().message(), "available: cpu");

  ServerOptions unavailable = TestServerOptions();
  unavailable.default_backend = "cuda";
  refused = StartServer(unavailable);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BackendSelectionTest, AStartupModelOnAnUnavailableBackendStaysFailed) {
  ServerOptions options = TestServerOptions();
  ModelSpec good{"good", "plain"};
  ModelSpec gpu{"gpu", "other"};
  gpu.backend = "cuda";
  options.models = {good, gpu};
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  v1::GetModelRequest request;
  request.set_name("gpu");
  v1::ModelInfo info;
  ASSERT_TRUE(server->models().GetModel(Context().get(), request, &info).ok());
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_EQ(info.backend(), "cuda");
  EXPECT_CONTAINS(info.error(), "not available");
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("good", {1}, 2)).status.ok());
}

TEST(BackendSelectionTest, ConfigNamesTheDefaultAndPerModelBackends) {
  absl::StatusOr<v1::ServerConfig> config = ParseServerConfig(
      "default_backend: \"cpu\"\n"
      "models { name: \"a\" path: \"plain\" backend: \"cpu\" }\n"
      "models { name: \"b\" path: \"other\" }\n");
  ASSERT_TRUE(config.ok()) << config.status();
  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "", &options).ok());
  EXPECT_EQ(options.default_backend, "cpu");
  ASSERT_EQ(options.models.size(), 2u);
  EXPECT_EQ(options.models[0].backend, "cpu");
  EXPECT_EQ(options.models[1].backend, "");
}

// The checkpoint's side files go through the same confinement as its weights: a tokenizer.json
// that leads out of the model directory is refused, not read.
TEST(BackendSelectionTest, SideFilesMayNotLeaveTheModelDirectory) {
  const fs::path dir = Models().root / "escaping_tokenizer";
  fs::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors"}) {
    fs::copy_file(Models().plain / name, dir / name, fs::copy_options::overwrite_existing);
  }
  fs::remove(dir / "tokenizer.json");
  fs::create_symlink(Models().outside / "config.json", dir / "tokenizer.json");
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  EXPECT_CODE(LoadOn(server->models(), "x", "escaping_tokenizer", "", &info), PERMISSION_DENIED,
              "leaves the model directory");
}

}  // namespace
}  // namespace kiln::server_test
