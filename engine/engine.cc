#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "engine/speculative.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that
// may still turn into a stop string is held back.
size_t HeldBackForStops(const std::string& text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& stop : stops) {
    for (size_t k = std::min(stop.size() - 1, text.size()); k > held; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        held = k;
        break;
      }
    }
  }
  return held;
}

}  // namespace

StepCapacity EngineStepCapacity(const EngineOptions& options, bool speculative) {
  constexpr int64_t kMaxRows = 4096;
  constexpr int64_t kMaxLogitsRows = 512;
  const int64_t running = std::max<int32_t>(1, options.max_running);
  // A speculating sequence verifies its last token and up to kMaxDraftTokens drafts.
  const int64_t rows_per_sequence = speculative ? 1 + kMaxDraftTokens : 1;
  StepCapacity capacity;
  capacity.max_sequences = running;
  capacity.max_logits_rows = std::min(kMaxLogitsRows, running * rows_per_sequence);
  capacity.max_rows = std::min(
      kMaxRows, std::max<int64_t>(1, options.max_step_tokens) + running * rows_per_sequence);
  return capacity;
}

struct Engine::Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  UpdateCallback on_update;
  std::optional<KvCache> cache;
  size_t prefilled = 0;  // prompt tokens already in the cache
  std::vector<int32_t> output;
  std::optional<Sampler> sampler;
  std::optional<StreamingDecoder> decoder;
  std::string held_text;  // decoded text not yet sent (a possible stop-string prefix)
  Clock::time_point submitted;
  Clock::time_point first_token;
  bool finished = false;

  // Speculative decoding (num_draft_tokens > 0).
  int32_t num_draft_tokens = 0;
  std::unique_ptr<DraftSession> draft;
  std::vector<int32_t> context;      // prompt + output, as the draft session sees it
  std::vector<int32_t> step_tokens;  // this step's verified chunk: last token, then the drafts
  Draft proposal;                    // this step's drafts
  std::vector<float> hidden;         // target hidden rows not yet handed to the session
  int64_t hidden_first = 0;          // the position of its first row
  SpeculativeStats speculative;

  bool prefill_done() const { return prefilled == request.prompt.size(); }
  bool verifying() const { return !step_tokens.empty(); }
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const PreparedModel> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("engine needs a model");
  if (options.max_running < 1 || options.max_queued < 0 || options.max_step_tokens < 1 ||
      options.max_context < 2) {
    return absl::InvalidArgumentError("engine options must be positive");
  }
  if (options.default_num_draft_tokens < 0 || options.default_num_draft_tokens > kMaxDraftTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_num_draft_tokens must be between 0 and ", kMaxDraftTokens));
  }
  if (options.default_num_draft_tokens > 0 && options.draft_source == nullptr) {
    return absl::InvalidArgumentError("default_num_draft_tokens > 0 needs a draft source");
  }
  auto engine =
      std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), options));
  engine->thread_ = std::thread([raw = engine.get()] { raw->Loop(); });
  return engine;
}

Engine::Engine(std::shared_ptr<const PreparedModel> model,
               std::shared_ptr<const Tokenizer> tokenizer, const EngineOptions& options)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), options_(options) {}

Engine::~Engine() { Shutdown(/*drain=*/false); }

