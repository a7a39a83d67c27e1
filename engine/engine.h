// One step loop per model (design.md §2): each step schedules the running sequences and admits
// waiting ones as the model's KV pool allows, runs prefill chunks and decode tokens of every
// scheduled sequence in one batched forward, samples, and streams updates out. It follows
// vLLM's scheduler: a sequence is its tokens (prompt + output) and how many of them its KV cache
// holds, so prefill, decode, speculative verification and the recompute after preemption are one
// mechanism; blocks are reserved before the forward; when they run out the most recently
// admitted sequence is preempted (its blocks freed, its output kept, back to the front of the
// queue) rather than anyone failing; full blocks join the prefix cache, and admission reuses the
// longest cached prefix. Sequences that speculate (engine/draft_source.h) have their drafts
// verified in the same batched forward: k + 1 positions each, then rejected positions are rolled
// back. Nothing a client or a draft source does can stop the loop: exceptions end the step's
// sequences with an error, and no lock is held while calling out.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/draft_source.h"
#include "engine/sampling.h"
#include "models/prepared_model.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct StoppingParams {
  int32_t max_tokens = 16;
  std::vector<std::string> stop;        // stop strings (need a tokenizer); not part of the output
  std::vector<int32_t> stop_token_ids;  // end generation; the id is part of the output
  bool ignore_eos = false;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StoppingParams stopping;
  int32_t logprobs = 0;  // top-n log-probabilities per token; 0 = none
  // Draft tokens verified per step (speculative decoding), up to kMaxDraftTokens; 0 = off.
  // Unset: EngineOptions::default_num_draft_tokens (by default the draft source's choice for
  // the sampling, when few sequences run). More than 0 needs an engine with a draft source. The
  // output is the same as without speculation (for sampling: the same distribution).
  std::optional<int32_t> num_draft_tokens;
};

enum class FinishReason { kNone, kLength, kStop, kEos, kCancelled };

struct SpeculativeStats {
  int64_t drafted = 0;   // draft tokens verified by the target
  int64_t accepted = 0;  // of which the target kept
};

struct GenerationUpdate {
  std::vector<int32_t> token_ids;  // new tokens
  std::string text;                // their text (complete UTF-8, stop strings removed)
  std::vector<SampledToken> logprobs;
  FinishReason finish = FinishReason::kNone;  // set on the last update
  absl::Status status;                        // an error ends the stream (finish stays kNone)
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // of which came from the prefix cache (set on the last)
  int32_t completion_tokens = 0;
  double time_to_first_token_seconds = 0;
  double total_seconds = 0;
  SpeculativeStats speculative;  // cumulative; set on the last update
};

// Called on the engine's thread; must return quickly (e.g. push into a queue).
using UpdateCallback = std::function<void(GenerationUpdate)>;

struct EngineOptions {
  // Sequences in one batched step, at most; below it the KV pool's free blocks decide. 64: on
  // a 2-core Zen 4, Qwen2.5-0.5B decodes 1.33x the aggregate tokens/s of 16 streams
  // (bench/kv_cache_bench.cc); vLLM's default is 256.
  int32_t max_running = 64;
  int32_t max_queued = 1024;      // waiting requests beyond which Submit is refused
  int32_t max_step_tokens = 512;  // prompt tokens prefilled per step (chunked prefill)
  int64_t max_context = 4096;     // prompt + output tokens of one sequence
  uint64_t seed = 0;              // seeds requests that bring no seed of their own
  // Proposes draft tokens for speculative decoding; null = requests cannot speculate.
  std::shared_ptr<DraftSource> draft_source;
  // For requests that leave num_draft_tokens unset: 0 to kMaxDraftTokens, or
  // kDraftSourceDefault: the draft source's depth for the request's sampling
  // (DraftSource::default_num_draft_tokens; none without a draft source), drafted only in steps
  // that run at most `default_drafts_max_running` sequences. 1: on a 2-core Zen 4, the trained
  // default model decoded greedy 1.23x faster with its MTP drafts at one stream, but 0.89x at 4,
  // 8 and 32 streams (bench/speculative_mtp.cc): once a step holds several sequences, verifying
  // k + 1 rows each costs more than the drafts save.
  int32_t default_num_draft_tokens = kDraftSourceDefault;
  int32_t default_drafts_max_running = 1;
  // Reuse cached KV blocks of equal prompt prefixes (the output is the same either way).
  bool prefix_caching = true;
};

