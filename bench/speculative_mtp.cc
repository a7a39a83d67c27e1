// kiln_speculative_bench --model DIR: speculative decoding with the model's own MTP head, on
// prompts cut from held-out text. For each draft depth (1, 2, 3 by default) and each number of
// concurrent streams (1 and 16) it prints decode tokens/s against no speculation, the acceptance
// rate at each draft position, the mean draft tokens accepted per verification and the share of
// time spent drafting; then the depth that decodes fastest at each stream count. Greedy outputs
// with and without speculation must be identical: the bench fails otherwise.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "bench/bench_util.h"
#include "bench/speculative_bench.h"
#include "engine/mtp_draft_source.h"
#include "eval/perplexity.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "",
          "a checkpoint with MTP heads (e.g. checkpoints/kiln-brown): measure speculative decoding "
          "with its own drafts on held-out text; unset: replayed drafts on --preset");
ABSL_FLAG(std::string, prompts_file, "tests/data/kiln-brown/heldout.txt",
          "--model: text the prompts are cut from (documents separated by blank lines)");
ABSL_FLAG(int32_t, prompts, 16, "--model: prompts, cut from the text at even spacing");
ABSL_FLAG(std::string, depths, "1,2,3", "--model: draft depths to measure");
ABSL_FLAG(float, temperature, 0,
          "--model: sampling temperature (0: greedy, whose outputs must not change with drafts)");
ABSL_FLAG(float, top_p, 1, "--model: nucleus sampling mass, with --temperature");
ABSL_FLAG(std::string, streams, "1,16",
          "--model: concurrent streams to measure at (the prompts run in groups of this size)");

ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int32_t, prompt_tokens);
ABSL_DECLARE_FLAG(int32_t, decode_tokens);
ABSL_DECLARE_FLAG(int32_t, repeats);

namespace kiln::bench {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseList(const std::string& text, const char* flag) {
  std::vector<int32_t> values;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(piece, &value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad value '", piece, "'"));
    }
    values.push_back(value);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return values;
}

// One measurement: every prompt, in groups of `streams` running at once.
struct Measurement {
  double decoded = 0;
  double decode_seconds = 0;  // summed over the groups (each: its slowest stream)
  double draft_seconds = 0;
  uint64_t steps = 0;
  uint64_t verifications = 0;
  int64_t accepted = 0;
  std::vector<uint64_t> accepted_at_position;
  std::vector<std::vector<int32_t>> outputs;
  double tokens_per_second() const { return decoded / decode_seconds; }
};

absl::StatusOr<Measurement> Measure(std::shared_ptr<const PreparedModel> model,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    int32_t streams, int32_t tokens, int32_t depth,
                                    const SamplingParams& sampling) {
  Measurement m;
  m.accepted_at_position.assign(kMaxDraftTokens, 0);
  std::shared_ptr<DraftSource> source;
  if (depth > 0) {
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<MtpDraftSource> mtp, MtpDraftSource::Create(model));
    source = std::move(mtp);
  }
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(streams)) {
    const size_t end = std::min(prompts.size(), first + static_cast<size_t>(streams));
    const std::vector<std::vector<int32_t>> group(prompts.begin() + static_cast<ptrdiff_t>(first),
                                                  prompts.begin() + static_cast<ptrdiff_t>(end));
    SamplingParams group_sampling = sampling;
    group_sampling.seed = sampling.seed.value_or(0) + first;  // a seed per prompt, any grouping
    KILN_ASSIGN_OR_RETURN(Run run, Generate(model, group, tokens, source, depth, group_sampling));
    m.decoded += static_cast<double>(run.decoded);
    m.decode_seconds += run.decode_seconds;
    m.draft_seconds += run.draft_seconds;
    m.steps += run.steps;
    m.verifications += run.verifications;
    m.accepted += run.speculative.accepted;
    for (size_t i = 0; i < run.accepted_at_position.size(); ++i) {
      m.accepted_at_position[i] += run.accepted_at_position[i];
    }
    m.outputs.insert(m.outputs.end(), run.outputs.begin(), run.outputs.end());
  }
  return m;
}

