// Decode-path linears, kernel against kernel: the small-M panel kernel and oneDNN's brgemm on the
// same packed weights, M = 1..16, alternating, medians. Each shape is packed `--copies` times and a
// measurement runs once over every copy, as decode runs a layer's weights once per step, so the
// weights come from memory (or from cache, for shapes and copies that fit, as in a small model).
// Prints GB/s of weight streamed for each kernel, the ratio, the kernel serving would choose and
// the read bandwidth of this machine for the roofline. With --layer_order the shapes run as a
// decode step runs them instead (copy c of each shape, then copy c + 1), each call timed alone,
// the kernel serving chose. With --quantize int8|int4 the quantized
// VNNI kernel runs alone (it has no brgemm twin) and its GB/s of packed bytes is held against the
// read-bandwidth probe.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "bench/bench_util.h"
#include "bench/read_bandwidth.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/small_m_linear.h"
#include "kernels/cpu/step_team.h"
#include "kernels/dtype.h"
#include "kernels/quantization.h"

ABSL_FLAG(std::string, shapes, "896x1152,896x896,896x9728,4864x896,896x151936",
          "comma-separated KxN (default: the linears of a Qwen2.5-0.5B layer and its LM head)");
ABSL_FLAG(std::string, copies, "24,24,24,24,1",
          "copies of each shape, run one after another per measurement (layers of a model)");
ABSL_FLAG(std::string, dtype, "bf16", "bf16 or f32");
ABSL_FLAG(int32_t, min_m, 1, "smallest M measured");
ABSL_FLAG(int32_t, max_m, 8,
          "largest M measured (up to 16, the small-M kernel's limit; up to 64 with --layer_order, "
          "where larger M runs the kernel serving would choose, as a batched decode step does)");
ABSL_FLAG(int32_t, repeats, 7, "measurements per kernel and M (the median is printed)");
ABSL_FLAG(bool, layer_order, false,
          "run the shapes as decode does, one layer (copy) after another, each call timed on "
          "its own: GB/s per shape from memory, where the default alternating passes over one "
          "shape's copies can find part of a small shape's copies still in L3");
ABSL_FLAG(bool, step_team, true,
          "--layer_order: run the calls on a step's thread team (kernels/cpu/step_team.h), as "
          "decode does; false: a parallel region per call");
ABSL_FLAG(bool, by_placement, true,
          "--layer_order: also print the passes whose threads stayed apart (a cache-line round "
          "trip between them over 150 ns before and after the pass: on the EPYC VMs two CCDs, "
          "each with its own link to memory) and those that stayed together, on their own");
ABSL_FLAG(bool, hand_over, false,
          "instead: time a job handed to the step's team and a one-row SiluMul on it, beside "
          "the threads' cache-line round trip");
ABSL_FLAG(std::string, quantize, "none",
          "none, or int8 / int4: time the quantized kernel on weights packed that way");
ABSL_FLAG(std::string, streams, "",
          "--layer_order: comma-separated panels a thread reads side by side at one row (1, 2, "
          "4), each pass running every count in turn, alternating, one row of output each "
          "(default: the counts chosen at load)");

