// What a client asks to load (LoadModelRequest and ServerConfig.models in C++), and its one
// validation.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loaders/tensorizer_verify.h"

namespace kiln {

// Tensorizer options of a ModelSpec (kiln.v1.TensorizerOptions in C++). Secrets are never logged.
struct TensorizerSpec {
  std::string config_path;              // inside a model root; "" = config.json beside the file
  bool skip_hash_verification = false;  // the same as hash_check "none"
  std::string hash_check;               // "" or "all" (CRC32 and SHA-256), "crc32" or "none"
  std::string encryption_key;           // 32 raw bytes
  std::string encryption_passphrase;
  std::string encryption_key_file;         // server-side file: 32 raw bytes
  std::string encryption_passphrase_file;  // server-side file: the passphrase (one line)
};

struct ModelSpec {
  std::string name;
  std::string path;     // a model directory or a Tensorizer file inside one of the model roots
  std::string format;   // "" (detect), "safetensors" or "tensorizer"
  std::string dtype;    // "" (the checkpoint's), "bf16" or "f32"
  std::string backend;  // "" (the server's default) or a backend name ("cpu")
  TensorizerSpec tensorizer;
  uint64_t kv_cache_bytes = 0;  // KV pool budget; 0 = the server's
  std::string kv_cache_dtype;   // "" (the server's), "auto", "f32" or "bf16" (models/kv_pool.h)
  bool prefix_caching = true;
  // A chat template replacing the checkpoint's default: its text, or a server-side file read
  // at load (the text wins when both are set). "" = the checkpoint's.
  std::string chat_template;
  std::string chat_template_file;
  std::string quantize;  // "" / "none", "int8" or "int4" (kernels/quantization.h)
};

// InvalidArgument naming the field at fault (name, path, format, dtype, quantize, kv_cache_dtype,
// backend, tensorizer.*).
// Whether the backend is available is the builder's to say (FailedPrecondition).
absl::Status ValidateModelSpec(const ModelSpec& spec);

// The stored Tensorizer hashes a spec asks to check (tensorizer.hash_check and
// skip_hash_verification); InvalidArgument naming the field for an unknown or contradictory one.
absl::StatusOr<tensorizer::HashCheck> TensorizerHashCheck(const TensorizerSpec& tz);

}  // namespace kiln
