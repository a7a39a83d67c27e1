#include "server/openai_service.h"

#include <ctime>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "server/auth.h"
#include "server/handler_util.h"
#include "server/openai_errors.h"
#include "server/openai_format.h"
#include "server/openai_generation.h"
#include "server/openai_request.h"

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0"
#endif

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

HttpResponse JsonResponse(const Json& body, int status = 200) {
  HttpResponse response;
  response.status = status;
  response.body = DumpJson(body);
  return response;
}

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// No Content-Type (as curl --data-binary sends with -H "Content-Type:") or a JSON one
// (application/json, application/*+json), parameters aside.
bool JsonContentType(const HttpRequest& request) {
  absl::string_view type = request.Header("content-type");
  type = absl::StripAsciiWhitespace(type.substr(0, type.find(';')));
  if (type.empty()) return true;
  const std::string lower = absl::AsciiStrToLower(type);
  return lower == "application/json" ||
         (absl::StartsWith(lower, "application/") && absl::EndsWith(lower, "+json"));
}

// A READY model, or: NotFound (unknown), Unavailable (loading, unloading, failed).
absl::StatusOr<ModelSnapshot> ReadyModel(const ModelRegistry& registry, const std::string& name) {
  absl::StatusOr<ModelSnapshot> model = registry.GetReady(name);
  if (!model.ok() && model.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::UnavailableError(model.status().message());
  }
  return model;
}

absl::Status RequireTokenizer(const ModelSnapshot& model, absl::string_view what) {
  if (model.tokenizer != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("model: '", model.spec.name, "' cannot serve ",
                                                    what, ": ", model.no_tokenizer_reason));
}

// The chat template the request renders with: "tool_use" when tools are given and the model
// names one (as transformers picks it), else the default.
absl::StatusOr<const ChatTemplate*> FindTemplate(const ModelSnapshot& model, bool tools) {
  const ChatTemplateSet* set = model.chat_templates.get();
  if (set == nullptr || set->templates.empty()) {
    std::string why;
    if (set != nullptr && !set->errors.empty()) why = absl::StrCat(" (", set->errors.front(), ")");
    return absl::FailedPreconditionError(absl::StrCat(
        "messages: model '", model.spec.name, "' has no chat template", why,
        "; use /v1/completions, or load the model with one (--chat-template, the config's "
        "chat_template_file, LoadModel's chat_template)"));
  }
  if (tools && set->templates.count("tool_use") > 0) return &set->templates.at("tool_use");
  return set->Find("");
}

std::string TokenString(const Tokenizer& tokenizer, std::optional<int32_t> id) {
  if (!id.has_value()) return "";
  return tokenizer.IdToToken(*id).value_or("");
}

// Messages → prompt text → ids, as transformers' apply_chat_template(tokenize=True) and vLLM.
absl::StatusOr<std::vector<int32_t>> ChatPrompt(const ChatCompletionRequest& chat,
                                                const ModelSnapshot& model) {
  KILN_RETURN_IF_ERROR(RequireTokenizer(model, "chat requests"));
  KILN_ASSIGN_OR_RETURN(const ChatTemplate* chat_template,
                        FindTemplate(model, !chat.tools.is_null()));
  // Template kwargs first, so that the request's own fields win over them.
  Json context = chat.chat_template_kwargs;
  const Tokenizer& tokenizer = *model.tokenizer;
  if (!context.contains("bos_token")) {
    context["bos_token"] = TokenString(tokenizer, tokenizer.special_tokens().bos);
  }
  if (!context.contains("eos_token")) {
    context["eos_token"] = TokenString(tokenizer, tokenizer.special_tokens().eos);
  }
  context["messages"] = chat.messages;
  if (!chat.tools.is_null()) context["tools"] = chat.tools;
  context["add_generation_prompt"] = chat.add_generation_prompt;
  absl::StatusOr<std::string> text = chat_template->Render(context);
  if (!text.ok()) {
    // raise_exception(...) is the template refusing these messages; a limit hit is the
    // messages being too much for it: both are the request's to fix.
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the chat template: ", text.status().message()));
  }
  if (chat.continue_final_message) {
    // As transformers: the prompt ends where the final message's content does.
    const Json& content = chat.messages.back()["content"];
    const std::string final_content = content.is_string() ? content.get<std::string>() : "";
    const size_t at = final_content.empty() ? std::string::npos : text->rfind(final_content);
    if (at == std::string::npos) {
      return absl::InvalidArgumentError(
          "continue_final_message: the final message's content is not in the rendered prompt");
    }
    text->resize(at + final_content.size());
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(*text, chat.add_special_tokens);
  if (!ids.ok()) return KilnAnnotate(ids.status(), "messages");
  if (ids->empty()) return absl::InvalidArgumentError("messages: the prompt encodes to no tokens");
  return ids;
}

absl::StatusOr<std::vector<int32_t>> CompletionPromptIds(const CompletionPrompt& prompt,
                                                         size_t index, bool add_special_tokens,
                                                         const ModelSnapshot& model) {
  const std::string field = absl::StrCat("prompt[", index, "]");
  if (const auto* ids = std::get_if<std::vector<int32_t>>(&prompt)) {
    if (ids->empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": no token ids"));
    return *ids;
  }
  KILN_RETURN_IF_ERROR(RequireTokenizer(model, "text prompts (send token ids)"));
  absl::StatusOr<std::vector<int32_t>> ids =
      model.tokenizer->Encode(std::get<std::string>(prompt), add_special_tokens);
  if (!ids.ok()) return KilnAnnotate(ids.status(), field);
  if (ids->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the text encodes to no tokens"));
  }
  return ids;
}