// The step capacity a model's execution context needs to run this engine's steps in one go: a
// full prefill chunk plus every running sequence's decode rows, or its verification rows when
// `speculative` (larger steps still run, as sub-steps). Bounded, so that a huge max_running does
// not size a huge arena.
StepCapacity EngineStepCapacity(const EngineOptions& options, bool speculative);

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  uint64_t kv_cache_bytes = 0;  // KV pool blocks held by sequences (running and drafting)
  // Cumulative over the engine's life:
  uint64_t steps = 0;             // steps run, i.e. target forwards (verification included)
  uint64_t generated_tokens = 0;  // tokens sent to clients
  SpeculativeStats speculative;
  // Verifications of a sequence's drafts, and in how many of them its i-th draft token (from 0)
  // was kept, which needs the ones before it kept too: ÷ verifications, the acceptance rate at
  // draft position i + 1 (as vLLM reports it).
  uint64_t verifications = 0;
  std::array<uint64_t, kMaxDraftTokens> accepted_at_position{};
  double forward_seconds = 0;  // in target forwards
  double draft_seconds = 0;    // in DraftSession::Propose
  uint64_t preemptions = 0;    // sequences preempted for want of KV blocks
  // Prompt tokens of admitted requests, and of those the ones served from the prefix cache.
  uint64_t prompt_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
};

class Engine {
 public:
  // `tokenizer` may be null: then updates carry no text and stop strings are refused.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<const PreparedModel> model,
                                                        std::shared_ptr<const Tokenizer> tokenizer,
                                                        const EngineOptions& options);
  // Cancels whatever is still running or waiting, then stops the loop.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. InvalidArgument names a bad field; ResourceExhausted when the queue is
  // full; Unavailable after Shutdown. Returns the request's id.
  absl::StatusOr<uint64_t> Submit(GenerationRequest request, UpdateCallback on_update);
  // The request's stream ends with FinishReason::kCancelled within one step. Unknown ids are
  // ignored (the request may have finished already).
  void Cancel(uint64_t request_id);
  // Refuses new requests; `drain` lets running and queued ones finish, otherwise they are
  // cancelled: they end with FinishReason::kCancelled, or with `reason` as their error when it
  // is not OK (what a client should hear, e.g. that the server is shutting down). Returns when
  // the loop has stopped.
  void Shutdown(bool drain, absl::Status reason = absl::OkStatus());

  EngineStats stats() const;
  const PreparedModel& model() const { return *model_; }
  // Prompt + output tokens of one sequence, as enforced: the option, capped by the KV pool.
  int64_t max_context() const { return options_.max_context; }
  // Draft tokens per step of a greedy request that names none, running alone (0: it does not
  // speculate).
  int32_t default_num_draft_tokens() const;

 private:
  struct Sequence;
  Engine(std::shared_ptr<const PreparedModel> model, std::shared_ptr<const Tokenizer> tokenizer,
         const EngineOptions& options);
  void Loop();
  void Step();
  // Cancellations (and a shutdown that does not drain) end their sequences.
  void HandleCancellations();
  // Reserves this step's blocks for the running sequences (preempting when the pool is out),
  // then admits waiting sequences while the pool, max_running and the token budget allow.
  void Schedule();
  // Starts a sequence's KV cache (reusing its longest cached prefix) and reserves its first
  // chunk, of at most `budget` (> 0) tokens; returns that chunk's size. ResourceExhausted when
  // the pool cannot hold it now.
  absl::StatusOr<int64_t> Start(Sequence& sequence, int64_t budget);
  // Frees a running sequence's blocks and puts it back at the front of the queue.
  void Preempt(size_t running_index);
  static BlockHash PrefixRoot(const Sequence& sequence);
  // Adds the sequence's newly full blocks to the prefix cache.
  void CacheFullBlocks(Sequence& sequence);
  void Finish(Sequence& sequence, FinishReason reason, absl::Status status);
  // Ends a sequence without a word to its client: its blocks and draft session go.
  void Drop(Sequence& sequence);
  // Hands an update to the client's callback; one that throws loses its stream, and only its.
  void Deliver(Sequence& sequence, GenerationUpdate update);
  // Ends every running sequence with `status` (a step that threw).
  void FailRunning(const absl::Status& status);
  // Asks the draft source for this step's drafts of every speculating sequence at once (one
  // batch); a sequence whose proposal failed is finished with the error. False when no sequence
  // drafted.
  bool ProposeDrafts();
  // The draft source's depth for a request sampled so that names none (0 without a source).
  int32_t DefaultDrafts(const SamplingParams& sampling) const;
  // Appends a token to the output and to `update`; returns why the sequence ends, if it does,
  // or an error (its text could not be decoded).
  absl::StatusOr<FinishReason> Emit(Sequence& sequence, SampledToken sampled,
                                    GenerationUpdate& update);

  std::shared_ptr<const PreparedModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  EngineOptions options_;

  mutable absl::Mutex mutex_;
  std::deque<std::unique_ptr<Sequence>> waiting_ ABSL_GUARDED_BY(mutex_);
  std::vector<uint64_t> cancelled_ ABSL_GUARDED_BY(mutex_);
  bool accepting_ ABSL_GUARDED_BY(mutex_) = true;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  bool drain_ ABSL_GUARDED_BY(mutex_) = true;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mutex_);  // what cancelled sequences end with
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  EngineStats stats_ ABSL_GUARDED_BY(mutex_);

  // Owned by the loop thread.
  std::vector<std::unique_ptr<Sequence>> running_;
  std::thread thread_;
};

}  // namespace kiln
