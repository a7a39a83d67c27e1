// Load, prefill and decode speed of a Qwen2.5-0.5B-shaped bf16 model, against this machine's
// measured memory read bandwidth and file read speed, all in one run. Prints medians and ratios:
//   load ratio        = (open → PreparedModel) ÷ (reading the checkpoint files once)
//   decode efficiency = weight bytes streamed per token × tokens/s ÷ read bandwidth (goal ≥ 0.85),
//                       each run against a bandwidth probe taken just before it
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "bench/bench_model.h"
#include "bench/bench_util.h"
#include "bench/read_bandwidth.h"
#include "clients/synth.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/step_team.h"
#include "loaders/load_model.h"
#include "models/kv_pool.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "model shape (kiln synth preset)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: bf16 or f32");
ABSL_FLAG(std::string, model_dir, "build/bench-models", "where synthesized models are kept");
ABSL_FLAG(int32_t, prompt_tokens, 512, "prefill prompt length");
ABSL_FLAG(int32_t, decode_tokens, 128, "tokens decoded at batch 1");
ABSL_FLAG(int32_t, repeats, 3, "repetitions per measurement (the median is printed)");
ABSL_FLAG(std::string, backend, "cpu", "compute backend (kernels/backend_registry.h)");
ABSL_FLAG(std::string, quantize, "", "weight quantization of the linears: none, int8 or int4");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "what the KV pool stores: auto (the model's compute dtype), f32 or bf16");
ABSL_FLAG(bool, compare_step_team, true,
          "also decode with the CPU backend's step team off (a parallel region per op), "
          "alternating runs, and print the ratio");
ABSL_FLAG(std::string, checkpoint, "",
          "load this checkpoint (a directory or a .tensors file, e.g. one `kiln tensorize "
          "--prepack` wrote) instead of the synthesized --preset model");

namespace kiln {
namespace {

using bench::Clock;
using bench::MeasureReadBandwidth;
using bench::Median;
using bench::Seconds;

// Seconds to read every file of the checkpoint once with read(2) (from the page cache when
// warm, which is also where the load below reads from).
// Reads the checkpoint's weight files once: a directory's .safetensors, or the file itself.
double MeasureFileRead(const std::filesystem::path& dir, uint64_t* bytes) {
  std::vector<char> block(8 << 20);
  *bytes = 0;
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
    }
  } else {
    files.push_back(dir);
  }
  const auto start = Clock::now();
  for (const std::filesystem::path& file : files) {
    int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ssize_t got;
    while ((got = ::read(fd, block.data(), block.size())) > 0) *bytes += static_cast<uint64_t>(got);
    ::close(fd);
  }
  return Seconds(start);
}

// Prints each op's share of a profiled run (prefill or decode), the linears also by projection
// ("layers.3.gate_up" counts as gate_up), and the time outside every op (the model's own code:
// step metadata, block tables, handing logits back; here also the caller's argmax).
void PrintStepShares(const char* title, const OpProfile& profile, double seconds, int32_t tokens) {
  std::printf("%s by part (%d tokens with every op timed: %.2f ms a token)\n", title, tokens,
              seconds / tokens * 1e3);
  auto line = [&](const std::string& name, double part, int64_t calls) {
    std::printf("  %-26s %6.1f %%  %8.3f ms a token  (%lld calls)\n", name.c_str(),
                100 * part / seconds, part / tokens * 1e3, static_cast<long long>(calls));
  };
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpProfile::Entry& entry = profile.by_kind[static_cast<size_t>(k)];
    if (entry.calls == 0) continue;
    line(std::string(OpKindName(static_cast<OpKind>(k))), entry.seconds, entry.calls);
    if (static_cast<OpKind>(k) != OpKind::kLinear) continue;
    std::map<std::string, OpProfile::Entry> by_projection;
    for (const auto& [name, linear] : profile.by_linear) {
      const size_t dot = name.rfind('.');
      OpProfile::Entry& sum = by_projection[dot == std::string::npos ? name : name.substr(dot + 1)];
      sum.seconds += linear.seconds;
      sum.calls += linear.calls;
    }
    for (const auto& [name, sum] : by_projection) line("  " + name, sum.seconds, sum.calls);
  }
  line("outside the ops", seconds - profile.total_seconds(), 0);
}

