// Decode and verify attention over the paged KV pool (kernels/cpu/attention.cc) on a model's head
// shape: microseconds a call (one layer of one sequence), GFLOP/s, and that rate ÷ the fp32 FMA
// peak of the same threads, measured in the same process. Attention over a few hundred positions
// reads little (a 0.5B model's bf16 KV at 512 positions is 0.3 MB a layer, from cache) and is
// bound by arithmetic, so the FMA peak, not the memory, is its roofline. Calls run layer after
// layer on a step's thread team, as decode runs them, over a block table in shuffled order. With
// --sequences N > 1 a layer's call attends for N sequences (a step of N streams), timed both as one
// call for all and as one call a sequence, alternating layer by layer.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "bench/bench_util.h"
#include "bench/compute_peak.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/step_team.h"
#include "kernels/dtype.h"

ABSL_FLAG(int32_t, heads, 14, "query heads (default: Qwen2.5-0.5B)");
ABSL_FLAG(int32_t, kv_heads, 2, "key/value heads");
ABSL_FLAG(int32_t, head_dim, 64, "dimensions a head");
ABSL_FLAG(int32_t, layers, 24, "layers (each its own keys and values, called in turn)");
ABSL_FLAG(int32_t, block_size, 16, "positions a KV block");
ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"128", "512", "2048"}),
          "positions the last new token sees");
ABSL_FLAG(std::vector<std::string>, tokens, std::vector<std::string>({"1", "4"}),
          "new tokens a call (1: decode; more: speculative verification)");
ABSL_FLAG(std::vector<std::string>, sequences, std::vector<std::string>({"1", "16"}),
          "sequences a layer's call attends for (a step of that many streams), each with its own "
          "context and block table; with more than one, also timed as one call a sequence, "
          "alternating layer by layer");
ABSL_FLAG(std::vector<std::string>, kv_dtypes, std::vector<std::string>({"bf16", "f32"}),
          "what the pool stores");
ABSL_FLAG(int64_t, evict_bytes, 12 << 20,
          "bytes read between two layers' calls (outside the timing), as decode's weight "
          "streaming evicts the keys and values from the caches (0: KV stays cached)");
ABSL_FLAG(int32_t, repeats, 7, "measurements per case (the median is printed)");

