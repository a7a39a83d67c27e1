#include "engine/draft_sources_testing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace kiln {
namespace {

class ScriptedSession : public DraftSession {
 public:
  ScriptedSession(const ScriptedDraftSource::Script* script, size_t prompt_size, int64_t vocab_size,
                  double correct_probability, uint64_t seed)
      : script_(script),
        prompt_size_(prompt_size),
        vocab_size_(vocab_size),
        correct_probability_(correct_probability),
        rng_(seed) {}

  absl::StatusOr<Draft> Propose(int32_t k, std::span<const int32_t> context,
                                const HiddenStates&) override {
    Draft draft;
    if (script_ == nullptr || context.size() < prompt_size_) return draft;
    const std::span<const int32_t> output = context.subspan(prompt_size_);
    const std::vector<int32_t>& script = script_->continuation;
    if (output.size() > script.size() ||
        !std::equal(output.begin(), output.end(), script.begin())) {
      return draft;  // the output left the script
    }
    std::bernoulli_distribution correct(correct_probability_);
    for (size_t i = output.size(); i < script.size() && draft.tokens.size() < size_t(k); ++i) {
      const int32_t token = script[i];
      draft.tokens.push_back(
          correct(rng_) ? token : static_cast<int32_t>((int64_t{token} + 1) % vocab_size_));
    }
    return draft;
  }
  void Commit(int32_t) override {}

 private:
  const ScriptedDraftSource::Script* script_;
  size_t prompt_size_;
  int64_t vocab_size_;
  double correct_probability_;
  std::mt19937_64 rng_;
};

class NoisySession : public DraftSession {
 public:
  NoisySession(int64_t vocab_size, uint64_t table_seed, float spread, bool greedy, uint64_t seed)
      : vocab_size_(vocab_size),
        table_seed_(table_seed),
        spread_(spread),
        greedy_(greedy),
        rng_(seed) {}

  absl::StatusOr<Draft> Propose(int32_t k, std::span<const int32_t> context,
                                const HiddenStates&) override {
    Draft draft;
    int32_t previous = context.empty() ? 0 : context.back();
    for (int32_t i = 0; i < k; ++i) {
      std::vector<float> q = Row(previous);
      if (greedy_) {
        previous = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
      } else {
        previous = std::discrete_distribution<int32_t>(q.begin(), q.end())(rng_);
        draft.probs.push_back(std::move(q));
      }
      draft.tokens.push_back(previous);
    }
    return draft;
  }
  void Commit(int32_t) override {}

 private:
  std::vector<float> Row(int32_t previous) const {
    std::mt19937_64 table(table_seed_ ^
                          (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(previous + 1)));
    std::normal_distribution<float> normal;
    std::vector<float> q(static_cast<size_t>(vocab_size_));
    double total = 0;
    for (float& x : q) {
      x = std::exp(spread_ * normal(table));
      total += x;
    }
    for (float& x : q) x = static_cast<float>(x / total);
    return q;
  }

  int64_t vocab_size_;
  uint64_t table_seed_;
  float spread_;
  bool greedy_;
  std::mt19937_64 rng_;
};

class SelfSession : public DraftSession {
 public:
  SelfSession(SelfDraftSource* source, std::shared_ptr<const PreparedModel> model, KvCache cache,
              const SelfDraftSource::Options& options, uint64_t seed, int64_t first_position)
      : source_(source),
        model_(std::move(model)),
        cache_(std::move(cache)),
        options_(options),
        rng_(seed),
        // Positions of a cached prefix are never delivered: nothing to compare there.
        target_rows_(static_cast<size_t>(first_position)),
        compared_(static_cast<size_t>(first_position)) {}

  ~SelfSession() override {
    if (options_.check_hidden) source_->AddHiddenCheck(check_);
  }

  absl::StatusOr<Draft> Propose(int32_t k, std::span<const int32_t> context,
                                const HiddenStates& target_hidden) override {
    if (context.empty()) return absl::InvalidArgumentError("empty context");
    if (options_.check_hidden) RecordTarget(context, target_hidden);

    // Keep the cached prefix the context still agrees with; always recompute the last token.
    size_t common = 0;
    while (common < cached_.size() && common + 1 < context.size() &&
           cached_[common] == context[common]) {
      ++common;
    }
    Rewind(common);

    Draft draft;
    std::vector<float> logits, hidden;
    std::vector<int32_t> feed(context.begin() + static_cast<long>(common), context.end());
    for (int32_t i = 0; i < k; ++i) {
      if (cache_.length() + static_cast<int64_t>(feed.size()) > cache_.capacity()) break;
      logits.clear();
      hidden.clear();
      SequenceChunk chunk{&cache_, feed, false};
      absl::Status status = model_->Forward({&chunk, 1}, &logits, &hidden);
      if (!status.ok()) return status;
      cached_.insert(cached_.end(), feed.begin(), feed.end());
      if (options_.check_hidden) {
        const size_t h = static_cast<size_t>(model_->config().hidden_size);
        for (size_t r = 0; r < feed.size(); ++r) {
          own_rows_.emplace_back(hidden.begin() + static_cast<long>(r * h),
                                 hidden.begin() + static_cast<long>((r + 1) * h));
        }
      }
      const int32_t token = Choose(logits, &draft);
      draft.tokens.push_back(token);
      feed = {token};
    }
    if (options_.check_hidden) Compare();
    proposed_from_ = context.size();
    return draft;
  }

  void Commit(int32_t accepted) override {
    // Context and kept drafts stay; the last fed token is at most the second-to-last draft.
    Rewind(std::min(cached_.size(), proposed_from_ + static_cast<size_t>(accepted)));
  }

