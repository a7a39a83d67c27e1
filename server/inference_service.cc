#include "server/inference_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "server/handler_util.h"

namespace kiln {
namespace {

// Engine updates of one request. The engine's callback fills it (quickly, on the engine's
// thread); the handler thread drains it. Shared by both, so it outlives whichever side ends
// first.
class UpdateQueue {
 public:
  void Push(GenerationUpdate update) {
    absl::MutexLock lock(&mutex_);
    updates_.push_back(std::move(update));
  }

  // Moves every queued update into `out`, waiting up to `timeout` for the first one.
  void Take(absl::Duration timeout, std::vector<GenerationUpdate>* out) {
    absl::MutexLock lock(&mutex_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return !updates_.empty(); };
    mutex_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    out->swap(updates_);
    updates_.clear();
  }

 private:
  absl::Mutex mutex_;
  std::vector<GenerationUpdate> updates_ ABSL_GUARDED_BY(mutex_);
};

absl::Status RequireModelName(const std::string& model) {
  if (model.empty()) {
    return absl::InvalidArgumentError("model: name the model to use (ListModels lists them)");
  }
  return absl::OkStatus();
}

absl::Status RequireTokenizer(const ModelSnapshot& model, absl::string_view rpc) {
  if (model.tokenizer != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(rpc, " needs a tokenizer, but ", model.no_tokenizer_reason));
}

}  // namespace

grpc::Status InferenceService::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  GenerateRecorder recorder(options_.metrics);
  const grpc::Status status =
      RunHandler("Generate", [&] { return DoGenerate(context, *request, writer, recorder); });
  recorder.OnEnd(status);
  return status;
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* /*context*/,
                                        const v1::TokenizeRequest* request,
                                        v1::TokenizeResponse* response) {
  return RunHandler("Tokenize", [&] { return DoTokenize(*request, response); });
}

grpc::Status InferenceService::Detokenize(grpc::ServerContext* /*context*/,
                                          const v1::DetokenizeRequest* request,
                                          v1::DetokenizeResponse* response) {
  return RunHandler("Detokenize", [&] { return DoDetokenize(*request, response); });
}

absl::Status InferenceService::DoGenerate(grpc::ServerContext* context,
                                          const v1::GenerateRequest& request,
                                          grpc::ServerWriter<v1::GenerateResponse>* writer,
                                          GenerateRecorder& recorder) {
  KILN_RETURN_IF_ERROR(RequireModelName(request.model()));
  // The snapshot keeps the engine alive for this call even if the model is unloaded meanwhile.
  KILN_ASSIGN_OR_RETURN(ModelSnapshot model, registry_->GetReady(request.model()));
  recorder.OnModel(request.model());
  KILN_ASSIGN_OR_RETURN(GenerationRequest generation,
                        ToGenerationRequest(request, model, options_.defaults, options_.limits));
  const int64_t prompt_tokens = static_cast<int64_t>(generation.prompt.size());
  auto queue = std::make_shared<UpdateQueue>();
  KILN_ASSIGN_OR_RETURN(const uint64_t id, model.engine->Submit(std::move(generation),
                                                                [queue](GenerationUpdate update) {
                                                                  queue->Push(std::move(update));
                                                                }));
  recorder.OnSubmitted(prompt_tokens);

  std::vector<GenerationUpdate> updates;
  while (true) {
    updates.clear();
    queue->Take(options_.cancel_poll, &updates);
    for (const GenerationUpdate& update : updates) {
      if (!update.status.ok()) return update.status;
      if (streams_ended_.load(std::memory_order_acquire)) {
        model.engine->Cancel(id);
        return ended_reason();
      }
      v1::GenerateResponse response;
      ToGenerateResponse(update, model.tokenizer.get(), &response);
      const bool last = update.finish != FinishReason::kNone;
      const int64_t tokens = static_cast<int64_t>(update.token_ids.size());
      if (tokens > 0 && options_.token_delay_for_testing > absl::ZeroDuration()) {
        absl::SleepFor(options_.token_delay_for_testing * tokens);
      }
      recorder.OnTokens(tokens);
      if (!writer->Write(response)) {
        if (!last) model.engine->Cancel(id);
        return absl::CancelledError("Generate: the client went away");
      }
      if (last) {
        recorder.OnSpeculative(update.speculative.drafted, update.speculative.accepted);
        recorder.OnFinish(update.finish);
        return absl::OkStatus();
      }
    }
    if (streams_ended_.load(std::memory_order_acquire)) {
      model.engine->Cancel(id);
      return ended_reason();
    }
    if (context->IsCancelled()) {
      // The client cancelled or its deadline passed: stop generating; the engine frees the
      // sequence's KV cache within one step.
      model.engine->Cancel(id);
      VLOG(1) << "Generate on '" << request.model() << "': call cancelled, request " << id
              << " cancelled";
      return absl::CancelledError("Generate: the call was cancelled or its deadline passed");
    }
  }
}

void InferenceService::EndStreams(absl::Status reason) {
  {
    absl::MutexLock lock(&ended_mutex_);
    ended_reason_ = std::move(reason);
  }
  streams_ended_.store(true, std::memory_order_release);
}

absl::Status InferenceService::ended_reason() const {
  absl::MutexLock lock(&ended_mutex_);
  return ended_reason_;
}

absl::Status InferenceService::DoTokenize(const v1::TokenizeRequest& request,
                                          v1::TokenizeResponse* response) {
  KILN_RETURN_IF_ERROR(RequireModelName(request.model()));
  KILN_ASSIGN_OR_RETURN(ModelSnapshot model, registry_->GetReady(request.model()));
  KILN_RETURN_IF_ERROR(RequireTokenizer(model, "Tokenize"));
  absl::StatusOr<std::vector<int32_t>> ids =
      model.tokenizer->Encode(request.text(), request.add_special_tokens());
  if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat("text: ", ids.status().message()));
  for (int32_t id : *ids) {
    response->add_token_ids(id);
    response->add_tokens(model.tokenizer->IdToToken(id).value_or(""));
  }
  return absl::OkStatus();
}

absl::Status InferenceService::DoDetokenize(const v1::DetokenizeRequest& request,
                                            v1::DetokenizeResponse* response) {
  KILN_RETURN_IF_ERROR(RequireModelName(request.model()));
  KILN_ASSIGN_OR_RETURN(ModelSnapshot model, registry_->GetReady(request.model()));
  KILN_RETURN_IF_ERROR(RequireTokenizer(model, "Detokenize"));
  const std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  absl::StatusOr<std::string> text = model.tokenizer->Decode(ids, request.skip_special_tokens());
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token_ids: ", text.status().message()));
  }
  response->set_text(*std::move(text));
  return absl::OkStatus();
}

}  // namespace kiln
