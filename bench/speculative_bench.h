// kiln_speculative_bench's two modes share this: a run of the engine over a set of prompts.
//   speculative_bench.cc: drafts replayed from a script (the cost of verification, the upper
//     bound, predictions), on a synthesized model of a real shape;
//   speculative_mtp.cc: drafts from a model's own MTP head on held-out text (acceptance by
//     position, tokens/s with and without speculation, the best draft depth).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/draft_source.h"
#include "engine/engine.h"
#include "models/prepared_model.h"

namespace kiln::bench {

struct Run {
  double decode_seconds = 0;  // first token → last token, slowest request
  int64_t decoded = 0;        // tokens after the first, all requests
  uint64_t steps = 0;         // target forwards, prefill steps excluded
  double draft_seconds = 0;
  SpeculativeStats speculative;
  uint64_t verifications = 0;
  std::vector<uint64_t> accepted_at_position;  // EngineStats::accepted_at_position
  std::vector<std::vector<int32_t>> outputs;
};

// Generation of `tokens` tokens (EOS ignored) for every prompt, all of them running at once in
// one engine, with `k` drafts per step from `source` (none: 0). Greedy unless `sampling` says
// otherwise; prompt i samples with seed sampling.seed + i.
absl::StatusOr<Run> Generate(std::shared_ptr<const PreparedModel> model,
                             const std::vector<std::vector<int32_t>>& prompts, int32_t tokens,
                             std::shared_ptr<DraftSource> source, int32_t k,
                             const SamplingParams& sampling = {});

// Median seconds of one target forward of each entry of `rows` new positions after `prompt`
// (logits for all of them when more than one, as verification asks), interleaved over `rounds`
// rounds after 4 to warm up, rolled back each time.
absl::StatusOr<std::vector<double>> ForwardSeconds(const PreparedModel& model,
                                                   std::span<const int32_t> prompt,
                                                   const std::vector<int32_t>& rows, int rounds);

// The MTP mode (speculative_mtp.cc); returns the exit code.
int RunMtpBench();

}  // namespace kiln::bench
