// Drafts from a model's own MTP heads (docs/mtp.md): the heads restored from the checkpoint's
// carried tensors read the target's final-norm hidden states and propose the next tokens.
#pragma once

#include <memory>

#include "engine/draft_source.h"
#include "models/prepared_model.h"

namespace kiln {

// Greedy drafts (q one-hot): draft step s uses head (s - 1) % num_mtp_heads(). Each session keeps
// head 0's KV cache in step with the target: on every Propose it first feeds the head the
// positions the target computed since the last call, (context[p + 1], h_p) for each new p, then
// drafts. Further heads see only their own draft positions (checkpoints with one MTP layer, the
// common case, reuse head 0 for every step).
class MtpDraftSource final : public DraftSource {
 public:
  // FailedPrecondition if `model` has no MTP heads.
  static absl::StatusOr<std::shared_ptr<MtpDraftSource>> Create(
      std::shared_ptr<const PreparedModel> model);

  absl::string_view name() const override { return "mtp"; }
  bool needs_target_hidden() const override { return true; }
  absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(
      const DraftSessionStart& start) override;

 private:
  explicit MtpDraftSource(std::shared_ptr<const PreparedModel> model) : model_(std::move(model)) {}
  std::shared_ptr<const PreparedModel> model_;
};

}  // namespace kiln
