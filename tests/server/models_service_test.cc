// The Models service over a real loopback channel: LoadModel/GetModel/ListModels/UnloadModel,
// ModelInfo contents, model roots (outside paths, symlink escapes), duplicate names, failed
// loads, the LOADING state and the admin token.
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

namespace fs = std::filesystem;

grpc::Status Load(v1::Models::Stub& stub, const std::string& name, const std::string& path,
                  v1::ModelInfo* info = nullptr, const std::string& dtype = "",
                  const std::string& format = "") {
  v1::LoadModelRequest request;
  request.set_name(name);
  request.set_path(path);
  request.set_dtype(dtype);
  request.set_format(format);
  v1::ModelInfo ignored;
  return stub.LoadModel(Context().get(), request, info != nullptr ? info : &ignored);
}

grpc::Status Unload(v1::Models::Stub& stub, const std::string& name) {
  v1::UnloadModelRequest request;
  request.set_name(name);
  v1::UnloadModelResponse response;
  return stub.UnloadModel(Context().get(), request, &response);
}

grpc::Status Get(v1::Models::Stub& stub, const std::string& name, v1::ModelInfo* info) {
  v1::GetModelRequest request;
  request.set_name(name);
  return stub.GetModel(Context().get(), request, info);
}

std::vector<std::string> Names(v1::Models::Stub& stub) {
  v1::ListModelsResponse response;
  grpc::Status status = stub.ListModels(Context().get(), v1::ListModelsRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> names;
  for (const v1::ModelInfo& info : response.models()) names.push_back(info.name());
  return names;
}

TEST(ModelsServiceTest, LoadGetListUnload) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  ASSERT_TRUE(Load(server->models(), "m1", "plain", &info).ok());
  EXPECT_EQ(info.name(), "m1");
  EXPECT_EQ(info.state(), v1::READY);
  EXPECT_EQ(info.architecture(), "LlamaForCausalLM");
  EXPECT_EQ(info.dtype(), "f32");
  EXPECT_GT(info.parameter_count(), 0);
  EXPECT_GT(info.bytes_in_memory(), 0u);
  EXPECT_EQ(info.format(), "safetensors");
  EXPECT_CONTAINS(info.loader(), "safetensors (");
  EXPECT_EQ(info.path(), fs::canonical(Models().plain).string());
  EXPECT_TRUE(info.error().empty());
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.max_context(), 512);
  EXPECT_GT(info.load_timings().total_seconds(), 0);
  EXPECT_GE(info.load_timings().total_seconds(), info.load_timings().post_load_seconds());
  EXPECT_GT(info.load_report().placed_size(), 0);
  EXPECT_GT(info.load_report().placed(0).bytes(), 0u);
  EXPECT_FALSE(info.load_report().placed(0).origin().empty());
  EXPECT_EQ(info.load_report().missing_size(), 0);
  EXPECT_EQ(info.load_report().unplaced_size(), 0);

  v1::ModelInfo got;
  ASSERT_TRUE(Get(server->models(), "m1", &got).ok());
  EXPECT_EQ(got.SerializeAsString(), info.SerializeAsString());
  EXPECT_EQ(Names(server->models()), std::vector<std::string>{"m1"});

  StreamResult generated = GenerateAll(server->inference(), GreedyRequest("m1", {1, 2, 3}, 4));
  EXPECT_TRUE(generated.status.ok()) << generated.status.error_message();
  EXPECT_EQ(generated.tokens.size(), 4u);

  ASSERT_TRUE(Unload(server->models(), "m1").ok());
  EXPECT_CODE(Get(server->models(), "m1", &got), NOT_FOUND, "m1");
  EXPECT_TRUE(Names(server->models()).empty());
  EXPECT_CODE(GenerateAll(server->inference(), GreedyRequest("m1", {1, 2, 3}, 4)).status, NOT_FOUND,
              "'m1' is not loaded");
  EXPECT_CODE(Unload(server->models(), "m1"), NOT_FOUND, "m1");
}