namespace kiln::bench {
namespace {

std::vector<int64_t> Numbers(const std::vector<std::string>& texts) {
  std::vector<int64_t> out;
  for (const std::string& t : texts) {
    int64_t v = 0;
    if (absl::SimpleAtoi(t, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// Reads the next `bytes` of a buffer 16 times larger, round and round, on every thread of the
// team: what streaming a layer's weights does to the caches between two attention calls.
class Evictor {
 public:
  explicit Evictor(int64_t bytes)
      : bytes_(bytes / 4096 * 4096),
        size_(16 * bytes_),
        data_(static_cast<std::byte*>(cpu::AllocateHost(static_cast<size_t>(size_)))) {
    if (data_ != nullptr) std::memset(data_.get(), 1, static_cast<size_t>(size_));
  }
  void Read(int threads) {
    if (data_ == nullptr || bytes_ == 0) return;
    const int64_t begin = next_;
    next_ = (next_ + bytes_) % size_;
    std::atomic<uint64_t> sum{0};
    cpu::RunOnThreads(threads, [&](int t, int n) {
      const auto* words = reinterpret_cast<const uint64_t*>(data_.get() + begin);
      const int64_t count = bytes_ / 8;
      uint64_t local = 0;
      for (int64_t i = count * t / n; i < count * (t + 1) / n; i += 8) local += words[i];
      sum.fetch_add(local, std::memory_order_relaxed);
    });
    sink_ += sum.load();
  }

 private:
  int64_t bytes_;
  int64_t size_;
  cpu::HostBytes data_;
  int64_t next_ = 0;
  uint64_t sink_ = 0;
};

struct Case {
  DType dtype;
  int64_t context;
  int64_t tokens;
  int64_t sequences;
};

struct Timing {
  double together = 0.0;    // one call for every sequence (µs a layer, median)
  double one_by_one = 0.0;  // one call a sequence (sequences > 1)
};

// Median microseconds of one layer's attention over c.sequences sequences of c.context positions.
Timing TimeCase(const AttentionShape& shape, const Case& c, int64_t layers, int64_t block_size,
                int repeats, int threads, Evictor& evictor) {
  const int64_t blocks = c.sequences * ((c.context + block_size - 1) / block_size);
  KvPoolRef pool;
  pool.num_blocks = blocks;
  pool.block_size = block_size;
  pool.layers = layers;
  pool.kv_dim = shape.kv_dim();
  pool.dtype = c.dtype;
  const int64_t elements = blocks * pool.block_elements();
  const size_t element_bytes = c.dtype == DType::kBF16 ? 2 : 4;
  cpu::HostBytes memory(
      static_cast<std::byte*>(cpu::AllocateHost(static_cast<size_t>(elements) * element_bytes)));
  if (memory == nullptr) return Timing{};
  pool.data = memory.get();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < elements; ++i) {
    if (c.dtype == DType::kBF16) {
      static_cast<uint16_t*>(pool.data)[i] = F32ToBF16(uniform(rng));
    } else {
      static_cast<float*>(pool.data)[i] = uniform(rng);
    }
  }
  // The blocks in shuffled order, each sequence a run of the shuffled list.
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const int64_t blocks_a_sequence = blocks / c.sequences;
  const int64_t q_stride = shape.qkv_dim();
  const int64_t rows = c.sequences * c.tokens;
  std::vector<float> q(static_cast<size_t>(rows * q_stride));
  for (float& v : q) v = uniform(rng);
  std::vector<float> out(static_cast<size_t>(rows * shape.q_dim()));
  auto sequences_of = [&](int64_t layer) {
    std::vector<cpu::AttentionSequence> sequences(static_cast<size_t>(c.sequences));
    for (int64_t s = 0; s < c.sequences; ++s) {
      cpu::AttentionSequence& a = sequences[static_cast<size_t>(s)];
      a.q = q.data() + s * c.tokens * q_stride;
      a.q_stride = q_stride;
      a.n_tokens = c.tokens;
      a.start_pos = c.context - c.tokens;
      a.kv = cpu::PagedKv{pool, table.data() + s * blocks_a_sequence, layer};
      a.out = out.data() + s * c.tokens * shape.q_dim();
      a.out_stride = shape.q_dim();
    }
    return sequences;
  };
  const int64_t passes = std::max<int64_t>(1, 4096 / (c.context * c.sequences));
  std::vector<double> together, one_by_one;
  for (int r = 0; r <= repeats; ++r) {  // the first round warms the caches and the team
    double seconds[2] = {0.0, 0.0};
    absl::Status held = cpu::StepTeam::Hold(threads, [&]() -> absl::Status {
      for (int64_t p = 0; p < passes; ++p) {
        for (int64_t layer = 0; layer < layers; ++layer) {
          const std::vector<cpu::AttentionSequence> sequences = sequences_of(layer);
          for (int way = 0; way < (c.sequences > 1 ? 2 : 1); ++way) {
            evictor.Read(threads);
            const auto start = Clock::now();
            if (way == 0) {
              cpu::CausalAttention(shape, sequences.data(), c.sequences);
            } else {
              for (const cpu::AttentionSequence& a : sequences) {
                cpu::CausalAttention(shape, a.q, a.q_stride, a.n_tokens, a.start_pos, a.kv, a.out,
                                     a.out_stride);
              }
            }
            seconds[way] += Seconds(start);
          }
        }
      }
      return absl::OkStatus();
    });
    if (r > 0) {
      together.push_back(seconds[0] * 1e6 / static_cast<double>(passes * layers));
      one_by_one.push_back(seconds[1] * 1e6 / static_cast<double>(passes * layers));
    }
  }
  return Timing{Median(together), c.sequences > 1 ? Median(one_by_one) : 0.0};
}

int Run() {
  AttentionShape shape;
  shape.n_heads = absl::GetFlag(FLAGS_heads);
  shape.n_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  shape.head_dim = absl::GetFlag(FLAGS_head_dim);
  shape.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const int threads = omp_get_max_threads();
  const bool avx512 = cpu::Avx512Supported();
  const double peak = Fp32FmaPeak(threads);
  Evictor evictor(absl::GetFlag(FLAGS_evict_bytes));
  std::printf(
      "attention: %lld heads, %lld KV heads, head_dim %lld, %d layers, blocks of %d, "
      "%d threads\n",
      static_cast<long long>(shape.n_heads), static_cast<long long>(shape.n_kv_heads),
      static_cast<long long>(shape.head_dim), absl::GetFlag(FLAGS_layers),
      absl::GetFlag(FLAGS_block_size), threads);
  if (avx512)
    std::printf("fp32 FMA peak  %.1f GFLOP/s (%d threads, measured)\n", peak / 1e9, threads);
  std::printf("%-6s %8s %7s %5s %12s %10s %8s %16s\n", "KV", "context", "tokens", "seqs",
              "us a call", "GFLOP/s", "÷ peak", "a call a seq, us");
  for (const std::string& name : absl::GetFlag(FLAGS_kv_dtypes)) {
    const DType dtype = name == "f32" ? DType::kF32 : DType::kBF16;
    for (int64_t context : Numbers(absl::GetFlag(FLAGS_contexts))) {
      for (int64_t tokens : Numbers(absl::GetFlag(FLAGS_tokens))) {
        if (tokens > context) continue;
        for (int64_t sequences : Numbers(absl::GetFlag(FLAGS_sequences))) {
          const Timing t = TimeCase(shape, Case{dtype, context, tokens, sequences},
                                    absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_block_size),
                                    absl::GetFlag(FLAGS_repeats), threads, evictor);
          // q·k and p·v: 2 FLOPs a multiply-add each, over the keys each token sees.
          double macs = 0.0;
          for (int64_t k = 0; k < tokens; ++k) {
            macs += 2.0 * static_cast<double>(shape.n_heads * shape.head_dim) *
                    static_cast<double>(context - tokens + k + 1);
          }
          const double gflops = 2.0 * macs * static_cast<double>(sequences) / (t.together * 1e3);
          std::printf("%-6s %8lld %7lld %5lld %12.2f %10.1f %8.2f", name.c_str(),
                      static_cast<long long>(context), static_cast<long long>(tokens),
                      static_cast<long long>(sequences), t.together, gflops,
                      avx512 ? gflops * 1e9 / peak : 0.0);
          if (sequences > 1) std::printf(" %16.2f", t.one_by_one);
          std::printf("\n");
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kiln::bench::Run();
}