absl::StatusOr<uint64_t> Engine::Submit(GenerationRequest request, UpdateCallback on_update) {
  const ModelConfig& config = model_->config();
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (int32_t token : request.prompt) {
    if (token < 0 || token >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", token, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(request.prompt.size()) >= options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", request.prompt.size(),
                                                   " tokens leaves no room in the context of ",
                                                   options_.max_context, " tokens"));
  }
  if (absl::Status status = ValidateSamplingParams(request.sampling); !status.ok()) return status;
  if (request.stopping.max_tokens < 1) {
    return absl::InvalidArgumentError("stopping.max_tokens must be at least 1");
  }
  for (const std::string& stop : request.stopping.stop) {
    if (stop.empty()) return absl::InvalidArgumentError("stopping.stop holds an empty string");
  }
  if (!request.stopping.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stopping.stop needs a model with a tokenizer");
  }
  if (request.logprobs < 0 || request.logprobs > 20) {
    return absl::InvalidArgumentError("logprobs must be between 0 and 20");
  }
  const int32_t drafts = request.num_draft_tokens.value_or(options_.default_num_draft_tokens);
  if (drafts < 0 || drafts > kMaxDraftTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_draft_tokens must be between 0 and ", kMaxDraftTokens));
  }
  if (drafts > 0 && options_.draft_source == nullptr) {
    return absl::InvalidArgumentError(
        "num_draft_tokens > 0 but this model has no draft source: speculative decoding is not "
        "available");
  }

  auto sequence = std::make_unique<Sequence>();
  sequence->num_draft_tokens = drafts;
  sequence->request = std::move(request);
  sequence->on_update = std::move(on_update);
  sequence->submitted = Clock::now();
  absl::MutexLock lock(&mutex_);
  if (!accepting_) return absl::FailedPreconditionError("the model is shutting down");
  if (static_cast<int32_t>(waiting_.size()) >= options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue of this model is full (",
                                                     options_.max_queued, " waiting requests)"));
  }
  sequence->id = next_id_++;
  const uint64_t seed = sequence->request.sampling.seed.value_or(
      options_.seed ^ (sequence->id * 0x9e3779b97f4a7c15ull));
  sequence->sampler.emplace(sequence->request.sampling, seed, sequence->request.prompt);
  const uint64_t id = sequence->id;
  waiting_.push_back(std::move(sequence));
  stats_.waiting = static_cast<int32_t>(waiting_.size());
  return id;
}

void Engine::Cancel(uint64_t request_id) {
  absl::MutexLock lock(&mutex_);
  cancelled_.push_back(request_id);
}

void Engine::Shutdown(bool drain) {
  {
    absl::MutexLock lock(&mutex_);
    accepting_ = false;
    stop_ = true;
    drain_ = drain_ && drain;
  }
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  EngineStats stats;
  {
    absl::MutexLock lock(&mutex_);
    stats = stats_;
  }
  const KvPool& pool = model_->kv_pool();
  stats.kv_cache_bytes = static_cast<uint64_t>(pool.stats().used_blocks) * pool.block_bytes();
  return stats;
}

void Engine::Finish(Sequence& sequence, FinishReason reason, absl::Status status) {
  GenerationUpdate update;
  if (status.ok() && sequence.decoder.has_value()) {
    sequence.held_text += sequence.decoder->Finish();
    // Text flushed at the end may still complete a stop string.
    for (const std::string& stop : sequence.request.stopping.stop) {
      if (size_t at = sequence.held_text.find(stop); at != std::string::npos) {
        sequence.held_text.resize(at);
        reason = FinishReason::kStop;
      }
    }
    update.text = std::move(sequence.held_text);
  }
  update.finish = status.ok() ? reason : FinishReason::kNone;
  update.status = std::move(status);
  update.prompt_tokens = static_cast<int32_t>(sequence.request.prompt.size());
  update.completion_tokens = static_cast<int32_t>(sequence.output.size());
  const Clock::time_point now = Clock::now();
  if (!sequence.output.empty()) {
    update.time_to_first_token_seconds = SecondsBetween(sequence.submitted, sequence.first_token);
  }
  update.total_seconds = SecondsBetween(sequence.submitted, now);
  update.speculative = sequence.speculative;
  sequence.finished = true;
  sequence.draft.reset();
  if (sequence.cache.has_value()) {
    sequence.cache.reset();  // frees the KV cache now, before the client hears of the end
    absl::MutexLock lock(&mutex_);
    stats_.running--;
  }
  sequence.on_update(std::move(update));
}