// Each model's KV pool: the server's block size, a budget per model, prefix caching per model
// (on by default), reported by GetModel and in each response's usage.
TEST(ModelsServiceTest, KvPoolBudgetAndPrefixCachingPerModel) {
  ServerOptions options = TestServerOptions();
  options.kv_pool.block_size = 8;
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  auto load = [&](const std::string& name, uint64_t bytes, bool disable, v1::ModelInfo* info) {
    v1::LoadModelRequest request;
    request.set_name(name);
    request.set_path(Models().plain.string());
    request.set_kv_cache_bytes(bytes);
    request.set_disable_prefix_caching(disable);
    return server->models().LoadModel(Context().get(), request, info);
  };
  v1::ModelInfo cached, uncached;
  ASSERT_TRUE(load("cached", 0, false, &cached).ok());
  constexpr uint64_t kBudget = 4u << 20;
  ASSERT_TRUE(load("uncached", kBudget, true, &uncached).ok());
  EXPECT_EQ(cached.kv_pool().block_size(), 8);
  EXPECT_TRUE(cached.kv_pool().prefix_caching());
  EXPECT_GT(cached.kv_pool().bytes(), 0u);
  EXPECT_FALSE(uncached.kv_pool().prefix_caching());
  EXPECT_LE(uncached.kv_pool().bytes(), kBudget);
  EXPECT_GT(uncached.kv_pool().bytes(), kBudget / 2);
  EXPECT_GT(uncached.kv_pool().blocks(), 0);

  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back(10 + i);
  std::vector<int32_t> outputs[2];
  for (const char* name : {"cached", "uncached"}) {
    const bool caching = std::string(name) == "cached";
    for (int round = 0; round < 2; ++round) {
      StreamResult result = GenerateAll(server->inference(), GreedyRequest(name, prompt, 5));
      ASSERT_TRUE(result.status.ok()) << result.status.error_message();
      EXPECT_EQ(result.last()->usage().prompt_tokens(), 21);
      // The second time, the two whole blocks of 8 come from the cache.
      EXPECT_EQ(result.last()->usage().cached_prompt_tokens(), caching && round == 1 ? 16 : 0)
          << name << " round " << round;
      outputs[caching] = result.tokens;
    }
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  v1::ModelInfo got;
  ASSERT_TRUE(Get(server->models(), "cached", &got).ok());
  EXPECT_EQ(got.kv_pool().prompt_tokens(), 42u);
  EXPECT_EQ(got.kv_pool().cached_prompt_tokens(), 16u);
  EXPECT_EQ(got.kv_pool().used_blocks(), 0);
  EXPECT_GE(got.kv_pool().cached_blocks(), 2);

  // A pool smaller than max_context caps the context of one sequence, and GetModel says so.
  const uint64_t block_bytes = cached.kv_pool().bytes() / cached.kv_pool().blocks();
  v1::ModelInfo small;
  ASSERT_TRUE(load("small", 16 * block_bytes, false, &small).ok());
  EXPECT_EQ(small.kv_pool().blocks(), 16);
  EXPECT_EQ(small.max_context(), 16 * 8);
  EXPECT_CODE(
      GenerateAll(server->inference(), GreedyRequest("small", std::vector<int32_t>(128, 3), 2))
          .status,
      INVALID_ARGUMENT, "maximum context length is 128 tokens");

  // A budget below one block is refused, naming it.
  v1::ModelInfo none;
  EXPECT_CODE(load("tiny", 16, false, &none), INVALID_ARGUMENT, "KV pool");
}

// A bf16 KV pool (kv_cache_dtype) holds twice the blocks of an f32 one in the same budget, says
// so in GetModel, and serves; a dtype kiln's pools do not hold is refused, naming the field.
TEST(ModelsServiceTest, KvCacheDTypePerModel) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  constexpr uint64_t kBudget = 4u << 20;
  auto load = [&](const std::string& name, const std::string& dtype, v1::ModelInfo* info) {
    v1::LoadModelRequest request;
    request.set_name(name);
    request.set_path(Models().plain.string());
    request.set_kv_cache_bytes(kBudget);
    request.set_kv_cache_dtype(dtype);
    return server->models().LoadModel(Context().get(), request, info);
  };
  v1::ModelInfo f32, bf16, automatic;
  ASSERT_TRUE(load("f32", "f32", &f32).ok());
  ASSERT_TRUE(load("bf16", "bf16", &bf16).ok());
  // "" = the server's default, "auto": this test model computes in f32, so its cache is f32.
  ASSERT_TRUE(load("auto", "", &automatic).ok());
  EXPECT_EQ(automatic.dtype(), "f32");
  EXPECT_EQ(automatic.kv_pool().dtype(), "f32");
  EXPECT_EQ(f32.kv_pool().dtype(), "f32");
  EXPECT_EQ(bf16.kv_pool().dtype(), "bf16");
  EXPECT_GE(bf16.kv_pool().blocks(), 2 * f32.kv_pool().blocks());
  EXPECT_LE(bf16.kv_pool().bytes(), kBudget);
  EXPECT_EQ(bf16.kv_pool().bytes() / static_cast<uint64_t>(bf16.kv_pool().blocks()),
            f32.kv_pool().bytes() / static_cast<uint64_t>(f32.kv_pool().blocks()) / 2);

  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(5 + i);
  StreamResult result = GenerateAll(server->inference(), GreedyRequest("bf16", prompt, 6));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens.size(), 6u);

  v1::ModelInfo refused;
  EXPECT_CODE(load("fp8", "fp8", &refused), INVALID_ARGUMENT, "kv_cache_dtype");
  EXPECT_CODE(Get(server->models(), "fp8", &refused), NOT_FOUND, "fp8");
}

