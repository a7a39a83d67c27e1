#include "server/model_spec.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/backend_registry.h"
#include "models/kv_pool.h"
#include "models/lifecycle.h"

namespace kiln {
namespace {

bool ValidNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == ':' || c == '/';
}

}  // namespace

absl::StatusOr<tensorizer::HashCheck> TensorizerHashCheck(const TensorizerSpec& tz) {
  if (tz.hash_check.empty()) {
    return tz.skip_hash_verification ? tensorizer::HashCheck::kNone : tensorizer::HashCheck::kAll;
  }
  absl::StatusOr<tensorizer::HashCheck> check = tensorizer::ParseHashCheck(tz.hash_check);
  if (!check.ok()) return KilnAnnotate(check.status(), "tensorizer.hash_check");
  if (tz.skip_hash_verification && *check != tensorizer::HashCheck::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensorizer: skip_hash_verification contradicts hash_check \"", tz.hash_check,
                     "\" (give one of them)"));
  }
  return check;
}

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  if (spec.name.empty()) return absl::InvalidArgumentError("name: a model name is required");
  if (spec.name.size() > 128) {
    return absl::InvalidArgumentError("name: model names are at most 128 characters");
  }
  if (!std::all_of(spec.name.begin(), spec.name.end(), ValidNameChar)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: '", spec.name, "' may hold only letters, digits and the characters - _ . : /"));
  }
  if (spec.path.empty()) {
    return absl::InvalidArgumentError("path: a model directory or Tensorizer file is required");
  }
  if (!spec.format.empty() && spec.format != "safetensors" && spec.format != "tensorizer") {
    return absl::InvalidArgumentError(
        absl::StrCat("format: '", spec.format,
                     "' is not supported (use \"\" to detect the format, \"safetensors\" or "
                     "\"tensorizer\")"));
  }
  const TensorizerSpec& tz = spec.tensorizer;
  const int secrets = !tz.encryption_key.empty() + !tz.encryption_passphrase.empty() +
                      !tz.encryption_key_file.empty() + !tz.encryption_passphrase_file.empty();
  if (secrets > 1) {
    return absl::InvalidArgumentError(
        "tensorizer: give at most one of encryption_key, encryption_passphrase, "
        "encryption_key_file and encryption_passphrase_file");
  }
  if (!tz.encryption_key.empty() && tz.encryption_key.size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensorizer.encryption_key: a key is 32 bytes, got ", tz.encryption_key.size()));
  }
  KILN_RETURN_IF_ERROR(TensorizerHashCheck(tz).status());
  KILN_RETURN_IF_ERROR(KilnAnnotate(ParseComputeDType(spec.dtype).status(), "dtype"));
  KILN_RETURN_IF_ERROR(KilnAnnotate(ParseQuantization(spec.quantize).status(), "quantize"));
  KILN_RETURN_IF_ERROR(ParseKvCacheDType(spec.kv_cache_dtype).status());
  if (!spec.backend.empty()) {
    if (absl::Status known = CheckBackendAvailable(spec.backend);
        known.code() == absl::StatusCode::kInvalidArgument) {
      return known;
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
