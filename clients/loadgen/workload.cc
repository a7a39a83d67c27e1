#include "clients/loadgen/workload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace kiln::loadgen {
namespace {

// Common English words: text prompts look like text to a tokenizer.
constexpr std::array<const char*, 64> kWords = {
    "the",   "kiln",  "fire", "clay", "glaze", "heat", "pot",   "time",  "of",   "and",  "to",
    "a",     "in",    "is",   "it",   "that",  "was",  "for",   "on",    "are",  "with", "as",
    "his",   "they",  "at",   "be",   "this",  "from", "have",  "or",    "by",   "one",  "had",
    "not",   "but",   "what", "all",  "were",  "when", "we",    "there", "can",  "an",   "your",
    "which", "their", "said", "if",   "do",    "will", "each",  "about", "how",  "up",   "out",
    "them",  "then",  "she",  "many", "some",  "so",   "these", "would", "other"};

absl::StatusOr<double> ParseNumber(absl::string_view text, const std::string& whole) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("'", whole, "': '", text, "' is not a number"));
  }
  return value;
}

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(const std::string& text,
                                                             const LengthDistribution& fallback) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  const std::string& kind = parts[0];
  std::vector<double> values;
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::StatusOr<double> value = ParseNumber(parts[i], text);
    if (!value.ok()) return value.status();
    values.push_back(*value);
  }
  LengthDistribution out;
  if (kind == "fixed" && values.size() <= 1) {
    out = values.empty() ? LengthDistribution{Kind::kFixed, fallback.a, 0}
                         : LengthDistribution{Kind::kFixed, values[0], 0};
    if (out.a < 1) return absl::InvalidArgumentError(absl::StrCat("'", text, "': must be ≥ 1"));
  } else if (kind == "uniform" && values.size() == 2) {
    out = {Kind::kUniform, values[0], values[1]};
    if (out.a < 1 || out.b < out.a) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "': needs 1 ≤ A ≤ B"));
    }
  } else if (kind == "normal" && values.size() == 2) {
    out = {Kind::kNormal, values[0], values[1]};
    if (out.a < 1 || out.b < 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "': needs MEAN ≥ 1, SD ≥ 0"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not fixed[:N], uniform:A:B or normal:MEAN:SD"));
  }
  return out;
}

int32_t LengthDistribution::Sample(std::mt19937_64& rng) const {
  double value = a;
  switch (kind) {
    case Kind::kFixed:
      break;
    case Kind::kUniform:
      value = static_cast<double>(std::uniform_int_distribution<int64_t>(
          static_cast<int64_t>(std::llround(a)), static_cast<int64_t>(std::llround(b)))(rng));
      break;
    case Kind::kNormal:
      value = b > 0 ? std::normal_distribution<double>(a, b)(rng) : a;
      break;
  }
  return static_cast<int32_t>(std::clamp<double>(std::llround(value), 1, 1 << 30));
}

double LengthDistribution::mean() const { return kind == Kind::kUniform ? (a + b) / 2 : a; }

std::string LengthDistribution::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return absl::StrCat("fixed:", a);
    case Kind::kUniform:
      return absl::StrCat("uniform:", a, ":", b);
    case Kind::kNormal:
      return absl::StrCat("normal:", a, ":", b);
  }
  return "?";
}

std::string WordsForIds(const std::vector<int32_t>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::StrAppend(&text, i ? " " : "", kWords[static_cast<uint32_t>(ids[i]) % kWords.size()]);
  }
  return text;
}

