// ServerConfig text format, the flag helpers of main.cc, and the status mapping.
#include "server/config.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/draft_source.h"
#include "gtest/gtest.h"
#include "server/grpc_status.h"
#include "server/model_spec.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

TEST(ConfigTest, ExampleConfigsParse) {
  const std::string configs = std::string(KILN_TEST_DATA_DIR) + "/../../configs";
  absl::StatusOr<v1::ServerConfig> config = ReadServerConfig(configs + "/server.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "127.0.0.1:50051");
  ASSERT_EQ(config->models_size(), 1);
  EXPECT_EQ(config->models(0).name(), "default");

  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "/srv/kiln/configs", &options).ok());
  EXPECT_EQ(options.listen, "127.0.0.1:50051");
  EXPECT_EQ(options.model_roots, std::vector<std::string>{"/srv/kiln/configs/../checkpoints"});
  ASSERT_EQ(options.models.size(), 1u);
  EXPECT_EQ(options.models[0].path, "kiln-brown");  // relative to the model roots, not rebased
  EXPECT_EQ(options.engine.max_queued, 1024);
  EXPECT_EQ(options.kv_pool.block_size, 16);
  EXPECT_EQ(options.kv_pool.bytes, 0u);  // derived per model
  EXPECT_EQ(options.engine.max_running, 64);
  EXPECT_EQ(options.engine.max_context, 4096);
  EXPECT_EQ(options.default_max_tokens, 256);

  absl::StatusOr<v1::ServerConfig> secure = ReadServerConfig(configs + "/server-secure.textproto");
  ASSERT_TRUE(secure.ok()) << secure.status();
  ServerOptions secure_options;
  ASSERT_TRUE(ApplyServerConfig(*secure, "/x", &secure_options).ok());
  EXPECT_EQ(secure_options.admin_token_file, "/etc/kiln/admin-token");
  EXPECT_EQ(secure_options.tls_cert_file, "/etc/kiln/tls/server.crt");
  EXPECT_EQ(secure_options.engine.max_running, 32);
}

TEST(ConfigTest, ErrorsGiveThePosition) {
  absl::StatusOr<v1::ServerConfig> config =
      ParseServerConfig("listen: \"a:1\"\nmax_queued: 3\n", "my.textproto");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(config.status().message(), "my.textproto:2:");
  EXPECT_CONTAINS(config.status().message(), "max_queued");

  EXPECT_EQ(ReadServerConfig("/no/such/file.textproto").status().code(),
            absl::StatusCode::kNotFound);
  ServerOptions options;
  v1::ServerConfig bad;
  bad.add_models()->set_name("only-a-name");
  EXPECT_EQ(ApplyServerConfig(bad, "", &options).code(), absl::StatusCode::kInvalidArgument);
  bad.Clear();
  bad.set_max_context(-1);
  EXPECT_EQ(ApplyServerConfig(bad, "", &options).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, UnsetFieldsKeepTheDefaults) {
  absl::StatusOr<v1::ServerConfig> config = ParseServerConfig("model_roots: \"/m\"");
  ASSERT_TRUE(config.ok());
  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "/base", &options).ok());
  EXPECT_EQ(options.listen, ServerOptions().listen);
  EXPECT_EQ(options.engine.max_queued, EngineOptions().max_queued);
  EXPECT_EQ(options.model_roots, std::vector<std::string>{"/m"});  // absolute: kept
}

TEST(ConfigTest, DraftTokensUnsetLeaveTheChoiceToTheDraftSourceAndZeroTurnsThemOff) {
  ServerOptions options;
  absl::StatusOr<v1::ServerConfig> config = ParseServerConfig("listen: \"127.0.0.1:1\"");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ApplyServerConfig(*config, "", &options).ok());
  EXPECT_EQ(options.engine.default_num_draft_tokens, kDraftSourceDefault);
  for (int32_t drafts : {0, 3, -1}) {
    config = ParseServerConfig(absl::StrCat("default_num_draft_tokens: ", drafts));
    ASSERT_TRUE(config.ok());
    ServerOptions set;
    ASSERT_TRUE(ApplyServerConfig(*config, "", &set).ok());
    EXPECT_EQ(set.engine.default_num_draft_tokens, drafts);
  }
  config = ParseServerConfig("default_num_draft_tokens: 17");
  ASSERT_TRUE(config.ok());
  const absl::Status status = ApplyServerConfig(*config, "", &options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(status.message(), "default_num_draft_tokens");
}

