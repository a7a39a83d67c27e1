// Verification of a draft against the target's logits (docs/mtp.md, "Speculative decoding
// loop"), kept apart from the step loop so that its statistics can be tested directly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/draft_source.h"
#include "engine/sampling.h"

namespace kiln {

struct Verification {
  std::vector<SampledToken> tokens;  // the accepted drafts, then the target's own token
  int32_t accepted = 0;              // drafts kept: tokens.size() - 1
};

// Verifies `draft` against `rows`: draft.tokens.size() + 1 rows of `vocab` logits, row i being
// the target's prediction after the context and the first i drafts.
//   Greedy samplers keep drafts while they equal the argmax (after penalties); the first
//   mismatch is replaced by the argmax, and when all match the last row adds a bonus token.
//   Sampling ones keep draft x with probability min(1, p(x)/q(x)), p being the distribution
//   Sample would draw from; a rejected x is replaced by a draw from normalize(max(p − q, 0)),
//   and when all are kept the bonus is drawn from p at the last row. The tokens then have
//   exactly the distribution of plain sampling.
// Every returned token has gone through sampler.Accept in order, since penalties at a position
// depend on the tokens before it. With top_logprobs > 0 the tokens carry log-probabilities as
// Sample's do; otherwise their logprob is left 0.
Verification VerifyDraft(Sampler& sampler, std::span<const float> rows, int64_t vocab,
                         const Draft& draft, int32_t top_logprobs);

}  // namespace kiln