 private:
  int32_t Choose(const std::vector<float>& logits, Draft* draft) {
    if (options_.greedy) {
      return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    const float max = *std::max_element(logits.begin(), logits.end());
    std::vector<float> q(logits.size());
    double total = 0;
    for (size_t j = 0; j < q.size(); ++j) {
      q[j] = std::exp((logits[j] - max) / options_.temperature);
      total += q[j];
    }
    const float uniform = options_.uniform_mix / static_cast<float>(q.size());
    for (float& x : q) x = static_cast<float>((1.0 - options_.uniform_mix) * x / total) + uniform;
    std::discrete_distribution<int32_t> pick(q.begin(), q.end());
    const int32_t token = pick(rng_);
    draft->probs.push_back(std::move(q));
    return token;
  }

  void Rewind(size_t length) {
    cache_.Truncate(static_cast<int64_t>(length));
    cached_.resize(std::min(cached_.size(), length));
    if (own_rows_.size() > length) own_rows_.resize(length);
  }

  void RecordTarget(std::span<const int32_t> context, const HiddenStates& hidden) {
    if (hidden.first_position != static_cast<int64_t>(target_rows_.size()) ||
        hidden.first_position + hidden.rows() != static_cast<int64_t>(context.size()) - 1) {
      ++check_.contract_violations;
    }
    const size_t h = static_cast<size_t>(hidden.hidden_size);
    for (int64_t r = 0; r < hidden.rows(); ++r) {
      target_rows_.emplace_back(hidden.values.begin() + static_cast<long>(r * h),
                                hidden.values.begin() + static_cast<long>((r + 1) * h));
    }
  }

  void Compare() {
    const size_t end = std::min(target_rows_.size(), own_rows_.size());
    for (; compared_ < end; ++compared_) {
      const std::vector<float>& a = target_rows_[compared_];
      const std::vector<float>& b = own_rows_[compared_];
      float diff = a.size() == b.size() ? 0.0f : std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < std::min(a.size(), b.size()); ++j) {
        diff = std::max(diff, std::abs(a[j] - b[j]));
      }
      check_.max_abs_diff = std::max(check_.max_abs_diff, diff);
      ++check_.rows_compared;
    }
  }

  SelfDraftSource* source_;
  std::shared_ptr<const PreparedModel> model_;
  KvCache cache_;
  SelfDraftSource::Options options_;
  std::mt19937_64 rng_;
  std::vector<int32_t> cached_;  // the tokens whose keys and values cache_ holds
  size_t proposed_from_ = 0;     // context length of the last proposal
  // Hidden-state check: rows by position, from the target and from this session.
  std::vector<std::vector<float>> target_rows_, own_rows_;
  size_t compared_ = 0;
  SelfDraftSource::HiddenCheck check_;
};

}  // namespace

ScriptedDraftSource::ScriptedDraftSource(std::vector<Script> scripts, int64_t vocab_size,
                                         double correct_probability, uint64_t seed)
    : scripts_(std::move(scripts)),
      vocab_size_(vocab_size),
      correct_probability_(correct_probability),
      seed_(seed) {}

absl::StatusOr<std::unique_ptr<DraftSession>> ScriptedDraftSource::StartSession(
    const DraftSessionStart& start) {
  // The script whose prompt starts the context (a resumed sequence's context has output too).
  const Script* found = nullptr;
  for (const Script& script : scripts_) {
    if (script.prompt.size() <= start.context.size() &&
        std::equal(script.prompt.begin(), script.prompt.end(), start.context.begin())) {
      found = &script;
    }
  }
  return std::make_unique<ScriptedSession>(
      found, found != nullptr ? found->prompt.size() : start.context.size(), vocab_size_,
      correct_probability_, seed_ + 0x9e3779b97f4a7c15ull * ++sessions_);
}

NoisyDraftSource::NoisyDraftSource(int64_t vocab_size, uint64_t seed, float spread, bool greedy)
    : vocab_size_(vocab_size), seed_(seed), spread_(spread), greedy_(greedy) {}

absl::StatusOr<std::unique_ptr<DraftSession>> NoisyDraftSource::StartSession(
    const DraftSessionStart&) {
  return std::make_unique<NoisySession>(vocab_size_, seed_, spread_, greedy_,
                                        seed_ + 0x9e3779b97f4a7c15ull * ++sessions_);
}

SelfDraftSource::SelfDraftSource(std::shared_ptr<const PreparedModel> model, Options options)
    : model_(std::move(model)), options_(options) {}

absl::StatusOr<std::unique_ptr<DraftSession>> SelfDraftSource::StartSession(
    const DraftSessionStart& start) {
  absl::StatusOr<KvCache> cache = model_->NewCache(start.max_length);
  if (!cache.ok()) return cache.status();
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mutex_);
    session = ++sessions_;
  }
  return std::make_unique<SelfSession>(this, model_, std::move(*cache), options_,
                                       options_.seed + 0x9e3779b97f4a7c15ull * session,
                                       start.first_position);
}

SelfDraftSource::HiddenCheck SelfDraftSource::hidden_check() const {
  absl::MutexLock lock(&mutex_);
  return check_;
}

void SelfDraftSource::AddHiddenCheck(const HiddenCheck& check) {
  absl::MutexLock lock(&mutex_);
  check_.rows_compared += check.rows_compared;
  check_.max_abs_diff = std::max(check_.max_abs_diff, check.max_abs_diff);
  check_.contract_violations += check.contract_violations;
}

}  // namespace kiln