// A copy of <root>/text whose tokenizer_config.json carries `chat_template` (and, when given, a
// chat_template.jinja beside it).
fs::path ModelWithTemplates(const std::string& name, const nlohmann::json& chat_template,
                            const std::string& jinja_file = "") {
  const fs::path dir = Models().root / name;
  fs::remove_all(dir);
  fs::copy(Models().text, dir, fs::copy_options::recursive);
  nlohmann::json config;
  std::ifstream(dir / "tokenizer_config.json") >> config;
  config["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << config.dump(2);
  if (!jinja_file.empty()) std::ofstream(dir / "chat_template.jinja") << jinja_file;
  return dir;
}

// Chat templates are parsed at load; one that does not parse is reported, and the model serves.
TEST(ModelsServiceTest, ChatTemplatesAreParsedAtLoadAndReported) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  const fs::path good = ModelWithTemplates(
      "chat-good", nlohmann::json::array({{{"name", "tool_use"}, {"template", "{{ tools }}"}}}),
      "{% for m in messages %}{{ m.content }}{% endfor %}");
  const fs::path broken = ModelWithTemplates("chat-broken", "{% include 'x.jinja' %}");
  v1::LoadModelRequest request;
  request.set_name("good");
  request.set_path(good.string());
  v1::ModelInfo info;
  ASSERT_TRUE(server->models().LoadModel(Context().get(), request, &info).ok());
  EXPECT_EQ(std::vector<std::string>(info.chat_templates().begin(), info.chat_templates().end()),
            (std::vector<std::string>{"default", "tool_use"}));
  EXPECT_EQ(info.chat_template_errors_size(), 0);

  request.set_name("broken");
  request.set_path(broken.string());
  ASSERT_TRUE(server->models().LoadModel(Context().get(), request, &info).ok());
  EXPECT_EQ(info.state(), v1::READY);
  EXPECT_EQ(info.chat_templates_size(), 0);
  ASSERT_EQ(info.chat_template_errors_size(), 1);
  EXPECT_CONTAINS(info.chat_template_errors(0), "template 'default' (tokenizer_config.json)");
  EXPECT_CONTAINS(info.chat_template_errors(0), "include");
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("broken", {1, 2}, 3)).status.ok());
}

