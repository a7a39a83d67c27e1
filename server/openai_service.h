// The OpenAI-compatible HTTP API over the model registry (what vLLM's, SGLang's and llama.cpp's
// servers serve): POST /v1/chat/completions and /v1/completions (whole or streamed as
// server-sent events), GET /v1/models[/{id}], GET /health, GET /version, vLLM's POST /tokenize
// and /detokenize, and GET /metrics when the server keeps metrics. It only translates: requests
// become engine requests of READY models (chat messages through the model's chat template), and
// engine updates become OpenAI's JSON. Errors go through ErrorResponse (openai_errors.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "http/http_server.h"
#include "server/metrics.h"
#include "server/registry.h"
#include "server/request_limits.h"

namespace kiln {

struct OpenAiServiceOptions {
  // Bearer token /v1/* requires ("Authorization: Bearer <key>"), as vLLM's --api-key; "" = open.
  std::string api_key;
  // Where generations are recorded (protocol="http"); null: nowhere. Must outlive the service.
  ServerMetrics* metrics = nullptr;
  RequestLimits limits;
};

class OpenAiService {
 public:
  OpenAiService(ModelRegistry* registry, OpenAiServiceOptions options);
  OpenAiService(const OpenAiService&) = delete;
  OpenAiService& operator=(const OpenAiService&) = delete;

  // The HttpHandler: routes one request and answers it (now or, for generations, as the engine
  // produces tokens).
  void Handle(HttpRequest request, std::shared_ptr<ResponseStream> response);

  // From now on /health answers 503 and generation requests are refused (Unavailable).
  void StopServing() { serving_.store(false); }

 private:
  absl::Status CheckApiKey(const HttpRequest& request) const;
  void ChatCompletions(const HttpRequest& request, std::shared_ptr<ResponseStream> response);
  void Completions(const HttpRequest& request, std::shared_ptr<ResponseStream> response);
  HttpResponse Models() const;
  HttpResponse Model(const std::string& name) const;
  HttpResponse Health() const;
  void Tokenize(const HttpRequest& request, const std::shared_ptr<ResponseStream>& response) const;
  void Detokenize(const HttpRequest& request,
                  const std::shared_ptr<ResponseStream>& response) const;

  ModelRegistry* const registry_;
  const OpenAiServiceOptions options_;
  std::atomic<bool> serving_{true};
};

}  // namespace kiln
