#include "server/openai_generation.h"

#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "server/openai_errors.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(ModelSnapshot model, OpenAiGeneration generation, std::shared_ptr<ResponseStream> response,
      ServerMetrics* metrics)
      : model_(std::move(model)),
        generation_(std::move(generation)),
        response_(std::move(response)),
        choices_(generation_.choices.size()) {
    for (Choice& choice : choices_) {
      choice.recorder = std::make_unique<GenerateRecorder>(metrics, "http");
      choice.recorder->OnModel(model_.spec.name);
    }
  }

  void Start();

 private:
  struct Choice {
    uint64_t engine_id = 0;
    bool submitted = false;
    bool done = false;
    std::string text;  // whole responses: everything generated
    std::vector<SampledToken> logprobs;
    int64_t text_offset = 0;  // streams: text sent so far (completions' logprobs offsets)
    FinishReason finish = FinishReason::kNone;
    int64_t prompt_tokens = 0;
    int64_t cached_prompt_tokens = 0;
    int64_t completion_tokens = 0;
    std::unique_ptr<GenerateRecorder> recorder;
  };

  void OnUpdate(size_t index, GenerationUpdate update);
  void OnClientGone();
  // Ends the answer with `status` (an error response, or an error event in a stream); returns
  // the engine ids of the choices still generating, to be cancelled once the lock is released.
  std::vector<uint64_t> Fail(const absl::Status& status);
  OpenAiUsage Usage() const;
  void Cancel(const std::vector<uint64_t>& ids) {
    for (uint64_t id : ids) model_.engine->Cancel(id);
  }

  const ModelSnapshot model_;
  OpenAiGeneration generation_;
  const std::shared_ptr<ResponseStream> response_;

  std::mutex mutex_;
  std::vector<Choice> choices_;  // guarded by mutex_
  size_t remaining_ = 0;         // choices not done
  bool answered_ = false;        // the answer is complete (or failed): later updates are dropped
  bool streaming_ = false;       // the stream's headers went out
  bool client_gone_ = false;
};

void Job::Start() {
  std::vector<uint64_t> to_cancel;
  {
    // Held across Submit so that no update is handled before every choice is in: the engine's
    // callback waits here at most for this loop (Submit itself never waits on the engine loop).
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& choice = choices_[i];
      choice.prompt_tokens = static_cast<int64_t>(generation_.choices[i].prompt.size());
      absl::StatusOr<uint64_t> id =
          model_.engine->Submit(std::move(generation_.choices[i]),
                                [self = shared_from_this(), i](GenerationUpdate update) {
                                  self->OnUpdate(i, std::move(update));
                                });
      if (!id.ok()) {
        absl::Status status = id.status();
        // Submit refuses only after the engine began to shut down.
        if (status.code() == absl::StatusCode::kFailedPrecondition) {
          status = absl::UnavailableError(status.message());
        }
        choice.done = true;
        choice.recorder->OnEnd(status);
        to_cancel = Fail(status);
        break;
      }
      choice.engine_id = *id;
      choice.submitted = true;
      choice.recorder->OnSubmitted(choice.prompt_tokens);
      ++remaining_;
    }
    if (!answered_ && generation_.stream) {
      streaming_ = true;
      response_->StartStream(200, "text/event-stream");
      if (generation_.envelope.api == OpenAiApi::kChat) {
        // Every choice opens with the assistant's role, as OpenAI's streams do.
        std::string opening;
        for (size_t i = 0; i < choices_.size(); ++i) {
          opening += SseEvent(ChoiceChunk(generation_.envelope, static_cast<int64_t>(i), "",
                                          /*first=*/true, nullptr, FinishReason::kNone,
                                          generation_.include_usage));
        }
        response_->Write(std::move(opening));
      }
    }
  }
  Cancel(to_cancel);
  // Outside the lock: the callback runs at once when the client is already gone.
  response_->OnDisconnect([weak = weak_from_this()] {
    if (std::shared_ptr<Job> self = weak.lock()) self->OnClientGone();
  });
}