namespace kiln {
namespace {

using bench::Clock;
using bench::Median;
using bench::Seconds;

struct Shape {
  int64_t k = 0;
  int64_t n = 0;
  int copies = 1;
};

std::vector<Shape> ParseShapes() {
  std::vector<Shape> shapes;
  const std::vector<std::string> copies = absl::StrSplit(absl::GetFlag(FLAGS_copies), ',');
  size_t i = 0;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> kn = absl::StrSplit(text, 'x');
    Shape shape;
    if (kn.size() != 2 || !absl::SimpleAtoi(kn[0], &shape.k) ||
        !absl::SimpleAtoi(kn[1], &shape.n)) {
      LOG(FATAL) << "bad shape " << text << " (want KxN)";
    }
    if (i < copies.size() && !absl::SimpleAtoi(copies[i], &shape.copies)) {
      LOG(FATAL) << "bad copies " << copies[i];
    }
    ++i;
    shapes.push_back(shape);
  }
  return shapes;
}

// `shape.copies` linears packed from one weight drawn from `normal` (σ 0.05).
std::vector<std::unique_ptr<PackedLinear>> PackCopies(Backend& backend, const Shape& shape,
                                                      DType dtype, Quantization quantization,
                                                      std::mt19937& rng,
                                                      std::normal_distribution<float>& normal) {
  std::vector<float> weight(static_cast<size_t>(shape.k * shape.n));
  for (float& v : weight) v = normal(rng) * 0.05f;
  std::vector<std::unique_ptr<PackedLinear>> linears;
  for (int c = 0; c < shape.copies; ++c) {
    LinearPackSpec spec;
    spec.name = "bench";
    spec.compute_dtype = dtype;
    spec.quantization = quantization;
    spec.row_blocks.push_back(WeightView{DType::kF32, shape.n, shape.k,
                                         reinterpret_cast<const std::byte*>(weight.data())});
    absl::StatusOr<std::unique_ptr<PackedLinear>> packed = backend.PackLinear(spec);
    CHECK(packed.ok()) << packed.status();
    linears.push_back(*std::move(packed));
  }
  return linears;
}

// The quantized kernel alone, M = 1..max_m: GB/s of its packed bytes (scales included) and that
// over the read bandwidth probed just before the shape.
int QuantizedMain(Backend& backend, Quantization quantization, int min_m, int max_m, int repeats) {
  std::printf("backend %s, %s weights\n", std::string(backend.description()).c_str(),
              std::string(QuantizationName(quantization)).c_str());
  std::printf("%-14s %6s %2s %10s %10s %8s\n", "K x N", "copies", "M", "GB/s", "probe GB/s",
              "÷ probe");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& shape : ParseShapes()) {
    const std::vector<std::unique_ptr<PackedLinear>> linears =
        PackCopies(backend, shape, DType::kBF16, quantization, rng, normal);
    double bytes = 0;
    for (const auto& linear : linears) {
      CHECK(linear->quantization() == quantization)
          << "packed as " << linear->kernel_name() << ", not quantized";
      bytes += static_cast<double>(linear->packed_bytes());
    }
    std::vector<float> x(static_cast<size_t>(max_m * shape.k));
    for (float& v : x) v = normal(rng);
    std::vector<float> y(static_cast<size_t>(max_m * shape.n));
    const double bandwidth = bench::MeasureReadBandwidth(2);
    for (int m = min_m; m <= max_m; ++m) {
      auto pass = [&] {
        const auto start = Clock::now();
        for (const auto& linear : linears)
          CHECK(cpu::RunLinear(*linear, x.data(), m, y.data()).ok());
        return Seconds(start);
      };
      pass();
      std::vector<double> times;
      for (int r = 0; r < repeats; ++r) times.push_back(pass());
      const double rate = bytes / Median(times);
      std::printf("%6ldx%-7ld %6d %2d %10.1f %10.1f %8.2f\n", shape.k, shape.n, shape.copies, m,
                  rate / 1e9, bandwidth / 1e9, rate / bandwidth);
    }
  }
  return 0;
}

// Where a pass's two threads were: the cache-line round trip between them before and after it
// (bench::MeasureThreadRoundTrip) both over 150 ns (apart: two CCDs on the EPYC VMs), both under
// (together: one CCX, or one core), or one of each (moved during the pass).
enum class Placement { kApart, kTogether, kMoved };
Placement PlacementOf(double before_ns, double after_ns) {
  constexpr double kApartNs = 150;
  if (before_ns > kApartNs && after_ns > kApartNs) return Placement::kApart;
  if (before_ns <= kApartNs && after_ns <= kApartNs) return Placement::kTogether;
  return Placement::kMoved;
}