TEST(ModelsServiceTest, DtypeAndAbsolutePathInsideTheRoot) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::ModelInfo info;
  ASSERT_TRUE(
      Load(server->models(), "b", Models().plain.string(), &info, "bf16", "safetensors").ok());
  EXPECT_EQ(info.dtype(), "bf16");
  EXPECT_GT(info.bytes_in_memory(), 0u);
  StreamResult generated = GenerateAll(server->inference(), GreedyRequest("b", {4, 5}, 3));
  EXPECT_TRUE(generated.status.ok()) << generated.status.error_message();
}

TEST(ModelsServiceTest, BadFieldsAreNamed) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::Models::Stub& stub = server->models();
  EXPECT_CODE(Load(stub, "", "plain"), INVALID_ARGUMENT, "name");
  EXPECT_CODE(Load(stub, "has space", "plain"), INVALID_ARGUMENT, "name");
  EXPECT_CODE(Load(stub, "m", ""), INVALID_ARGUMENT, "path");
  EXPECT_CODE(Load(stub, "m", "plain", nullptr, "", "gguf"), INVALID_ARGUMENT, "format");
  EXPECT_CODE(Load(stub, "m", "plain", nullptr, "fp8"), INVALID_ARGUMENT, "dtype");
  v1::ModelInfo info;
  EXPECT_CODE(Get(stub, "", &info), INVALID_ARGUMENT, "name");
  EXPECT_CODE(Unload(stub, ""), INVALID_ARGUMENT, "name");
  EXPECT_TRUE(Names(stub).empty());
}

TEST(ModelsServiceTest, DuplicateNameIsAlreadyExists) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(Load(server->models(), "dup", "plain").ok());
  EXPECT_CODE(Load(server->models(), "dup", "other"), ALREADY_EXISTS, "unload it first");
  v1::ModelInfo info;
  ASSERT_TRUE(Get(server->models(), "dup", &info).ok());
  EXPECT_EQ(info.state(), v1::READY);
  EXPECT_EQ(info.path(), fs::canonical(Models().plain).string());  // still the first one
}

TEST(ModelsServiceTest, PathsMustStayInsideTheModelRoots) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::Models::Stub& stub = server->models();
  EXPECT_CODE(Load(stub, "x", Models().outside.string()), PERMISSION_DENIED,
              "outside the model roots");
  EXPECT_CODE(Load(stub, "x", "../outside"), PERMISSION_DENIED, "outside the model roots");
  EXPECT_CODE(Load(stub, "x", "/etc"), PERMISSION_DENIED, "outside the model roots");

  // A symlink inside the root that leads out of it is refused; one that stays inside is fine.
  const fs::path escape = Models().root / "escape_link";
  const fs::path inside = Models().root / "inside_link";
  std::error_code ec;
  fs::remove(escape, ec);
  fs::remove(inside, ec);
  fs::create_directory_symlink(Models().outside, escape);
  fs::create_directory_symlink(Models().plain, inside);
  EXPECT_CODE(Load(stub, "x", "escape_link"), PERMISSION_DENIED, "outside the model roots");
  EXPECT_CODE(Load(stub, "x", escape.string()), PERMISSION_DENIED, "outside the model roots");
  v1::ModelInfo info;
  ASSERT_TRUE(Load(stub, "x", "inside_link", &info).ok());
  EXPECT_EQ(info.path(), fs::canonical(Models().plain).string());
  EXPECT_CODE(Load(stub, "y", "no_such_model"), NOT_FOUND, "does not exist");
  EXPECT_EQ(Names(stub), std::vector<std::string>{"x"});
  fs::remove(escape, ec);
  fs::remove(inside, ec);
}

