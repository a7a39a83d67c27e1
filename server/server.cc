#include "server/server.h"

#include <fstream>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "http/http_server.h"
#include "server/auth.h"
#include "server/grpc_parse_errors.h"
#include "server/inference_service.h"
#include "server/metrics.h"
#include "server/models_service.h"
#include "server/openai_service.h"

namespace kiln {
namespace {

// After the shutdown grace: how long ended streams have to write their last message.
constexpr absl::Duration kShutdownFinalWrites = absl::Seconds(2);

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, " cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  return text;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  KILN_ASSIGN_OR_RETURN(std::string cert, ReadFile(options.tls_cert_file, "TLS certificate"));
  KILN_ASSIGN_OR_RETURN(std::string key, ReadFile(options.tls_key_file, "TLS key"));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

absl::Status ValidateOptions(const ServerOptions& options) {
  if (options.listen.empty() || options.listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: '", options.listen, "' is not HOST:PORT"));
  }
  if (!options.metrics_listen.empty() && options.metrics_listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: '", options.metrics_listen, "' is not HOST:PORT"));
  }
  if (!options.http_listen.empty() && options.http_listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_listen: '", options.http_listen, "' is not HOST:PORT"));
  }
  if (options.engine.max_running < 1) {
    return absl::InvalidArgumentError("max_running_sequences must be at least 1");
  }
  if (options.engine.max_queued < 0) {
    return absl::InvalidArgumentError("max_queued_requests must not be negative");
  }
  if (options.engine.max_context < 2) {
    return absl::InvalidArgumentError("max_context must be at least 2");
  }
  if (options.default_max_tokens < 1) {
    return absl::InvalidArgumentError("default_max_tokens must be at least 1");
  }
  if (options.max_threads < 8) return absl::InvalidArgumentError("max_threads must be at least 8");
  if (options.token_delay_for_testing < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("token_delay_for_testing must not be negative");
  }
  if (options.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shutdown_grace must not be negative");
  }
  return ValidateRequestLimits(options.limits);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(ServerOptions options) {
  KILN_RETURN_IF_ERROR(ValidateOptions(options));
  std::string admin_token = options.admin_token;
  if (!options.admin_token_file.empty()) {
    KILN_ASSIGN_OR_RETURN(admin_token, ReadAdminTokenFile(options.admin_token_file));
  }
  std::string api_key = options.api_key;
  if (!options.api_key_file.empty()) {
    KILN_ASSIGN_OR_RETURN(api_key, ReadAdminTokenFile(options.api_key_file, "API key file"));
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        MakeCredentials(options));

  auto server = std::unique_ptr<RunningServer>(new RunningServer());
  server->shutdown_grace_ = options.shutdown_grace;
  RegistryOptions registry_options;
  registry_options.model_roots = options.model_roots;
  registry_options.engine = options.engine;
  registry_options.kv_pool = options.kv_pool;
  registry_options.default_backend = options.default_backend;
  registry_options.on_loading_for_testing = options.on_loading_for_testing;
  KILN_ASSIGN_OR_RETURN(server->registry_, ModelRegistry::Create(std::move(registry_options)));
  for (const ModelSpec& spec : options.models) {
    // A model that fails stays listed as FAILED with its error; the others still serve.
    absl::StatusOr<ModelSnapshot> loaded = server->registry_->LoadAtStartup(spec);
    if (!loaded.ok()) LOG(ERROR) << "startup model '" << spec.name << "': " << loaded.status();
  }

  // The HTTP API records into the same kiln_* series (and serves them at its /metrics too).
  if (!options.metrics_listen.empty() || !options.http_listen.empty()) {
    server->metrics_ = std::make_unique<ServerMetrics>(server->registry_.get());
  }
  if (!options.metrics_listen.empty()) {
    ServerMetrics* metrics = server->metrics_.get();
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(options.metrics_listen, [metrics] { return metrics->Render(); });
    if (!http.ok()) {
      server->registry_->Shutdown();
      return http.status();
    }
    server->metrics_http_ = *std::move(http);
    server->metrics_port_ = server->metrics_http_->port();
    server->metrics_address_ = server->metrics_http_->address();
    LOG(INFO) << "metrics on http://" << server->metrics_address_ << "/metrics";
  }
  if (options.token_delay_for_testing > absl::ZeroDuration()) {
    LOG(WARNING) << "every streamed token is delayed by "
                 << absl::FormatDuration(options.token_delay_for_testing)
                 << " (--token-delay-for-testing: for tests and benchmarks only)";
  }

  InferenceServiceOptions inference_options;
  inference_options.defaults.max_tokens = options.default_max_tokens;
  inference_options.cancel_poll = options.cancel_poll;
  inference_options.metrics = server->metrics_.get();
  inference_options.token_delay_for_testing = options.token_delay_for_testing;
  inference_options.limits = options.limits;
  server->inference_ =
      std::make_unique<InferenceService>(server->registry_.get(), inference_options);
  server->models_ = std::make_unique<ModelsService>(server->registry_.get(), admin_token);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  // A second server on a busy port must fail, not share the port (gRPC sets SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->inference_.get());
  builder.RegisterService(server->models_.get());
  // One thread per in-flight call in the synchronous API: enough for many concurrent streams.
  grpc::ResourceQuota quota("kiln-server");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  // A larger message is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is parsed.
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.limits.max_request_bytes));
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    server->registry_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (address in use or not available?)"));
  }
  server->port_ = port;
  server->address_ = absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":", port);
  if (!options.http_listen.empty()) {
    OpenAiServiceOptions openai_options;
    openai_options.api_key = api_key;
    openai_options.metrics = server->metrics_.get();
    openai_options.limits = options.limits;
    server->openai_ =
        std::make_unique<OpenAiService>(server->registry_.get(), std::move(openai_options));
    OpenAiService* openai = server->openai_.get();
    HttpServerOptions http_options;
    http_options.max_body_bytes = static_cast<size_t>(options.limits.max_request_bytes);
    http_options.read_timeout = options.limits.http_read_timeout;
    http_options.max_body_setting = "--max-request-bytes";
    http_options.read_timeout_setting = "--http-read-timeout";
    absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(
        options.http_listen,
        [openai](HttpRequest request, std::shared_ptr<ResponseStream> out) {
          openai->Handle(std::move(request), std::move(out));
        },
        http_options);
    if (!http.ok()) return KilnAnnotate(http.status(), "http_listen");  // ~RunningServer stops
    server->http_ = *std::move(http);
    server->http_port_ = server->http_->port();
    server->http_address_ = server->http_->address();
    LOG(INFO) << "OpenAI API on http://" << server->http_address_ << "/v1"
              << (api_key.empty() ? " (open)" : " (needs the API key)");
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus(v1::Inference::service_full_name(), true);
    health->SetServingStatus(v1::Models::service_full_name(), true);
  }
  LOG(INFO) << "per model: max_running " << options.engine.max_running << ", max_queued "
            << options.engine.max_queued << ", max_context " << options.engine.max_context
            << ", default_max_tokens " << options.default_max_tokens << "; KV blocks of "
            << options.kv_pool.block_size << " positions, pool "
            << (options.kv_pool.bytes == 0 ? std::string("sized from max_running x max_context")
                                           : absl::StrCat(options.kv_pool.bytes, " bytes"));
  LOG(INFO) << "listening on " << server->address_
            << (options.tls_cert_file.empty() ? " (insecure)" : " (TLS)")
            << (admin_token.empty() ? "; Models service open to every client"
                                    : "; Models service needs the admin token");
  return server;
}

