#include "engine/draft_source.h"

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status ValidateDraft(const Draft& draft, int32_t k, int64_t vocab_size) {
  if (static_cast<int64_t>(draft.tokens.size()) > k) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft of ", draft.tokens.size(), " tokens, more than the ", k, " asked for"));
  }
  for (int32_t token : draft.tokens) {
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "draft token id ", token, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  if (draft.probs.empty()) return absl::OkStatus();
  if (draft.probs.size() != draft.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft has ", draft.tokens.size(), " tokens but ", draft.probs.size(), " distributions"));
  }
  for (size_t i = 0; i < draft.tokens.size(); ++i) {
    if (static_cast<int64_t>(draft.probs[i].size()) != vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft distribution ", i, " has ", draft.probs[i].size(),
                       " entries, not the vocabulary's ", vocab_size));
    }
    // A token drawn from q has q > 0; q = 0 would make p/q undefined.
    if (!(draft.probs[i][static_cast<size_t>(draft.tokens[i])] > 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft token ", i, " has no mass in its own distribution"));
    }
  }
  return absl::OkStatus();
}

void DraftSource::ProposeAll(std::span<DraftCall> calls) {
  for (DraftCall& call : calls) {
    call.result = call.session->Propose(call.k, call.context, call.target_hidden);
  }
}

}  // namespace kiln