// One choice's engine request. Unset max_tokens: the rest of the context (vLLM's rule); a
// request that cannot fit is refused as vLLM refuses it.
absl::StatusOr<GenerationRequest> EngineRequest(OpenAiApi api, const OpenAiSampling& sampling,
                                                std::vector<int32_t> prompt,
                                                const ModelSnapshot& model, int64_t choice) {
  const int64_t context = model.max_context;
  const int64_t prompt_size = static_cast<int64_t>(prompt.size());
  if (prompt_size >= context) {
    return absl::InvalidArgumentError(absl::StrCat(api == OpenAiApi::kChat ? "messages" : "prompt",
                                                   ": this model's maximum context length is ",
                                                   context, " tokens, but the prompt has ",
                                                   prompt_size, " tokens"));
  }
  if (sampling.max_tokens.has_value() && prompt_size + *sampling.max_tokens > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: this model's maximum context length is ", context,
                     " tokens, but the request asks for ", prompt_size + *sampling.max_tokens, " (",
                     prompt_size, " in the prompt, ", *sampling.max_tokens, " in the completion)"));
  }
  const int64_t vocab = model.model->config().vocab_size;
  for (int32_t id : prompt) {
    if (id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (int32_t id : sampling.stop_token_ids) {
    if (id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids: ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  GenerationRequest request;
  request.prompt = std::move(prompt);
  request.sampling = sampling.sampling;
  // n > 1 with a seed: each choice its own stream of draws, all reproducible.
  if (request.sampling.seed.has_value() && choice > 0) {
    *request.sampling.seed += static_cast<uint64_t>(choice) * 0x9e3779b97f4a7c15ull;
  }
  request.stopping.max_tokens =
      static_cast<int32_t>(sampling.max_tokens.value_or(context - prompt_size));
  request.stopping.stop = sampling.stop;
  request.stopping.stop_token_ids = sampling.stop_token_ids;
  request.stopping.ignore_eos = sampling.ignore_eos;
  // The chosen token's log-probability comes with any top-n request; 0 alternatives shown.
  if (sampling.logprobs) request.logprobs = std::max(1, sampling.top_logprobs);
  return request;
}

absl::StatusOr<OpenAiGeneration> MakeGeneration(OpenAiApi api, const OpenAiSampling& sampling,
                                                std::vector<std::vector<int32_t>> prompts,
                                                const ModelSnapshot& model) {
  if (!sampling.stop.empty()) {
    KILN_RETURN_IF_ERROR(RequireTokenizer(model, "stop strings (use stop_token_ids)"));
  }
  OpenAiGeneration generation;
  generation.envelope = {api, NewResponseId(api), UnixNow(), model.spec.name};
  generation.stream = sampling.stream;
  generation.include_usage = sampling.include_usage;
  generation.logprobs = {sampling.logprobs, sampling.top_logprobs};
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int32_t j = 0; j < sampling.n; ++j) {
      const int64_t choice = static_cast<int64_t>(generation.choices.size());
      KILN_ASSIGN_OR_RETURN(GenerationRequest request,
                            EngineRequest(api, sampling, prompts[p], model, choice));
      generation.choices.push_back(std::move(request));
      generation.prompt_of_choice.push_back(static_cast<int>(p));
    }
  }
  return generation;
}

// Errors of a handler that has not answered become its error response.
template <typename Body>
void Answer(const char* what, const std::shared_ptr<ResponseStream>& response, Body&& body) {
  const absl::Status status = RunCatching(what, std::forward<Body>(body));
  if (!status.ok()) response->Respond(ErrorResponse(status));
}

}  // namespace

