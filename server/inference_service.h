// kiln.v1.Inference: Generate (server streaming), Tokenize, Detokenize. Only translates between
// the proto messages and the engine/tokenizer of a READY model.
#pragma once

#include "absl/time/time.h"
#include "kiln/v1/kiln.grpc.pb.h"
#include "server/generate_convert.h"
#include "server/metrics.h"
#include "server/registry.h"

namespace kiln {

struct InferenceServiceOptions {
  GenerateDefaults defaults;
  // How often a waiting Generate handler looks at its call for a cancellation or a deadline.
  absl::Duration cancel_poll = absl::Milliseconds(20);
  // Where Generate calls are recorded; null: nowhere. Must outlive the service.
  ServerMetrics* metrics = nullptr;
  // Tests and benchmarks: each streamed update waits this long per token before it is written,
  // so that a load test knows the inter-token latency it should measure.
  absl::Duration token_delay_for_testing = absl::ZeroDuration();
};

class InferenceService final : public v1::Inference::Service {
 public:
  InferenceService(ModelRegistry* registry, InferenceServiceOptions options)
      : registry_(registry), options_(options) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;

 private:
  absl::Status DoGenerate(grpc::ServerContext* context, const v1::GenerateRequest& request,
                          grpc::ServerWriter<v1::GenerateResponse>* writer,
                          GenerateRecorder& recorder);
  absl::Status DoTokenize(const v1::TokenizeRequest& request, v1::TokenizeResponse* response);
  absl::Status DoDetokenize(const v1::DetokenizeRequest& request, v1::DetokenizeResponse* response);

  ModelRegistry* const registry_;
  const InferenceServiceOptions options_;
};

}  // namespace kiln
