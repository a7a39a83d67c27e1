#include "engine/mtp_draft_source.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/argmax.h"

namespace kiln {

// Members are public: the class is private to MtpDraftSource, whose ProposeBatch drives it.
class MtpDraftSource::Session final : public DraftSession {
 public:
  Session(std::shared_ptr<const PreparedModel> model, std::vector<KvCache> caches,
          int64_t first_position)
      : model(std::move(model)), caches(std::move(caches)), consumed(first_position) {}

  absl::StatusOr<Draft> Propose(int32_t k, std::span<const int32_t> context,
                                const HiddenStates& target_hidden) override {
    DraftCall call{this, k, context, target_hidden};
    ProposeBatch(*model, {&call, 1});
    return std::move(call.result);
  }

  // Nothing to do here: the next Propose drops this call's draft positions from every cache.
  void Commit(int32_t /*accepted*/) override {}

  std::shared_ptr<const PreparedModel> model;
  std::vector<KvCache> caches;  // one per head
  int64_t consumed = 0;         // positions head 0 has seen with the target's hidden states
};

absl::StatusOr<std::shared_ptr<MtpDraftSource>> MtpDraftSource::Create(
    std::shared_ptr<const PreparedModel> model) {
  if (model == nullptr || model->num_mtp_heads() == 0) {
    return absl::FailedPreconditionError("the model has no MTP heads to draft with");
  }
  return std::shared_ptr<MtpDraftSource>(new MtpDraftSource(std::move(model)));
}

void MtpDraftSource::ProposeAll(std::span<DraftCall> calls) { ProposeBatch(*model_, calls); }

int32_t MtpDraftSource::default_num_draft_tokens(const SamplingParams& sampling) const {
  if (sampling.temperature == 0.0f) return 2;
  return sampling.temperature <= 0.3f ? 1 : 0;
}

// Per draft step, one MtpForward over every session still drafting: step 0 feeds head 0 each
// session's new target positions (its last row drafts token 1); step s feeds head
// s % num_mtp_heads() each session's draft token s and the hidden state that produced it.
void MtpDraftSource::ProposeBatch(const PreparedModel& model, std::span<DraftCall> calls) {
  const int64_t hidden_size = model.config().hidden_size;
  const int heads = model.num_mtp_heads();
  struct Active {
    DraftCall* call;
    Session* session;
    int32_t token = 0;
    std::vector<float> state;  // hidden state of the row that drafted `token`
  };
  std::vector<Active> active;
  std::vector<MtpChunk> chunks;
  for (DraftCall& call : calls) {
    auto* session = static_cast<Session*>(call.session);
    call.result = Draft{};
    // Draft positions of the last call are not part of the sequence any more.
    for (KvCache& cache : session->caches) cache.Truncate(session->consumed);
    const HiddenStates& hidden = call.target_hidden;
    if (hidden.rows() > 0 && hidden.first_position != session->consumed) {
      call.result = absl::InternalError(absl::StrCat("MTP draft: hidden states start at position ",
                                                     hidden.first_position, ", expected ",
                                                     session->consumed));
      continue;
    }
    if (hidden.rows() > 0 && hidden.hidden_size != hidden_size) {
      call.result = absl::InternalError("MTP draft: hidden states have the wrong width");
      continue;
    }
    const int64_t rows = hidden.rows();
    if (rows == 0 || call.k < 0 ||
        session->consumed + rows > static_cast<int64_t>(call.context.size()) - 1) {
      continue;  // nothing new to draft from
    }
    // Position p gets (context[p + 1], h_p).
    chunks.push_back({&session->caches[0],
                      call.context.subspan(static_cast<size_t>(session->consumed + 1),
                                           static_cast<size_t>(rows)),
                      hidden.values, /*all_logits=*/false});
    active.push_back({&call, session});
  }
  std::vector<float> logits, hidden_out;
  for (int32_t step = 0; !active.empty(); ++step) {
    if (step > 0) {
      // Sessions that asked for fewer drafts (or none: step 0 only took in the target's states),
      // or whose head cache is full, stop here.
      std::erase_if(active, [&](const Active& a) {
        const KvCache& cache = a.session->caches[static_cast<size_t>(step % heads)];
        return step >= a.call->k || cache.length() >= cache.capacity();
      });
      chunks.clear();
      for (Active& a : active) {
        chunks.push_back(
            {&a.session->caches[static_cast<size_t>(step % heads)], {&a.token, 1}, a.state, false});
      }
      if (active.empty()) break;
    }
    logits.clear();
    hidden_out.clear();
    const absl::Status status = model.MtpForward(step % heads, chunks, &logits, &hidden_out);
    if (!status.ok()) {
      for (Active& a : active) a.call->result = status;
      return;
    }
    const size_t vocab = static_cast<size_t>(model.config().vocab_size);
    size_t row_end = 0;  // rows of hidden_out up to this chunk's
    for (size_t i = 0; i < active.size(); ++i) {
      Active& a = active[i];
      row_end += chunks[i].tokens.size();
      if (step == 0) a.session->consumed += static_cast<int64_t>(chunks[i].tokens.size());
      if (a.call->k == 0) continue;  // only taking in the target's states
      a.token = ArgmaxFirst(std::span<const float>(logits).subspan(i * vocab, vocab));
      a.call->result->tokens.push_back(a.token);
      const auto last = hidden_out.begin() + static_cast<ptrdiff_t>(row_end * hidden_size);
      a.state.assign(last - hidden_size, last);
    }
  }
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
      new Session(model_, std::move(caches), start.first_position));
}

}  // namespace kiln
