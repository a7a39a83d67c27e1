#include "server/generate_convert.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

v1::FinishReason ToProtoFinish(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::LENGTH;
    case FinishReason::kStop:
      return v1::STOP;
    case FinishReason::kEos:
      return v1::EOS;
    case FinishReason::kCancelled:
      return v1::CANCELLED;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

std::string TokenText(const Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return "";
  absl::StatusOr<std::string> text = tokenizer->Decode({&id, 1}, /*skip_special_tokens=*/false);
  return text.ok() ? *std::move(text) : "";
}

void FillLogprob(const Tokenizer* tokenizer, int32_t id, float logprob, v1::TokenLogprob* out) {
  out->set_token_id(id);
  out->set_logprob(logprob);
  out->set_text(TokenText(tokenizer, id));
}

}  // namespace

absl::StatusOr<GenerationRequest> ToGenerationRequest(const v1::GenerateRequest& request,
                                                      const ModelSnapshot& model,
                                                      const GenerateDefaults& defaults,
                                                      const RequestLimits& limits) {
  if (model.model == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", request.model(), "' is not ready to generate"));
  }
  GenerationRequest out;
  switch (request.prompt_input_case()) {
    case v1::GenerateRequest::kPrompt: {
      if (model.tokenizer == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("prompt: text prompts need a tokenizer, but ", model.no_tokenizer_reason,
                         "; send prompt_token_ids instead"));
      }
      absl::StatusOr<std::vector<int32_t>> ids =
          model.tokenizer->Encode(request.prompt(), request.add_special_tokens());
      if (!ids.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
      }
      if (ids->empty()) return absl::InvalidArgumentError("prompt: the text encodes to no tokens");
      out.prompt = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::kPromptTokenIds:
      if (request.prompt_token_ids().ids().empty()) {
        return absl::InvalidArgumentError("prompt_token_ids: the list of ids is empty");
      }
      out.prompt.assign(request.prompt_token_ids().ids().begin(),
                        request.prompt_token_ids().ids().end());
      break;
    case v1::GenerateRequest::PROMPT_INPUT_NOT_SET:
      return absl::InvalidArgumentError(
          "prompt: set exactly one of prompt (text) or prompt_token_ids");
  }

  const v1::SamplingParams& sampling = request.sampling();
  out.sampling.temperature = sampling.temperature();
  out.sampling.top_k = sampling.top_k();
  out.sampling.top_p = sampling.has_top_p() ? sampling.top_p() : 1.0f;
  out.sampling.min_p = sampling.min_p();
  out.sampling.repetition_penalty =
      sampling.has_repetition_penalty() ? sampling.repetition_penalty() : 1.0f;
  out.sampling.presence_penalty = sampling.presence_penalty();
  out.sampling.frequency_penalty = sampling.frequency_penalty();
  if (sampling.has_seed()) out.sampling.seed = sampling.seed();

  const v1::StoppingCriteria& stopping = request.stopping();
  if (stopping.max_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("stopping.max_tokens must not be negative (got ",
                                                   stopping.max_tokens(), "; 0 = the default)"));
  }
  // As vLLM: an explicit max_tokens must fit in the context; the default takes what is left.
  const int64_t prompt_size = static_cast<int64_t>(out.prompt.size());
  const int64_t room = model.max_context - prompt_size;
  if (room < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt: this model's maximum context length is ", model.max_context,
                     " tokens, but the prompt has ", prompt_size, " tokens"));
  }
  if (stopping.max_tokens() > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stopping.max_tokens: this model's maximum context length is ", model.max_context,
        " tokens, but the request asks for ", prompt_size + stopping.max_tokens(), " (",
        prompt_size, " in the prompt, ", stopping.max_tokens(), " to generate)"));
  }
  out.stopping.max_tokens = stopping.max_tokens() == 0
                                ? static_cast<int32_t>(std::min<int64_t>(defaults.max_tokens, room))
                                : stopping.max_tokens();
  out.stopping.stop.assign(stopping.stop().begin(), stopping.stop().end());
  KILN_RETURN_IF_ERROR(CheckStopStrings(out.stopping.stop, "stopping.stop", limits));
  const int64_t vocab = model.model->config().vocab_size;
  for (int32_t id : stopping.stop_token_ids()) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stopping.stop_token_ids: ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  out.stopping.stop_token_ids.assign(stopping.stop_token_ids().begin(),
                                     stopping.stop_token_ids().end());
  out.stopping.ignore_eos = stopping.ignore_eos();
  KILN_RETURN_IF_ERROR(CheckLogprobs(request.logprobs(), "logprobs", limits));
  out.logprobs = request.logprobs();

  // Unset `speculative`: the server's default (for models with MTP heads); 0: off.
  if (request.has_speculative()) {
    const int32_t drafts = request.speculative().num_draft_tokens();
    if (drafts < 0 || drafts > kMaxDraftTokens) {
      return absl::InvalidArgumentError(absl::StrCat("speculative.num_draft_tokens must be in [0, ",
                                                     kMaxDraftTokens, "], got ", drafts));
    }
    const PreparedModel& prepared = *model.model;
    if (drafts > 0 && prepared.num_mtp_heads() == 0) {
      const int64_t advertised = prepared.config().num_mtp_layers;
      return absl::InvalidArgumentError(absl::StrCat(
          "speculative.num_draft_tokens: model '", request.model(),
          "' has no MTP heads to draft with",
          advertised > 0 ? absl::StrCat(" (its config advertises ", advertised,
                                        " MTP layers but the checkpoint lacks them; see the "
                                        "load report's warnings)")
                         : ""));
    }
    out.num_draft_tokens = drafts;
  }
  return out;
}

void ToGenerateResponse(const GenerationUpdate& update, const Tokenizer* tokenizer,
                        v1::GenerateResponse* response) {
  response->mutable_token_ids()->Add(update.token_ids.begin(), update.token_ids.end());
  response->set_text(update.text);
  for (const SampledToken& sampled : update.logprobs) {
    v1::TokenLogprobs* logprobs = response->add_logprobs();
    FillLogprob(tokenizer, sampled.token_id, sampled.logprob, logprobs->mutable_chosen());
    for (const TokenLogprob& top : sampled.top) {
      FillLogprob(tokenizer, top.token_id, top.logprob, logprobs->add_top());
    }
  }
  if (update.finish == FinishReason::kNone) return;
  response->set_finish_reason(ToProtoFinish(update.finish));
  response->mutable_usage()->set_prompt_tokens(update.prompt_tokens);
  response->mutable_usage()->set_completion_tokens(update.completion_tokens);
  response->mutable_usage()->set_cached_prompt_tokens(update.cached_prompt_tokens);
  response->mutable_timings()->set_time_to_first_token_seconds(update.time_to_first_token_seconds);
  response->mutable_timings()->set_total_seconds(update.total_seconds);
  response->mutable_speculative_stats()->set_drafted(update.speculative.drafted);
  response->mutable_speculative_stats()->set_accepted(update.speculative.accepted);
}

}  // namespace kiln
