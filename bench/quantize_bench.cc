// What int8 and int4 weights cost in accuracy, against the same model unquantized, in one run:
//   per projection, the relative error of each linear's output on the activations the quantized
//   model really sees (each call also run through the unquantized weight), mean and worst layer;
//   the relative error of the logits and the greedy agreement over a teacher-forced continuation
//   (both models read the same tokens: the unquantized model's greedy choices).
// Synthesized presets by default (random weights: flat logits, so greedy agreement there is a
// harsh measure); --model DIR runs a real checkpoint such as checkpoints/kiln-brown.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "bench/bench_model.h"
#include "bench/bench_util.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/onednn_linear.h"
#include "loaders/load_model.h"

ABSL_FLAG(std::string, presets, "kiln-tiny,qwen2.5-0.5b",
          "synth presets to measure, comma-separated");
ABSL_FLAG(std::string, model, "", "a checkpoint directory to measure instead of the presets");
ABSL_FLAG(std::string, model_dir, "build/bench-models", "where synthesized models are kept");
ABSL_FLAG(int32_t, prompt_tokens, 64, "prompt length");
ABSL_FLAG(int32_t, decode_tokens, 32, "teacher-forced continuation length");

namespace kiln {
namespace {

using bench::Argmax;

// ‖got − expected‖ / ‖expected‖ over everything added.
struct ErrorSum {
  double error_squares = 0;
  double reference_squares = 0;
  void Add(const float* got, const float* expected, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      error_squares += std::pow(double{got[i]} - expected[i], 2);
      reference_squares += double{expected[i]} * expected[i];
    }
  }
  double relative() const { return std::sqrt(error_squares / std::max(reference_squares, 1e-300)); }
};

// Measures one checkpoint in one quantization against its unquantized self.
int Measure(const std::filesystem::path& dir, const PreparedModel& reference,
            std::shared_ptr<Backend> backend, Quantization kind) {
  LoadOptions options;
  options.quantize = kind;
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded = LoadModel(dir, backend, options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const PreparedModel& model = **loaded;
  if (model.quantization() != kind) {
    std::printf("  %s: not available on this CPU (the linears stayed %s)\n",
                std::string(QuantizationName(kind)).c_str(),
                std::string(DTypeName(model.compute_dtype())).c_str());
    return 0;
  }
  // Per linear name, the error of its outputs against the unquantized weight on the same input.
  std::map<std::string, ErrorSum> by_linear;
  std::vector<float> expected;
  model.set_linear_observer(
      [&](const PackedLinear& linear, const TensorView& in, const TensorView& out) {
        const PackedLinear* dense = reference.FindLinear(linear.name());
        if (dense == nullptr || in.device.kind != DeviceKind::kHost) return;
        expected.resize(static_cast<size_t>(out.rows * out.cols));
        if (!cpu::RunLinear(*dense, in.f32(), in.rows, expected.data()).ok()) return;
        by_linear[linear.name()].Add(out.f32(), expected.data(), expected.size());
      });

  const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
  for (int32_t i = 0; i < prompt_tokens; ++i) prompt[i] = (i * 7919 + 13) % vocab;
  absl::StatusOr<KvCache> cache_q = model.NewCache(prompt_tokens + decode_tokens + 1);
  absl::StatusOr<KvCache> cache_r = reference.NewCache(prompt_tokens + decode_tokens + 1);
  if (!cache_q.ok() || !cache_r.ok()) return 1;
  std::vector<float> logits_q, logits_r;
  std::vector<double> logit_errors;
  int agree = 0;
  std::vector<int32_t> step = prompt;
  for (int32_t t = 0; t <= decode_tokens; ++t) {
    logits_q.clear();
    logits_r.clear();
    SequenceChunk chunk_q{&*cache_q, step, false};
    SequenceChunk chunk_r{&*cache_r, step, false};
    if (!model.Forward({&chunk_q, 1}, &logits_q).ok() ||
        !reference.Forward({&chunk_r, 1}, &logits_r).ok()) {
      return 1;
    }
    ErrorSum logit_error;
    logit_error.Add(logits_q.data(), logits_r.data(), logits_r.size());
    logit_errors.push_back(logit_error.relative());
    const int32_t next = Argmax(logits_r);
    agree += Argmax(logits_q) == next;
    step = {next};
  }
  model.set_linear_observer(nullptr);

  // Per projection (the name after the layer prefix): mean over layers and the worst layer.
  struct Projection {
    double sum = 0;
    int layers = 0;
    double worst = 0;
    std::string worst_name;
  };
  std::map<std::string, Projection> projections;
  for (const auto& [name, sum] : by_linear) {
    const size_t dot = name.rfind('.');
    Projection& p = projections[dot == std::string::npos ? name : name.substr(dot + 1)];
    const double relative = sum.relative();
    p.sum += relative;
    ++p.layers;
    if (relative >= p.worst) {
      p.worst = relative;
      p.worst_name = name;
    }
  }
  std::printf("  %s (%d of %d linears, %.1f MB packed):\n",
              std::string(QuantizationName(kind)).c_str(), model.quantized_linears(),
              model.linear_count(), model.weight_bytes() / 1e6);
  for (const auto& [name, p] : projections) {
    std::printf("    %-9s linear output error %.4f mean over %d, worst %.4f (%s)\n", name.c_str(),
                p.sum / p.layers, p.layers, p.worst, p.worst_name.c_str());
  }
  std::printf("    logits    relative error %.4f median, %.4f max over %zu positions\n",
              bench::Median(logit_errors),
              *std::max_element(logit_errors.begin(), logit_errors.end()), logit_errors.size());
  std::printf("    greedy    %d of %d next tokens agree (%.1f %%)\n", agree, decode_tokens + 1,
              100.0 * agree / (decode_tokens + 1));
  return 0;
}

int Main() {
  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend("cpu");
  if (!created.ok()) return 1;
  std::shared_ptr<Backend> backend(std::move(*created));
  std::vector<std::filesystem::path> dirs;
  if (!absl::GetFlag(FLAGS_model).empty()) {
    dirs.push_back(absl::GetFlag(FLAGS_model));
  } else {
    for (absl::string_view preset :
         absl::StrSplit(absl::GetFlag(FLAGS_presets), ',', absl::SkipEmpty())) {
      absl::StatusOr<std::filesystem::path> dir =
          bench::SynthCheckpoint(std::string(preset), "bf16", absl::GetFlag(FLAGS_model_dir));
      if (!dir.ok()) {
        return std::fprintf(stderr, "%s\n", std::string(dir.status().message()).c_str()), 1;
      }
      dirs.push_back(*dir);
    }
  }
  for (const std::filesystem::path& dir : dirs) {
    absl::StatusOr<std::unique_ptr<PreparedModel>> reference = LoadModel(dir, backend);
    if (!reference.ok()) {
      return std::fprintf(stderr, "%s\n", std::string(reference.status().message()).c_str()), 1;
    }
    std::printf("%s (%s, %.1f MB packed), prompt %d + %d teacher-forced tokens, against %s:\n",
                dir.filename().c_str(), (*reference)->config().architecture_name.c_str(),
                (*reference)->weight_bytes() / 1e6, absl::GetFlag(FLAGS_prompt_tokens),
                absl::GetFlag(FLAGS_decode_tokens),
                std::string(DTypeName((*reference)->compute_dtype())).c_str());
    for (Quantization kind : {Quantization::kInt8, Quantization::kInt4}) {
      if (Measure(dir, **reference, backend, kind) != 0) return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  return kiln::Main();
}
