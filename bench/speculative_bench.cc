// Speculative decoding through the engine. With --model DIR, drafts from that model's own MTP
// head on held-out text (speculative_mtp.cc). Without, on a Qwen2.5-0.5B-shaped bf16 model (as
// decode_bench): decode tokens/s without speculation, with drafts that are always rejected
// (the overhead of verifying k + 1 positions; goal ≤ 10%), with drafts that are always right
// (the upper bound), and with drafts right with probability α per token. The drafts come from a
// replayed script of the model's own greedy output, so they cost nothing: the draft time
// printed shows it. From the measured cost of one verification step the bench predicts
// tokens/s at a given acceptance, with and without the estimated cost of an MTP head (one
// decoder layer + the LM head per draft token), and checks the prediction against the α runs.
#include "bench/speculative_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/notification.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "bench/bench_model.h"
#include "bench/bench_util.h"
#include "clients/synth.h"
#include "engine/draft_sources_testing.h"
#include "engine/engine.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "model shape (kiln synth preset)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: bf16 or f32");
ABSL_FLAG(std::string, model_dir, "build/bench-models", "where synthesized models are kept");
ABSL_FLAG(int32_t, prompt_tokens, 64, "prompt length");
ABSL_FLAG(int32_t, decode_tokens, 64, "tokens generated per request");
ABSL_FLAG(int32_t, draft_tokens, 4, "draft tokens per step (k)");
ABSL_FLAG(int32_t, batch, 1, "concurrent requests");
ABSL_FLAG(int32_t, repeats, 3, "repetitions per measurement (the median is printed)");
ABSL_DECLARE_FLAG(std::string, model);

namespace kiln {
namespace bench {

absl::StatusOr<Run> Generate(std::shared_ptr<const PreparedModel> model,
                             const std::vector<std::vector<int32_t>>& prompts, int32_t tokens,
                             std::shared_ptr<DraftSource> source, int32_t k,
                             const SamplingParams& sampling) {
  EngineOptions options;
  options.max_running = static_cast<int32_t>(prompts.size());
  options.max_step_tokens = 1 << 20;  // every prompt prefilled in the first step
  options.max_context = static_cast<int64_t>(prompts[0].size()) + tokens + 1;
  options.draft_source = std::move(source);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model, nullptr, options);
  if (!engine.ok()) return engine.status();
  struct Stream {
    absl::Mutex mutex;
    std::vector<int32_t> tokens;
    GenerationUpdate last;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (const std::vector<int32_t>& prompt : prompts) {
    GenerationRequest request;
    request.prompt = prompt;
    request.sampling = sampling;
    request.sampling.seed = sampling.seed.value_or(0) + streams.size();
    request.stopping.max_tokens = tokens;
    request.stopping.ignore_eos = true;
    request.num_draft_tokens = k;
    auto stream = std::make_unique<Stream>();
    Stream* raw = stream.get();
    streams.push_back(std::move(stream));
    absl::StatusOr<uint64_t> id = (*engine)->Submit(request, [raw](GenerationUpdate update) {
      const bool final = update.finish != FinishReason::kNone || !update.status.ok();
      {
        absl::MutexLock lock(&raw->mutex);
        raw->tokens.insert(raw->tokens.end(), update.token_ids.begin(), update.token_ids.end());
        if (final) raw->last = update;
      }
      if (final) raw->done.Notify();
    });
    if (!id.ok()) return id.status();
  }
  Run run;
  for (auto& stream : streams) {
    stream->done.WaitForNotification();
    if (!stream->last.status.ok()) return stream->last.status;
    run.decode_seconds = std::max(
        run.decode_seconds, stream->last.total_seconds - stream->last.time_to_first_token_seconds);
    run.decoded += static_cast<int64_t>(stream->tokens.size()) - 1;
    run.outputs.push_back(stream->tokens);
  }
  (*engine)->Shutdown(/*drain=*/true);
  const EngineStats stats = (*engine)->stats();
  run.steps = stats.steps - 1;  // the prefill step
  run.draft_seconds = stats.draft_seconds;
  run.speculative = stats.speculative;
  run.verifications = stats.verifications;
  run.accepted_at_position.assign(stats.accepted_at_position.begin(),
                                  stats.accepted_at_position.end());
  return run;
}

absl::StatusOr<std::vector<double>> ForwardSeconds(const PreparedModel& model,
                                                   std::span<const int32_t> prompt,
                                                   const std::vector<int32_t>& rows, int rounds) {
  const int32_t most = *std::max_element(rows.begin(), rows.end());
  KILN_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(static_cast<int64_t>(prompt.size()) + most));
  std::vector<float> logits;
  SequenceChunk chunk{&cache, prompt, false};
  KILN_RETURN_IF_ERROR(model.Forward({&chunk, 1}, &logits));
  const std::vector<int32_t> positions(static_cast<size_t>(most), 7);
  std::vector<std::vector<double>> samples(rows.size());
  for (int r = 0; r < 4 + rounds; ++r) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t n = static_cast<size_t>(rows[i]);
      logits.clear();
      SequenceChunk step{&cache, std::span<const int32_t>(positions).first(n), n > 1};
      const auto start = std::chrono::steady_clock::now();
      KILN_RETURN_IF_ERROR(model.Forward({&step, 1}, &logits));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      cache.Truncate(static_cast<int64_t>(prompt.size()));
      if (r >= 4) samples[i].push_back(seconds);  // 4 rounds warm up
    }
  }
  std::vector<double> medians;
  for (const std::vector<double>& s : samples) medians.push_back(Median(s));
  return medians;
}

}  // namespace bench

