// `kiln synth`, `kiln run`, `kiln perplexity` and `kiln tensorize`: commands that work without a
// server.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "clients/cli.h"
#include "clients/cli_flags.h"
#include "clients/synth.h"
#include "eval/perplexity.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "loaders/tensorizer_verify.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "kiln: " << status.message() << "\n";
  return kExitError;
}

// Tensorizer options from the shared flags; key files are read here, in this process.
absl::StatusOr<TensorizerCheckpointOptions> TensorizerFlags() {
  TensorizerCheckpointOptions options;
  if (const std::string check = absl::GetFlag(FLAGS_hash_check); !check.empty()) {
    absl::StatusOr<tensorizer::HashCheck> parsed = tensorizer::ParseHashCheck(check);
    if (!parsed.ok()) return KilnAnnotate(parsed.status(), "--hash_check");
    if (absl::GetFlag(FLAGS_skip_hash_verification) && *parsed != tensorizer::HashCheck::kNone) {
      return absl::InvalidArgumentError("--skip_hash_verification contradicts --hash_check " +
                                        check + " (give one of them)");
    }
    options.hash_check = *parsed;
  } else if (absl::GetFlag(FLAGS_skip_hash_verification)) {
    options.hash_check = tensorizer::HashCheck::kNone;
  }
  if (!absl::GetFlag(FLAGS_tensorizer_config).empty()) {
    options.config_path = absl::GetFlag(FLAGS_tensorizer_config);
  }
  auto read = [](const std::string& path) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError("cannot read " + path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  if (const std::string file = absl::GetFlag(FLAGS_encryption_key_file); !file.empty()) {
    KILN_ASSIGN_OR_RETURN(options.encryption_key, read(file));
  }
  if (const std::string file = absl::GetFlag(FLAGS_encryption_passphrase_file); !file.empty()) {
    KILN_ASSIGN_OR_RETURN(options.encryption_passphrase, read(file));
    while (!options.encryption_passphrase.empty() &&
           (options.encryption_passphrase.back() == '\n' ||
            options.encryption_passphrase.back() == '\r')) {
      options.encryption_passphrase.pop_back();
    }
  }
  return options;
}

// A model loaded in this process with the --backend and Tensorizer flags, and its side files.
struct LocalModel {
  std::unique_ptr<PreparedModel> model;
  std::map<std::string, std::string> side_files;
  std::string where;  // the checkpoint's directory or file, for messages
};

absl::StatusOr<LocalModel> LoadLocal(const std::string& path, std::optional<DType> dtype) {
  LoadOptions options;
  options.compute_dtype = dtype;
  absl::StatusOr<Quantization> quantize = ParseQuantization(absl::GetFlag(FLAGS_quantize));
  if (!quantize.ok()) return KilnAnnotate(quantize.status(), "--quantize");
  options.quantize = *quantize;
  KILN_ASSIGN_OR_RETURN(options.tensorizer, TensorizerFlags());
  const std::string backend_name = absl::GetFlag(FLAGS_backend).empty()
                                       ? std::string(kDefaultBackend)
                                       : absl::GetFlag(FLAGS_backend);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(backend_name));
  KILN_ASSIGN_OR_RETURN(OpenedCheckpoint opened, OpenCheckpoint(path, options));
  LocalModel local;
  local.side_files = opened.side_files;
  local.where =
      opened.location.file.empty() ? opened.location.dir.string() : opened.location.file.string();
  KILN_ASSIGN_OR_RETURN(
      local.model,
      PrepareCheckpoint(std::move(opened), std::shared_ptr<Backend>(std::move(backend)), options));
  return local;
}

}  // namespace

int Synth(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "no arguments"); !status.ok()) {
    return UsageError("synth", status.message());
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("synth", "synth needs --out DIR");
  absl::StatusOr<ModelConfig> config = SynthPresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) return Fail(config.status());
  if (absl::GetFlag(FLAGS_mtp_layers) < 0) return UsageError("synth", "--mtp_layers must be >= 0");
  config->num_mtp_layers = absl::GetFlag(FLAGS_mtp_layers);
  SynthOptions options;
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    absl::StatusOr<DType> dtype = ParseDTypeApiName(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok())
      return UsageError("synth", absl::StrCat("--dtype: ", dtype.status().message()));
    options.dtype = *dtype;
  }
  options.seed = absl::GetFlag(FLAGS_seed).value_or(0);
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  if (absl::Status status = WriteSynthCheckpoint(out, *config, options); !status.ok()) {
    return Fail(status);
  }
  std::cout << "wrote " << absl::GetFlag(FLAGS_preset) << " (" << DTypeName(options.dtype)
            << ") to " << out << "\n";
  return kExitOk;
}