void Job::OnUpdate(size_t index, GenerationUpdate update) {
  std::vector<uint64_t> to_cancel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Choice& choice = choices_[index];
    if (choice.done) return;
    const bool last = update.finish != FinishReason::kNone || !update.status.ok();
    choice.recorder->OnTokens(static_cast<int64_t>(update.token_ids.size()));
    if (last) {
      choice.done = true;
      --remaining_;
      choice.recorder->OnSpeculative(update.speculative.drafted, update.speculative.accepted);
      choice.recorder->OnFinish(update.finish);
      absl::Status end = update.status;
      if (end.ok() && update.finish == FinishReason::kCancelled) {
        end = client_gone_ ? absl::CancelledError("the client went away")
                           : absl::UnavailableError(
                                 "the request was cancelled: the model was unloaded or the server "
                                 "is shutting down");
      }
      choice.recorder->OnEnd(end);
      if (!end.ok()) {
        if (!answered_ && !client_gone_) to_cancel = Fail(end);
      }
    }
    // Once an error was answered, or nobody listens, there is nothing more to say.
    if (!answered_ && !client_gone_) {
      if (last) {
        choice.finish = update.finish;
        choice.cached_prompt_tokens = update.cached_prompt_tokens;
        choice.completion_tokens = update.completion_tokens;
      }
      std::string out;
      if (generation_.stream) {
        if (!update.text.empty() || !update.logprobs.empty() || last) {
          Json logprobs =
              update.logprobs.empty()
                  ? Json(nullptr)
                  : LogprobsJson(generation_.envelope.api, update.logprobs, generation_.logprobs,
                                 model_.tokenizer.get(), choice.text_offset);
          out = SseEvent(ChoiceChunk(generation_.envelope, static_cast<int64_t>(index), update.text,
                                     /*first=*/false, std::move(logprobs), update.finish,
                                     generation_.include_usage));
        }
        choice.text_offset += static_cast<int64_t>(update.text.size());
      } else {
        choice.text += update.text;
        for (SampledToken& sampled : update.logprobs) choice.logprobs.push_back(std::move(sampled));
      }
      if (remaining_ == 0) {
        answered_ = true;
        if (generation_.stream) {
          if (generation_.include_usage) out += SseEvent(UsageChunk(generation_.envelope, Usage()));
          out += kSseDone;
          response_->Write(std::move(out));
          response_->End();
        } else {
          std::vector<OpenAiChoice> finished(choices_.size());
          for (size_t i = 0; i < choices_.size(); ++i) {
            finished[i].text = std::move(choices_[i].text);
            finished[i].logprobs = std::move(choices_[i].logprobs);
            finished[i].finish = choices_[i].finish;
          }
          HttpResponse response;
          response.body = CompletionResponseJson(generation_.envelope, finished, Usage(),
                                                 generation_.logprobs, model_.tokenizer.get());
          response_->Respond(std::move(response));
        }
      } else if (!out.empty()) {
        response_->Write(std::move(out));
      }
    }
  }
  Cancel(to_cancel);
}

void Job::OnClientGone() {
  std::vector<uint64_t> to_cancel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    client_gone_ = true;
    for (const Choice& choice : choices_) {
      if (choice.submitted && !choice.done) to_cancel.push_back(choice.engine_id);
    }
  }
  if (!to_cancel.empty()) {
    VLOG(1) << "HTTP client of " << generation_.envelope.id << " went away: cancelling "
            << to_cancel.size() << " choice(s)";
  }
  Cancel(to_cancel);
}

std::vector<uint64_t> Job::Fail(const absl::Status& status) {
  answered_ = true;
  if (streaming_) {
    // vLLM's form: the error object as an event, then the end of the stream.
    response_->Write(absl::StrCat("data: ", OpenAiErrorJson(status), "\n\n", kSseDone));
    response_->End();
  } else {
    response_->Respond(ErrorResponse(status));
  }
  std::vector<uint64_t> ids;
  for (const Choice& choice : choices_) {
    if (choice.submitted && !choice.done) ids.push_back(choice.engine_id);
  }
  return ids;
}

OpenAiUsage Job::Usage() const {
  // Each prompt counts once, however many choices continue it (as OpenAI counts n > 1).
  OpenAiUsage usage;
  int last_prompt = -1;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const int prompt = generation_.prompt_of_choice[i];
    if (prompt != last_prompt) {
      usage.prompt_tokens += choices_[i].prompt_tokens;
      usage.cached_prompt_tokens += choices_[i].cached_prompt_tokens;
      last_prompt = prompt;
    }
    usage.completion_tokens += choices_[i].completion_tokens;
  }
  return usage;
}

}  // namespace

void RunOpenAiGeneration(ModelSnapshot model, OpenAiGeneration generation,
                         std::shared_ptr<ResponseStream> response, ServerMetrics* metrics) {
  auto job =
      std::make_shared<Job>(std::move(model), std::move(generation), std::move(response), metrics);
  job->Start();
}

}  // namespace kiln