absl::StatusOr<std::vector<FilePrompt>> LoadPromptsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts-file: cannot read ", path));
  std::vector<FilePrompt> prompts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(path, ":", number, ": ");
    nlohmann::json json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "not a JSON object"));
    }
    FilePrompt prompt;
    if (auto it = json.find("prompt"); it != json.end()) {
      if (!it->is_string()) return absl::InvalidArgumentError(where + "\"prompt\" is not a string");
      prompt.text = it->get<std::string>();
    } else if (auto ids = json.find("prompt_ids"); ids != json.end()) {
      if (!ids->is_array() || ids->empty()) {
        return absl::InvalidArgumentError(where + "\"prompt_ids\" is not a non-empty array");
      }
      for (const nlohmann::json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          return absl::InvalidArgumentError(where + "\"prompt_ids\" holds a non-id");
        }
        prompt.ids.push_back(id.get<int32_t>());
      }
    } else {
      return absl::InvalidArgumentError(where + "needs \"prompt\" or \"prompt_ids\"");
    }
    if (auto it = json.find("max_tokens"); it != json.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(where + "\"max_tokens\" is not a positive integer");
      }
      prompt.max_tokens = it->get<int32_t>();
    }
    prompts.push_back(std::move(prompt));
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no prompts"));
  return prompts;
}

absl::StatusOr<PromptSource> PromptSource::Create(const WorkloadOptions& options) {
  std::vector<FilePrompt> file;
  if (!options.prompts_file.empty()) {
    absl::StatusOr<std::vector<FilePrompt>> loaded = LoadPromptsFile(options.prompts_file);
    if (!loaded.ok()) return loaded.status();
    file = *std::move(loaded);
  }
  if (options.vocab_size < 1) return absl::InvalidArgumentError("--vocab-size must be ≥ 1");
  return PromptSource(options, std::move(file));
}

RequestSpec PromptSource::Next() {
  RequestSpec spec;
  if (!file_.empty()) {
    const FilePrompt& prompt = file_[next_file_];
    next_file_ = (next_file_ + 1) % file_.size();
    spec.is_text = prompt.text.has_value();
    if (spec.is_text) {
      spec.text = *prompt.text;
      spec.input_tokens = static_cast<int32_t>(std::count(spec.text.begin(), spec.text.end(), ' ') +
                                               (spec.text.empty() ? 0 : 1));
    } else {
      spec.ids = prompt.ids;
      spec.input_tokens = static_cast<int32_t>(spec.ids.size());
    }
    spec.max_tokens = prompt.max_tokens ? *prompt.max_tokens : options_.output.Sample(rng_);
    return spec;
  }
  const int32_t length = options_.input.Sample(rng_);
  spec.input_tokens = length;
  spec.max_tokens = options_.output.Sample(rng_);
  if (options_.prompt_kind == PromptKind::kText) {
    spec.is_text = true;
    std::uniform_int_distribution<size_t> word(0, kWords.size() - 1);
    for (int32_t i = 0; i < length; ++i)
      absl::StrAppend(&spec.text, i ? " " : "", kWords[word(rng_)]);
  } else {
    std::uniform_int_distribution<int32_t> id(0, options_.vocab_size - 1);
    spec.ids.reserve(length);
    for (int32_t i = 0; i < length; ++i) spec.ids.push_back(id(rng_));
  }
  return spec;
}

FaultPlanner::FaultPlanner(double cancel_fraction, double disconnect_fraction, uint64_t seed)
    : cancel_fraction_(cancel_fraction),
      disconnect_fraction_(disconnect_fraction),
      // Apart from the prompts' generator, which is seeded with the seed itself.
      rng_(seed ^ 0x9e3779b97f4a7c15ULL) {}

FaultPlanner::Plan FaultPlanner::Next(int32_t max_tokens) {
  const double which = std::uniform_real_distribution<double>(0, 1)(rng_);
  const double where = std::uniform_real_distribution<double>(0, 1)(rng_);
  Plan plan;
  if (max_tokens < 2) return plan;
  if (which < cancel_fraction_) {
    plan.fault = ClientFault::kCancel;
  } else if (which < cancel_fraction_ + disconnect_fraction_) {
    plan.fault = ClientFault::kDisconnect;
  } else {
    return plan;
  }
  // Uniform over the max_tokens − 1 counts 1 .. max_tokens − 1.
  plan.after_tokens =
      1 + std::min<int32_t>(max_tokens - 2, static_cast<int32_t>(where * (max_tokens - 1)));
  return plan;
}

}  // namespace kiln::loadgen