OpenAiService::OpenAiService(ModelRegistry* registry, OpenAiServiceOptions options)
    : registry_(registry), options_(std::move(options)) {}

absl::Status OpenAiService::CheckApiKey(const HttpRequest& request) const {
  if (options_.api_key.empty()) return absl::OkStatus();
  const absl::string_view header = request.Header("authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  if (header.empty()) {
    return absl::UnauthenticatedError(
        "no API key: send it as 'Authorization: Bearer <key>' (the server's --api-key)");
  }
  if (!absl::StartsWith(header, kBearer) ||
      !ConstantTimeEquals(header.substr(kBearer.size()), options_.api_key)) {
    return absl::UnauthenticatedError("the API key is not the server's --api-key");
  }
  return absl::OkStatus();
}

void OpenAiService::Handle(HttpRequest request, std::shared_ptr<ResponseStream> response) {
  const std::string& path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  auto route = [&](bool method_ok) {
    if (method_ok) return true;
    HttpResponse refused =
        ErrorResponse(absl::InvalidArgumentError(
                          absl::StrCat("method: ", request.method, " is not allowed on ", path)),
                      405);
    refused.headers.emplace_back("Allow", get ? "POST" : "GET");
    response->Respond(std::move(refused));
    return false;
  };
  if (path == "/health") {
    if (route(get)) response->Respond(Health());
    return;
  }
  if (path == "/version") {
    if (route(get)) response->Respond(JsonResponse(Json{{"version", KILN_VERSION}}));
    return;
  }
  if (path == "/metrics" && options_.metrics != nullptr) {
    if (!route(get)) return;
    HttpResponse metrics;
    metrics.content_type = "text/plain; version=0.0.4; charset=utf-8";
    metrics.body = options_.metrics->Render();
    response->Respond(std::move(metrics));
    return;
  }
  // vLLM guards /v1/* with its API key (and leaves /health, /tokenize and the rest open).
  if (absl::StartsWith(path, "/v1/")) {
    if (absl::Status status = CheckApiKey(request); !status.ok()) {
      HttpResponse refused = ErrorResponse(status);
      refused.headers.emplace_back("WWW-Authenticate", "Bearer");
      response->Respond(std::move(refused));
      return;
    }
  }
  // A JSON body must say so: a web page can send text/plain or a form to a local server
  // without asking first (FastAPI, and so vLLM, refuse such bodies too).
  if (post && !JsonContentType(request)) {
    response->Respond(ErrorResponse(
        absl::InvalidArgumentError(absl::StrCat("Content-Type: expected application/json, got ",
                                                request.Header("content-type"))),
        415));
    return;
  }
  if (path == "/v1/chat/completions") {
    if (route(post)) ChatCompletions(request, std::move(response));
    return;
  }
  if (path == "/v1/completions") {
    if (route(post)) Completions(request, std::move(response));
    return;
  }
  if (path == "/v1/models") {
    if (route(get)) response->Respond(Models());
    return;
  }
  if (absl::StartsWith(path, "/v1/models/")) {
    if (route(get)) response->Respond(Model(path.substr(absl::string_view("/v1/models/").size())));
    return;
  }
  if (path == "/tokenize") {
    if (route(post)) Tokenize(request, response);
    return;
  }
  if (path == "/detokenize") {
    if (route(post)) Detokenize(request, response);
    return;
  }
  response->Respond(ErrorResponse(absl::NotFoundError(
      absl::StrCat("path: ", path,
                   " is not served here (POST /v1/chat/completions, /v1/completions, /tokenize, "
                   "/detokenize; GET /v1/models, /health, /version)"))));
}

void OpenAiService::ChatCompletions(const HttpRequest& request,
                                    std::shared_ptr<ResponseStream> response) {
  Answer("chat completion", response, [&]() -> absl::Status {
    if (!serving_.load()) return absl::UnavailableError("the server is shutting down");
    KILN_ASSIGN_OR_RETURN(ChatCompletionRequest chat,
                          ParseChatCompletionRequest(request.body, options_.limits));
    KILN_ASSIGN_OR_RETURN(ModelSnapshot model, ReadyModel(*registry_, chat.common.model));
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ChatPrompt(chat, model));
    std::vector<std::vector<int32_t>> prompts;
    prompts.push_back(std::move(prompt));
    KILN_ASSIGN_OR_RETURN(OpenAiGeneration generation,
                          MakeGeneration(OpenAiApi::kChat, chat.common, std::move(prompts), model));
    RunOpenAiGeneration(std::move(model), std::move(generation), response, options_.metrics);
    return absl::OkStatus();
  });
}