// --layer_order: copy c of every shape that has one, shape by shape, then the next copy (as a
// decode step runs a model's layers), at M = 1..max_m; per shape the GB/s of its packed bytes,
// each call timed alone, median over `repeats` passes, against the probe taken before the pass.
// With --streams, each pass runs once per stream count, so the counts meet the same drift.
int LayerOrderMain(Backend& backend, DType dtype, Quantization quantization, int min_m, int max_m,
                   int repeats) {
  std::printf("backend %s, %s weights, %s, layer order\n",
              std::string(backend.description()).c_str(), std::string(DTypeName(dtype)).c_str(),
              std::string(QuantizationName(quantization)).c_str());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<Shape> shapes = ParseShapes();
  std::vector<std::vector<std::unique_ptr<PackedLinear>>> linears;
  int layers = 0;
  int64_t widest = 0;
  for (const Shape& shape : shapes) {
    linears.push_back(PackCopies(backend, shape, dtype, quantization, rng, normal));
    layers = std::max(layers, shape.copies);
    widest = std::max({widest, shape.k, shape.n});
  }
  std::vector<float> x(static_cast<size_t>(max_m * widest));
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(max_m * widest));
  // The stream counts to alternate (0: leave each linear at the count chosen at load).
  std::vector<int> stream_counts;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_streams), ',', absl::SkipEmpty())) {
    int count = 0;
    CHECK(absl::SimpleAtoi(text, &count) && (count == 1 || count == 2 || count == 4))
        << "--streams takes 1, 2 and 4, not " << text;
    stream_counts.push_back(count);
  }
  if (stream_counts.empty()) stream_counts.push_back(0);
  std::printf("%-14s %6s %2s %7s %10s %10s %8s %12s  %s\n", "K x N", "copies", "M", "streams",
              "GB/s", "probe GB/s", "÷ probe", "us a call", "passes");
  for (int m = min_m; m <= max_m; ++m) {
    // [count][shape]: each pass's seconds.
    std::vector<std::vector<std::vector<double>>> seconds(
        stream_counts.size(), std::vector<std::vector<double>>(shapes.size()));
    std::vector<double> probes;
    std::vector<Placement> placements;
    for (int pass = 0; pass <= repeats; ++pass) {  // pass 0 warms up
      const double probe = bench::MeasureReadBandwidth(2);
      const double round_trip_before = bench::MeasureThreadRoundTrip();
      for (size_t c = 0; c < stream_counts.size(); ++c) {
        for (auto& copies : linears) {
          for (auto& linear : copies) {
            if (stream_counts[c] != 0 && cpu::DecodeStreams(*linear) != 0) {
              CHECK(cpu::SetDecodeStreams(*linear, stream_counts[c]).ok());
            }
          }
        }
        std::vector<double> total(shapes.size(), 0.0);
        // As a decode step runs them: on the step's team when teams are on and M is one a team
        // takes.
        const bool team = cpu::StepTeamsEnabled() && m <= cpu::kSmallMMaxRows;
        const absl::Status status =
            cpu::StepTeam::Hold(team ? omp_get_max_threads() : 1, [&]() -> absl::Status {
              for (int layer = 0; layer < layers; ++layer) {
                for (size_t s = 0; s < shapes.size(); ++s) {
                  if (layer >= shapes[s].copies) continue;
                  const auto start = Clock::now();
                  KILN_RETURN_IF_ERROR(cpu::RunLinear(*linears[s][static_cast<size_t>(layer)],
                                                      x.data(), m, y.data()));
                  total[s] += Seconds(start);
                }
              }
              return absl::OkStatus();
            });
        CHECK(status.ok()) << status;
        if (pass == 0) continue;
        for (size_t s = 0; s < shapes.size(); ++s) seconds[c][s].push_back(total[s]);
      }
      if (pass > 0) {
        probes.push_back(probe);
        placements.push_back(PlacementOf(round_trip_before, bench::MeasureThreadRoundTrip()));
      }
    }
    // All passes, then (--by_placement) the passes of each placement seen, on their own.
    std::vector<std::pair<std::string, std::vector<bool>>> selections;
    selections.emplace_back("all", std::vector<bool>(probes.size(), true));
    if (absl::GetFlag(FLAGS_by_placement)) {
      for (const auto& [placement, name] :
           {std::pair{Placement::kApart, "apart"}, std::pair{Placement::kTogether, "together"}}) {
        std::vector<bool> chosen(probes.size());
        for (size_t i = 0; i < probes.size(); ++i) chosen[i] = placements[i] == placement;
        if (std::count(chosen.begin(), chosen.end(), true) > 0) {
          selections.emplace_back(name, std::move(chosen));
        }
      }
    }
    auto select = [](const std::vector<double>& values, const std::vector<bool>& chosen) {
      std::vector<double> kept;
      for (size_t i = 0; i < values.size(); ++i) {
        if (chosen[i]) kept.push_back(values[i]);
      }
      return kept;
    };
    for (const auto& [name, chosen] : selections) {
      const double probe = Median(select(probes, chosen));
      const std::string label =
          absl::StrCat(name, " (", std::count(chosen.begin(), chosen.end(), true), ")");
      for (size_t s = 0; s < shapes.size(); ++s) {
        double bytes = 0;
        for (const auto& linear : linears[s]) bytes += static_cast<double>(linear->packed_bytes());
        for (size_t c = 0; c < stream_counts.size(); ++c) {
          const double t = Median(select(seconds[c][s], chosen));
          const int streams = cpu::DecodeStreams(*linears[s][0]);
          const std::string streams_text =
              streams == 0 ? "-"
                           : std::to_string(stream_counts[c] == 0 ? streams : stream_counts[c]);
          std::printf("%6ldx%-7ld %6d %2d %7s %10.1f %10.1f %8.2f %12.1f  %s\n", shapes[s].k,
                      shapes[s].n, shapes[s].copies, m, streams_text.c_str(), bytes / t / 1e9,
                      probe / 1e9, bytes / t / probe, t / shapes[s].copies * 1e6, label.c_str());
        }
      }
    }
  }
  return 0;
}

