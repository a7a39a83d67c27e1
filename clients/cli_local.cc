// `kiln synth` and `kiln run`: commands that work without a server.
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
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"

namespace kiln::cli {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "kiln: " << status.message() << "\n";
  return kExitError;
}

// Tensorizer options from the shared flags; key files are read here, in this process.
absl::StatusOr<TensorizerCheckpointOptions> TensorizerFlags() {
  TensorizerCheckpointOptions options;
  options.verify_hashes = !absl::GetFlag(FLAGS_skip_hash_verification);
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
  LoadOptions options;
  absl::StatusOr<std::optional<DType>> dtype = ParseComputeDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return UsageError("run", absl::StrCat("--dtype: ", dtype.status().message()));
  options.compute_dtype = *dtype;
  absl::StatusOr<TensorizerCheckpointOptions> tensorizer = TensorizerFlags();
  if (!tensorizer.ok()) return Fail(tensorizer.status());
  options.tensorizer = *std::move(tensorizer);
  const std::string backend_name = absl::GetFlag(FLAGS_backend).empty()
                                       ? std::string(kDefaultBackend)
                                       : absl::GetFlag(FLAGS_backend);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_name);
  if (!backend.ok()) return Fail(backend.status());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      LoadModel(model_dir, std::shared_ptr<Backend>(std::move(*backend)), options);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& config = (*model)->config();
  const int32_t max_tokens = std::max(0, absl::GetFlag(FLAGS_max_tokens).value_or(16));
  absl::StatusOr<KvCache> cache =
      (*model)->NewCache(static_cast<int64_t>(prompt->size()) + max_tokens);
  if (!cache.ok()) return Fail(cache.status());

  std::vector<int32_t> generated;
  std::vector<float> logits;
  std::vector<int32_t> step = *prompt;
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
  std::cout << "model " << config.architecture_name << " from " << model_dir << " on backend "
            << (*model)->backend_name() << "\n"
            << "prompt ids:    " << absl::StrJoin(*prompt, ",") << "\n"
            << "generated ids: " << absl::StrJoin(generated, ",") << "\n";
  if (generated.size() > 1) {
    std::printf("first token %.1f ms, then %.1f tokens/s\n", first_token_seconds * 1e3,
                static_cast<double>(generated.size() - 1) / (total - first_token_seconds));
  }
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
  absl::StatusOr<NativeTensorizeResult> written =
      WriteNativeTensorized(out, opened->source, opened->config, write_options);
  if (!written.ok()) return Fail(written.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "wrote " << out << ": " << written->tensors << " tensors, " << written->bytes
            << " bytes, engine layout"
            << (write_options.dtype ? absl::StrCat(", ", DTypeName(*write_options.dtype)) : "")
            << ", " << write_options.embedded_files.size() << " embedded file(s), " << seconds
            << " s\n";
  return kExitOk;
}

}  // namespace kiln::cli