void OpenAiService::Completions(const HttpRequest& request,
                                std::shared_ptr<ResponseStream> response) {
  Answer("completion", response, [&]() -> absl::Status {
    if (!serving_.load()) return absl::UnavailableError("the server is shutting down");
    KILN_ASSIGN_OR_RETURN(CompletionRequest completion,
                          ParseCompletionRequest(request.body, options_.limits));
    KILN_ASSIGN_OR_RETURN(ModelSnapshot model, ReadyModel(*registry_, completion.common.model));
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < completion.prompts.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(
          std::vector<int32_t> ids,
          CompletionPromptIds(completion.prompts[i], i, completion.add_special_tokens, model));
      prompts.push_back(std::move(ids));
    }
    KILN_ASSIGN_OR_RETURN(
        OpenAiGeneration generation,
        MakeGeneration(OpenAiApi::kCompletion, completion.common, std::move(prompts), model));
    RunOpenAiGeneration(std::move(model), std::move(generation), response, options_.metrics);
    return absl::OkStatus();
  });
}

HttpResponse OpenAiService::Health() const {
  if (!serving_.load()) {
    return ErrorResponse(absl::UnavailableError("the server is shutting down"));
  }
  for (const ModelSnapshot& model : registry_->List()) {
    if (model.state == ModelState::kReady) return JsonResponse(Json{{"status", "ok"}});
  }
  return ErrorResponse(absl::UnavailableError("no model is READY"));
}

namespace {

Json ModelJson(const ModelSnapshot& model) {
  return Json{{"id", model.spec.name},
              {"object", "model"},
              {"created", UnixNow()},
              {"owned_by", "kiln"},
              {"root", model.resolved_path},
              {"parent", nullptr},
              {"max_model_len", model.max_context}};
}

}  // namespace

HttpResponse OpenAiService::Models() const {
  Json data = Json::array();
  for (const ModelSnapshot& model : registry_->List()) {
    if (model.state == ModelState::kReady) data.push_back(ModelJson(model));
  }
  return JsonResponse(Json{{"object", "list"}, {"data", std::move(data)}});
}

HttpResponse OpenAiService::Model(const std::string& name) const {
  absl::StatusOr<ModelSnapshot> model = ReadyModel(*registry_, name);
  if (!model.ok()) return ErrorResponse(model.status());
  return JsonResponse(ModelJson(*model));
}

void OpenAiService::Tokenize(const HttpRequest& request,
                             const std::shared_ptr<ResponseStream>& response) const {
  Answer("tokenize", response, [&]() -> absl::Status {
    KILN_ASSIGN_OR_RETURN(TokenizeRequest tokenize,
                          ParseTokenizeRequest(request.body, options_.limits));
    KILN_ASSIGN_OR_RETURN(ModelSnapshot model, ReadyModel(*registry_, tokenize.model));
    KILN_RETURN_IF_ERROR(RequireTokenizer(model, "/tokenize"));
    std::vector<int32_t> ids;
    if (tokenize.chat.has_value()) {
      KILN_ASSIGN_OR_RETURN(ids, ChatPrompt(*tokenize.chat, model));
    } else {
      absl::StatusOr<std::vector<int32_t>> encoded =
          model.tokenizer->Encode(*tokenize.prompt, tokenize.add_special_tokens);
      if (!encoded.ok()) return KilnAnnotate(encoded.status(), "prompt");
      ids = *std::move(encoded);
    }
    Json body = {{"count", ids.size()}, {"max_model_len", model.max_context}, {"tokens", ids}};
    body["token_strs"] = nullptr;
    if (tokenize.return_token_strs) {
      Json strs = Json::array();
      for (int32_t id : ids) strs.push_back(model.tokenizer->IdToToken(id).value_or(""));
      body["token_strs"] = std::move(strs);
    }
    response->Respond(JsonResponse(body));
    return absl::OkStatus();
  });
}

void OpenAiService::Detokenize(const HttpRequest& request,
                               const std::shared_ptr<ResponseStream>& response) const {
  Answer("detokenize", response, [&]() -> absl::Status {
    KILN_ASSIGN_OR_RETURN(DetokenizeRequest detokenize, ParseDetokenizeRequest(request.body));
    KILN_ASSIGN_OR_RETURN(ModelSnapshot model, ReadyModel(*registry_, detokenize.model));
    KILN_RETURN_IF_ERROR(RequireTokenizer(model, "/detokenize"));
    absl::StatusOr<std::string> text = model.tokenizer->Decode(detokenize.tokens);
    if (!text.ok()) return KilnAnnotate(text.status(), "tokens");
    response->Respond(JsonResponse(Json{{"prompt", *std::move(text)}}));
    return absl::OkStatus();
  });
}

}  // namespace kiln
