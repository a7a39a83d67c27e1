// What kiln-loadgen sends and when: prompt and output lengths drawn from distributions, synthetic
// prompts (token ids or text) or prompts read from a JSONL file, and Poisson arrivals for the
// open loop.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/loadgen/stats.h"

namespace kiln::loadgen {

// A distribution of token counts; every draw is at least 1.
struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kNormal };
  Kind kind = Kind::kFixed;
  double a = 128;  // fixed: the value; uniform: low; normal: mean
  double b = 0;    // uniform: high (inclusive); normal: standard deviation

  static LengthDistribution Fixed(int64_t value) { return {Kind::kFixed, double(value), 0}; }
  // "fixed" (keeps `fallback`'s value), "fixed:N", "uniform:A:B", "normal:MEAN:SD".
  static absl::StatusOr<LengthDistribution> Parse(const std::string& text,
                                                  const LengthDistribution& fallback);
  int32_t Sample(std::mt19937_64& rng) const;
  double mean() const;
  std::string ToString() const;
};

enum class PromptKind { kIds, kText };

struct WorkloadOptions {
  LengthDistribution input = LengthDistribution::Fixed(128);
  LengthDistribution output = LengthDistribution::Fixed(128);
  PromptKind prompt_kind = PromptKind::kIds;
  int32_t vocab_size = 256;  // synthetic ids are drawn from [0, vocab_size)
  std::string prompts_file;  // JSONL; replaces the synthetic prompts
  uint64_t seed = 0;
};

// One request's prompt and length.
struct RequestSpec {
  std::string text;          // when is_text
  std::vector<int32_t> ids;  // otherwise
  bool is_text = false;
  int32_t max_tokens = 0;
  int32_t input_tokens = 0;  // ids: exact; text: the number of words (the server reports more)
};

// Text for a token-id prompt where only text can go (a chat message): one word per id, the id's
// word in a fixed list of 64 common words (id mod 64), so that the prompt's length in the
// server's tokens is near the number of ids, not equal to it (its usage reports the real one).
std::string WordsForIds(const std::vector<int32_t>& ids);

// A line of a prompts file: {"prompt": "..."} or {"prompt_ids": [1, 2]}, optional "max_tokens".
struct FilePrompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
  std::optional<int32_t> max_tokens;
};
// Errors name the file and line. Blank lines are skipped; an empty file is an error.
absl::StatusOr<std::vector<FilePrompt>> LoadPromptsFile(const std::string& path);

// Hands out request specs; deterministic for a seed. Not thread-safe.
class PromptSource {
 public:
  // Reads the prompts file when one is named.
  static absl::StatusOr<PromptSource> Create(const WorkloadOptions& options);
  // File prompts are used in order and then again from the start; their max_tokens, when
  // absent, is drawn from the output distribution.
  RequestSpec Next();

 private:
  PromptSource(WorkloadOptions options, std::vector<FilePrompt> file)
      : options_(std::move(options)), file_(std::move(file)), rng_(options_.seed) {}

  WorkloadOptions options_;
  std::vector<FilePrompt> file_;
  size_t next_file_ = 0;
  std::mt19937_64 rng_;
};

// Which requests the client ends on purpose (--cancel-fraction, --disconnect-fraction) and after
// how many received tokens: uniform in [1, max_tokens), so always before the last one. Drawn from
// a generator of its own, in request order, the same number of draws for every request, so that a
// seed gives the same plan for request N whatever else the run draws. A request of fewer than 2
// tokens has no such count: it is left alone.
class FaultPlanner {
 public:
  struct Plan {
    ClientFault fault = ClientFault::kNone;
    int32_t after_tokens = 0;
  };
  FaultPlanner(double cancel_fraction, double disconnect_fraction, uint64_t seed);
  Plan Next(int32_t max_tokens);

 private:
  double cancel_fraction_, disconnect_fraction_;
  std::mt19937_64 rng_;
};

// Inter-arrival gaps of a Poisson process (exponential, mean 1/rate seconds).
class PoissonArrivals {
 public:
  PoissonArrivals(double rate_per_second, uint64_t seed) : rng_(seed), gap_(rate_per_second) {}
  double NextGapSeconds() { return gap_(rng_); }

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

}  // namespace kiln::loadgen
