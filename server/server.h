// Server assembly: registry + Inference + Models + health + reflection on one gRPC server.
// main.cc only turns flags and the config file into ServerOptions; tests run StartServer
// in-process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "grpcpp/server.h"
#include "server/registry.h"
#include "server/request_limits.h"

namespace kiln {

class HttpServer;
class InferenceService;
class MetricsHttpServer;
class ModelsService;
class OpenAiService;
class ServerMetrics;

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // HOST:PORT; port 0 picks a free one
  std::vector<std::string> model_roots;    // LoadModel paths must resolve inside one of these
  std::vector<ModelSpec> models;           // loaded before the server starts listening
  std::string default_backend;             // for models that name none; "" = "cpu"
  EngineOptions engine;                    // per model: max_running, max_queued, max_context
  KvPoolOptions kv_pool;                   // per model: block size and budget (0 = derived)
  int32_t default_max_tokens = 256;        // for requests with stopping.max_tokens = 0
  std::string admin_token;                 // "": the Models service is open
  std::string admin_token_file;            // read at start; overrides admin_token
  std::string tls_cert_file;               // both set: TLS; neither: insecure
  std::string tls_key_file;
  // HOST:PORT of the Prometheus endpoint (HTTP GET /metrics); "" = off; port 0 picks a free one.
  std::string metrics_listen;
  // HOST:PORT of the OpenAI-compatible HTTP API; "" = off; port 0 picks a free one.
  std::string http_listen;
  // Bearer token the HTTP API's /v1/* requires ("" = open), as vLLM's --api-key; a file holding
  // it is read at start and overrides it.
  std::string api_key;
  std::string api_key_file;
  // gRPC sync-server threads: each open Generate stream holds one, so this bounds concurrent
  // streams (requests queue in the engine, not here: see EngineOptions::max_queued).
  int max_threads = 2048;
  // What one request may ask for (stop strings, choices, logprobs, bytes, HTTP read time).
  RequestLimits limits;
  // After SIGTERM, in-flight calls may finish for this long; streams still running then end
  // with UNAVAILABLE ("kiln-server is shutting down").
  absl::Duration shutdown_grace = absl::Seconds(3);
  absl::Duration cancel_poll = absl::Milliseconds(20);
  // Tests and benchmarks only: every streamed token is delayed by this much (see
  // InferenceServiceOptions), so that load tests measure a known inter-token latency.
  absl::Duration token_delay_for_testing = absl::ZeroDuration();
  // Tests: see RegistryOptions::on_loading_for_testing.
  std::function<void(const ModelSpec&)> on_loading_for_testing;
};

class RunningServer {
 public:
  ~RunningServer();  // Shutdown() and Wait()
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;

  int port() const { return port_; }
  // HOST:PORT with the bound port.
  const std::string& address() const { return address_; }
  // The metrics endpoint's bound port and HOST:PORT; 0 and "" when it is off.
  int metrics_port() const { return metrics_port_; }
  const std::string& metrics_address() const { return metrics_address_; }
  // The OpenAI HTTP API's bound port and HOST:PORT; 0 and "" when it is off.
  int http_port() const { return http_port_; }
  const std::string& http_address() const { return http_address_; }
  // "kiln-server: ready on 127.0.0.1:50051 (models: default)", with
  // "; OpenAI API on http://127.0.0.1:8000/v1" and "; metrics on http://127.0.0.1:9090/metrics"
  // appended when those are on.
  std::string ReadyLine() const;
  ModelRegistry& registry() { return *registry_; }

  // Graceful: health goes NOT_SERVING (HTTP /health 503), no new calls or connections are
  // accepted, in-flight calls and HTTP requests get shutdown_grace to finish and are then
  // cancelled (HTTP streams end with an error event and [DONE]), then every engine stops.
  // Idempotent.
  void Shutdown();
  // Returns once the server has shut down.
  void Wait();

 private:
  friend absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(ServerOptions options);
  RunningServer() = default;

  absl::Duration shutdown_grace_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<ServerMetrics> metrics_;  // null when metrics_listen is ""
  std::unique_ptr<InferenceService> inference_;
  std::unique_ptr<ModelsService> models_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // stopped by Shutdown
  int metrics_port_ = 0;
  std::string metrics_address_;
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<HttpServer> http_;  // stopped by Shutdown
  int http_port_ = 0;
  std::string http_address_;
  int port_ = 0;
  std::string address_;
  absl::Mutex shutdown_mutex_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mutex_) = false;
};

// Loads the startup models (one that fails stays listed as FAILED), then listens. Errors: bad
// options (InvalidArgument), unreadable token/TLS files, or a listen address that cannot be
// bound (Unavailable).
absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(ServerOptions options);

}  // namespace kiln