TEST(ModelsServiceTest, WithoutModelRootsEveryLoadIsRefused) {
  ServerOptions options = TestServerOptions();
  options.model_roots.clear();
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  EXPECT_CODE(Load(server->models(), "m", Models().plain.string()), PERMISSION_DENIED,
              "--model-root");
  EXPECT_CODE(Load(server->models(), "m", "plain"), PERMISSION_DENIED, "--model-root");
}

TEST(ModelsServiceTest, FailedLoadLeavesTheRegistryAsItWas) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::Models::Stub& stub = server->models();
  ASSERT_TRUE(Load(stub, "good", "plain").ok());

  EXPECT_CODE(Load(stub, "bad", "empty"), NOT_FOUND, "no checkpoint");
  // A truncated checkpoint: the loader's error comes back and nothing is registered.
  const fs::path broken = Models().root / "broken";
  fs::create_directories(broken);
  fs::copy_file(Models().plain / "config.json", broken / "config.json",
                fs::copy_options::overwrite_existing);
  testing_util::WriteBytes(broken / "model.safetensors", std::string("\x10\x00\x00\x00", 4));
  grpc::Status status = Load(stub, "bad", "broken");
  EXPECT_FALSE(status.ok());
  EXPECT_CONTAINS(status.error_message(), "loading model 'bad'");
  EXPECT_EQ(Names(stub), std::vector<std::string>{"good"});
  v1::ModelInfo info;
  EXPECT_CODE(Get(stub, "bad", &info), NOT_FOUND, "bad");

  StreamResult generated = GenerateAll(server->inference(), GreedyRequest("good", {1, 2}, 3));
  EXPECT_TRUE(generated.status.ok()) << generated.status.error_message();
  // The name is free again.
  EXPECT_TRUE(Load(stub, "bad", "other").ok());
}

TEST(ModelsServiceTest, StartupModelThatFailsStaysVisibleAsFailed) {
  ServerOptions options = TestServerOptions();
  options.models = {{"ok", "plain", "", ""}, {"broken", "empty", "", ""}};
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->server().ReadyLine(), "kiln-server: ready on " + server->server().address() +
                                              " (models: ok; failed: broken)");
  v1::ListModelsResponse list;
  ASSERT_TRUE(server->models().ListModels(Context().get(), {}, &list).ok());
  ASSERT_EQ(list.models_size(), 2);
  EXPECT_EQ(list.models(0).name(), "broken");
  EXPECT_EQ(list.models(0).state(), v1::FAILED);
  EXPECT_CONTAINS(list.models(0).error(), "no checkpoint");
  EXPECT_EQ(list.models(1).state(), v1::READY);

  EXPECT_CODE(GenerateAll(server->inference(), GreedyRequest("broken", {1}, 2)).status,
              FAILED_PRECONDITION, "FAILED");
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("ok", {1}, 2)).status.ok());
  EXPECT_CODE(Load(server->models(), "broken", "other"), ALREADY_EXISTS, "FAILED");
  ASSERT_TRUE(Unload(server->models(), "broken").ok());
  EXPECT_TRUE(Load(server->models(), "broken", "other").ok());
}

