// The standard services a generic gRPC client relies on: grpc.health.v1.Health and server
// reflection. Their messages are built and read as raw protobuf wire bytes (Debian ships neither
// health.proto nor reflection.proto headers), so nothing here trusts kiln's own generated code.
#include <set>

#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Field `number` of wire type length-delimited as bytes.
std::string LengthDelimited(int number, const std::string& bytes) {
  std::string out;
  out.push_back(static_cast<char>((number << 3) | 2));
  size_t size = bytes.size();
  while (size >= 0x80) {
    out.push_back(static_cast<char>((size & 0x7f) | 0x80));
    size >>= 7;
  }
  out.push_back(static_cast<char>(size));
  return out + bytes;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// grpc.health.v1.Health/Check; returns the ServingStatus (1 = SERVING) or -code on error.
int HealthCheck(TestServer& server, const std::string& service) {
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ByteBuffer request = ToBuffer(service.empty() ? "" : LengthDelimited(1, service));
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientContext> context = Context();
  grpc::Status status = grpc::internal::BlockingUnaryCall(server.channel().get(), method,
                                                          context.get(), request, &response);
  if (!status.ok()) return -static_cast<int>(status.error_code());
  UnknownFieldSet fields;
  const std::string bytes = FromBuffer(response);
  EXPECT_TRUE(fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() == 1) return static_cast<int>(fields.field(i).varint());
  }
  return 0;  // UNKNOWN (the default value is not on the wire)
}

// One request on grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo; returns the
// response's fields.
void Reflect(TestServer& server, const std::string& request_bytes, UnknownFieldSet* fields) {
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientContext> context = Context();
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          server.channel().get(), method, context.get()));
  EXPECT_TRUE(stream->Write(ToBuffer(request_bytes)));
  EXPECT_TRUE(stream->WritesDone());
  grpc::ByteBuffer response;
  if (stream->Read(&response)) {
    const std::string bytes = FromBuffer(response);
    EXPECT_TRUE(fields->ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  }
  while (stream->Read(&response)) {
  }
  grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

std::vector<std::string> Nested(const UnknownFieldSet& fields, int number) {
  std::vector<std::string> out;
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    if (field.number() == number && field.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      out.push_back(field.length_delimited());
    }
  }
  return out;
}

// Fields `number` (length-delimited) of the message in `bytes`.
std::vector<std::string> Nested(const std::string& bytes, int number) {
  UnknownFieldSet fields;
  EXPECT_TRUE(fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  return Nested(fields, number);
}

class StandardServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options = TestServerOptions();
    options.models = {{"plain", "plain", "", ""}};
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
  }
  std::unique_ptr<TestServer> server_;
};

TEST_F(StandardServicesTest, HealthReportsServing) {
  constexpr int kServing = 1;
  EXPECT_EQ(HealthCheck(*server_, ""), kServing);
  EXPECT_EQ(HealthCheck(*server_, "kiln.v1.Inference"), kServing);
  EXPECT_EQ(HealthCheck(*server_, "kiln.v1.Models"), kServing);
  EXPECT_EQ(HealthCheck(*server_, "no.such.Service"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));
}

TEST_F(StandardServicesTest, ReflectionListsAndDescribesTheServices) {
  // ServerReflectionRequest.list_services = 7.
  UnknownFieldSet listed;
  Reflect(*server_, LengthDelimited(7, ""), &listed);
  // ServerReflectionResponse.list_services_response = 6 { repeated ServiceResponse service = 1
  // { string name = 1 } }.
  std::set<std::string> services;
  for (const std::string& list : Nested(listed, 6)) {
    for (const std::string& service : Nested(list, 1)) {
      for (const std::string& name : Nested(service, 1)) services.insert(name);
    }
  }
  EXPECT_TRUE(services.count("kiln.v1.Inference")) << services.size();
  EXPECT_TRUE(services.count("kiln.v1.Models"));

  // ServerReflectionRequest.file_containing_symbol = 4 → file_descriptor_response = 4
  // { repeated bytes file_descriptor_proto = 1 }.
  UnknownFieldSet described;
  Reflect(*server_, LengthDelimited(4, "kiln.v1.Inference"), &described);
  bool found = false;
  for (const std::string& response : Nested(described, 4)) {
    for (const std::string& file_bytes : Nested(response, 1)) {
      google::protobuf::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(file_bytes));
      if (file.package() != "kiln.v1") continue;
      for (const auto& service : file.service()) {
        if (service.name() != "Inference") continue;
        for (const auto& method : service.method()) {
          if (method.name() == "Generate") {
            found = true;
            EXPECT_TRUE(method.server_streaming());
            EXPECT_EQ(method.output_type(), ".kiln.v1.GenerateResponse");
          }
        }
      }
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace kiln::server_test