int Run(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "no arguments"); !status.ok()) {
    return UsageError("run", status.message());
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) return UsageError("run", "run needs --model DIR");
  std::string prompt_text = absl::GetFlag(FLAGS_prompt_ids);
  if (prompt_text.empty()) prompt_text = "1,2,3,4,5";
  absl::StatusOr<std::vector<int32_t>> prompt = ParseIds(prompt_text, "prompt_ids");
  if (!prompt.ok()) return UsageError("run", prompt.status().message());
  if (prompt->empty()) return UsageError("run", "--prompt_ids is empty");
  absl::StatusOr<std::optional<DType>> dtype = ParseComputeDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return UsageError("run", absl::StrCat("--dtype: ", dtype.status().message()));
  absl::StatusOr<LocalModel> local = LoadLocal(model_dir, *dtype);
  if (!local.ok()) return Fail(local.status());
  const PreparedModel& model = *local->model;
  const ModelConfig& config = model.config();
  const int32_t max_tokens = std::max(0, absl::GetFlag(FLAGS_max_tokens).value_or(16));
  absl::StatusOr<KvCache> cache = model.NewCache(static_cast<int64_t>(prompt->size()) + max_tokens);
  if (!cache.ok()) return Fail(cache.status());

  std::vector<int32_t> generated;
  std::vector<float> logits;
  std::vector<int32_t> step = *prompt;
  const auto start = std::chrono::steady_clock::now();
  double first_token_seconds = 0;
  for (int32_t i = 0; i < max_tokens; ++i) {
    logits.clear();
    SequenceChunk chunk{&*cache, step, false};
    if (absl::Status status = model.Forward({&chunk, 1}, &logits); !status.ok())
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
  std::cout << "model " << config.architecture_name << " from " << model_dir << " on backend "
            << model.backend_name() << "\n"
            << "prompt ids:    " << absl::StrJoin(*prompt, ",") << "\n"
            << "generated ids: " << absl::StrJoin(generated, ",") << "\n";
  if (generated.size() > 1) {
    std::printf("first token %.1f ms, then %.1f tokens/s\n", first_token_seconds * 1e3,
                static_cast<double>(generated.size() - 1) / (total - first_token_seconds));
  }
  return kExitOk;
}

int Perplexity(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "no arguments"); !status.ok()) {
    return UsageError("perplexity", status.message());
  }
  const std::string model_path = absl::GetFlag(FLAGS_model);
  const std::string text_path = absl::GetFlag(FLAGS_text_file);
  if (model_path.empty() || text_path.empty()) {
    return UsageError("perplexity", "perplexity needs --model PATH and --text_file FILE");
  }
  PerplexityOptions options;
  options.context = absl::GetFlag(FLAGS_context);
  options.max_windows = absl::GetFlag(FLAGS_max_windows);
  if (options.context < 2) return UsageError("perplexity", "--context must be at least 2");
  if (options.max_windows < 0) return UsageError("perplexity", "--max_windows must be ≥ 0");
  absl::StatusOr<std::optional<DType>> dtype = ParseComputeDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    return UsageError("perplexity", absl::StrCat("--dtype: ", dtype.status().message()));
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", text_path)));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<LocalModel> local = LoadLocal(model_path, *dtype);
  if (!local.ok()) return Fail(local.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFiles(local->side_files, local->where);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  absl::StatusOr<std::vector<int32_t>> ids = EncodeDocuments(**tokenizer, text);
  if (!ids.ok()) return Fail(ids.status());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<PerplexityResult> result = kiln::Perplexity(*local->model, *ids, options);
  if (!result.ok()) return Fail(result.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const PreparedModel& model = *local->model;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json out = {{"text", text_path},
                          {"tokens", ids->size()},
                          {"context", options.context},
                          {"windows", result->windows},
                          {"dtype", DTypeName(model.compute_dtype())},
                          {"quantization", QuantizationName(model.quantization())},
                          {"perplexity", result->perplexity},
                          {"seconds", seconds}};
    if (result->mtp_scored > 0) out["mtp_perplexity"] = result->mtp_perplexity;
    std::cout << out.dump() << "\n";
    return kExitOk;
  }
  std::printf(
      "%s: %zu tokens, %lld windows of %lld, %s%s on %s\n", text_path.c_str(), ids->size(),
      static_cast<long long>(result->windows), static_cast<long long>(options.context),
      std::string(DTypeName(model.compute_dtype())).c_str(),
      model.quantization() == Quantization::kNone
          ? ""
          : absl::StrCat(" with ", QuantizationName(model.quantization()), " weights").c_str(),
      std::string(model.backend_name()).c_str());
  std::printf("perplexity %.4f (%.4f nats per token over %lld positions)\n", result->perplexity,
              result->mean_nll, static_cast<long long>(result->scored));
  if (result->mtp_scored > 0) {
    std::printf("MTP head 0, token after next: perplexity %.4f over %lld positions\n",
                result->mtp_perplexity, static_cast<long long>(result->mtp_scored));
  }
  std::printf("%.2f s, %.0f tokens/s\n", seconds,
              static_cast<double>(result->scored + result->mtp_scored) / seconds);
  return kExitOk;
}

