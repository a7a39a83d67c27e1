#include "engine/mtp_draft_source.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

class MtpDraftSession final : public DraftSession {
 public:
  MtpDraftSession(std::shared_ptr<const PreparedModel> model, std::vector<KvCache> caches,
                  int64_t first_position)
      : model_(std::move(model)), caches_(std::move(caches)), consumed_(first_position) {}

  absl::StatusOr<Draft> Propose(int32_t k, std::span<const int32_t> context,
                                const HiddenStates& target_hidden) override {
    const int64_t hidden_size = model_->config().hidden_size;
    // Draft positions of the last call are not part of the sequence any more.
    for (KvCache& cache : caches_) cache.Truncate(consumed_);
    if (target_hidden.rows() > 0 && target_hidden.first_position != consumed_) {
      return absl::InternalError(absl::StrCat("MTP draft: hidden states start at position ",
                                              target_hidden.first_position, ", expected ",
                                              consumed_));
    }
    if (target_hidden.rows() > 0 && target_hidden.hidden_size != hidden_size) {
      return absl::InternalError("MTP draft: hidden states have the wrong width");
    }
    const int64_t rows = target_hidden.rows();
    Draft draft;
    if (rows == 0 || k <= 0 || consumed_ + rows > static_cast<int64_t>(context.size()) - 1) {
      return draft;  // nothing new to draft from
    }
    // Head 0 catches up: position p gets (context[p + 1], h_p); the last row drafts token 1.
    std::span<const int32_t> next_tokens =
        context.subspan(static_cast<size_t>(consumed_ + 1), static_cast<size_t>(rows));
    MtpChunk chunk{&caches_[0], next_tokens, target_hidden.values, /*all_logits=*/false};
    logits_.clear();
    hidden_.clear();
    KILN_RETURN_IF_ERROR(model_->MtpForward(0, {&chunk, 1}, &logits_, &hidden_));
    consumed_ += rows;
    int32_t token = Argmax(logits_);
    draft.tokens.push_back(token);
    std::vector<float> state(hidden_.end() - hidden_size, hidden_.end());
    for (int32_t step = 1; step < k; ++step) {
      const int head = step % model_->num_mtp_heads();
      KvCache& cache = caches_[static_cast<size_t>(head)];
      if (cache.length() >= cache.capacity()) break;
      MtpChunk next{&cache, {&token, 1}, state, false};
      logits_.clear();
      hidden_.clear();
      KILN_RETURN_IF_ERROR(model_->MtpForward(head, {&next, 1}, &logits_, &hidden_));
      token = Argmax(logits_);
      draft.tokens.push_back(token);
      state.assign(hidden_.end() - hidden_size, hidden_.end());
    }
    return draft;
  }

  // Nothing to do here: the next Propose drops this call's draft positions from every cache.
  void Commit(int32_t /*accepted*/) override {}

 private:
  std::shared_ptr<const PreparedModel> model_;
  std::vector<KvCache> caches_;  // one per head
  int64_t consumed_ = 0;         // positions head 0 has seen with the target's hidden states
  std::vector<float> logits_, hidden_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<MtpDraftSource>> MtpDraftSource::Create(
    std::shared_ptr<const PreparedModel> model) {
  if (model == nullptr || model->num_mtp_heads() == 0) {
    return absl::FailedPreconditionError("the model has no MTP heads to draft with");
  }
  return std::shared_ptr<MtpDraftSource>(new MtpDraftSource(std::move(model)));
}

absl::StatusOr<std::unique_ptr<DraftSession>> MtpDraftSource::StartSession(
    const DraftSessionStart& start) {
  // Room for the sequence plus one step of drafts, within the model's context (drafts past it
  // are simply not made).
  const int64_t capacity =
      std::min<int64_t>(start.max_length + kMaxDraftTokens, model_->context_limit());
  if (start.first_position > 0 && start.target_cache == nullptr) {
    return absl::InvalidArgumentError(
        "MTP draft: a cached prefix needs the target's KV cache, whose blocks hold the heads' "
        "keys and values");
  }
  std::vector<KvCache> caches;
  for (int head = 0; head < model_->num_mtp_heads(); ++head) {
    // The heads' keys and values sit in their own layer slots of the sequence's blocks.
    absl::StatusOr<KvCache> cache = start.target_cache != nullptr
                                        ? model_->NewMtpCache(*start.target_cache, capacity)
                                        : model_->NewMtpCache(capacity);
    if (!cache.ok()) return KilnAnnotate(cache.status(), "MTP draft session");
    cache->set_length(head == 0 ? start.first_position : 0);
    caches.push_back(*std::move(cache));
  }
  return std::unique_ptr<DraftSession>(
      new MtpDraftSession(model_, std::move(caches), start.first_position));
}

}  // namespace kiln