std::string RunningServer::ReadyLine() const {
  std::vector<std::string> ready, failed;
  for (const ModelSnapshot& model : registry_->List()) {
    if (model.state == ModelState::kReady) ready.push_back(model.spec.name);
    if (model.state == ModelState::kFailed) failed.push_back(model.spec.name);
  }
  std::string line =
      absl::StrCat("kiln-server: ready on ", address_,
                   " (models: ", ready.empty() ? "none" : absl::StrJoin(ready, ", "));
  if (!failed.empty()) absl::StrAppend(&line, "; failed: ", absl::StrJoin(failed, ", "));
  absl::StrAppend(&line, ")");
  if (!http_address_.empty())
    absl::StrAppend(&line, "; OpenAI API on http://", http_address_, "/v1");
  if (!metrics_address_.empty()) {
    absl::StrAppend(&line, "; metrics on http://", metrics_address_, "/metrics");
  }
  return line;
}

void RunningServer::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_ == nullptr) {
    if (registry_ != nullptr) registry_->Shutdown();
    if (http_ != nullptr) http_->Shutdown(absl::ZeroDuration());
    metrics_http_.reset();
    return;
  }
  LOG(INFO) << "shutting down: in-flight calls have " << absl::FormatDuration(shutdown_grace_)
            << " to finish";
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->Shutdown();  // every service reports NOT_SERVING from now on
  }
  if (openai_ != nullptr) openai_->StopServing();
  if (http_ != nullptr) http_->StopAccepting();
  // gRPC refuses new calls from now on and waits for the running ones; so does HTTP below.
  // Streams still running when the grace is over are ended by their engines with a reason the
  // client sees (UNAVAILABLE; an error event on HTTP), and get a little longer to write it
  // before gRPC cancels what is left.
  const absl::Time deadline = absl::Now() + shutdown_grace_;
  absl::Notification grpc_drained;
  std::thread grpc_shutdown([this, deadline, &grpc_drained] {
    server_->Shutdown(absl::ToChronoTime(deadline + kShutdownFinalWrites));
    grpc_drained.Notify();
  });
  grpc_drained.WaitForNotificationWithDeadline(deadline);
  while (http_ != nullptr && http_->active_requests() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Status ended = absl::UnavailableError(
      absl::StrCat("kiln-server is shutting down: streams still running after the shutdown grace "
                   "of ",
                   absl::FormatDuration(shutdown_grace_), " (--shutdown-grace) are ended"));
  inference_->EndStreams(ended);
  registry_->Shutdown(ended);
  grpc_shutdown.join();
  if (http_ != nullptr) http_->Shutdown(kShutdownFinalWrites);
  metrics_http_.reset();  // frees its port
  LOG(INFO) << "shut down";
}

void RunningServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

RunningServer::~RunningServer() {
  Shutdown();
  Wait();
}

}  // namespace kiln
