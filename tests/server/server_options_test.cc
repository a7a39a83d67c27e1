// StartServer: bad options, unreadable files, a busy port, TLS, and the ready line.
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

TEST(ServerOptionsTest, BadOptionsAreRefused) {
  ServerOptions options = TestServerOptions();
  options.listen = "no-port";
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kInvalidArgument);

  options = TestServerOptions();
  options.model_roots = {"/no/such/root"};
  absl::StatusOr<std::unique_ptr<RunningServer>> server = StartServer(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(server.status().message(), "/no/such/root");

  options = TestServerOptions();
  options.tls_cert_file = "/no/such/cert.pem";
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.tls_key_file = "/no/such/key.pem";
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kNotFound);

  options = TestServerOptions();
  options.admin_token_file = "/no/such/token";
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kNotFound);
  testing_util::ScratchDir scratch;
  testing_util::WriteBytes(scratch / "empty-token", " \n");
  options.admin_token_file = (scratch / "empty-token").string();
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kInvalidArgument);

  options = TestServerOptions();
  options.engine.max_running = 0;
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerOptionsTest, BusyPortIsUnavailable) {
  auto first = TestServer::Start(TestServerOptions());
  ASSERT_NE(first, nullptr);
  ServerOptions options = TestServerOptions();
  options.listen = first->server().address();
  absl::StatusOr<std::unique_ptr<RunningServer>> second = StartServer(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_CONTAINS(second.status().message(), first->server().address());
}

TEST(ServerOptionsTest, ReadyLineNamesTheBoundPortAndModels) {
  ServerOptions options = TestServerOptions();
  options.models = {{"default", "plain", "", ""}};
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->server().port(), 0);
  EXPECT_EQ(server->server().ReadyLine(),
            "kiln-server: ready on 127.0.0.1:" + std::to_string(server->server().port()) +
                " (models: default)");
  auto empty = TestServer::Start(TestServerOptions());
  ASSERT_NE(empty, nullptr);
  EXPECT_CONTAINS(empty->server().ReadyLine(), "(models: none)");
}

// A self-signed certificate for "kiln.test" and its key, PEM.
void MakeSelfSigned(std::string* cert_pem, std::string* key_pem) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  ASSERT_NE(key, nullptr);
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("kiln.test"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, cert, cert, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "DNS:kiln.test"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
    ASSERT_NE(extension, nullptr);
    X509_add_ext(cert, extension, -1);
    X509_EXTENSION_free(extension);
  }
  ASSERT_GT(X509_sign(cert, key, EVP_sha256()), 0);
  auto to_string = [](BIO* bio) {
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    std::string out(data, static_cast<size_t>(size));
    BIO_free(bio);
    return out;
  };
  BIO* cert_bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(cert_bio, cert);
  *cert_pem = to_string(cert_bio);
  BIO* key_bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(key_bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  *key_pem = to_string(key_bio);
  X509_free(cert);
  EVP_PKEY_free(key);
}

TEST(ServerOptionsTest, ServesTlsWhenGivenACertificate) {
  std::string cert, key;
  MakeSelfSigned(&cert, &key);
  ASSERT_FALSE(cert.empty());
  testing_util::ScratchDir scratch;
  testing_util::WriteBytes(scratch / "server.crt", cert);
  testing_util::WriteBytes(scratch / "server.key", key);
  ServerOptions options = TestServerOptions();
  options.tls_cert_file = (scratch / "server.crt").string();
  options.tls_key_file = (scratch / "server.key").string();
  options.models = {{"plain", "plain", "", ""}};
  absl::StatusOr<std::unique_ptr<RunningServer>> server = StartServer(options);
  ASSERT_TRUE(server.ok()) << server.status();

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = cert;
  grpc::ChannelArguments arguments;
  arguments.SetSslTargetNameOverride("kiln.test");
  auto channel =
      grpc::CreateCustomChannel((*server)->address(), grpc::SslCredentials(ssl), arguments);
  auto stub = v1::Inference::NewStub(channel);
  StreamResult result = GenerateAll(*stub, GreedyRequest("plain", {1, 2}, 3));
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens.size(), 3u);

  // A plaintext client cannot talk to it.
  auto plain_channel =
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto plain_stub = v1::Inference::NewStub(plain_channel);
  EXPECT_FALSE(
      GenerateAll(*plain_stub, GreedyRequest("plain", {1, 2}, 3), absl::Seconds(2)).status.ok());
}

}  // namespace
}  // namespace kiln::server_test
