// `kiln`: the command-line tool. Subcommands:
//   kiln synth --preset NAME --out DIR [--dtype bf16|f32|f16] [--seed N] [--max_shard_bytes N]
//   kiln run --model DIR [--prompt_ids 1,2,3] [--max_tokens N] [--dtype bf16|f32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "clients/synth.h"
#include "loaders/load_model.h"

ABSL_FLAG(std::string, preset, "kiln-tiny", "synth: model shape to write");
ABSL_FLAG(std::string, out, "", "synth: directory to write the checkpoint into");
ABSL_FLAG(std::string, dtype, "",
          "synth: weight dtype (bf16, f32, f16; default bf16); run: compute dtype (bf16 or f32; "
          "default: the checkpoint's)");
ABSL_FLAG(uint64_t, seed, 0, "synth: random seed");
ABSL_FLAG(uint64_t, max_shard_bytes, uint64_t{1} << 30,
          "synth: shard the checkpoint above this size");
ABSL_FLAG(std::string, model, "", "run: model directory");
ABSL_FLAG(std::string, prompt_ids, "1,2,3,4,5", "run: comma-separated prompt token ids");
ABSL_FLAG(int32_t, max_tokens, 16, "run: tokens to generate (greedy)");

namespace kiln {
namespace {

constexpr char kUsage[] =
    "kiln: tools for the kiln inference server.\n"
    "  kiln synth --preset NAME --out DIR [--dtype bf16] [--seed 0]\n"
    "      write a deterministic random-weight checkpoint of a real model's shape\n"
    "  kiln run --model DIR [--prompt_ids 1,2,3] [--max_tokens 16]\n"
    "      load a model in this process and generate greedily from token ids\n";

int Fail(const absl::Status& status) {
  std::cerr << "kiln: " << status.message() << "\n";
  return 1;
}

absl::StatusOr<DType> ParseDType(const std::string& text) {
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "f32" || text == "fp32" || text == "float32") return DType::kF32;
  if (text == "f16" || text == "fp16" || text == "float16") return DType::kF16;
  return absl::InvalidArgumentError("--dtype must be bf16, f32 or f16, not \"" + text + "\"");
}

int Synth() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail(absl::InvalidArgumentError("synth needs --out DIR"));
  absl::StatusOr<ModelConfig> config = SynthPresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) return Fail(config.status());
  SynthOptions options;
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return Fail(dtype.status());
    options.dtype = *dtype;
  }
  options.seed = absl::GetFlag(FLAGS_seed);
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  if (absl::Status status = WriteSynthCheckpoint(out, *config, options); !status.ok()) {
    return Fail(status);
  }
  std::cout << "wrote " << absl::GetFlag(FLAGS_preset) << " (" << DTypeName(options.dtype)
            << ") to " << out << "\n";
  return 0;
}

int Run() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) return Fail(absl::InvalidArgumentError("run needs --model DIR"));
  std::vector<int32_t> prompt;
  for (absl::string_view piece :
       absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return Fail(absl::InvalidArgumentError("--prompt_ids: \"" + std::string(piece) +
                                             "\" is not a token id"));
    }
    prompt.push_back(id);
  }
  if (prompt.empty()) return Fail(absl::InvalidArgumentError("--prompt_ids is empty"));
  LoadOptions options;
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return Fail(dtype.status());
    options.compute_dtype = *dtype;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  if (!backend.ok()) return Fail(backend.status());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      LoadModel(model_dir, std::shared_ptr<Backend>(std::move(*backend)), options);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& config = (*model)->config();
  const int32_t max_tokens = std::max(0, absl::GetFlag(FLAGS_max_tokens));
  absl::StatusOr<KvCache> cache =
      (*model)->NewCache(static_cast<int64_t>(prompt.size()) + max_tokens);
  if (!cache.ok()) return Fail(cache.status());

  std::vector<int32_t> generated;
  std::vector<float> logits;
  std::vector<int32_t> step = prompt;
  const auto start = std::chrono::steady_clock::now();
  double first_token_seconds = 0;
  for (int32_t i = 0; i < max_tokens; ++i) {
    logits.clear();
    SequenceChunk chunk{&*cache, step, false};
    if (absl::Status status = (*model)->Forward({&chunk, 1}, &logits); !status.ok())
      return Fail(status);
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(next);
    if (i == 0)
      first_token_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), next) !=
        config.eos_token_ids.end())
      break;
    step = {next};
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "model " << config.architecture_name << " from " << model_dir << "\n"
            << "prompt ids:    " << absl::StrJoin(prompt, ",") << "\n"
            << "generated ids: " << absl::StrJoin(generated, ",") << "\n";
  if (generated.size() > 1) {
    std::printf("first token %.1f ms, then %.1f tokens/s\n", first_token_seconds * 1e3,
                static_cast<double>(generated.size() - 1) / (total - first_token_seconds));
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kiln::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  const std::string command = args.size() > 1 ? args[1] : "";
  if (command == "synth") return kiln::Synth();
  if (command == "run") return kiln::Run();
  std::cerr << kiln::kUsage;
  return command.empty() ? 2 : (std::cerr << "kiln: unknown command \"" << command << "\"\n", 2);
}
