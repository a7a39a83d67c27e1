// Helpers shared by the normalizer, pre-tokenizer and decoder parsers (internal to tokenizer/):
// typed reads of tokenizer.json fields and the crate's String-or-Regex pattern.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"

namespace kiln::tokenizer_internal {

// The "type" of a component spec; `kind` ("normalizer", ...) names it in errors.
absl::StatusOr<std::string> SpecType(const nlohmann::json& spec, absl::string_view kind);

// Optional fields: the default when absent or null, an error when of the wrong JSON type.
absl::StatusOr<bool> SpecBool(const nlohmann::json& spec, absl::string_view key, bool fallback,
                              absl::string_view context);
absl::StatusOr<std::string> SpecString(const nlohmann::json& spec, absl::string_view key,
                                       std::optional<std::string> fallback,
                                       absl::string_view context);
absl::StatusOr<uint64_t> SpecUint(const nlohmann::json& spec, absl::string_view key,
                                  uint64_t fallback, absl::string_view context);
// A field holding exactly one character (Rust `char`), returned as its UTF-8.
absl::StatusOr<std::string> SpecChar(const nlohmann::json& spec, absl::string_view key,
                                     std::optional<std::string> fallback,
                                     absl::string_view context);
// The array field `key` (an error when absent or not an array).
absl::StatusOr<const nlohmann::json*> SpecArray(const nlohmann::json& spec, absl::string_view key,
                                                absl::string_view context);

// The crate's pattern: {"String": literal} or {"Regex": pattern}.
class SpecPattern {
 public:
  static absl::StatusOr<SpecPattern> Parse(const nlohmann::json& spec, absl::string_view key,
                                           absl::string_view context);
  // Byte ranges of the successive non-overlapping, non-empty matches (a regex's match error is
  // returned, out then unspecified).
  absl::Status FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  // text with every match replaced by content.
  absl::StatusOr<std::string> ReplaceAll(absl::string_view text, absl::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // null for a literal
};

}  // namespace kiln::tokenizer_internal