// Median seconds of one MTP draft step of head 0 for one row, after the prompt's positions.
absl::StatusOr<double> DraftRowSeconds(std::shared_ptr<const PreparedModel> model,
                                       const std::vector<int32_t>& prompt, int rounds) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  KILN_ASSIGN_OR_RETURN(KvCache cache, model->NewCache(n + 1));
  std::vector<float> logits, hidden;
  SequenceChunk chunk{&cache, prompt, false};
  KILN_RETURN_IF_ERROR(model->Forward({&chunk, 1}, &logits, &hidden));
  KILN_ASSIGN_OR_RETURN(KvCache head_cache, model->NewMtpCache(cache, n + 1));
  const size_t width = static_cast<size_t>(model->config().hidden_size);
  // Head 0 catches up on all but the last position, then drafts from the last one again and
  // again.
  MtpChunk catch_up{&head_cache, std::span<const int32_t>(prompt).subspan(1),
                    std::span<const float>(hidden).first((prompt.size() - 1) * width), false};
  KILN_RETURN_IF_ERROR(model->MtpForward(0, {&catch_up, 1}, &logits));
  const int32_t next = prompt.back();
  std::vector<double> samples;
  for (int r = 0; r < 4 + rounds; ++r) {
    MtpChunk row{&head_cache, {&next, 1}, std::span<const float>(hidden).last(width), false};
    logits.clear();
    const auto start = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(model->MtpForward(0, {&row, 1}, &logits));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    head_cache.Truncate(n - 1);
    if (r >= 4) samples.push_back(seconds);
  }
  return Median(samples);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