namespace {

using bench::Generate;
using bench::Median;
using bench::Run;

struct Measured {
  double tokens_per_second = 0;
  double seconds_per_step = 0;
  double draft_share = 0;  // draft time ÷ decode time
  double acceptance = 0;   // accepted ÷ drafted
  double tokens_per_step = 0;
};

Measured Summarize(const std::vector<Run>& runs, size_t batch) {
  std::vector<double> rates, step_costs, shares;
  Measured m;
  for (const Run& run : runs) {
    rates.push_back(static_cast<double>(run.decoded) / run.decode_seconds);
    step_costs.push_back(run.decode_seconds / static_cast<double>(run.steps));
    shares.push_back(run.draft_seconds / run.decode_seconds);
    m.acceptance = run.speculative.drafted == 0 ? 0
                                                : static_cast<double>(run.speculative.accepted) /
                                                      static_cast<double>(run.speculative.drafted);
    m.tokens_per_step = static_cast<double>(run.decoded) / static_cast<double>(run.steps * batch);
  }
  m.tokens_per_second = Median(rates);
  m.seconds_per_step = Median(step_costs);
  m.draft_share = Median(shares);
  return m;
}

// Expected tokens per verification step when each draft token is right with probability a.
double TokensPerStep(double a, int k) {
  return a >= 1.0 ? k + 1.0 : (1.0 - std::pow(a, k + 1)) / (1.0 - a);
}

int Main() {
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const std::string preset = absl::GetFlag(FLAGS_preset);
  absl::StatusOr<std::filesystem::path> checkpoint =
      bench::SynthCheckpoint(preset, absl::GetFlag(FLAGS_dtype), absl::GetFlag(FLAGS_model_dir));
  if (!checkpoint.ok()) {
    return std::fprintf(stderr, "%s\n", std::string(checkpoint.status().message()).c_str()), 1;
  }
  const std::filesystem::path dir = *checkpoint;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  if (!backend.ok()) return 1;
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded =
      LoadModel(dir, std::shared_ptr<Backend>(std::move(*backend)));
  if (!loaded.ok()) {
    return std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str()), 1;
  }
  std::shared_ptr<const PreparedModel> model(std::move(*loaded));

  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t tokens = absl::GetFlag(FLAGS_decode_tokens);
  const int32_t k = absl::GetFlag(FLAGS_draft_tokens);
  const int32_t batch = std::max(1, absl::GetFlag(FLAGS_batch));
  const int64_t vocab = model->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
    for (int32_t i = 0; i < prompt_tokens; ++i) {
      prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13 + b * 104729) % vocab);
    }
    prompts.push_back(std::move(prompt));
  }
  std::printf("%s %s, batch %d, prompt %d, %d tokens per request, k = %d, median of %d\n",
              preset.c_str(), absl::GetFlag(FLAGS_dtype).c_str(), batch, prompt_tokens, tokens, k,
              repeats);

  // The target forward alone: 1 position against k + 1, interleaved and rolled back each time,
  // so that the cost of verification is seen without the engine around it.
  {
    absl::StatusOr<std::vector<double>> seconds =
        bench::ForwardSeconds(*model, prompts[0], {1, k + 1}, 8 * repeats);
    if (!seconds.ok()) return 1;
    std::printf(
        "target forward, 1 position  %7.2f ms; %d positions %7.2f ms (%.2f×; median of %d)\n",
        (*seconds)[0] * 1e3, k + 1, (*seconds)[1] * 1e3, (*seconds)[1] / (*seconds)[0],
        8 * repeats);
  }

  // The greedy output, which the scripted drafts replay.
  absl::StatusOr<Run> reference = Generate(model, prompts, tokens, nullptr, 0);
  if (!reference.ok()) return 1;
  std::vector<ScriptedDraftSource::Script> scripts;
  for (int32_t b = 0; b < batch; ++b) {
    scripts.push_back(
        {prompts[static_cast<size_t>(b)], reference->outputs[static_cast<size_t>(b)]});
  }
  auto scripted = [&](double correct) {
    return std::make_shared<ScriptedDraftSource>(scripts, vocab, correct, 17);
  };

  // All configurations run in turn, `repeats` times after one warm-up round, so that load
  // changes on the machine hit them alike.
  struct Config {
    std::string label;
    std::shared_ptr<DraftSource> source;
    int32_t k;
    std::vector<Run> runs;
  };
  std::vector<Config> configs = {{"no speculation", nullptr, 0, {}},
                                 {"drafts always rejected", scripted(0.0), k, {}},
                                 {"drafts always accepted", scripted(1.0), k, {}}};
  const std::vector<double> alphas = {0.5, 0.7, 0.9};
  for (double a : alphas) configs.push_back({"alpha", scripted(a), k, {}});
  for (int r = 0; r <= repeats; ++r) {
    for (Config& config : configs) {
      absl::StatusOr<Run> run = Generate(model, prompts, tokens, config.source, config.k);
      if (!run.ok()) {
        std::fprintf(stderr, "%s\n", std::string(run.status().message()).c_str());
        return 1;
      }
      if (r > 0) config.runs.push_back(std::move(*run));
    }
  }
  std::vector<Measured> measured;
  for (const Config& config : configs) measured.push_back(Summarize(config.runs, prompts.size()));
  const Measured& plain = measured[0];
  const Measured& rejected = measured[1];
  for (size_t i = 0; i < 3; ++i) {
    const Measured& m = measured[i];
    std::printf(
        "%-24s %8.2f tokens/s  %7.2f ms/step  %5.2f tokens/step  acceptance %.2f  "
        "draft time %.1f%%\n",
        configs[i].label.c_str(), m.tokens_per_second, m.seconds_per_step * 1e3, m.tokens_per_step,
        m.acceptance, m.draft_share * 100);
  }
  const double overhead = plain.tokens_per_second / rejected.tokens_per_second - 1.0;
  std::printf("overhead at acceptance 0 %+7.1f%%  (verifying %d extra positions; goal ≤ 10%%)\n",
              overhead * 100, k);

  // Prediction: tokens/step ÷ (verification step + draft time). The step cost is the rejected
  // run's (same k + 1 positions). An MTP head streams about one decoder layer + the LM head
  // per draft token; in memory-bound decode its cost scales with those bytes.
  const ModelConfig& c = model->config();
  const double layer = static_cast<double>(c.hidden_size) * (c.q_dim() + 2 * c.kv_dim()) +
                       static_cast<double>(c.q_dim()) * c.hidden_size +
                       3.0 * static_cast<double>(c.hidden_size) * c.intermediate_size;
  const double lm_head = static_cast<double>(c.vocab_size) * c.hidden_size;
  const double eh_proj = 2.0 * c.hidden_size * c.hidden_size;
  const double mtp_share = (layer + eh_proj + lm_head) / (layer * c.num_hidden_layers + lm_head);
  const double t_step = rejected.seconds_per_step;
  const double t_plain = plain.seconds_per_step;
  std::printf(
      "verification step %.2f ms = %.2f × a plain step (%.2f ms); an MTP draft token ≈ "
      "%.0f%% of a plain step\n",
      t_step * 1e3, t_step / t_plain, t_plain * 1e3, mtp_share * 100);
  std::printf("%-24s %10s %10s %10s %12s %12s\n", "per-token acceptance", "tok/step", "predicted",
              "measured", "with MTP", "MTP speed-up");
  for (size_t i = 0; i < alphas.size(); ++i) {
    const double per_step = TokensPerStep(alphas[i], k);
    const double predicted = per_step * static_cast<double>(batch) / t_step;
    const double with_mtp =
        per_step * static_cast<double>(batch) / (t_step + k * mtp_share * t_plain);
    std::printf("α = %.1f                  %10.2f %10.2f %10.2f %12.2f %11.2f×\n", alphas[i],
                per_step, predicted, measured[3 + i].tokens_per_second, with_mtp,
                with_mtp / plain.tokens_per_second);
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (!absl::GetFlag(FLAGS_model).empty()) return kiln::bench::RunMtpBench();
  return kiln::Main();
}