struct PrefillAndDecode {
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Prefills `prompt` into a fresh cache, then decodes `decode_tokens` greedy tokens at batch 1;
// with profiles, every op of the prefill and of the decode steps is timed into them.
absl::StatusOr<PrefillAndDecode> RunPrefillAndDecode(const PreparedModel& model,
                                                     const std::vector<int32_t>& prompt,
                                                     int32_t decode_tokens,
                                                     OpProfile* prefill_profile = nullptr,
                                                     OpProfile* decode_profile = nullptr) {
  KILN_ASSIGN_OR_RETURN(KvCache cache,
                        model.NewCache(static_cast<int64_t>(prompt.size()) + decode_tokens));
  PrefillAndDecode run;
  std::vector<float> logits;
  SequenceChunk chunk{&cache, prompt, false};
  model.set_op_profile(prefill_profile);
  auto start = Clock::now();
  KILN_RETURN_IF_ERROR(model.Forward({&chunk, 1}, &logits));
  run.prefill_seconds = Seconds(start);
  int32_t next = bench::Argmax(logits);
  model.set_op_profile(decode_profile);
  start = Clock::now();
  absl::Status status;
  for (int32_t t = 0; t < decode_tokens && status.ok(); ++t) {
    logits.clear();
    chunk.tokens = {&next, 1};
    status = model.Forward({&chunk, 1}, &logits);
    next = bench::Argmax(logits);
  }
  run.decode_seconds = Seconds(start);
  model.set_op_profile(nullptr);
  KILN_RETURN_IF_ERROR(status);
  return run;
}

int Main() {
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const std::string preset = absl::GetFlag(FLAGS_preset);
  absl::StatusOr<std::filesystem::path> checkpoint =
      bench::SynthCheckpoint(preset, absl::GetFlag(FLAGS_dtype), absl::GetFlag(FLAGS_model_dir));
  if (!checkpoint.ok()) {
    return std::fprintf(stderr, "%s\n", std::string(checkpoint.status().message()).c_str()), 1;
  }
  const std::filesystem::path dir = absl::GetFlag(FLAGS_checkpoint).empty()
                                        ? *checkpoint
                                        : std::filesystem::path(absl::GetFlag(FLAGS_checkpoint));

  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend(absl::GetFlag(FLAGS_backend));
  if (!created.ok()) {
    return std::fprintf(stderr, "%s\n", std::string(created.status().message()).c_str()), 1;
  }
  std::shared_ptr<Backend> backend(std::move(*created));
  std::printf("backend                   %s (%s)\n", std::string(backend->name()).c_str(),
              backend->description().c_str());

  LoadOptions load_options;
  absl::StatusOr<Quantization> quantize = ParseQuantization(absl::GetFlag(FLAGS_quantize));
  if (!quantize.ok()) {
    return std::fprintf(stderr, "--quantize: %s\n",
                        std::string(quantize.status().message()).c_str()),
           1;
  }
  load_options.quantize = *quantize;
  absl::StatusOr<std::optional<DType>> kv_dtype =
      ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv_dtype.ok()) {
    return std::fprintf(stderr, "--kv_cache_dtype: %s\n",
                        std::string(kv_dtype.status().message()).c_str()),
           1;
  }
  load_options.kv_pool.dtype = *kv_dtype;
  uint64_t file_bytes = 0;
  MeasureFileRead(dir, &file_bytes);  // warm the page cache
  std::vector<double> read_times, load_times;
  std::unique_ptr<PreparedModel> model;
  for (int r = 0; r < repeats; ++r) {
    read_times.push_back(MeasureFileRead(dir, &file_bytes));
    model.reset();
    const auto start = Clock::now();
    absl::StatusOr<std::unique_ptr<PreparedModel>> loaded = LoadModel(dir, backend, load_options);
    load_times.push_back(Seconds(start));
    if (!loaded.ok()) {
      return std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str()), 1;
    }
    model = std::move(*loaded);
  }
  const double read_s = Median(read_times), load_s = Median(load_times);
  std::printf(
      "checkpoint                %8.2f GB in files, %s weights packed as %s%s\n", file_bytes / 1e9,
      absl::GetFlag(FLAGS_dtype).c_str(), std::string(DTypeName(model->compute_dtype())).c_str(),
      model->quantization() == Quantization::kNone
          ? ""
          : absl::StrCat(" (", QuantizationName(model->quantization()), " in ",
                         model->quantized_linears(), " of ", model->linear_count(), " linears)")
                .c_str());
  std::printf("KV pool                   %s, %lld blocks of %lld positions (%.1f MB)\n",
              std::string(DTypeApiName(model->kv_pool().dtype())).c_str(),
              static_cast<long long>(model->kv_pool().num_blocks()),
              static_cast<long long>(model->kv_pool().block_size()),
              model->kv_pool().bytes() / 1e6);
  std::printf("read files once           %8.3f s (%.2f GB/s)\n", read_s, file_bytes / read_s / 1e9);
  std::printf(
      "load (open → prepared)    %8.3f s  = %.2f × reading the files "
      "(open %.3f s, bind %.3f s, post-load %.3f s)\n",
      load_s, load_s / read_s, model->timings().open_seconds, model->timings().bind_seconds,
      model->timings().post_load_seconds);

  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
  for (int32_t i = 0; i < prompt_tokens; ++i)
    prompt[static_cast<size_t>(i)] =
        (i * 7919 + 13) % static_cast<int32_t>(model->config().vocab_size);

  // The machine's bandwidth moves by up to 2× over minutes here: each run is held against a probe
  // taken just before it, and the efficiency printed is the median of those ratios.
  const double streamed = static_cast<double>(model->bytes_streamed_per_token());
  std::vector<double> prefill_rates, decode_rates, bandwidths, round_trips, efficiencies;
  // Decode rate without the step team ÷ with it, per pair of runs (the order alternates).
  const bool compare_team = absl::GetFlag(FLAGS_compare_step_team);
  std::vector<double> no_team_rates, team_gains;
  for (int r = 0; r < repeats; ++r) {
    bandwidths.push_back(MeasureReadBandwidth(2));
    round_trips.push_back(bench::MeasureThreadRoundTrip());
    double no_team_rate = 0;
    auto run_without_team = [&]() -> bool {
      cpu::EnableStepTeams(false);
      absl::StatusOr<PrefillAndDecode> run = RunPrefillAndDecode(*model, prompt, decode_tokens);
      cpu::EnableStepTeams(true);
      if (!run.ok()) return false;
      no_team_rate = decode_tokens / run->decode_seconds;
      return true;
    };
    if (compare_team && r % 2 == 1 && !run_without_team()) return 1;
    absl::StatusOr<PrefillAndDecode> run = RunPrefillAndDecode(*model, prompt, decode_tokens);
    if (!run.ok()) return 1;
    prefill_rates.push_back(prompt_tokens / run->prefill_seconds);
    decode_rates.push_back(decode_tokens / run->decode_seconds);
    efficiencies.push_back(streamed * decode_rates.back() / bandwidths.back());
    if (compare_team && r % 2 == 0 && !run_without_team()) return 1;
    if (compare_team) {
      no_team_rates.push_back(no_team_rate);
      team_gains.push_back(decode_rates.back() / no_team_rate);
    }
  }
  const double prefill = Median(prefill_rates), decode = Median(decode_rates);

  // One more run with every op timed (each waits for the last), for the shares of each part.
  OpProfile prefill_profile, decode_profile;
  absl::StatusOr<PrefillAndDecode> profiled =
      RunPrefillAndDecode(*model, prompt, decode_tokens, &prefill_profile, &decode_profile);
  if (!profiled.ok()) return 1;
  const double profiled_seconds = profiled->decode_seconds;
  std::printf(
      "memory read bandwidth     %8.2f GB/s, median of the probes before each run "
      "(%.2f to %.2f)\n",
      Median(bandwidths) / 1e9, *std::min_element(bandwidths.begin(), bandwidths.end()) / 1e9,
      *std::max_element(bandwidths.begin(), bandwidths.end()) / 1e9);
  std::printf("threads' round trip       %s\n", bench::DescribeRoundTrips(round_trips).c_str());
  std::printf("prefill (%d tokens)      %8.1f tokens/s\n", prompt_tokens, prefill);
  std::printf("decode (batch 1, %d)     %8.2f tokens/s, %.3f GB streamed per token\n",
              decode_tokens, decode, streamed / 1e9);
  std::printf(
      "decode efficiency         %8.2f  (streamed bytes × tokens/s ÷ the bandwidth probed just "
      "before, median; goal ≥ 0.85)\n",
      Median(efficiencies));
  if (compare_team) {
    std::printf(
        "decode, step team off     %8.2f tokens/s (a parallel region per op); the team gives "
        "%.3f× (median of %d back-to-back pairs)\n",
        Median(no_team_rates), Median(team_gains), repeats);
  }
  PrintStepShares("prefill", prefill_profile, profiled->prefill_seconds, prompt_tokens);
  PrintStepShares("decode step", decode_profile, profiled_seconds, decode_tokens);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return kiln::Main();
}
