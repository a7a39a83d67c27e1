#include "engine/engine.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/engine_sequence.h"
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

// The parent of a sequence's first block in the prefix cache. Blocks of speculating sequences
// also hold the MTP heads' keys and values (their own layer slots), which other sequences never
// write: they are cached apart, so that a drafting sequence never reads a head's slots that a
// plain one left unwritten. Outputs would be right either way (drafts are verified); drafts
// would not.
BlockHash Engine::PrefixRoot(const Sequence& sequence) {
  return sequence.num_draft_tokens > 0 ? BlockHash{0, 1} : BlockHash{};
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const PreparedModel> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("engine needs a model");
  if (options.max_running < 1 || options.max_queued < 0 || options.max_step_tokens < 1 ||
      options.max_context < 2) {
    return absl::InvalidArgumentError("engine options must be positive");
  }
  if (options.default_num_draft_tokens != kDraftSourceDefault &&
      (options.default_num_draft_tokens < 0 ||
       options.default_num_draft_tokens > kMaxDraftTokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_num_draft_tokens must be between 0 and ", kMaxDraftTokens,
                     ", or kDraftSourceDefault"));
  }
  if (options.default_num_draft_tokens > 0 && options.draft_source == nullptr) {
    return absl::InvalidArgumentError("default_num_draft_tokens > 0 needs a draft source");
  }
  if (options.default_drafts_max_running < 1) {
    return absl::InvalidArgumentError("default_drafts_max_running must be at least 1");
  }
  EngineOptions effective = options;
  // One sequence must always fit the pool on its own (then preemption always ends).
  const KvPool& pool = model->kv_pool();
  const int64_t pool_positions = pool.num_blocks() * pool.block_size();
  if (pool_positions < effective.max_context) {
    LOG(WARNING) << "the KV pool holds " << pool_positions << " positions (" << pool.num_blocks()
                 << " blocks): the context of one sequence is capped there"
                 << " (asked for " << effective.max_context << ")";
    effective.max_context = pool_positions;
  }
  if (effective.max_context < 2) {
    return absl::InvalidArgumentError(absl::StrCat("the KV pool (", pool.num_blocks(),
                                                   " blocks of ", pool.block_size(),
                                                   " positions) is too small for a sequence"));
  }
  auto engine =
      std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), effective));
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
  const bool source_default = !request.num_draft_tokens.has_value() &&
                              options_.default_num_draft_tokens == kDraftSourceDefault;
  const int32_t drafts = source_default
                             ? DefaultDrafts(request.sampling)
                             : request.num_draft_tokens.value_or(options_.default_num_draft_tokens);
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
  sequence->default_drafts = source_default;
  sequence->request = std::move(request);
  sequence->on_update = std::move(on_update);
  sequence->prompt_size = sequence->request.prompt.size();
  sequence->tokens = sequence->request.prompt;
  sequence->capacity =
      std::min<int64_t>(options_.max_context, static_cast<int64_t>(sequence->prompt_size) +
                                                  sequence->request.stopping.max_tokens);
  sequence->submitted = Clock::now();
  absl::MutexLock lock(&mutex_);
  // Unavailable: an unload raced this request past the registry; a client may retry.
  if (!accepting_) return absl::UnavailableError("the model is shutting down");
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