int TensorizeLocal(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "no arguments"); !status.ok()) {
    return UsageError("tensorize", status.message());
  }
  const std::string model_path = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model_path.empty() || out.empty()) {
    return UsageError("tensorize", "tensorize needs --model PATH and --out FILE");
  }
  NativeTensorizeOptions write_options;
  absl::StatusOr<std::optional<DType>> dtype = ParseComputeDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    return UsageError("tensorize", absl::StrCat("--dtype: ", dtype.status().message()));
  }
  write_options.dtype = *dtype;
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && !absl::GetFlag(FLAGS_overwrite)) {
    return Fail(absl::AlreadyExistsError(out + " exists (pass --overwrite to replace it)"));
  }
  LoadOptions options;
  absl::StatusOr<TensorizerCheckpointOptions> tensorizer = TensorizerFlags();
  if (!tensorizer.ok()) return Fail(tensorizer.status());
  options.tensorizer = *std::move(tensorizer);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(model_path, options);
  if (!opened.ok()) return Fail(opened.status());
  write_options.embedded_files = opened->side_files;
  absl::StatusOr<Quantization> quantize = ParseQuantization(absl::GetFlag(FLAGS_quantize));
  if (!quantize.ok()) return UsageError("tensorize", quantize.status().message());
  const bool prepack = absl::GetFlag(FLAGS_prepack);
  if (*quantize != Quantization::kNone && !prepack) {
    return UsageError("tensorize",
                      "--quantize needs --prepack (quantized weights are stored packed)");
  }
  absl::StatusOr<NativeTensorizeResult> written;
  if (prepack) {
    const std::string backend_name = absl::GetFlag(FLAGS_backend).empty()
                                         ? std::string(kDefaultBackend)
                                         : absl::GetFlag(FLAGS_backend);
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_name);
    if (!backend.ok()) return Fail(backend.status());
    PostLoadOptions post_load;
    post_load.quantize = *quantize;
    written = WritePrepackedNativeTensorized(out, opened->source, opened->config,
                                             std::shared_ptr<Backend>(*std::move(backend)),
                                             post_load, write_options);
  } else {
    written = WriteNativeTensorized(out, opened->source, opened->config, write_options);
  }
  if (!written.ok()) return Fail(written.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "wrote " << out << ": " << written->tensors << " tensors, " << written->bytes
            << " bytes, engine layout"
            << (write_options.dtype ? absl::StrCat(", ", DTypeName(*write_options.dtype)) : "")
            << (written->packed > 0 ? absl::StrCat(", ", written->packed, " linears packed") : "")
            << (*quantize != Quantization::kNone
                    ? absl::StrCat(" (", QuantizationName(*quantize), ")")
                    : "")
            << ", " << write_options.embedded_files.size() << " embedded file(s), " << seconds
            << " s\n";
  return kExitOk;
}

}  // namespace kiln::cli
