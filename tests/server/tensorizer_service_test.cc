// Tensorizer files over the Models service: LoadModel with Tensorizer options (config path, key
// files, passphrase files) and the Tensorize RPC (native files that load on their own, with their
// tokenizer), and the errors of each.
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

namespace fs = std::filesystem;
using testing_util::ScratchDir;

const fs::path kData = fs::path(KILN_TEST_DATA_DIR);

// <root>/tz: the encrypted fp16 fixture, the plain fp32 one and the model's config.json.
const fs::path& TensorizerDir() {
  static const fs::path* dir = [] {
    auto* path = new fs::path(Models().root / "tz");
    fs::create_directories(*path);
    for (const char* name :
         {"llama_tiny_hf_fp16_encrypted_passphrase.tensors", "llama_tiny_hf_fp32.tensors"}) {
      fs::copy_file(kData / "tensorizer" / name, *path / name, fs::copy_options::skip_existing);
    }
    fs::copy_file(kData / "llama_tiny" / "config.json", *path / "config.json",
                  fs::copy_options::skip_existing);
    return path;
  }();
  return *dir;
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string Key() {
  const std::string hex = "63693b1dfaac2334aab8f73608e284ee2450d49f6c7dd34ad8cd8aa5ea6e81e0";
  std::string key;
  for (size_t i = 0; i < hex.size(); i += 2) {
    key.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return key;
}

grpc::Status Load(v1::Models::Stub& stub, const v1::LoadModelRequest& request,
                  v1::ModelInfo* info) {
  return stub.LoadModel(Context().get(), request, info);
}

v1::LoadModelRequest EncryptedRequest(const std::string& name) {
  v1::LoadModelRequest request;
  request.set_name(name);
  request.set_path((TensorizerDir() / "llama_tiny_hf_fp16_encrypted_passphrase.tensors").string());
  return request;
}

grpc::Status Tensorize(v1::Models::Stub& stub, const std::string& model, const std::string& out,
                       v1::TensorizeResponse* response, bool overwrite = false,
                       const std::string& dtype = "", bool prepack = false) {
  v1::TensorizeRequest request;
  request.set_model(model);
  request.set_output_path(out);
  request.set_overwrite(overwrite);
  request.set_dtype(dtype);
  request.set_prepack(prepack);
  return stub.Tensorize(Context().get(), request, response);
}

// Models `a` and `b` give the same greedy tokens and text from the same prompt.
void ExpectSameGreedyText(TestServer& server, const std::string& a, const std::string& b) {
  v1::GenerateRequest request;
  request.set_prompt("hello");
  request.mutable_stopping()->set_max_tokens(8);
  request.mutable_stopping()->set_ignore_eos(true);
  request.set_model(a);
  StreamResult from_a = GenerateAll(server.inference(), request);
  request.set_model(b);
  StreamResult from_b = GenerateAll(server.inference(), request);
  ASSERT_TRUE(from_a.status.ok()) << a << ": " << from_a.status.error_message();
  ASSERT_TRUE(from_b.status.ok()) << b << ": " << from_b.status.error_message();
  EXPECT_EQ(from_a.tokens, from_b.tokens);
  EXPECT_EQ(from_a.text, from_b.text);
}

TEST(TensorizerServiceTest, EncryptedFileWithKeyFileOrPassphraseFile) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  ScratchDir secrets;  // key files may live outside the model roots
  WriteFile(secrets / "model.key", Key());
  WriteFile(secrets / "passphrase.txt", "tensorizer-fixture-passphrase\n");

  v1::LoadModelRequest by_key = EncryptedRequest("by-key");
  by_key.mutable_tensorizer()->set_encryption_key_file((secrets / "model.key").string());
  v1::ModelInfo info;
  grpc::Status status = Load(server->models(), by_key, &info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.state(), v1::READY);
  EXPECT_EQ(info.format(), "tensorizer");
  EXPECT_CONTAINS(info.loader(), "decrypted");
  EXPECT_EQ(info.load_report().placed_size(), 21);

  v1::LoadModelRequest by_passphrase = EncryptedRequest("by-passphrase");
  by_passphrase.mutable_tensorizer()->set_encryption_passphrase_file(
      (secrets / "passphrase.txt").string());
  ASSERT_TRUE(Load(server->models(), by_passphrase, &info).ok());

  // Both decrypt to the same weights.
  StreamResult a = GenerateAll(server->inference(), GreedyRequest("by-key", {1, 2, 3, 4, 5}, 6));
  StreamResult b =
      GenerateAll(server->inference(), GreedyRequest("by-passphrase", {1, 2, 3, 4, 5}, 6));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.tokens, b.tokens);
  // Argmax of the fixture's last position is 4 (tests/data/tensorizer/README.md).
  EXPECT_EQ(a.tokens.front(), 4);
}

