// The engine's state for one request (private to engine/: Engine's files share it).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/kv_pool.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct Engine::Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  UpdateCallback on_update;
  size_t prompt_size = 0;
  // Every token of the sequence: the prompt, then the output. The KV cache holds the first
  // cache->length() of them; a step feeds it the next ones (vLLM's num_computed_tokens).
  std::vector<int32_t> tokens;
  std::optional<KvCache> cache;  // while running
  int64_t capacity = 0;          // positions its cache may hold
  std::optional<Sampler> sampler;
  std::optional<StreamingDecoder> decoder;
  std::string held_text;  // decoded text not yet sent (a possible stop-string prefix)
  std::chrono::steady_clock::time_point submitted;
  std::chrono::steady_clock::time_point first_token;
  bool started = false;  // admitted at least once
  bool finished = false;

  // Prefix cache: the hash of the last of its leading blocks already hashed, and their count.
  BlockHash block_hash;
  int64_t hashed_blocks = 0;
  int32_t cached_prompt_tokens = 0;  // at its first admission

  // This step: tokens fed (0 = not scheduled) and drafts the reserved blocks leave room for.
  int64_t step_rows = 0;
  int64_t draft_room = 0;

  // Speculative decoding (num_draft_tokens > 0).
  int32_t num_draft_tokens = 0;
  bool default_drafts = false;  // the draft source's default: paused in crowded steps
  std::unique_ptr<DraftSession> draft;
  std::vector<int32_t> step_tokens;  // this step's verified chunk: last token, then the drafts
  Draft proposal;                    // this step's drafts
  std::vector<float> hidden;         // target hidden rows not yet handed to the session
  int64_t hidden_first = 0;          // the position of its first row
  SpeculativeStats speculative;

  int64_t computed() const { return cache.has_value() ? cache->length() : 0; }
  int64_t output_size() const { return static_cast<int64_t>(tokens.size() - prompt_size); }
  // Everything but the last token is in the cache: the next step decodes.
  bool decoding() const { return computed() + 1 == static_cast<int64_t>(tokens.size()); }
  bool verifying() const { return !step_tokens.empty(); }
};

}  // namespace kiln
