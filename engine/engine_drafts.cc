// The engine's drafting for speculative decoding: how many drafts a request gets by default, and
// the draft proposals of a step, made for all drafting sequences in one call to the source.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "engine/engine.h"
#include "engine/engine_sequence.h"
#include "engine/speculative.h"

namespace kiln {
namespace {

// A sequence whose default drafts are paused hands its draft session the target's hidden states
// once this many have gathered (the session's state then stays current at little cost).
constexpr int64_t kPausedDraftBacklog = 32;

}  // namespace

int32_t Engine::DefaultDrafts(const SamplingParams& sampling) const {
  if (options_.draft_source == nullptr) return 0;
  return std::clamp(options_.draft_source->default_num_draft_tokens(sampling), 0, kMaxDraftTokens);
}

int32_t Engine::default_num_draft_tokens() const {
  return options_.default_num_draft_tokens == kDraftSourceDefault
             ? DefaultDrafts(SamplingParams{})
             : options_.default_num_draft_tokens;
}

bool Engine::ProposeDrafts() {
  std::vector<Sequence*> drafting;
  std::vector<DraftCall> calls;
  const int64_t hidden_size = model_->config().hidden_size;
  const bool crowded = static_cast<int64_t>(running_.size()) > options_.default_drafts_max_running;
  for (auto& owned : running_) {
    Sequence& sequence = *owned;
    sequence.step_tokens.clear();
    if (sequence.draft == nullptr || !sequence.decoding() || sequence.step_rows == 0 ||
        sequence.output_size() == 0 || sequence.draft_room <= 0) {
      continue;
    }
    int32_t k = static_cast<int32_t>(sequence.draft_room);
    if (sequence.default_drafts && crowded) {
      // Paused: the session still takes in the target's hidden states now and then, so that
      // they do not pile up here.
      if (static_cast<int64_t>(sequence.hidden.size()) < kPausedDraftBacklog * hidden_size) {
        continue;
      }
      k = 0;
    }
    drafting.push_back(&sequence);
    calls.push_back({sequence.draft.get(), k, sequence.tokens,
                     HiddenStates{sequence.hidden_first, hidden_size, sequence.hidden}});
  }
  if (calls.empty()) return false;
  options_.draft_source->ProposeAll(calls);
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& sequence = *drafting[i];
    DraftCall& call = calls[i];
    absl::Status status = call.result.status();
    if (status.ok()) {
      status = ValidateDraft(*call.result, call.k, model_->config().vocab_size);
      if (!status.ok()) {
        status = absl::InternalError(absl::StrCat("draft source: ", status.message()));
      }
    }
    if (!status.ok()) {
      LOG(ERROR) << "draft proposal failed: " << status;
      Finish(sequence, FinishReason::kNone, status);
      continue;
    }
    sequence.hidden_first += call.target_hidden.rows();
    sequence.hidden.clear();
    sequence.proposal = *std::move(call.result);
    if (sequence.proposal.tokens.empty()) continue;
    sequence.step_tokens.push_back(sequence.tokens.back());
    sequence.step_tokens.insert(sequence.step_tokens.end(), sequence.proposal.tokens.begin(),
                                sequence.proposal.tokens.end());
  }
  return true;
}

}  // namespace kiln