TEST(TensorizerServiceTest, KeyErrorsAreClearAndLeaveOtherModelsServing) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::LoadModelRequest plain;
  plain.set_name("plain");
  plain.set_path(Models().plain.string());
  v1::ModelInfo info;
  ASSERT_TRUE(Load(server->models(), plain, &info).ok());

  EXPECT_CODE(Load(server->models(), EncryptedRequest("no-key"), &info), FAILED_PRECONDITION,
              "is encrypted");
  v1::LoadModelRequest wrong = EncryptedRequest("wrong");
  wrong.mutable_tensorizer()->set_encryption_passphrase("wrong passphrase");
  const grpc::Status wrong_status = Load(server->models(), wrong, &info);
  EXPECT_EQ(wrong_status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << wrong_status.error_message();
  EXPECT_EQ(wrong_status.error_message().find("wrong passphrase"), std::string::npos);

  ScratchDir secrets;
  WriteFile(secrets / "short.key", "0123456789");
  v1::LoadModelRequest short_key = EncryptedRequest("short");
  short_key.mutable_tensorizer()->set_encryption_key_file((secrets / "short.key").string());
  EXPECT_CODE(Load(server->models(), short_key, &info), INVALID_ARGUMENT, "holds 10 bytes");
  v1::LoadModelRequest two = EncryptedRequest("two");
  two.mutable_tensorizer()->set_encryption_passphrase("a");
  two.mutable_tensorizer()->set_encryption_key_file((secrets / "short.key").string());
  EXPECT_CODE(Load(server->models(), two, &info), INVALID_ARGUMENT, "at most one");

  v1::LoadModelRequest outside_config;
  outside_config.set_name("outside-config");
  outside_config.set_path((TensorizerDir() / "llama_tiny_hf_fp32.tensors").string());
  outside_config.mutable_tensorizer()->set_config_path(
      (kData / "llama_tiny" / "config.json").string());
  EXPECT_CODE(Load(server->models(), outside_config, &info), PERMISSION_DENIED,
              "tensorizer.config_path");

  // None of it disturbed the loaded model or left entries behind.
  StreamResult result = GenerateAll(server->inference(), GreedyRequest("plain", {1, 2, 3}, 3));
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  v1::ListModelsResponse list;
  ASSERT_TRUE(server->models().ListModels(Context().get(), {}, &list).ok());
  EXPECT_EQ(list.models_size(), 1);
}

TEST(TensorizerServiceTest, TensorizeWritesAFileThatLoadsOnItsOwn) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::LoadModelRequest text;
  text.set_name("text");
  text.set_path(Models().text.string());
  v1::ModelInfo info;
  ASSERT_TRUE(Load(server->models(), text, &info).ok());

  const fs::path out_dir = Models().root / "native-out";
  fs::create_directories(out_dir);
  const fs::path out = out_dir / "text.tensors";
  fs::remove(out);
  v1::TensorizeResponse written;
  grpc::Status status = Tensorize(server->models(), "text", out.string(), &written);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(fs::path(written.path()), fs::canonical(out));
  EXPECT_EQ(written.bytes(), fs::file_size(out));
  EXPECT_GT(written.tensors(), 0);

  v1::LoadModelRequest native;
  native.set_name("native");
  native.set_path(out.string());
  native.set_format("tensorizer");
  ASSERT_TRUE(Load(server->models(), native, &info).ok());
  EXPECT_CONTAINS(info.loader(), "native");

  // Same greedy text from the same prompt: weights and tokenizer both came along.
  ExpectSameGreedyText(*server, "text", "native");

  EXPECT_CODE(Tensorize(server->models(), "text", out.string(), &written), ALREADY_EXISTS,
              "overwrite");
  EXPECT_TRUE(Tensorize(server->models(), "text", out.string(), &written, true, "bf16").ok());
  ScratchDir elsewhere;
  EXPECT_CODE(Tensorize(server->models(), "text", (elsewhere / "x.tensors").string(), &written),
              PERMISSION_DENIED, "output_path");
  EXPECT_CODE(Tensorize(server->models(), "missing", out.string(), &written), NOT_FOUND, "missing");
  EXPECT_CODE(Tensorize(server->models(), "text", out.string(), &written, true, "int8"),
              INVALID_ARGUMENT, "dtype");
}

// With prepack, the file holds the linears as the server packed them: a load adopts every one of
// them, packs nothing, and generates the same text; GetModel says so.
TEST(TensorizerServiceTest, TensorizeWithPrepackWritesTheServersPackedLinears) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  v1::LoadModelRequest text;
  text.set_name("text");
  text.set_path(Models().text.string());
  v1::ModelInfo info;
  ASSERT_TRUE(Load(server->models(), text, &info).ok());
  EXPECT_EQ(info.adopted_linears(), 0);

  const fs::path out_dir = Models().root / "prepacked-out";
  fs::create_directories(out_dir);
  const fs::path out = out_dir / "text.tensors";
  fs::remove(out);
  v1::TensorizeResponse written;
  grpc::Status status = Tensorize(server->models(), "text", out.string(), &written,
                                  /*overwrite=*/false, /*dtype=*/"", /*prepack=*/true);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(written.packed(), 0);
  EXPECT_LE(written.packed(), written.tensors());

  v1::LoadModelRequest prepacked;
  prepacked.set_name("prepacked");
  prepacked.set_path(out.string());
  prepacked.set_format("tensorizer");
  ASSERT_TRUE(Load(server->models(), prepacked, &info).ok());
  EXPECT_EQ(info.adopted_linears(), written.packed());
  EXPECT_TRUE(info.adopted_in_place_linears() == 0 ||
              info.adopted_in_place_linears() == info.adopted_linears());

  ExpectSameGreedyText(*server, "text", "prepacked");

  // Another dtype than the model's cannot be prepacked from it.
  const std::string other = info.dtype() == "bf16" ? "f32" : "bf16";
  EXPECT_CODE(Tensorize(server->models(), "text", out.string(), &written, /*overwrite=*/true, other,
                        /*prepack=*/true),
              INVALID_ARGUMENT, "dtype");
  // A model loaded from a prepacked file holds packed records: write from the original instead.
  EXPECT_CODE(Tensorize(server->models(), "prepacked", (out_dir / "again.tensors").string(),
                        &written, /*overwrite=*/true, "", /*prepack=*/true),
              FAILED_PRECONDITION, "stored packed");
}

}  // namespace
}  // namespace kiln::server_test
