// Tensorizer files as model checkpoints: raw/Hugging Face state dicts, vLLM-tensorized modules
// and kiln's own native tensorized files, each turned into a WeightSource for the one lifecycle
// (models/lifecycle.h). The binary format itself lives in loaders/tensorizer_reader.h.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "loaders/tensorizer_verify.h"
#include "models/lifecycle.h"
#include "models/model_config.h"
#include "models/weight_source.h"

namespace kiln {

enum class TensorizerKind {
  kRaw,     // a Hugging Face state dict (write_state_dict / write_module): HF names, no config
  kVllm,    // vLLM's serialize_vllm_model: `.vllm_tensorized_marker`, vLLM's fused module names
  kNative,  // `kiln tensorize`: engine layout, `.kiln_tensorized_marker`, config and tokenizer
};
absl::string_view TensorizerKindName(TensorizerKind kind);

struct TensorizerCheckpointOptions {
  // config.json for raw and vLLM files; unset: config.json beside the file. A native file
  // carries its own and ignores this.
  std::optional<std::filesystem::path> config_path;
  // The stored hashes to check: every CRC32 and SHA-256, only the CRC32s (fast, against damage
  // only) or none.
  tensorizer::HashCheck hash_check = tensorizer::HashCheck::kAll;
  // Encrypted files: the 32-byte key or a passphrase (at most one). Never logged.
  std::string encryption_key;
  std::string encryption_passphrase;
};

struct TensorizerCheckpoint {
  TensorizerKind kind = TensorizerKind::kRaw;
  ModelConfig config;
  WeightSource source;
  // A native file's embedded side files (tokenizer.json, ...) by file name; empty otherwise.
  std::map<std::string, std::string> embedded_files;
};

// Opens `file`, detects its kind, reads (decrypts, verifies) every tensor and maps names onto
// kiln's parameters. Errors name the file and the tensor.
absl::StatusOr<TensorizerCheckpoint> OpenTensorizerCheckpoint(
    const std::filesystem::path& file, const TensorizerCheckpointOptions& options);

// True if `file` starts with the Tensorizer magic "|TZR|".
bool HasTensorizerMagic(const std::filesystem::path& file);

struct NativeTensorizeOptions {
  std::optional<DType> dtype;  // F32 or BF16; unset keeps each tensor's dtype
  // Side files stored in the file (TensorizerCheckpoint::embedded_files when read back).
  std::map<std::string, std::string> embedded_files;
  // Linears stored packed, by engine-layout tensor name (models/prepack.h makes them): each
  // replaces its tensor, or joins the file when there is none (a tied LM head). The file is then
  // format version 2. The images' bytes must stay valid during the call.
  std::map<std::string, PackedImage> packed;
};

struct NativeTensorizeResult {
  uint64_t bytes = 0;
  int tensors = 0;
  int packed = 0;  // of them, stored packed
};

// Writes `source` (either layout) as a native tensorized file: engine layout, carried tensors
// (MTP heads) under their own names, `.kiln_tensorized_marker`, the config as JSON, and
// `embedded_files`. Only Tensorizer data versions 1–2 features are used, so the Tensorizer
// library itself reads the file.
absl::StatusOr<NativeTensorizeResult> WriteNativeTensorized(const std::filesystem::path& file,
                                                            const WeightSource& source,
                                                            const ModelConfig& config,
                                                            const NativeTensorizeOptions& options);

// WriteNativeTensorized with the linears prepared on `backend` as a load would (post_load.quantize
// applies; options.dtype converts first) and stored packed (`kiln tensorize --prepack`).
absl::StatusOr<NativeTensorizeResult> WritePrepackedNativeTensorized(
    const std::filesystem::path& file, const WeightSource& source, const ModelConfig& config,
    std::shared_ptr<Backend> backend, const PostLoadOptions& post_load,
    NativeTensorizeOptions options);

}  // namespace kiln
