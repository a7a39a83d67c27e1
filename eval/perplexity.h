// Perplexity of a text under a PreparedModel, computed from kiln's own logits: the number a
// training script's evaluation reports, so that the two can be compared (tools/default_model/
// evaluate.py defines the same documents and windows). The stream is cut into non-overlapping
// windows of `context` + 1 tokens; in each, the model reads the first `context` tokens from an
// empty cache and every position is scored on the next token. Models with MTP heads are also scored
// on the first head's prediction of the token after next (position p reads h_p and token p + 1, as
// the draft step does), over the window's first `context` - 1 positions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/prepared_model.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct PerplexityOptions {
  int64_t context = 512;    // positions per window
  int64_t max_windows = 0;  // 0 = every whole window of the stream
  bool mtp = true;          // also score the first MTP head, when the model has one
};

struct PerplexityResult {
  int64_t windows = 0;
  int64_t scored = 0;      // positions scored by the main model
  double mean_nll = 0;     // nats per scored position
  double perplexity = 0;   // exp(mean_nll)
  int64_t mtp_scored = 0;  // 0 when no MTP head was scored
  double mtp_mean_nll = 0;
  double mtp_perplexity = 0;
};

// Token stream of a text of documents separated by blank lines: each document, trimmed of
// surrounding whitespace, encoded without special tokens and followed by the tokenizer's EOS
// (how tools/default_model trains and evaluates). FailedPrecondition when the tokenizer has no
// EOS.
absl::StatusOr<std::vector<int32_t>> EncodeDocuments(const Tokenizer& tokenizer,
                                                     absl::string_view text);

// InvalidArgument when the stream holds no whole window (fewer than context + 2 tokens, as the
// reference evaluation counts them) or the context exceeds the model's limit.
absl::StatusOr<PerplexityResult> Perplexity(const PreparedModel& model,
                                            std::span<const int32_t> ids,
                                            const PerplexityOptions& options = {});

}  // namespace kiln
