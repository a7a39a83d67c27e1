#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

// Rows per forward call: bounds the logits held at once (rows × vocab floats) for large
// vocabularies; the cache carries the window across calls, so the result does not depend on it.
constexpr int64_t kRowsPerCall = 64;

// −log softmax(row)[target], in double.
double NegativeLogLikelihood(std::span<const float> row, int32_t target) {
  const float max = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - max);
  return std::log(sum) + max - static_cast<double>(row[static_cast<size_t>(target)]);
}

// Adds the NLL of `targets` under consecutive logits rows.
double SumNll(std::span<const float> logits, int64_t vocab, std::span<const int32_t> targets) {
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    total += NegativeLogLikelihood(
        logits.subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)), targets[r]);
  }
  return total;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodeDocuments(const Tokenizer& tokenizer,
                                                     absl::string_view text) {
  const std::optional<int32_t> eos = tokenizer.special_tokens().eos;
  if (!eos.has_value()) {
    return absl::FailedPreconditionError("the tokenizer has no EOS token to end documents with");
  }
  std::vector<int32_t> ids;
  for (absl::string_view document : absl::StrSplit(text, "\n\n")) {
    document = absl::StripAsciiWhitespace(document);
    if (document.empty()) continue;
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> encoded,
                          tokenizer.Encode(document, /*add_special_tokens=*/false));
    ids.insert(ids.end(), encoded.begin(), encoded.end());
    ids.push_back(*eos);
  }
  return ids;
}

absl::StatusOr<PerplexityResult> Perplexity(const PreparedModel& model,
                                            std::span<const int32_t> ids,
                                            const PerplexityOptions& options) {
  const int64_t context = options.context;
  if (context < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("perplexity context must be ≥ 2, got ", context));
  }
  if (context > model.context_limit()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "perplexity context ", context, " exceeds the model's limit of ", model.context_limit()));
  }
  // Window starts: 0, context, 2·context, … below size − context − 1 (the reference's range).
  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t windows = n - context - 1 > 0 ? (n - context - 1 + context - 1) / context : 0;
  if (options.max_windows > 0) windows = std::min(windows, options.max_windows);
  if (windows == 0) {
    return absl::InvalidArgumentError(absl::StrCat("perplexity needs at least ", context + 2,
                                                   " tokens for one window of ", context, ", got ",
                                                   n));
  }
  const bool score_mtp = options.mtp && model.num_mtp_heads() > 0;
  const int64_t vocab = model.config().vocab_size;
  const size_t hidden_size = static_cast<size_t>(model.config().hidden_size);

  PerplexityResult result;
  result.windows = windows;
  double nll = 0, mtp_nll = 0;
  std::vector<float> logits, hidden, mtp_logits;
  for (int64_t w = 0; w < windows; ++w) {
    const std::span<const int32_t> window =
        ids.subspan(static_cast<size_t>(w * context), static_cast<size_t>(context + 1));
    KILN_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(context));
    hidden.clear();
    for (int64_t first = 0; first < context; first += kRowsPerCall) {
      const int64_t rows = std::min(kRowsPerCall, context - first);
      const std::span<const int32_t> tokens =
          window.subspan(static_cast<size_t>(first), static_cast<size_t>(rows));
      SequenceChunk chunk{&cache, tokens, /*all_logits=*/true};
      logits.clear();
      KILN_RETURN_IF_ERROR(model.Forward({&chunk, 1}, &logits, score_mtp ? &hidden : nullptr));
      nll += SumNll(logits, vocab,
                    window.subspan(static_cast<size_t>(first) + 1, static_cast<size_t>(rows)));
    }
    result.scored += context;
    if (!score_mtp) continue;
    // Head 0 at position p reads token p + 1 and h_p and predicts token p + 2.
    KILN_ASSIGN_OR_RETURN(KvCache mtp_cache, model.NewMtpCache(cache, context));
    for (int64_t first = 0; first < context - 1; first += kRowsPerCall) {
      const int64_t rows = std::min(kRowsPerCall, context - 1 - first);
      MtpChunk chunk{
          &mtp_cache, window.subspan(static_cast<size_t>(first) + 1, static_cast<size_t>(rows)),
          std::span<const float>(hidden).subspan(static_cast<size_t>(first) * hidden_size,
                                                 static_cast<size_t>(rows) * hidden_size),
          /*all_logits=*/true};
      mtp_logits.clear();
      KILN_RETURN_IF_ERROR(model.MtpForward(0, {&chunk, 1}, &mtp_logits));
      mtp_nll += SumNll(mtp_logits, vocab,
                        window.subspan(static_cast<size_t>(first) + 2, static_cast<size_t>(rows)));
    }
    result.mtp_scored += context - 1;
  }
  result.mean_nll = nll / static_cast<double>(result.scored);
  result.perplexity = std::exp(result.mean_nll);
  if (result.mtp_scored > 0) {
    result.mtp_mean_nll = mtp_nll / static_cast<double>(result.mtp_scored);
    result.mtp_perplexity = std::exp(result.mtp_mean_nll);
  }
  return result;
}

}  // namespace kiln
