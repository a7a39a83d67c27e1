// Draft sources for tests and benchmarks, not for serving:
//   ScriptedDraftSource replays known continuations (e.g. the target's own greedy output), each
//     token right with a chosen probability: 1 gives full acceptance at no draft cost, 0 an
//     adversarial draft that the target always rejects, values between a given acceptance rate.
//   NoisyDraftSource draws drafts from a fixed random distribution per previous token: a cheap
//     draft with a non-trivial q that the target accepts only sometimes.
//   SelfDraftSource drafts with a model (normally the target itself) through its own KV cache,
//     greedily or by sampling from a tempered, smoothed distribution (a non-trivial q). It can
//     also check the target hidden states the engine hands over against its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/draft_source.h"
#include "models/prepared_model.h"

namespace kiln {

class ScriptedDraftSource : public DraftSource {
 public:
  struct Script {
    std::vector<int32_t> prompt;
    std::vector<int32_t> continuation;
  };
  // Each proposed token is the script's with probability `correct_probability` and otherwise
  // (script token + 1) % vocab_size, drawn per position from a generator seeded by `seed`. A
  // prompt without a script, or a context that left its script, gets empty drafts.
  ScriptedDraftSource(std::vector<Script> scripts, int64_t vocab_size, double correct_probability,
                      uint64_t seed = 0);

  absl::string_view name() const override { return "scripted"; }
  absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(
      const DraftSessionStart& start) override;

 private:
  std::vector<Script> scripts_;
  int64_t vocab_size_;
  double correct_probability_;
  uint64_t seed_;
  std::atomic<uint64_t> sessions_{0};
};

class NoisyDraftSource : public DraftSource {
 public:
  // q(· | t) ∝ exp(spread · g), g ~ N(0, 1) per token, seeded by `seed` and the previous token
  // t. Drafts are drawn from q (and returned with it), or with `greedy` are q's argmax (no q).
  NoisyDraftSource(int64_t vocab_size, uint64_t seed, float spread = 1.0f, bool greedy = false);

  absl::string_view name() const override { return "noisy"; }
  absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(
      const DraftSessionStart& start) override;

 private:
  int64_t vocab_size_;
  uint64_t seed_;
  float spread_;
  bool greedy_;
  std::atomic<uint64_t> sessions_{0};
};

class SelfDraftSource : public DraftSource {
 public:
  struct Options {
    // Greedy drafts (q one-hot) or draws from q = (1 − uniform_mix) · softmax(logits /
    // temperature) + uniform_mix / vocab, returned with the draft.
    bool greedy = true;
    float temperature = 1.0f;
    float uniform_mix = 0.0f;
    uint64_t seed = 0;
    // Asks for the target's hidden states and compares each row with the one this source
    // computes for the same position (same model → equal up to batching round-off).
    bool check_hidden = false;
  };
  struct HiddenCheck {
    int64_t rows_compared = 0;
    float max_abs_diff = 0;
    // Deliveries that were not contiguous with the previous one or did not end at
    // context.size() − 1 (HiddenStates' contract).
    int64_t contract_violations = 0;
  };

  SelfDraftSource(std::shared_ptr<const PreparedModel> model, Options options);

  absl::string_view name() const override { return "self"; }
  bool needs_target_hidden() const override { return options_.check_hidden; }
  absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(
      const DraftSessionStart& start) override;

  HiddenCheck hidden_check() const;
  void AddHiddenCheck(const HiddenCheck& check);  // for sessions

 private:
  std::shared_ptr<const PreparedModel> model_;
  Options options_;
  mutable absl::Mutex mutex_;
  uint64_t sessions_ ABSL_GUARDED_BY(mutex_) = 0;
  HiddenCheck check_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace kiln
