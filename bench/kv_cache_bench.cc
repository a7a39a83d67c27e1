// The paged KV pool on a Qwen2.5-0.5B-shaped bf16 model (as decode_bench), in one run:
//   capacity    sequences that fit a 2 GiB pool: reserving prompt + max_tokens per sequence
//               (kiln's scheme before the pool), blocks for what each sequence holds, and blocks
//               with a shared system prompt held once (prefix caching); measured by allocating
//               from a real pool of that budget
//   throughput  aggregate decode tokens/s through the engine at 1, 4, 16 and 64 streams, and (CPU)
//               the most n streams can decode against the one stream measured when a step of n
//               rows is bound by the arithmetic peak (measured here), not by reading the weights
//   TTFT        time to first token of a request whose 2,000-token prefix is cold vs cached
//               (goal: cached ≤ 0.2 × cold)
// Every timing is the median of --repeats runs.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "bench/bench_model.h"
#include "bench/bench_util.h"
#include "bench/compute_peak.h"
#include "bench/read_bandwidth.h"
#include "clients/synth.h"
#include "engine/engine.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "models/kv_cache.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "model shape (kiln synth preset)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: bf16 or f32");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "what the KV pool stores: auto (the model's compute dtype), f32 or bf16");
ABSL_FLAG(std::string, model_dir, "build/bench-models", "where synthesized models are kept");
ABSL_FLAG(uint64_t, capacity_budget_bytes, 2ull << 30, "pool budget of the capacity count");
ABSL_FLAG(int32_t, capacity_prompt_tokens, 512, "capacity: prompt tokens per sequence");
ABSL_FLAG(int32_t, capacity_shared_tokens, 384, "capacity: of which a shared system prompt");
ABSL_FLAG(int32_t, capacity_max_tokens, 4096, "capacity: max_tokens each request asks for");
ABSL_FLAG(int32_t, capacity_generated_tokens, 256, "capacity: tokens each has generated");
ABSL_FLAG(std::vector<std::string>, streams, std::vector<std::string>({"1", "4", "16", "64"}),
          "concurrent streams of the throughput runs");
ABSL_FLAG(int32_t, prompt_tokens, 32, "throughput: prompt tokens per stream");
ABSL_FLAG(int32_t, decode_tokens, 64, "throughput: tokens generated per stream");
ABSL_FLAG(int32_t, prefix_tokens, 2000, "TTFT: shared prefix length");
ABSL_FLAG(int32_t, suffix_tokens, 16, "TTFT: tokens after the shared prefix");
ABSL_FLAG(int32_t, repeats, 3, "repetitions per measurement (the median is printed)");
ABSL_FLAG(std::string, backend, "cpu", "compute backend (kernels/backend_registry.h)");

