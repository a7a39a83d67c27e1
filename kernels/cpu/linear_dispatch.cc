#include "kernels/cpu/linear_dispatch.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "kernels/cpu/small_m_linear.h"

namespace kiln::cpu {
namespace {

struct Memo {
  absl::Mutex mu;
  absl::flat_hash_map<LinearShape, KernelChoice> choices ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<LinearShape, StreamChoice> streams ABSL_GUARDED_BY(mu);
};

Memo& TheMemo() {
  static Memo* const memo = new Memo();  // never destroyed: used until the process ends
  return *memo;
}

constexpr int kMaxSmallMRows = static_cast<int>(kSmallMMaxRows);

// The measured M and the rows each stands for.
struct Bucket {
  int64_t m;
  int first;
  int last;
};
constexpr Bucket kBuckets[] = {{1, 1, 1}, {3, 2, 4}, {8, 5, 8}, {16, 9, 16}};
// Timed rounds per kernel and bucket, after one untimed round each, alternating kernels so that
// the machine's slower drifts (shared memory bandwidth) fall on both.
constexpr int kTimedRounds = 5;
// The small-M kernel keeps a bucket unless brgemm is this much faster: where the weights stream
// from memory the two are within the noise of a shared machine (linear_bench: small-M 1.05-1.26x
// brgemm at M = 1 over a model's layers), and a tie should not hand a layer to the kernel with the
// per-call overhead.
constexpr double kSmallMTieMargin = 1.05;

uint32_t RowsMask(int first, int last) {
  uint32_t mask = 0;
  for (int m = first; m <= last; ++m) mask |= 1u << (m - 1);
  return mask;
}

std::string RowsText(uint32_t mask) {
  std::vector<std::string> parts;
  for (int m = 1; m <= kMaxSmallMRows; ++m) {
    if (mask >> (m - 1) & 1u) parts.push_back(absl::StrCat(m));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ",");
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Seconds `run` takes.
double Time(absl::FunctionRef<void()> run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Bit m-1 set where the small-M kernel measured faster; `summary` says what was measured.
uint32_t Measure(RoundFn round, std::string* summary) {
  uint32_t small_m_rows = 0;
  std::string times;
  for (const Bucket& bucket : kBuckets) {
    round(bucket.m, true);
    round(bucket.m, false);
    std::vector<double> small;
    std::vector<double> brgemm;
    for (int r = 0; r < kTimedRounds; ++r) {
      small.push_back(Time([&] { round(bucket.m, true); }));
      brgemm.push_back(Time([&] { round(bucket.m, false); }));
    }
    const double t_small = Median(small);
    const double t_brgemm = Median(brgemm);
    if (t_small <= t_brgemm * kSmallMTieMargin) small_m_rows |= RowsMask(bucket.first, bucket.last);
    absl::StrAppendFormat(&times, "%sM=%d %.0f vs %.0f us", times.empty() ? "" : ", ", bucket.m,
                          t_small * 1e6, t_brgemm * 1e6);
  }
  const std::string measured = absl::StrCat("(per round, small-M vs brgemm: ", times, ")");
  *summary = small_m_rows == 0 ? absl::StrCat("brgemm for every M ", measured)
                               : absl::StrCat("small-M kernel for M in {", RowsText(small_m_rows),
                                              "}, brgemm for the rest ", measured);
  return small_m_rows;
}

// KILN_LINEAR_KERNEL, read once.
enum class Pin { kAuto, kBrgemm, kSmallM };
Pin ThePin() {
  static const Pin pin = [] {
    const char* value = std::getenv("KILN_LINEAR_KERNEL");
    const std::string text = value == nullptr ? "" : value;
    if (text.empty() || text == "auto") return Pin::kAuto;
    if (text == "brgemm") return Pin::kBrgemm;
    if (text == "small_m") return Pin::kSmallM;
    LOG(WARNING) << "KILN_LINEAR_KERNEL=" << text
                 << " is not one of auto, brgemm, small_m; measuring (auto)";
    return Pin::kAuto;
  }();
  return pin;
}

}  // namespace

std::string DescribeShape(const LinearShape& shape) {
  return absl::StrCat("[K=", shape.k, ", N=", shape.n, "] ", DTypeName(shape.dtype),
                      shape.bias ? " +bias" : "",
                      shape.quantization == Quantization::kNone
                          ? ""
                          : absl::StrCat(" ", QuantizationName(shape.quantization)));
}

bool KnownChoice(const LinearShape& shape, KernelChoice* choice) {
  Memo& memo = TheMemo();
  absl::MutexLock lock(&memo.mu);
  auto it = memo.choices.find(shape);
  if (it == memo.choices.end()) return false;
  *choice = it->second;
  return true;
}

namespace {

// The K blockings tried, likeliest first (oneDNN 2.6's bf16 brgemm: all of K up to 512, 512 up to
// 1024, 1024 above).
std::vector<int64_t> Candidates(const LinearShape& shape, const KernelChoice* like) {
  std::vector<int64_t> tried;
  auto add = [&](int64_t k_block) {
    if (k_block >= shape.k) k_block = 0;
    if (std::find(tried.begin(), tried.end(), k_block) == tried.end()) tried.push_back(k_block);
  };
  if (like != nullptr) add(like->k_block);
  add(shape.k <= 512 ? 0 : shape.k <= 1024 ? 512 : 1024);
  for (int64_t k_block : {0, 512, 1024, 256, 2048, 128, 384, 768, 64, 32, 16}) add(k_block);
  return tried;
}

}  // namespace

KernelChoice ChooseKernel(const LinearShape& shape, ProbeFn probe, RoundFn round,
                          const LinearShape* like_shape, const KernelChoice* like) {
  KernelChoice choice;
  if (KnownChoice(shape, &choice)) return choice;
  const Pin pin = ThePin();
  bool found = false;
  bool copied = false;
  for (int64_t k_block : Candidates(shape, like)) {
    if (probe(k_block)) {
      choice.k_block = k_block;
      choice.bit_identical = found = true;
      break;
    }
  }
  if (!found && pin != Pin::kSmallM) {
    choice.summary =
        "brgemm for every M (no K blocking makes the small-M kernel's sums equal brgemm's)";
  } else if (pin == Pin::kBrgemm) {
    choice.summary = "brgemm for every M (KILN_LINEAR_KERNEL=brgemm)";
  } else if (pin == Pin::kSmallM) {
    if (!found) probe(choice.k_block);
    choice.small_m_rows = RowsMask(1, kMaxSmallMRows);
    choice.summary =
        absl::StrCat("small-M kernel for M ≤ ", kMaxSmallMRows, " (KILN_LINEAR_KERNEL=small_m)");
  } else if (like != nullptr && like->k_block == choice.k_block) {
    choice.small_m_rows = like->small_m_rows;
    choice.summary = absl::StrCat("as ", DescribeShape(*like_shape), ": ", like->summary);
    copied = true;  // like's summary names its blocking already
  } else {
    const uint32_t rows = Measure(round, &choice.summary);  // outside the lock: milliseconds
    choice.small_m_rows = rows;
  }
  if (found && choice.small_m_rows != 0 && !copied) {
    absl::StrAppend(&choice.summary, "; K blocks of ",
                    choice.k_block == 0 ? std::string("all of K") : absl::StrCat(choice.k_block),
                    ", bit-identical to brgemm");
  }
  Memo& memo = TheMemo();
  absl::MutexLock lock(&memo.mu);
  auto [it, inserted] = memo.choices.emplace(shape, choice);
  if (inserted) LOG(INFO) << "linear " << DescribeShape(shape) << ": " << it->second.summary;
  return it->second;
}

namespace {

// The default count keeps its place unless another count's median round is this much faster
// (the rounds of a shared machine's memory drift by a few percent).
constexpr double kStreamTieMargin = 1.03;

// KILN_DECODE_STREAMS, read once: 0 (auto, measure) or a count.
int StreamPin() {
  static const int pin = [] {
    const char* value = std::getenv("KILN_DECODE_STREAMS");
    const std::string text = value == nullptr ? "" : value;
    if (text.empty() || text == "auto") return 0;
    for (const int streams : kStreamCounts) {
      if (text == std::to_string(streams)) return streams;
    }
    LOG(WARNING) << "KILN_DECODE_STREAMS=" << text << " is not one of auto, 1, 2, 4; measuring";
    return 0;
  }();
  return pin;
}

// For the log: "2 panels side by side a thread at one row".
std::string StreamsText(int streams) {
  return absl::StrCat(streams, streams == 1 ? " panel" : " panels",
                      " side by side a thread at one row");
}

StreamChoice MeasureStreams(StreamRoundFn round) {
  constexpr int kCounts = static_cast<int>(std::size(kStreamCounts));
  std::vector<double> times[kCounts];
  for (const int streams : kStreamCounts) round(streams);
  for (int r = 0; r < kTimedRounds; ++r) {
    for (int i = 0; i < kCounts; ++i) times[i].push_back(Time([&] { round(kStreamCounts[i]); }));
  }
  StreamChoice choice;
  double medians[kCounts];
  std::string measured;
  for (int i = 0; i < kCounts; ++i) {
    medians[i] = Median(times[i]);
    absl::StrAppendFormat(&measured, "%s%d: %.0f us", i == 0 ? "" : ", ", kStreamCounts[i],
                          medians[i] * 1e6);
  }
  choice.streams = PickStreams(medians);
  choice.summary =
      absl::StrCat(StreamsText(choice.streams), " (per round, by streams: ", measured, ")");
  return choice;
}

}  // namespace

int PickStreams(absl::Span<const double> median_seconds) {
  int streams = kStreamCounts[0];
  double best = median_seconds[0];
  for (size_t i = 1; i < median_seconds.size() && i < std::size(kStreamCounts); ++i) {
    if (median_seconds[i] * kStreamTieMargin < best) {
      best = median_seconds[i];
      streams = kStreamCounts[i];
    }
  }
  return streams;
}

bool KnownStreams(const LinearShape& shape, StreamChoice* choice) {
  Memo& memo = TheMemo();
  absl::MutexLock lock(&memo.mu);
  auto it = memo.streams.find(shape);
  if (it == memo.streams.end()) return false;
  *choice = it->second;
  return true;
}

StreamChoice ChooseStreams(const LinearShape& shape, StreamRoundFn round,
                           const LinearShape* like_shape, const StreamChoice* like) {
  StreamChoice choice;
  if (KnownStreams(shape, &choice)) return choice;
  if (const int pin = StreamPin(); pin != 0) {
    choice.streams = pin;
    choice.summary = absl::StrCat(StreamsText(pin), " (KILN_DECODE_STREAMS)");
  } else if (like != nullptr) {
    choice.streams = like->streams;
    choice.summary = absl::StrCat("as ", DescribeShape(*like_shape), ": ", like->summary);
  } else {
    choice = MeasureStreams(round);  // outside the lock: milliseconds
  }
  Memo& memo = TheMemo();
  absl::MutexLock lock(&memo.mu);
  auto [it, inserted] = memo.streams.emplace(shape, choice);
  if (inserted) LOG(INFO) << "linear " << DescribeShape(shape) << ": " << it->second.summary;
  return it->second;
}

std::vector<int> ChooseStreamsForShapes(const std::vector<StreamShape>& shapes) {
  size_t all_bytes = 0;
  for (const StreamShape& shape : shapes) all_bytes += shape.total_bytes;
  auto timed = [&](const StreamShape& shape) {
    return shape.weight_bytes <= kLargestStreamTimedBytes &&
           (shape.total_bytes >= kStreamRoundBytes || all_bytes < kStreamRoundBytes);
  };
  std::vector<size_t> order(shapes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // The timed shapes first, most bytes first: the others take the first one's choice.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (timed(shapes[a]) != timed(shapes[b])) return timed(shapes[a]);
    return shapes[a].total_bytes > shapes[b].total_bytes;
  });
  std::vector<int> streams(shapes.size());  // each set below
  const StreamShape* like_shape = nullptr;
  StreamChoice like;
  for (const size_t i : order) {
    const StreamShape& shape = shapes[i];
    const bool copy = !timed(shape) && like_shape != nullptr;
    const StreamChoice choice = ChooseStreams(
        shape.shape, shape.round, copy ? &like_shape->shape : nullptr, copy ? &like : nullptr);
    streams[i] = choice.streams;
    if (like_shape == nullptr && timed(shape)) {
      like_shape = &shape;
      like = choice;
    }
  }
  return streams;
}

}  // namespace kiln::cpu
