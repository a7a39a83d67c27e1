#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

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

  bool prefill_done() const { return prefilled == request.prompt.size(); }
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const PreparedModel> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("engine needs a model");
  if (options.max_running < 1 || options.max_queued < 0 || options.max_step_tokens < 1 ||
      options.max_context < 2) {
    return absl::InvalidArgumentError("engine options must be positive");
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

  auto sequence = std::make_unique<Sequence>();
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
  absl::MutexLock lock(&mutex_);
  return stats_;
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
  sequence.finished = true;
  if (sequence.cache.has_value()) {
    const uint64_t bytes = sequence.cache->bytes();
    sequence.cache.reset();  // frees the KV cache now, before the client hears of the end
    absl::MutexLock lock(&mutex_);
    stats_.kv_cache_bytes -= bytes;
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
      absl::MutexLock lock(&mutex_);
      stats_.kv_cache_bytes += sequence->cache->bytes();
      stats_.running++;
      if (tokenizer_ != nullptr)
        sequence->decoder.emplace(*tokenizer_, /*skip_special_tokens=*/true);
    }
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
}

bool Engine::Step() {
  Admit();
  if (running_.empty()) return false;

  // One batched forward: the next prompt chunk of each prefilling sequence (within the step's
  // token budget) and the last token of each decoding one.
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
    } else {
      chunk.tokens = std::span<const int32_t>(sequence->output).last(1);
    }
    chunks.push_back(chunk);
    stepped.push_back(sequence.get());
  }
  std::vector<float> logits;
  absl::Status status = model_->Forward(chunks, &logits);
  if (!status.ok()) {
    LOG(ERROR) << "forward step failed: " << status;
    for (Sequence* sequence : stepped) Finish(*sequence, FinishReason::kNone, status);
    std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
    return true;
  }

  const int64_t vocab = model_->config().vocab_size;
  const std::vector<int32_t>& model_eos = model_->config().eos_token_ids;
  for (size_t i = 0; i < stepped.size(); ++i) {
    Sequence& sequence = *stepped[i];
    if (!sequence.prefill_done()) {
      sequence.prefilled += chunks[i].tokens.size();
      if (!sequence.prefill_done()) continue;
    }
    const StoppingParams& stopping = sequence.request.stopping;
    std::span<float> row(logits.data() + static_cast<size_t>(i) * static_cast<size_t>(vocab),
                         static_cast<size_t>(vocab));
    SampledToken sampled = sequence.sampler->Sample(row, sequence.request.logprobs);
    const int32_t token = sampled.token_id;
    sequence.sampler->Accept(token);
    if (sequence.output.empty()) sequence.first_token = Clock::now();
    sequence.output.push_back(token);

    GenerationUpdate update;
    update.token_ids = {token};
    if (sequence.request.logprobs > 0) update.logprobs.push_back(std::move(sampled));
    FinishReason reason = FinishReason::kNone;
    if (sequence.decoder.has_value()) {
      absl::StatusOr<std::string> text = sequence.decoder->Push(token);
      if (text.ok()) sequence.held_text += *text;
      const std::vector<std::string>& stops = stopping.stop;
      size_t stop_at = std::string::npos;
      for (const std::string& stop : stops)
        stop_at = std::min(stop_at, sequence.held_text.find(stop));
      if (stop_at != std::string::npos) {
        update.text = sequence.held_text.substr(0, stop_at);
        sequence.held_text.clear();
        sequence.decoder.reset();  // nothing after a stop string is sent
        reason = FinishReason::kStop;
      } else {
        const size_t keep = HeldBackForStops(sequence.held_text, stops);
        update.text = sequence.held_text.substr(0, sequence.held_text.size() - keep);
        sequence.held_text.erase(0, sequence.held_text.size() - keep);
      }
    }
    const bool is_eos =
        (tokenizer_ != nullptr && std::find(tokenizer_->special_tokens().eos_ids.begin(),
                                            tokenizer_->special_tokens().eos_ids.end(),
                                            token) != tokenizer_->special_tokens().eos_ids.end()) ||
        std::find(model_eos.begin(), model_eos.end(), token) != model_eos.end();
    if (reason == FinishReason::kNone) {
      if (!stopping.ignore_eos && is_eos) {
        reason = FinishReason::kEos;
      } else if (std::find(stopping.stop_token_ids.begin(), stopping.stop_token_ids.end(), token) !=
                 stopping.stop_token_ids.end()) {
        reason = FinishReason::kStop;
      } else if (static_cast<int32_t>(sequence.output.size()) >= stopping.max_tokens ||
                 sequence.cache->length() + 1 > sequence.cache->capacity()) {
        reason = FinishReason::kLength;
      }
    }
    sequence.on_update(std::move(update));
    if (reason != FinishReason::kNone) Finish(sequence, reason, {});
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
  absl::MutexLock lock(&mutex_);
  stats_.steps++;
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
  stats_ = EngineStats{0, 0, 0, stats_.steps};
}

}  // namespace kiln