namespace kiln {
namespace {

using bench::Clock;
using bench::Median;
using bench::Seconds;

// Sequences whose block tables (each of `positions` positions, the first `shared` of them the
// same for all when prefix caching shares them) fit `pool`. Allocates for real: what the pool's
// allocator does, not arithmetic.
int64_t SequencesThatFit(const std::shared_ptr<KvPool>& pool, int64_t layers, int64_t positions,
                         int64_t shared) {
  std::vector<KvCache> caches;
  const int64_t block = pool->block_size();
  std::vector<int32_t> shared_blocks;
  if (shared >= block) {
    KvCache first(pool, layers, positions);
    if (!first.Reserve(shared / block * block).ok()) return 0;
    shared_blocks.assign(first.blocks().begin(), first.blocks().end());
    first.set_length(shared / block * block);
    caches.push_back(std::move(first));  // holds the shared blocks
  }
  int64_t count = 0;
  while (true) {
    KvCache cache(pool, layers, positions);
    if (!shared_blocks.empty()) {
      for (int32_t b : shared_blocks) pool->Retain(b);
      cache.AdoptPrefix(shared_blocks);
    }
    if (!cache.Reserve(positions).ok()) break;
    caches.push_back(std::move(cache));
    ++count;
  }
  return count;
}

struct StreamsRun {
  double seconds = 0;  // submit → last stream done
  int64_t tokens = 0;
  // While every stream decodes (from the last stream's first token to the first stream's last):
  // the batch's steady state, without the prefills and the tail of a shrinking batch.
  double decode_seconds = 0;
  int64_t decode_tokens = 0;
};

struct Stream {
  absl::Mutex mutex;
  std::vector<int32_t> tokens;
  GenerationUpdate last;
  Clock::time_point first_token;
  std::vector<std::pair<Clock::time_point, int64_t>> arrivals;  // (when, tokens) per update
  bool got_first = false;
  absl::Notification done;
};

UpdateCallback Collect(Stream* stream) {
  return [stream](GenerationUpdate update) {
    const bool final = update.finish != FinishReason::kNone || !update.status.ok();
    {
      absl::MutexLock lock(&stream->mutex);
      if (!stream->got_first && !update.token_ids.empty()) {
        stream->got_first = true;
        stream->first_token = Clock::now();
      }
      stream->tokens.insert(stream->tokens.end(), update.token_ids.begin(), update.token_ids.end());
      if (!update.token_ids.empty()) {
        stream->arrivals.emplace_back(Clock::now(), static_cast<int64_t>(update.token_ids.size()));
      }
      if (final) stream->last = update;
    }
    if (final) stream->done.Notify();
  };
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest request;
  request.prompt = std::move(prompt);
  request.stopping.max_tokens = max_tokens;
  request.stopping.ignore_eos = true;
  return request;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = token(rng);
  return tokens;
}

absl::StatusOr<StreamsRun> RunStreams(std::shared_ptr<const PreparedModel> model, int streams,
                                      int32_t prompt_tokens, int32_t decode_tokens, uint32_t seed) {
  EngineOptions options;
  options.max_running = streams;
  options.max_context = 4096;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, nullptr, options));
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<Stream>> results;
  const Clock::time_point start = Clock::now();
  for (int s = 0; s < streams; ++s) {
    results.push_back(std::make_unique<Stream>());
    KILN_RETURN_IF_ERROR(
        engine
            ->Submit(
                Greedy(RandomTokens(rng, prompt_tokens, model->config().vocab_size), decode_tokens),
                Collect(results.back().get()))
            .status());
  }
  StreamsRun run;
  Clock::time_point all_decoding = start;
  Clock::time_point first_done = Clock::time_point::max();
  for (auto& result : results) {
    result->done.WaitForNotification();
    if (!result->last.status.ok()) return result->last.status;
    run.tokens += static_cast<int64_t>(result->tokens.size());
    if (result->arrivals.empty()) continue;
    all_decoding = std::max(all_decoding, result->arrivals.front().first);
    first_done = std::min(first_done, result->arrivals.back().first);
  }
  run.seconds = Seconds(start);
  for (auto& result : results) {
    for (const auto& [when, count] : result->arrivals) {
      if (when > all_decoding && when <= first_done) run.decode_tokens += count;
    }
  }
  run.decode_seconds = first_done > all_decoding
                           ? std::chrono::duration<double>(first_done - all_decoding).count()
                           : 0;
  return run;
}