// --hand_over: what handing work to the step's team costs (an empty job), and a SiluMul of one
// decode row (4864 values) split over the team, beside the cache-line round trip between the two
// threads, ten rounds: on the EPYC VMs 215 and 1200 ns with the threads on one CCX (65 ns round
// trip), 960 and 2350 ns across two CCDs (220 ns).
int HandOverMain() {
  constexpr int64_t kInter = 4864;
  std::vector<float> gate_up(2 * kInter, 0.5f), out(kInter);
  for (int round = 0; round < 10; ++round) {
    const double round_trip = bench::MeasureThreadRoundTrip();
    double empty_ns = 0, silu_ns = 0;
    const absl::Status status = cpu::StepTeam::Hold(2, [&]() -> absl::Status {
      cpu::StepTeam* team = cpu::StepTeam::Current();
      if (team == nullptr) return absl::FailedPreconditionError("no team: one thread");
      constexpr int kJobs = 20000, kRows = 5000;
      auto start = Clock::now();
      for (int i = 0; i < kJobs; ++i) team->Run(2, [](int, int) {});
      empty_ns = Seconds(start) * 1e9 / kJobs;
      start = Clock::now();
      for (int i = 0; i < kRows; ++i) {
        cpu::SiluMul(gate_up.data(), 2 * kInter, 1, kInter, out.data(), kInter);
      }
      silu_ns = Seconds(start) * 1e9 / kRows;
      return absl::OkStatus();
    });
    if (!status.ok()) return std::fprintf(stderr, "%s\n", status.ToString().c_str()), 1;
    std::printf(
        "round trip %4.0f ns: an empty job handed to the team %5.0f ns, SiluMul of %ld "
        "values %5.0f ns\n",
        round_trip, empty_ns, kInter, silu_ns);
  }
  return 0;
}