void Engine::Shutdown(bool drain, absl::Status reason) {
  {
    absl::MutexLock lock(&mutex_);
    accepting_ = false;
    stop_ = true;
    drain_ = drain_ && drain;
    if (stop_reason_.ok()) stop_reason_ = std::move(reason);
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
  update.prompt_tokens = static_cast<int32_t>(sequence.prompt_size);
  update.cached_prompt_tokens = sequence.cached_prompt_tokens;
  update.completion_tokens = static_cast<int32_t>(sequence.output_size());
  const Clock::time_point now = Clock::now();
  if (sequence.output_size() > 0) {
    update.time_to_first_token_seconds = SecondsBetween(sequence.submitted, sequence.first_token);
  }
  update.total_seconds = SecondsBetween(sequence.submitted, now);
  update.speculative = sequence.speculative;
  Drop(sequence);  // frees the KV blocks now, before the client hears of the end
  Deliver(sequence, std::move(update));
}

void Engine::Drop(Sequence& sequence) {
  if (sequence.finished) return;
  const bool was_running = sequence.cache.has_value();
  sequence.finished = true;
  sequence.draft.reset();
  sequence.cache.reset();
  if (was_running) {
    absl::MutexLock lock(&mutex_);
    stats_.running--;
  }
}

void Engine::Deliver(Sequence& sequence, GenerationUpdate update) {
  try {
    sequence.on_update(std::move(update));
  } catch (const std::exception& e) {
    LOG(ERROR) << "request " << sequence.id << ": its update callback threw (" << e.what()
               << "); the stream is dropped";
    Drop(sequence);
  } catch (...) {
    LOG(ERROR) << "request " << sequence.id << ": its update callback threw; the stream is dropped";
    Drop(sequence);
  }
}

void Engine::FailRunning(const absl::Status& status) {
  LOG(ERROR) << "step failed: " << status << "; ending its " << running_.size() << " sequences";
  for (auto& sequence : running_) {
    if (!sequence->finished) Finish(*sequence, FinishReason::kNone, status);
  }
  running_.clear();
  absl::MutexLock lock(&mutex_);
  stats_.running = 0;
}

void Engine::HandleCancellations() {
  std::vector<std::unique_ptr<Sequence>> cancelled_waiting;
  std::vector<uint64_t> cancelled;
  bool cancel_all = false;
  absl::Status stop_reason;
  {
    absl::MutexLock lock(&mutex_);
    cancelled.swap(cancelled_);
    cancel_all = stop_ && !drain_;
    stop_reason = stop_reason_;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (cancel_all ||
          std::find(cancelled.begin(), cancelled.end(), (*it)->id) != cancelled.end()) {
        cancelled_waiting.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    stats_.waiting = static_cast<int32_t>(waiting_.size());
  }
  // A sequence the client cancelled ends plainly; one the shutdown cancelled hears why.
  const auto finish_cancelled = [&](Sequence& sequence) {
    const bool by_client =
        std::find(cancelled.begin(), cancelled.end(), sequence.id) != cancelled.end();
    Finish(sequence, FinishReason::kCancelled, by_client ? absl::OkStatus() : stop_reason);
  };
  for (auto& sequence : cancelled_waiting) finish_cancelled(*sequence);
  for (auto& sequence : running_) {
    if (cancel_all ||
        std::find(cancelled.begin(), cancelled.end(), sequence->id) != cancelled.end()) {
      finish_cancelled(*sequence);
    }
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
}

// Drafts a decoding sequence may verify this step: past max_tokens or past its cache they would
// be wasted (k + 1 new positions must fit after its tokens but the last).
namespace {

int64_t DraftRoom(int64_t drafts, int64_t max_tokens, int64_t produced, int64_t capacity,
                  int64_t computed) {
  return std::max<int64_t>(0,
                           std::min({drafts, max_tokens - produced - 1, capacity - computed - 1}));
}

}  // namespace

absl::StatusOr<int64_t> Engine::Start(Sequence& sequence, int64_t budget) {
  absl::StatusOr<KvCache> created = model_->NewCache(sequence.capacity);
  if (!created.ok()) return created.status();
  sequence.cache.emplace(*std::move(created));
  KvCache& cache = *sequence.cache;
  KvPool& pool = model_->kv_pool();
  const int64_t block = pool.block_size();
  const int64_t total = static_cast<int64_t>(sequence.tokens.size());
  // The longest cached prefix of whole blocks, leaving at least the last token to compute (its
  // logits are needed). A drafting sequence gives back its last cached block, so that the target
  // recomputes it and hands the draft source the hidden states there (as vLLM does for EAGLE).
  std::vector<int32_t> prefix;
  std::vector<BlockHash> chain;
  if (options_.prefix_caching) {
    const int64_t most = (total - 1) / block;
    for (int64_t b = 0; b < most; ++b) {
      std::optional<BlockHash> next =
          BlockHash::Of(chain.empty() ? PrefixRoot(sequence) : chain.back(),
                        std::span<const int32_t>(sequence.tokens).subspan(b * block, block));
      if (!next.has_value()) break;
      std::optional<int32_t> hit = pool.AcquireCached(*next);
      if (!hit.has_value()) break;
      prefix.push_back(*hit);
      chain.push_back(*next);
    }
    if (sequence.num_draft_tokens > 0 && !prefix.empty()) {
      pool.Release(prefix.back());
      prefix.pop_back();
      chain.pop_back();
    }
  }
  cache.AdoptPrefix(prefix);
  const int64_t computed = cache.length();
  const int64_t rows = std::min(total - computed, budget);  // ≥ 1: the last token is never cached
  if (absl::Status reserved = cache.Reserve(computed + rows); !reserved.ok()) {
    sequence.cache.reset();  // gives the prefix back
    return reserved;
  }
  sequence.block_hash = chain.empty() ? PrefixRoot(sequence) : chain.back();
  sequence.hashed_blocks = static_cast<int64_t>(prefix.size());
  if (!sequence.started) {
    sequence.started = true;
    sequence.cached_prompt_tokens = static_cast<int32_t>(computed);
    if (tokenizer_ != nullptr) {
      sequence.decoder.emplace(*tokenizer_, /*skip_special_tokens=*/true);
    }
    absl::MutexLock lock(&mutex_);
    stats_.prompt_tokens += sequence.prompt_size;
    stats_.cached_prompt_tokens += static_cast<uint64_t>(computed);
  }
  sequence.hidden.clear();
  sequence.hidden_first = computed;
  sequence.step_tokens.clear();
  return rows;
}

void Engine::Preempt(size_t index) {
  std::unique_ptr<Sequence> sequence = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<long>(index));
  VLOG(1) << "preempting request " << sequence->id << " (" << sequence->computed()
          << " positions cached) for want of KV blocks";
  sequence->draft.reset();  // a new session starts when it resumes
  sequence->cache.reset();  // its blocks go back to the pool (full ones stay cached)
  sequence->step_rows = 0;
  sequence->step_tokens.clear();
  absl::MutexLock lock(&mutex_);
  stats_.preemptions++;
  stats_.running--;
  waiting_.push_front(std::move(sequence));
  stats_.waiting = static_cast<int32_t>(waiting_.size());
}

void Engine::Schedule() {
  int64_t budget = options_.max_step_tokens;
  // Running sequences in admission order. Each gets this step's tokens and the blocks for them
  // (a decoding one also for its drafts); when the pool is out, the most recently admitted
  // sequence is preempted, until the blocks fit or this sequence was the one preempted.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& sequence = *running_[i];
    const int64_t computed = sequence.computed();
    const int64_t remaining = static_cast<int64_t>(sequence.tokens.size()) - computed;
    int64_t rows = 0;
    int64_t drafts = 0;
    if (remaining == 1) {
      rows = 1;
      if (sequence.num_draft_tokens > 0) {
        drafts = DraftRoom(sequence.num_draft_tokens, sequence.request.stopping.max_tokens,
                           sequence.output_size(), sequence.capacity, computed);
      }
    } else {
      rows = std::min(remaining, budget);
    }
    sequence.step_rows = 0;
    sequence.draft_room = 0;
    if (rows <= 0) continue;  // waits for prefill budget
    bool preempted_self = false;
    while (!sequence.cache->Reserve(computed + rows + drafts).ok()) {
      const size_t victim = running_.size() - 1;
      preempted_self = victim == i;
      Preempt(victim);
      if (preempted_self) break;
    }
    if (preempted_self) break;
    if (remaining > 1) budget -= rows;
    sequence.step_rows = rows;
    sequence.draft_room = drafts;
  }

  // Then waiting sequences, first come first served, while max_running, the token budget and the
  // pool allow (vLLM admits while the next prefill chunk fits).
  while (static_cast<int32_t>(running_.size()) < options_.max_running && budget > 0) {
    std::unique_ptr<Sequence> sequence;
    {
      absl::MutexLock lock(&mutex_);
      if (waiting_.empty()) break;
      sequence = std::move(waiting_.front());
      waiting_.pop_front();
      stats_.waiting = static_cast<int32_t>(waiting_.size());
    }
    absl::StatusOr<int64_t> started_rows = Start(*sequence, budget);
    if (!started_rows.ok()) {
      // Out of blocks: it waits for running sequences to give some back. With nothing running
      // nothing would, and any other error is the request's own.
      const absl::Status& error = started_rows.status();
      if (error.code() != absl::StatusCode::kResourceExhausted || running_.empty()) {
        Finish(*sequence, FinishReason::kNone,
               error.code() == absl::StatusCode::kResourceExhausted
                   ? absl::ResourceExhaustedError(absl::StrCat(
                         "the KV pool has ", model_->kv_pool().available_blocks(), " of ",
                         model_->kv_pool().num_blocks(), " blocks free, too few for this request"))
                   : error);
        continue;
      }
      absl::MutexLock lock(&mutex_);
      waiting_.push_front(std::move(sequence));
      stats_.waiting = static_cast<int32_t>(waiting_.size());
      break;
    }
    {
      absl::MutexLock lock(&mutex_);
      stats_.running++;
    }
    Sequence& started = *sequence;
    running_.push_back(std::move(sequence));
    if (started.num_draft_tokens > 0) {
      DraftSessionStart start;
      start.context = started.tokens;
      start.max_length = started.capacity;
      start.first_position = started.computed();
      start.target_cache = &*started.cache;
      absl::StatusOr<std::unique_ptr<DraftSession>> session =
          options_.draft_source->StartSession(start);
      if (!session.ok()) {
        Finish(started, FinishReason::kNone,
               KilnAnnotate(session.status(), "starting the draft session"));
        continue;
      }
      started.draft = std::move(*session);
    }
    const int64_t rows = *started_rows;
    budget -= started.decoding() ? 0 : rows;
    started.step_rows = rows;
    started.draft_room = 0;
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
}

absl::StatusOr<FinishReason> Engine::Emit(Sequence& sequence, SampledToken sampled,
                                          GenerationUpdate& update) {
  const StoppingParams& stopping = sequence.request.stopping;
  const int32_t token = sampled.token_id;
  if (sequence.output_size() == 0) sequence.first_token = Clock::now();
  sequence.tokens.push_back(token);
  update.token_ids.push_back(token);
  if (sequence.request.logprobs > 0) update.logprobs.push_back(std::move(sampled));

  if (sequence.decoder.has_value()) {
    absl::StatusOr<std::string> text = sequence.decoder->Push(token);
    if (!text.ok()) {
      return absl::InternalError(
          absl::StrCat("the model produced token ", token,
                       ", which its tokenizer cannot decode: ", text.status().message()));
    }
    sequence.held_text += *text;
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
  // The cache holds all tokens but the last; the next step needs room for one more.
  if (sequence.output_size() >= stopping.max_tokens ||
      static_cast<int64_t>(sequence.tokens.size()) > sequence.capacity) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

void Engine::CacheFullBlocks(Sequence& sequence) {
  if (!options_.prefix_caching || !sequence.cache.has_value()) return;
  const KvCache& cache = *sequence.cache;
  KvPool& pool = model_->kv_pool();
  const int64_t block = pool.block_size();
  // A block is cacheable once every position in it is computed and kept (after rollback).
  while ((sequence.hashed_blocks + 1) * block <= cache.length()) {
    const int64_t b = sequence.hashed_blocks;
    std::optional<BlockHash> hash = BlockHash::Of(
        sequence.block_hash, std::span<const int32_t>(sequence.tokens).subspan(b * block, block));
    if (!hash.has_value()) return;
    pool.Cache(cache.blocks()[static_cast<size_t>(b)], *hash);
    sequence.block_hash = *hash;
    sequence.hashed_blocks++;
  }
}

void Engine::Step() {
  HandleCancellations();
  Schedule();
  if (running_.empty()) return;

  // Drafts come first: a session may run forwards of its own.
  const Clock::time_point draft_start = Clock::now();
  const bool drafted = ProposeDrafts();
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
  const double draft_seconds = drafted ? SecondsBetween(draft_start, Clock::now()) : 0.0;

  // One batched forward: each scheduled sequence's next tokens (a prefill chunk, its last token,
  // or that token and its drafts, with logits for all of them).
  std::vector<SequenceChunk> chunks;
  std::vector<Sequence*> stepped;
  for (auto& sequence : running_) {
    if (sequence->step_rows == 0) continue;
    SequenceChunk chunk;
    chunk.cache = &*sequence->cache;
    if (sequence->verifying()) {
      chunk.tokens = sequence->step_tokens;
      chunk.all_logits = true;
    } else {
      chunk.tokens = std::span<const int32_t>(sequence->tokens)
                         .subspan(static_cast<size_t>(sequence->computed()),
                                  static_cast<size_t>(sequence->step_rows));
    }
    chunks.push_back(chunk);
    stepped.push_back(sequence.get());
  }
  if (chunks.empty()) return;
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
    return;
  }

  const int64_t vocab = model_->config().vocab_size;
  const size_t hidden_size = static_cast<size_t>(model_->config().hidden_size);
  struct Delivery {
    Sequence* sequence;
    GenerationUpdate update;
    FinishReason reason;
    absl::Status error;
  };
  std::vector<Delivery> delivered;
  uint64_t generated = 0;
  SpeculativeStats speculative;
  uint64_t verifications = 0;
  std::array<uint64_t, kMaxDraftTokens> accepted_at_position{};
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

    GenerationUpdate update;
    FinishReason reason = FinishReason::kNone;
    absl::Status error;
    if (!sequence.verifying()) {
      keep_hidden(n);
      if (sequence.computed() < static_cast<int64_t>(sequence.tokens.size())) {
        CacheFullBlocks(sequence);
        continue;  // a prefill chunk that did not reach the end of the tokens
      }
      SampledToken sampled = sequence.sampler->Sample(chunk_logits, sequence.request.logprobs);
      sequence.sampler->Accept(sampled.token_id);
      absl::StatusOr<FinishReason> emitted = Emit(sequence, std::move(sampled), update);
      if (emitted.ok()) reason = *emitted;
      error = emitted.status();
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
      if (k > 0) ++verifications;
      for (int32_t position = 0; position < verified.accepted; ++position) {
        ++accepted_at_position[static_cast<size_t>(position)];
      }
      // Tokens after a stop are dropped, as they would never have been sampled.
      for (SampledToken& sampled : verified.tokens) {
        absl::StatusOr<FinishReason> emitted = Emit(sequence, std::move(sampled), update);
        if (!emitted.ok()) {
          error = emitted.status();
          break;
        }
        reason = *emitted;
        if (reason != FinishReason::kNone) break;
      }
      sequence.step_tokens.clear();
    }
    CacheFullBlocks(sequence);
    generated += update.token_ids.size();
    delivered.push_back({&sequence, std::move(update), reason, std::move(error)});
  }
  // Stats first, so that a client that sees its last update also sees its step counted.
  {
    absl::MutexLock lock(&mutex_);
    stats_.steps++;
    stats_.generated_tokens += generated;
    stats_.speculative.drafted += speculative.drafted;
    stats_.speculative.accepted += speculative.accepted;
    stats_.verifications += verifications;
    for (size_t position = 0; position < accepted_at_position.size(); ++position) {
      stats_.accepted_at_position[position] += accepted_at_position[position];
    }
    stats_.forward_seconds += forward_seconds;
    stats_.draft_seconds += draft_seconds;
  }
  for (Delivery& delivery : delivered) {
    if (!delivery.update.token_ids.empty()) {
      Deliver(*delivery.sequence, std::move(delivery.update));
    }
    if (delivery.sequence->finished) continue;  // its callback threw
    if (!delivery.error.ok()) {
      Finish(*delivery.sequence, FinishReason::kNone, std::move(delivery.error));
    } else if (delivery.reason != FinishReason::kNone) {
      Finish(*delivery.sequence, delivery.reason, {});
    }
  }
  std::erase_if(running_, [](const auto& sequence) { return sequence->finished; });
}

void Engine::Loop() {
  // Named for top -H, perf and debuggers (at most 15 characters).
  pthread_setname_np(pthread_self(), "kiln-engine");
  while (true) {
    {
      absl::MutexLock lock(&mutex_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return !running_.empty() || !waiting_.empty() || !cancelled_.empty() || stop_;
      };
      mutex_.Await(absl::Condition(&has_work));
      if (stop_ && waiting_.empty() && running_.empty()) break;
    }
    // A step must never stop the loop: whatever it throws ends its sequences, not the model.
    try {
      Step();
    } catch (const std::bad_alloc&) {
      FailRunning(absl::ResourceExhaustedError("out of memory in a step of this model"));
    } catch (const std::exception& e) {
      FailRunning(absl::InternalError(absl::StrCat("a step of this model failed: ", e.what())));
    } catch (...) {
      FailRunning(absl::InternalError("a step of this model failed"));
    }
  }
  absl::MutexLock lock(&mutex_);
  stats_.running = 0;
  stats_.waiting = 0;
}

}  // namespace kiln