absl::Status MtpBench() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t tokens = absl::GetFlag(FLAGS_decode_tokens);
  const int32_t count = absl::GetFlag(FLAGS_prompts);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> depths,
                        ParseList(absl::GetFlag(FLAGS_depths), "depths"));
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> stream_counts,
                        ParseList(absl::GetFlag(FLAGS_streams), "streams"));
  for (int32_t depth : depths) {
    if (depth < 1 || depth > kMaxDraftTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("--depths: each in [1, ", kMaxDraftTokens, "], got ", depth));
    }
  }
  if (count < 1 || prompt_tokens < 1 || tokens < 2) {
    return absl::InvalidArgumentError("--prompts, --prompt_tokens ≥ 1 and --decode_tokens ≥ 2");
  }

  LoadOptions options;
  KILN_ASSIGN_OR_RETURN(options.compute_dtype, ParseComputeDType(absl::GetFlag(FLAGS_dtype)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> loaded,
                        LoadModel(dir, std::shared_ptr<Backend>(std::move(backend)), options));
  std::shared_ptr<const PreparedModel> model(std::move(loaded));
  if (model->num_mtp_heads() == 0) {
    return absl::FailedPreconditionError(dir + " has no MTP heads to draft with");
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromDirectory(dir));
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(absl::GetFlag(FLAGS_prompts_file)));
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeDocuments(*tokenizer, text));
  if (static_cast<int64_t>(ids.size()) < static_cast<int64_t>(count) * prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_prompts_file), " has ",
                                                   ids.size(), " tokens, too few for ", count,
                                                   " prompts of ", prompt_tokens));
  }
  SamplingParams sampling;
  sampling.temperature = absl::GetFlag(FLAGS_temperature);
  sampling.top_p = absl::GetFlag(FLAGS_top_p);
  sampling.seed = 1;
  KILN_RETURN_IF_ERROR(ValidateSamplingParams(sampling));
  const bool greedy = sampling.temperature == 0.0f;
  std::vector<std::vector<int32_t>> prompts;
  const size_t stride = ids.size() / static_cast<size_t>(count);
  for (int32_t i = 0; i < count; ++i) {
    const auto begin = ids.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * stride);
    prompts.emplace_back(begin, begin + prompt_tokens);
  }
  std::printf(
      "%s: %s, %d MTP head(s); %d prompts of %d held-out tokens (%s), %d tokens each, %s; "
      "median of %d\n",
      dir.c_str(), std::string(DTypeName(model->compute_dtype())).c_str(), model->num_mtp_heads(),
      count, prompt_tokens, absl::GetFlag(FLAGS_prompts_file).c_str(), tokens,
      greedy ? "greedy"
             : absl::StrFormat("sampled at temperature %g, top_p %g (seeded)", sampling.temperature,
                               sampling.top_p)
                   .c_str(),
      repeats);

  // Where the time of a step goes: the target forward at 1 and k + 1 positions, one MTP draft
  // row.
  {
    std::vector<int32_t> rows = {1};
    for (int32_t depth : depths) rows.push_back(depth + 1);
    // On a thread of its own: OpenMP keeps a team of workers per thread that calls it, and an
    // idle team left on this thread would compete with the engine's for the cores.
    absl::StatusOr<std::vector<double>> measured;
    absl::StatusOr<double> draft_seconds;
    std::thread([&] {
      measured = ForwardSeconds(*model, prompts[0], rows, 8 * repeats);
      draft_seconds = DraftRowSeconds(model, prompts[0], 8 * repeats);
    }).join();
    KILN_ASSIGN_OR_RETURN(std::vector<double> seconds, std::move(measured));
    std::string line = absl::StrFormat("target forward: 1 position %.3f ms", seconds[0] * 1e3);
    for (size_t i = 1; i < rows.size(); ++i) {
      absl::StrAppendFormat(&line, "; %d positions %.3f ms (%.2f×)", rows[i], seconds[i] * 1e3,
                            seconds[i] / seconds[0]);
    }
    KILN_ASSIGN_OR_RETURN(double draft, std::move(draft_seconds));
    std::printf("%s\nMTP draft step, 1 row: %.3f ms (%.2f× a 1-position target forward)\n",
                line.c_str(), draft * 1e3, draft / seconds[0]);
  }

  for (int32_t streams : stream_counts) {
    if (streams < 1) return absl::InvalidArgumentError("--streams: each at least 1");
    std::vector<int32_t> configs = {0};
    configs.insert(configs.end(), depths.begin(), depths.end());
    std::vector<std::vector<double>> rates(configs.size());
    std::vector<Measurement> last(configs.size());
    // Every configuration in turn, one warm-up round first, so that load changes on the machine
    // hit them alike.
    for (int r = 0; r <= repeats; ++r) {
      for (size_t c = 0; c < configs.size(); ++c) {
        KILN_ASSIGN_OR_RETURN(Measurement m,
                              Measure(model, prompts, streams, tokens, configs[c], sampling));
        if (greedy && m.outputs != last[0].outputs && c > 0) {
          return absl::InternalError(absl::StrCat("greedy output with ", configs[c],
                                                  " draft tokens differs from plain decoding"));
        }
        if (r > 0) rates[c].push_back(m.tokens_per_second());
        last[c] = std::move(m);
      }
    }
    std::printf("\n%d stream%s at a time%s\n", streams, streams == 1 ? "" : "s",
                streams == 1 ? " (batch 1)" : " (aggregate decode tokens/s)");
    std::printf("  %5s %10s %9s %12s %14s  %-28s %s\n", "depth", "tokens/s", "speed-up",
                "tokens/step", "accepted/step", "acceptance at position 1..k",
                "ms per step (drafting)");
    const double plain = Median(rates[0]);
    size_t best = 0;
    for (size_t c = 0; c < configs.size(); ++c) {
      const Measurement& m = last[c];
      const double rate = Median(rates[c]);
      if (rate > Median(rates[best])) best = c;
      std::string positions;
      for (int32_t i = 0; i < configs[c]; ++i) {
        absl::StrAppendFormat(&positions, "%s%.3f", i == 0 ? "" : " ",
                              static_cast<double>(m.accepted_at_position[static_cast<size_t>(i)]) /
                                  static_cast<double>(std::max<uint64_t>(1, m.verifications)));
      }
      const double accepted_per_step = static_cast<double>(m.accepted) /
                                       static_cast<double>(std::max<uint64_t>(1, m.verifications));
      // Per engine step after the prefill one, against the bare forwards printed above.
      const double steps = static_cast<double>(std::max<uint64_t>(1, m.steps));
      std::printf("  %5d %10.1f %8.2f× %12.2f %14s  %-28s %.3f (%.3f)\n", configs[c], rate,
                  rate / plain, configs[c] == 0 ? 1.0 : 1.0 + accepted_per_step,
                  configs[c] == 0 ? "-" : absl::StrFormat("%.3f", accepted_per_step).c_str(),
                  configs[c] == 0 ? "-" : positions.c_str(), 1e3 * m.decode_seconds / steps,
                  1e3 * m.draft_seconds / steps);
    }
    std::printf("  fastest at %d stream%s: %s (%.2f× no speculation)\n", streams,
                streams == 1 ? "" : "s",
                best == 0 ? "no speculation" : absl::StrCat("depth ", configs[best]).c_str(),
                Median(rates[best]) / plain);
  }
  return absl::OkStatus();
}

}  // namespace

int RunMtpBench() {
  absl::Status status = MtpBench();
  if (!status.ok()) {
    std::fprintf(stderr, "kiln_speculative_bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace kiln::bench