int Main() {
  if (absl::GetFlag(FLAGS_hand_over)) return HandOverMain();
  absl::StatusOr<Quantization> quantization = ParseQuantization(absl::GetFlag(FLAGS_quantize));
  CHECK(quantization.ok()) << quantization.status();
  const DType dtype = absl::GetFlag(FLAGS_dtype) == "f32" ? DType::kF32 : DType::kBF16;
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const bool layer_order = absl::GetFlag(FLAGS_layer_order);
  const int max_m = std::clamp(absl::GetFlag(FLAGS_max_m), 1,
                               layer_order ? 64 : static_cast<int>(cpu::kSmallMMaxRows));
  const int min_m = std::clamp(absl::GetFlag(FLAGS_min_m), 1, max_m);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  CHECK(backend.ok()) << backend.status();
  cpu::EnableStepTeams(absl::GetFlag(FLAGS_step_team));
  if (layer_order) {
    return LayerOrderMain(**backend, dtype, *quantization, min_m, max_m, repeats);
  }
  if (*quantization != Quantization::kNone) {
    return QuantizedMain(**backend, *quantization, min_m, max_m, repeats);
  }
  std::printf("backend %s, %s weights\n", std::string((*backend)->description()).c_str(),
              std::string(DTypeName(dtype)).c_str());
  std::printf("%-14s %6s %2s %12s %12s %8s %8s %10s\n", "K x N", "copies", "M", "small-M GB/s",
              "brgemm GB/s", "ratio", "max err", "chosen");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& shape : ParseShapes()) {
    const std::vector<std::unique_ptr<PackedLinear>> linears =
        PackCopies(**backend, shape, dtype, Quantization::kNone, rng, normal);
    if (!cpu::HasSmallMKernel(*linears[0])) {
      std::printf("%6ldx%-7ld no small-M kernel for this layout/CPU (%s)\n", shape.k, shape.n,
                  linears[0]->kernel_name().c_str());
      continue;
    }
    const double bytes = static_cast<double>(shape.k * shape.n) * DTypeSize(dtype) * shape.copies;
    std::vector<float> x(static_cast<size_t>(max_m * shape.k));
    for (float& v : x) v = normal(rng);
    std::vector<float> y_small(static_cast<size_t>(max_m * shape.n));
    std::vector<float> y_brgemm(y_small.size());
    for (int m = min_m; m <= max_m; ++m) {
      auto pass = [&](cpu::LinearPath path, std::vector<float>& y) {
        const auto start = Clock::now();
        for (const auto& linear : linears) {
          CHECK(cpu::RunLinear(*linear, x.data(), m, y.data(), path).ok());
        }
        return Seconds(start);
      };
      std::vector<double> small;
      std::vector<double> brgemm;
      std::vector<double> chosen;
      pass(cpu::LinearPath::kSmallM, y_small);
      pass(cpu::LinearPath::kBrgemm, y_brgemm);
      for (int r = 0; r < repeats; ++r) {
        small.push_back(pass(cpu::LinearPath::kSmallM, y_small));
        brgemm.push_back(pass(cpu::LinearPath::kBrgemm, y_brgemm));
        chosen.push_back(pass(cpu::LinearPath::kChosen, y_brgemm));
      }
      pass(cpu::LinearPath::kBrgemm, y_brgemm);
      double max_err = 0.0;
      for (int64_t i = 0; i < m * shape.n; ++i) {
        max_err = std::max(max_err, std::abs(static_cast<double>(y_small[i]) - y_brgemm[i]) /
                                        (1.0 + std::abs(static_cast<double>(y_brgemm[i]))));
      }
      const double t_small = Median(small);
      const double t_brgemm = Median(brgemm);
      const double t_chosen = Median(chosen);
      std::printf("%6ldx%-7ld %6d %2d %12.1f %12.1f %7.2fx %8.1e %10.1f\n", shape.k, shape.n,
                  shape.copies, m, bytes / t_small / 1e9, bytes / t_brgemm / 1e9,
                  t_brgemm / t_small, max_err, bytes / t_chosen / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kiln::Main();
}