// Time to first token of one request, alone on the engine.
absl::StatusOr<double> Ttft(Engine& engine, std::vector<int32_t> prompt,
                            std::vector<int32_t>* tokens, int32_t* cached) {
  Stream stream;
  const Clock::time_point start = Clock::now();
  KILN_RETURN_IF_ERROR(engine.Submit(Greedy(std::move(prompt), 4), Collect(&stream)).status());
  stream.done.WaitForNotification();
  if (!stream.last.status.ok()) return stream.last.status;
  *tokens = stream.tokens;
  *cached = stream.last.cached_prompt_tokens;
  return std::chrono::duration<double>(stream.first_token - start).count();
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
  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend(absl::GetFlag(FLAGS_backend));
  if (!created.ok()) {
    return std::fprintf(stderr, "%s\n", std::string(created.status().message()).c_str()), 1;
  }
  std::shared_ptr<Backend> backend(std::move(*created));
  LoadOptions load_options;
  load_options.step_capacity.max_sequences = 64;
  load_options.step_capacity.max_rows = 1024;
  load_options.step_capacity.max_logits_rows = 64;
  absl::StatusOr<std::optional<DType>> kv_cache_dtype =
      ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv_cache_dtype.ok()) {
    return std::fprintf(stderr, "--kv_cache_dtype: %s\n",
                        std::string(kv_cache_dtype.status().message()).c_str()),
           1;
  }
  load_options.kv_pool.dtype = *kv_cache_dtype;
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded = LoadModel(dir, backend, load_options);
  if (!loaded.ok()) {
    return std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str()), 1;
  }
  std::shared_ptr<const PreparedModel> model(std::move(*loaded));
  const ModelConfig& c = model->config();
  const int64_t layers = c.num_hidden_layers;
  const DType kv_dtype = model->kv_pool().dtype();
  std::printf(
      "kv_cache_bench: %s %s, %lld layers, kv_dim %lld (%lld bytes of %s K+V per position)\n",
      preset.c_str(), absl::GetFlag(FLAGS_dtype).c_str(), static_cast<long long>(layers),
      static_cast<long long>(c.kv_dim()),
      static_cast<long long>(layers * 2 * c.kv_dim() * static_cast<int64_t>(DTypeSize(kv_dtype))),
      std::string(DTypeApiName(kv_dtype)).c_str());

  // Capacity at a fixed budget.
  {
    const uint64_t budget = absl::GetFlag(FLAGS_capacity_budget_bytes);
    const int64_t prompt = absl::GetFlag(FLAGS_capacity_prompt_tokens);
    const int64_t shared = std::min<int64_t>(prompt, absl::GetFlag(FLAGS_capacity_shared_tokens));
    const int64_t max_tokens = absl::GetFlag(FLAGS_capacity_max_tokens);
    const int64_t generated = absl::GetFlag(FLAGS_capacity_generated_tokens);
    KvPoolOptions pool_options;
    pool_options.bytes = budget;
    pool_options.dtype = kv_dtype;  // as the model's own pool
    absl::StatusOr<std::shared_ptr<KvPool>> pool =
        KvPool::Create(*backend, layers, c.kv_dim(), pool_options);
    if (!pool.ok()) {
      return std::fprintf(stderr, "%s\n", std::string(pool.status().message()).c_str()), 1;
    }
    const int64_t reserved = SequencesThatFit(*pool, layers, prompt + max_tokens, 0);
    const int64_t paged = SequencesThatFit(*pool, layers, prompt + generated, 0);
    const int64_t shared_paged = SequencesThatFit(*pool, layers, prompt + generated, shared);
    std::printf(
        "capacity at %.2f GiB (%lld blocks of %lld): prompt %lld (%lld shared), max_tokens %lld, "
        "%lld generated\n",
        static_cast<double>(budget) / (1 << 30), static_cast<long long>((*pool)->num_blocks()),
        static_cast<long long>((*pool)->block_size()), static_cast<long long>(prompt),
        static_cast<long long>(shared), static_cast<long long>(max_tokens),
        static_cast<long long>(generated));
    std::printf("  reserved prompt + max_tokens : %6lld sequences\n",
                static_cast<long long>(reserved));
    std::printf("  paged blocks                 : %6lld sequences (%.1fx)\n",
                static_cast<long long>(paged),
                static_cast<double>(paged) / static_cast<double>(std::max<int64_t>(1, reserved)));
    std::printf(
        "  paged + shared prefix        : %6lld sequences (%.1fx)\n",
        static_cast<long long>(shared_paged),
        static_cast<double>(shared_paged) / static_cast<double>(std::max<int64_t>(1, reserved)));
  }

  // Aggregate decode throughput.
  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  double single = 0;
  double single_decode = 0;
  std::printf(
      "throughput: prompt %d, %d tokens per stream (tokens/s over the whole run, and while every "
      "stream decodes)\n",
      prompt_tokens, decode_tokens);
  // What this machine allows n streams against one: a step of n rows makes n multiply-adds of
  // every weight, at least n · 2 · weights ÷ the arithmetic peak (measured here), while one stream
  // is bound by reading the weights. Where the n-row arithmetic takes longer than the one-stream
  // token measured below, n streams decode at most n · t(1) / t(n) times as fast as one.
  const bool bf16_weights = absl::GetFlag(FLAGS_dtype) == "bf16";
  const double multiply_adds =
      static_cast<double>(model->bytes_streamed_per_token()) / (bf16_weights ? 2.0 : 4.0);
  double peak = 0.0;
  if (absl::GetFlag(FLAGS_backend) == "cpu") {
    peak = bf16_weights ? bench::Bf16DotPeak(omp_get_max_threads())
                        : bench::Fp32FmaPeak(omp_get_max_threads());
  }
  if (peak > 0) {
    std::printf(
        "  a row makes %.0f M multiply-adds: %.2f ms at the %s peak (%.0f GFLOP/s, %d threads, "
        "measured)\n",
        multiply_adds / 1e6, 2 * multiply_adds / peak * 1e3, bf16_weights ? "vdpbf16ps" : "FMA",
        peak / 1e9, omp_get_max_threads());
  }
  for (const std::string& text : absl::GetFlag(FLAGS_streams)) {
    const int streams = std::max(1, std::atoi(text.c_str()));
    std::vector<double> rates;
    std::vector<double> decode_rates;
    std::vector<double> round_trips;  // before and after each run: where the threads were
    for (int r = 0; r < repeats; ++r) {
      round_trips.push_back(bench::MeasureThreadRoundTrip());
      absl::StatusOr<StreamsRun> run =
          RunStreams(model, streams, prompt_tokens, decode_tokens, 100 + r);
      round_trips.push_back(bench::MeasureThreadRoundTrip());
      if (!run.ok()) {
        return std::fprintf(stderr, "%s\n", std::string(run.status().message()).c_str()), 1;
      }
      rates.push_back(static_cast<double>(run->tokens) / run->seconds);
      if (run->decode_seconds > 0) {
        decode_rates.push_back(static_cast<double>(run->decode_tokens) / run->decode_seconds);
      }
    }
    const double rate = Median(rates);
    const double decode_rate = decode_rates.empty() ? 0 : Median(decode_rates);
    if (streams == 1 || single == 0) {
      single = rate / streams;
      single_decode = decode_rate / streams;
    }
    std::printf(
        "  %3d streams: %8.1f tokens/s (%.2fx one stream); decoding: %8.1f tokens/s (%.2fx)\n",
        streams, rate, rate / std::max(1e-9, single), decode_rate,
        decode_rate / std::max(1e-9, single_decode));
    std::printf("               threads' round trip before and after the runs: %s\n",
                bench::DescribeRoundTrips(round_trips).c_str());
    if (peak > 0 && streams > 1 && single_decode > 0) {
      const double one = 1.0 / single_decode;
      const double arithmetic = streams * 2 * multiply_adds / peak;
      std::printf(
          "               at most %.2fx the one stream above (a step's arithmetic at the peak: "
          "%.1f ms); decoding, the steps made their linears' multiply-adds at %.2f of the peak\n",
          streams * one / std::max(one, arithmetic), arithmetic * 1e3,
          decode_rate * 2 * multiply_adds / peak);
    }
  }

  // TTFT with a cold and a cached 2,000-token prefix.
  {
    const int32_t prefix_tokens = absl::GetFlag(FLAGS_prefix_tokens);
    const int32_t suffix_tokens = absl::GetFlag(FLAGS_suffix_tokens);
    EngineOptions options;
    options.max_context = 4096;
    options.max_step_tokens = 512;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model, nullptr, options);
    if (!engine.ok()) return 1;
    std::vector<double> cold, cached;
    int32_t cached_tokens = 0;
    bool same = true;
    for (int r = 0; r < repeats; ++r) {
      std::mt19937 rng(7000 + r);  // a new prefix each repeat: nothing of it is cached yet
      const std::vector<int32_t> prefix = RandomTokens(rng, prefix_tokens, c.vocab_size);
      std::vector<int32_t> first = prefix, second = prefix;
      const std::vector<int32_t> a = RandomTokens(rng, suffix_tokens, c.vocab_size);
      const std::vector<int32_t> b = RandomTokens(rng, suffix_tokens, c.vocab_size);
      first.insert(first.end(), a.begin(), a.end());
      second.insert(second.end(), b.begin(), b.end());
      std::vector<int32_t> out_cold, out_cached, out_check;
      int32_t hit = 0, ignored = 0;
      absl::StatusOr<double> t_cold = Ttft(**engine, first, &out_cold, &ignored);
      absl::StatusOr<double> t_cached = Ttft(**engine, second, &out_cached, &hit);
      if (!t_cold.ok() || !t_cached.ok()) return 1;
      cold.push_back(*t_cold);
      cached.push_back(*t_cached);
      cached_tokens = hit;
      // The cached run's tokens equal a run of the same prompt without prefix caching.
      EngineOptions uncached_options = options;
      uncached_options.prefix_caching = false;
      absl::StatusOr<std::unique_ptr<Engine>> uncached =
          Engine::Create(model, nullptr, uncached_options);
      if (!uncached.ok()) return 1;
      if (!Ttft(**uncached, second, &out_check, &ignored).ok()) return 1;
      same = same && out_check == out_cached;
    }
    const double cold_s = Median(cold), cached_s = Median(cached);
    std::printf(
        "TTFT, %d-token shared prefix + %d tokens: cold %.1f ms, cached %.1f ms "
        "(%d tokens from cache) = %.3fx cold (goal <= 0.2); outputs %s\n",
        prefix_tokens, suffix_tokens, cold_s * 1e3, cached_s * 1e3, cached_tokens,
        cached_s / cold_s, same ? "identical to uncached" : "DIFFER from uncached");
  }
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
