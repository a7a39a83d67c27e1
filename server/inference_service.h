// kiln.v1.Inference: Generate (server streaming), Tokenize, Detokenize. Only translates between
// the proto messages and the engine/tokenizer of a READY model.
#pragma once

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kiln/v1/kiln.grpc.pb.h"
#include "server/generate_convert.h"
#include "server/metrics.h"
#include "server/registry.h"
#include "server/request_limits.h"

namespace kiln {

struct InferenceServiceOptions {
  GenerateDefaults defaults;
  RequestLimits limits;
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

  // Every Generate stream still open ends with `reason` (not OK) at its next update or poll,
  // and so does every later one; for the end of a server's shutdown grace, when the engines may
  // be done but a stream still has updates to write.
  void EndStreams(absl::Status reason);

 private:
  absl::Status DoGenerate(grpc::ServerContext* context, const v1::GenerateRequest& request,
                          grpc::ServerWriter<v1::GenerateResponse>* writer,
                          GenerateRecorder& recorder);
  absl::Status DoTokenize(const v1::TokenizeRequest& request, v1::TokenizeResponse* response);
  absl::Status DoDetokenize(const v1::DetokenizeRequest& request, v1::DetokenizeResponse* response);

  absl::Status ended_reason() const;

  ModelRegistry* const registry_;
  const InferenceServiceOptions options_;
  std::atomic<bool> streams_ended_{false};
  mutable absl::Mutex ended_mutex_;
  absl::Status ended_reason_ ABSL_GUARDED_BY(ended_mutex_);
};

}  // namespace kiln
