// Draft sources for speculative decoding (docs/mtp.md, "Speculative decoding loop"). A source
// makes one session per sequence; each step the session proposes up to k tokens, the engine
// verifies them with one target forward over k + 1 positions, and tells the session how many it
// kept so that the session can roll back its own state (e.g. an MTP head's KV cache).
//
// Sessions are called on the engine's step thread only. A source shared by several engines must
// make StartSession thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/sampling.h"
#include "models/kv_cache.h"

namespace kiln {

// Most draft tokens one step may verify per sequence.
inline constexpr int32_t kMaxDraftTokens = 16;
// EngineOptions::default_num_draft_tokens: leave the choice to the draft source
// (DraftSource::default_num_draft_tokens).
inline constexpr int32_t kDraftSourceDefault = -1;

// The target model's last hidden states (after the final norm) for consecutive positions of the
// context: row r belongs to position first_position + r, i.e. it is the state from which the
// target predicted context[first_position + r + 1]. MTP heads draft from these.
struct HiddenStates {
  int64_t first_position = 0;
  int64_t hidden_size = 0;
  std::span<const float> values;  // rows × hidden_size

  int64_t rows() const {
    return hidden_size == 0 ? 0 : static_cast<int64_t>(values.size()) / hidden_size;
  }
};

struct Draft {
  std::vector<int32_t> tokens;  // proposed continuation, at most k tokens (may be empty)
  // q: for each token, the vocab-sized distribution it was drawn from. Empty means greedy drafts
  // (q is one-hot at the token). Sampling verification needs q to stay exact; greedy
  // verification ignores it.
  std::vector<std::vector<float>> probs;
};

// InvalidArgument unless `draft` holds at most `k` tokens inside the vocabulary and its q (when
// given) is one vocab-sized distribution per token that gives its own token a positive mass.
absl::Status ValidateDraft(const Draft& draft, int32_t k, int64_t vocab_size);

class DraftSession {
 public:
  virtual ~DraftSession() = default;

  // Proposes up to `k` tokens to follow `context` (prompt + accepted output); k = 0 only takes
  // in `target_hidden` (the engine pauses a sequence's drafts that way). `target_hidden`
  // covers the positions the target computed and kept since the last call (all prompt positions
  // on the first call); every position below context.size() - 1 is delivered exactly once over
  // the session. It is empty unless the source's needs_target_hidden() is true.
  virtual absl::StatusOr<Draft> Propose(int32_t k, std::span<const int32_t> context,
                                        const HiddenStates& target_hidden) = 0;
  // `accepted` of the last proposal's tokens were kept (a prefix); the session drops state it
  // built for the rest. The token the target chose after them arrives in the next context.
  virtual void Commit(int32_t accepted) = 0;
};

// What a session starts from.
struct DraftSessionStart {
  // The sequence's tokens so far: its prompt, or prompt + output when it resumes after a
  // preemption.
  std::span<const int32_t> context;
  int64_t max_length = 0;  // tokens it will hold at most (prompt + output)
  // Positions below this came from the prefix cache: their hidden states are never delivered,
  // and the first HiddenStates starts here.
  int64_t first_position = 0;
  // The target's KV cache of the sequence, whose blocks a draft source may share (an MTP head's
  // keys and values in its own layer slot); null where there is none (tests).
  const KvCache* target_cache = nullptr;
};

// One session's part of a batched proposal (DraftSource::ProposeAll): the arguments of its
// Propose, and what Propose would have returned.
struct DraftCall {
  DraftSession* session = nullptr;  // a session this source started
  int32_t k = 0;
  std::span<const int32_t> context;
  HiddenStates target_hidden;
  absl::StatusOr<Draft> result = Draft{};
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;

  virtual absl::string_view name() const = 0;
  // Whether sessions read HiddenStates; the engine collects them only then.
  virtual bool needs_target_hidden() const { return false; }
  // Draft tokens per step for a request that names none, where the engine leaves the choice to
  // the source (kDraftSourceDefault): the depth that decodes fastest with this source for
  // requests sampled so, as measured. 0: such requests speculate only when they ask to.
  virtual int32_t default_num_draft_tokens(const SamplingParams& /*sampling*/) const { return 0; }
  // A session for one sequence (e.g. with a KV cache sized for start.max_length).
  virtual absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(
      const DraftSessionStart& start) = 0;
  // Proposes for every call at once (the sequences of one engine step), each result what its
  // session's Propose would return. The default calls Propose session by session; a source that
  // drafts with a model runs all sessions' draft positions as one batch per draft step.
  virtual void ProposeAll(std::span<DraftCall> calls);
};

}  // namespace kiln