TEST(ConfigTest, KvPoolSettings) {
  absl::StatusOr<v1::ServerConfig> config = ParseServerConfig(R"pb(
    kv_cache_bytes: 1073741824
    kv_block_size: 32
    kv_cache_dtype: "bf16"
    models { name: "a" path: "a" kv_cache_bytes: 65536 disable_prefix_caching: true }
    models { name: "b" path: "b" kv_cache_dtype: "f32" }
  )pb");
  ASSERT_TRUE(config.ok()) << config.status();
  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "/etc/kiln", &options).ok());
  EXPECT_EQ(options.kv_pool.bytes, 1073741824u);
  EXPECT_EQ(options.kv_pool.block_size, 32);
  EXPECT_EQ(options.kv_pool.dtype, DType::kBF16);
  ASSERT_EQ(options.models.size(), 2u);
  EXPECT_EQ(options.models[0].kv_cache_dtype, "");
  EXPECT_EQ(options.models[1].kv_cache_dtype, "f32");
  EXPECT_EQ(options.models[0].kv_cache_bytes, 65536u);
  EXPECT_FALSE(options.models[0].prefix_caching);
  EXPECT_EQ(options.models[1].kv_cache_bytes, 0u);
  EXPECT_TRUE(options.models[1].prefix_caching);
  v1::ServerConfig bad;
  bad.set_kv_block_size(-4);
  EXPECT_EQ(ApplyServerConfig(bad, "", &options).code(), absl::StatusCode::kInvalidArgument);
  v1::ServerConfig bad_dtype;
  bad_dtype.set_kv_cache_dtype("int8");
  const absl::Status status = ApplyServerConfig(bad_dtype, "", &options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(status.message(), "kv_cache_dtype");
  EXPECT_CONTAINS(status.message(), "int8");
}

TEST(ConfigTest, TensorizerOptionsOfAModel) {
  absl::StatusOr<v1::ServerConfig> config = ParseServerConfig(R"pb(
    models {
      name: "llama"
      path: "llama/model.tensors"
      format: "tensorizer"
      tensorizer {
        config_path: "llama/config.json"
        skip_hash_verification: true
        encryption_key_file: "keys/llama.key"
      }
    }
    models {
      name: "other"
      path: "other.tensors"
      tensorizer { encryption_passphrase_file: "/run/secrets/other" hash_check: "crc32" }
    }
  )pb");
  ASSERT_TRUE(config.ok()) << config.status();
  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "/etc/kiln", &options).ok());
  ASSERT_EQ(options.models.size(), 2u);
  const TensorizerSpec& llama = options.models[0].tensorizer;
  EXPECT_EQ(options.models[0].format, "tensorizer");
  EXPECT_EQ(llama.config_path, "llama/config.json");  // resolved inside the model roots later
  EXPECT_TRUE(llama.skip_hash_verification);
  EXPECT_EQ(llama.encryption_key_file, "/etc/kiln/keys/llama.key");  // relative to the config
  EXPECT_EQ(options.models[1].tensorizer.encryption_passphrase_file, "/run/secrets/other");

  // What each spelling asks the loader to check; unknown or contradictory ones name the field.
  EXPECT_EQ(TensorizerHashCheck(llama).value(), tensorizer::HashCheck::kNone);
  EXPECT_EQ(TensorizerHashCheck(options.models[1].tensorizer).value(),
            tensorizer::HashCheck::kCrc32);
  EXPECT_EQ(TensorizerHashCheck(TensorizerSpec{}).value(), tensorizer::HashCheck::kAll);
  TensorizerSpec spec;
  spec.hash_check = "sha1";
  absl::Status status = TensorizerHashCheck(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "tensorizer.hash_check")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "\"sha1\"")) << status;
  spec.hash_check = "crc32";
  spec.skip_hash_verification = true;
  status = TensorizerHashCheck(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "contradicts")) << status;
  spec.hash_check = "NONE";
  EXPECT_EQ(TensorizerHashCheck(spec).value(), tensorizer::HashCheck::kNone);
}

TEST(ConfigTest, RepeatedFlagsAreCollected) {
  std::vector<std::string> args = {
      "kiln-server", "--model_root=/a,/b", "--listen=x:1", "-model_root", "/c", "--model_root",
      "/d",          "--model=m=/p",       "--model",      "n=/q,o=/r",   "--", "--model_root=/e"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  const int argc = static_cast<int>(argv.size());
  EXPECT_EQ(CollectRepeatedFlag(argc, argv.data(), "model_root", true),
            (std::vector<std::string>{"/a", "/b", "/c", "/d"}));
  EXPECT_EQ(CollectRepeatedFlag(argc, argv.data(), "model", true),
            (std::vector<std::string>{"m=/p", "n=/q", "o=/r"}));
  EXPECT_EQ(CollectRepeatedFlag(argc, argv.data(), "listen", false),
            (std::vector<std::string>{"x:1"}));
  EXPECT_TRUE(CollectRepeatedFlag(argc, argv.data(), "config", false).empty());
}

TEST(ConfigTest, ModelFlags) {
  absl::StatusOr<ModelSpec> spec = ParseModelFlag("default=models/tiny");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->name, "default");
  EXPECT_EQ(spec->path, "models/tiny");
  EXPECT_FALSE(ParseModelFlag("no-equals").ok());
  EXPECT_FALSE(ParseModelFlag("=path").ok());
  EXPECT_FALSE(ParseModelFlag("name=").ok());

  std::vector<ModelSpec> models = {{"a", "1", "", ""}, {"b", "2", "", ""}};
  AddOrReplaceModel({"a", "3", "", ""}, &models);
  AddOrReplaceModel({"c", "4", "", ""}, &models);
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].path, "3");
  EXPECT_EQ(models[2].name, "c");
}