void Engine::Admit() {
  std::vector<std::unique_ptr<Sequence>> cancelled_waiting;
  std::vector<uint64_t> cancelled;
  bool cancel_all = false;
  {
    absl::MutexLock lock(&mutex_);
    cancelled.swap(cancelled_);
    cancel_all = stop_ && !drain_;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (cancel_all ||
          std::find(cancelled.begin(), cancelled.end(), (*it)->id) != cancelled.end()) {
        cancelled_waiting.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_running) {
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
    stats_.waiting = static_cast<int32_t>(waiting_.size());
  }
  for (auto& sequence : cancelled_waiting) Finish(*sequence, FinishReason::kCancelled, {});
  for (auto& sequence : running_) {
    if (cancel_all ||
        std::find(cancelled.begin(), cancelled.end(), sequence->id) != cancelled.end()) {
      Finish(*sequence, FinishReason::kCancelled, {});
      continue;
    }
    if (!sequence->cache.has_value()) {
      const int64_t capacity = std::min<int64_t>(
          options_.max_context, static_cast<int64_t>(sequence->request.prompt.size()) +
                                    sequence->request.stopping.max_tokens);
      absl::StatusOr<KvCache> cache = model_->NewCache(capacity);
      if (!cache.ok()) {
        Finish(*sequence, FinishReason::kNone, cache.status());
        continue;
      }
      sequence->cache.emplace(std::move(*cache));
      {
        // Only the counters: callbacks, sessions and allocations run without the lock (Finish
        // takes it too).
        absl::MutexLock lock(&mutex_);
        stats_.running++;
      }
      if (tokenizer_ != nullptr)
        sequence->decoder.emplace(*tokenizer_, /*skip_special_tokens=*/true);
      if (sequence->num_draft_tokens > 0) {
        absl::StatusOr<std::unique_ptr<DraftSession>> session =
            options_.draft_source->StartSession(sequence->request.prompt, capacity);
        if (!session.ok()) {
          Finish(*sequence, FinishReason::kNone, session.status());
          continue;
        }
        sequence->draft = std::move(*session);
        sequence->context = sequence->request.prompt;
      }
    }
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
}

bool Engine::ProposeDrafts(Sequence& sequence) {
  sequence.step_tokens.clear();
  if (sequence.draft == nullptr || !sequence.prefill_done() || sequence.output.empty()) {
    return true;
  }
  // Drafts past max_tokens or past the cache would be wasted: k + 1 new positions must fit
  // after the cache's prompt + output − 1.
  const int64_t produced = static_cast<int64_t>(sequence.output.size());
  const int64_t k = std::min<int64_t>(
      {sequence.num_draft_tokens, sequence.request.stopping.max_tokens - produced - 1,
       sequence.cache->capacity() - static_cast<int64_t>(sequence.request.prompt.size()) -
           produced});
  if (k <= 0) return true;
  const HiddenStates hidden{sequence.hidden_first, model_->config().hidden_size, sequence.hidden};
  absl::StatusOr<Draft> proposal =
      sequence.draft->Propose(static_cast<int32_t>(k), sequence.context, hidden);
  absl::Status status = proposal.status();
  if (status.ok()) {
    status = ValidateDraft(*proposal, static_cast<int32_t>(k), model_->config().vocab_size);
    if (!status.ok()) {
      status = absl::InternalError(absl::StrCat("draft source: ", status.message()));
    }
  }
  if (!status.ok()) {
    LOG(ERROR) << "draft proposal failed: " << status;
    Finish(sequence, FinishReason::kNone, status);
    return false;
  }
  sequence.hidden_first += hidden.rows();
  sequence.hidden.clear();
  sequence.proposal = std::move(*proposal);
  if (sequence.proposal.tokens.empty()) return true;
  sequence.step_tokens.push_back(sequence.output.back());
  sequence.step_tokens.insert(sequence.step_tokens.end(), sequence.proposal.tokens.begin(),
                              sequence.proposal.tokens.end());
  return true;
}

FinishReason Engine::Emit(Sequence& sequence, SampledToken sampled, GenerationUpdate& update) {
  const StoppingParams& stopping = sequence.request.stopping;
  const int32_t token = sampled.token_id;
  if (sequence.output.empty()) sequence.first_token = Clock::now();
  sequence.output.push_back(token);
  if (sequence.draft != nullptr) sequence.context.push_back(token);
  update.token_ids.push_back(token);
  if (sequence.request.logprobs > 0) update.logprobs.push_back(std::move(sampled));

  if (sequence.decoder.has_value()) {
    absl::StatusOr<std::string> text = sequence.decoder->Push(token);
    if (text.ok()) sequence.held_text += *text;
    const std::vector<std::string>& stops = stopping.stop;
    size_t stop_at = std::string::npos;
    for (const std::string& stop : stops) {
      stop_at = std::min(stop_at, sequence.held_text.find(stop));
    }
    if (stop_at != std::string::npos) {
      update.text += sequence.held_text.substr(0, stop_at);
      sequence.held_text.clear();
      sequence.decoder.reset();  // nothing after a stop string is sent
      return FinishReason::kStop;
    }
    const size_t keep = HeldBackForStops(sequence.held_text, stops);
    update.text += sequence.held_text.substr(0, sequence.held_text.size() - keep);
    sequence.held_text.erase(0, sequence.held_text.size() - keep);
  }
  const std::vector<int32_t>& model_eos = model_->config().eos_token_ids;
  const bool is_eos =
      (tokenizer_ != nullptr && std::find(tokenizer_->special_tokens().eos_ids.begin(),
                                          tokenizer_->special_tokens().eos_ids.end(),
                                          token) != tokenizer_->special_tokens().eos_ids.end()) ||
      std::find(model_eos.begin(), model_eos.end(), token) != model_eos.end();
  if (!stopping.ignore_eos && is_eos) return FinishReason::kEos;
  if (std::find(stopping.stop_token_ids.begin(), stopping.stop_token_ids.end(), token) !=
      stopping.stop_token_ids.end()) {
    return FinishReason::kStop;
  }
  // The cache holds prompt + output − 1 positions; the next step needs one more.
  if (static_cast<int32_t>(sequence.output.size()) >= stopping.max_tokens ||
      static_cast<int64_t>(sequence.request.prompt.size() + sequence.output.size()) >
          sequence.cache->capacity()) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

bool Engine::Step() {
  Admit();
  if (running_.empty()) return false;

  // Drafts come first: a session may run forwards of its own.
  const Clock::time_point draft_start = Clock::now();
  bool drafted = false;
  for (auto& sequence : running_) drafted |= sequence->draft != nullptr && ProposeDrafts(*sequence);
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
  const double draft_seconds = drafted ? SecondsBetween(draft_start, Clock::now()) : 0.0;
  if (running_.empty()) return true;

  // One batched forward: the next prompt chunk of each prefilling sequence (within the step's
  // token budget), the last token of each decoding one, and that token plus the drafts of each
  // speculating one (with logits for all of them).
  std::vector<SequenceChunk> chunks;
  std::vector<Sequence*> stepped;
  int64_t budget = options_.max_step_tokens;
  for (auto& sequence : running_) {
    SequenceChunk chunk;
    chunk.cache = &*sequence->cache;
    if (!sequence->prefill_done()) {
      if (budget <= 0) continue;
      const size_t n = std::min<size_t>(sequence->request.prompt.size() - sequence->prefilled,
                                        static_cast<size_t>(budget));
      chunk.tokens =
          std::span<const int32_t>(sequence->request.prompt).subspan(sequence->prefilled, n);
      budget -= static_cast<int64_t>(n);
    } else if (sequence->verifying()) {
      chunk.tokens = sequence->step_tokens;
      chunk.all_logits = true;
    } else {
      chunk.tokens = std::span<const int32_t>(sequence->output).last(1);
    }
    chunks.push_back(chunk);
    stepped.push_back(sequence.get());
  }
  const bool want_hidden =
      options_.draft_source != nullptr && options_.draft_source->needs_target_hidden();
  std::vector<float> logits, hidden;
  const Clock::time_point forward_start = Clock::now();
  absl::Status status = model_->Forward(chunks, &logits, want_hidden ? &hidden : nullptr);
  const double forward_seconds = SecondsBetween(forward_start, Clock::now());
  if (!status.ok()) {
    LOG(ERROR) << "forward step failed: " << status;
    for (Sequence* sequence : stepped) Finish(*sequence, FinishReason::kNone, status);
    std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
    return true;
  }

  const int64_t vocab = model_->config().vocab_size;
  const size_t hidden_size = static_cast<size_t>(model_->config().hidden_size);
  struct Delivery {
    Sequence* sequence;
    GenerationUpdate update;
    FinishReason reason;
  };
  std::vector<Delivery> delivered;
  uint64_t generated = 0;
  SpeculativeStats speculative;
  size_t logits_row = 0, hidden_row = 0;
  for (size_t i = 0; i < stepped.size(); ++i) {
    Sequence& sequence = *stepped[i];
    const size_t n = chunks[i].tokens.size();
    const size_t rows = chunks[i].all_logits ? n : 1;
    const std::span<float> chunk_logits(logits.data() + logits_row * static_cast<size_t>(vocab),
                                        rows * static_cast<size_t>(vocab));
    const float* chunk_hidden = want_hidden ? hidden.data() + hidden_row * hidden_size : nullptr;
    logits_row += rows;
    hidden_row += n;
    // Hidden rows of the positions that stay in the cache, for the draft session.
    auto keep_hidden = [&](size_t kept) {
      if (want_hidden && sequence.draft != nullptr) {
        sequence.hidden.insert(sequence.hidden.end(), chunk_hidden,
                               chunk_hidden + kept * hidden_size);
      }
    };
    if (!sequence.prefill_done()) {
      sequence.prefilled += n;
      keep_hidden(n);
      if (!sequence.prefill_done()) continue;
    } else if (!sequence.verifying()) {
      keep_hidden(1);
    }

    GenerationUpdate update;
    FinishReason reason = FinishReason::kNone;
    if (!sequence.verifying()) {
      SampledToken sampled = sequence.sampler->Sample(chunk_logits, sequence.request.logprobs);
      sequence.sampler->Accept(sampled.token_id);
      reason = Emit(sequence, std::move(sampled), update);
    } else {
      Verification verified = VerifyDraft(*sequence.sampler, chunk_logits, vocab, sequence.proposal,
                                          sequence.request.logprobs);
      const int64_t k = static_cast<int64_t>(sequence.proposal.tokens.size());
      // The cache now ends with the last token and k drafts; the rejected drafts go.
      sequence.cache->Truncate(sequence.cache->length() - k + verified.accepted);
      keep_hidden(static_cast<size_t>(verified.accepted) + 1);
      sequence.draft->Commit(verified.accepted);
      sequence.speculative.drafted += k;
      sequence.speculative.accepted += verified.accepted;
      speculative.drafted += k;
      speculative.accepted += verified.accepted;
      // Tokens after a stop are dropped, as they would never have been sampled.
      for (SampledToken& sampled : verified.tokens) {
        reason = Emit(sequence, std::move(sampled), update);
        if (reason != FinishReason::kNone) break;
      }
    }
    generated += update.token_ids.size();
    delivered.push_back({&sequence, std::move(update), reason});
  }
  // Stats first, so that a client that sees its last update also sees its step counted.
  {
    absl::MutexLock lock(&mutex_);
    stats_.steps++;
    stats_.generated_tokens += generated;
    stats_.speculative.drafted += speculative.drafted;
    stats_.speculative.accepted += speculative.accepted;
    stats_.forward_seconds += forward_seconds;
    stats_.draft_seconds += draft_seconds;
  }
  for (Delivery& delivery : delivered) {
    delivery.sequence->on_update(std::move(delivery.update));
    if (delivery.reason != FinishReason::kNone) Finish(*delivery.sequence, delivery.reason, {});
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
  return true;
}

void Engine::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mutex_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return !running_.empty() || !waiting_.empty() || !cancelled_.empty() || stop_;
      };
      mutex_.Await(absl::Condition(&has_work));
      if (stop_ && waiting_.empty() && running_.empty()) break;
    }
    Step();
  }
  absl::MutexLock lock(&mutex_);
  stats_.running = 0;
  stats_.waiting = 0;
}

}  // namespace kiln