TEST(ModelsServiceTest, LoadingModelIsVisibleAndNotReady) {
  absl::Notification release;
  ServerOptions options = TestServerOptions();
  options.on_loading_for_testing = [&](const ModelSpec& spec) {
    if (spec.name == "slow") release.WaitForNotificationWithTimeout(absl::Seconds(20));
  };
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  grpc::Status load_status;
  v1::ModelInfo loaded;
  std::thread loader([&] { load_status = Load(server->models(), "slow", "plain", &loaded); });

  v1::ModelInfo info;
  EXPECT_TRUE(WaitFor([&] { return Get(server->models(), "slow", &info).ok(); }));
  EXPECT_EQ(info.state(), v1::LOADING);
  EXPECT_EQ(info.path(), "plain");
  EXPECT_EQ(Names(server->models()), std::vector<std::string>{"slow"});
  // Loading passes: a client may retry (HTTP answers 503).
  EXPECT_CODE(GenerateAll(server->inference(), GreedyRequest("slow", {1}, 2)).status, UNAVAILABLE,
              "LOADING");
  EXPECT_CODE(Unload(server->models(), "slow"), FAILED_PRECONDITION, "LOADING");
  EXPECT_CODE(Load(server->models(), "slow", "other"), ALREADY_EXISTS, "LOADING");

  release.Notify();
  loader.join();
  ASSERT_TRUE(load_status.ok()) << load_status.error_message();
  EXPECT_EQ(loaded.state(), v1::READY);
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("slow", {1}, 2)).status.ok());
}

TEST(ModelsServiceTest, AdminTokenGuardsEveryModelsCall) {
  testing_util::ScratchDir scratch;
  testing_util::WriteBytes(scratch / "token", "s3cret-token\n");
  ServerOptions options = TestServerOptions();
  options.admin_token_file = (scratch / "token").string();
  options.models = {{"m", "plain", "", ""}};
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  v1::Models::Stub& stub = server->models();

  auto with_token = [](const std::string& value) {
    std::unique_ptr<grpc::ClientContext> context = Context();
    if (!value.empty()) context->AddMetadata("authorization", value);
    return context;
  };
  v1::ListModelsResponse list;
  v1::ModelInfo info;
  v1::UnloadModelResponse unloaded;
  v1::LoadModelRequest load;
  load.set_name("n");
  load.set_path("other");
  v1::GetModelRequest get;
  get.set_name("m");
  v1::UnloadModelRequest unload;
  unload.set_name("m");

  // Missing: UNAUTHENTICATED on every RPC.
  EXPECT_CODE(stub.ListModels(with_token("").get(), {}, &list), UNAUTHENTICATED, "Bearer");
  EXPECT_CODE(stub.GetModel(with_token("").get(), get, &info), UNAUTHENTICATED, "Bearer");
  EXPECT_CODE(stub.LoadModel(with_token("").get(), load, &info), UNAUTHENTICATED, "Bearer");
  EXPECT_CODE(stub.UnloadModel(with_token("").get(), unload, &unloaded), UNAUTHENTICATED, "Bearer");
  EXPECT_CODE(stub.ListModels(with_token("Basic abc").get(), {}, &list), UNAUTHENTICATED, "Bearer");
  // Wrong: PERMISSION_DENIED.
  for (const char* wrong : {"Bearer wrong", "Bearer s3cret-toke", "Bearer s3cret-token2"}) {
    EXPECT_CODE(stub.ListModels(with_token(wrong).get(), {}, &list), PERMISSION_DENIED,
                "does not match");
    EXPECT_CODE(stub.LoadModel(with_token(wrong).get(), load, &info), PERMISSION_DENIED,
                "does not match");
  }
  // Right.
  EXPECT_TRUE(stub.ListModels(with_token("Bearer s3cret-token").get(), {}, &list).ok());
  EXPECT_EQ(list.models_size(), 1);
  EXPECT_TRUE(stub.GetModel(with_token("bearer s3cret-token").get(), get, &info).ok());
  EXPECT_TRUE(stub.LoadModel(with_token("Bearer s3cret-token").get(), load, &info).ok());
  EXPECT_TRUE(stub.UnloadModel(with_token("Bearer s3cret-token").get(), unload, &unloaded).ok());
  // The Inference service needs no token.
  EXPECT_TRUE(GenerateAll(server->inference(), GreedyRequest("n", {1, 2}, 2)).status.ok());
}

TEST(AuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_FALSE(ConstantTimeEquals("abcabc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace kiln::server_test