TEST(ConfigTest, HttpApiAndChatTemplates) {
  absl::StatusOr<v1::ServerConfig> config = ParseServerConfig(R"pb(
    http_listen: "0.0.0.0:8000"
    api_key_file: "secrets/api_key"
    models { name: "a" path: "a" chat_template_file: "templates/chatml.jinja" quantize: "int8" }
    models { name: "b" path: "b" }
  )pb");
  ASSERT_TRUE(config.ok()) << config.status();
  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "/etc/kiln", &options).ok());
  EXPECT_EQ(options.http_listen, "0.0.0.0:8000");
  EXPECT_EQ(options.api_key_file, "/etc/kiln/secrets/api_key");
  ASSERT_EQ(options.models.size(), 2u);
  EXPECT_EQ(options.models[0].chat_template_file, "/etc/kiln/templates/chatml.jinja");
  EXPECT_EQ(options.models[1].chat_template_file, "");
  EXPECT_EQ(options.models[0].quantize, "int8");
  EXPECT_EQ(options.models[1].quantize, "");

  // --chat-template NAME=FILE for one model, FILE for every one.
  ASSERT_TRUE(ApplyChatTemplateFlag("b=/t/b.jinja", &options.models).ok());
  EXPECT_EQ(options.models[1].chat_template_file, "/t/b.jinja");
  EXPECT_EQ(options.models[0].chat_template_file, "/etc/kiln/templates/chatml.jinja");
  ASSERT_TRUE(ApplyChatTemplateFlag("/t/all=of.jinja", &options.models).ok());
  EXPECT_EQ(options.models[0].chat_template_file, "/t/all=of.jinja");
  EXPECT_EQ(options.models[1].chat_template_file, "/t/all=of.jinja");
  std::vector<ModelSpec> none;
  const absl::Status status = ApplyChatTemplateFlag("x.jinja", &none);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "no startup model")) << status;

  // --quantize MODE or NAME=MODE, checked.
  ASSERT_TRUE(ApplyQuantizeFlag("b=int4", &options.models).ok());
  EXPECT_EQ(options.models[1].quantize, "int4");
  EXPECT_EQ(options.models[0].quantize, "int8");
  ASSERT_TRUE(ApplyQuantizeFlag("none", &options.models).ok());
  EXPECT_EQ(options.models[0].quantize, "none");
  ASSERT_TRUE(ApplyQuantizeFlag("int8", &options.models).ok());
  EXPECT_EQ(options.models[0].quantize, "int8");
  EXPECT_EQ(options.models[1].quantize, "int8");
  const absl::Status bad = ApplyQuantizeFlag("b=q4_0", &options.models);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.message(), "--quantize")) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "q4_0")) << bad;
}

TEST(GrpcStatusTest, OneMappingForEveryCode) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const std::vector<std::pair<absl::Status, grpc::StatusCode>> cases = {
      {absl::InvalidArgumentError("prompt: bad"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::NotFoundError("m"), grpc::StatusCode::NOT_FOUND},
      {absl::FailedPreconditionError("m"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::ResourceExhaustedError("m"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::PermissionDeniedError("m"), grpc::StatusCode::PERMISSION_DENIED},
      {absl::UnauthenticatedError("m"), grpc::StatusCode::UNAUTHENTICATED},
      {absl::AlreadyExistsError("m"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::CancelledError("m"), grpc::StatusCode::CANCELLED},
      {absl::DeadlineExceededError("m"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::InternalError("m"), grpc::StatusCode::INTERNAL},
      {absl::UnavailableError("m"), grpc::StatusCode::UNAVAILABLE},
      {absl::DataLossError("m"), grpc::StatusCode::DATA_LOSS},
      {absl::OutOfRangeError("m"), grpc::StatusCode::OUT_OF_RANGE},
      {absl::UnimplementedError("m"), grpc::StatusCode::UNIMPLEMENTED},
      {absl::AbortedError("m"), grpc::StatusCode::ABORTED},
      {absl::UnknownError("m"), grpc::StatusCode::UNKNOWN},
  };
  for (const auto& [status, code] : cases) {
    const grpc::Status converted = ToGrpcStatus(status);
    EXPECT_EQ(converted.error_code(), code) << status;
    EXPECT_EQ(converted.error_message(), std::string(status.message()));
  }
}

}  // namespace
}  // namespace kiln
