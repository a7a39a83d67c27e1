#include "tokenizer/spec_util.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

using nlohmann::json;

// The field `key` of spec, or nullptr when spec has no such non-null field.
const json* Field(const json& spec, absl::string_view key) {
  if (!spec.is_object()) return nullptr;
  const auto it = spec.find(std::string(key));
  if (it == spec.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(absl::string_view context, absl::string_view key,
                       absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(context, ": field \"", key, "\" must be ", expected));
}

}  // namespace

absl::StatusOr<std::string> SpecType(const json& spec, absl::string_view kind) {
  if (!spec.is_object())
    return absl::InvalidArgumentError(absl::StrCat(kind, " must be an object"));
  const json* type = Field(spec, "type");
  if (type == nullptr || !type->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " has no string \"type\""));
  }
  return type->get<std::string>();
}

absl::StatusOr<bool> SpecBool(const json& spec, absl::string_view key, bool fallback,
                              absl::string_view context) {
  const json* value = Field(spec, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return WrongType(context, key, "a boolean");
  return value->get<bool>();
}

absl::StatusOr<std::string> SpecString(const json& spec, absl::string_view key,
                                       std::optional<std::string> fallback,
                                       absl::string_view context) {
  const json* value = Field(spec, key);
  if (value == nullptr) {
    if (fallback.has_value()) return *std::move(fallback);
    return absl::InvalidArgumentError(absl::StrCat(context, ": missing field \"", key, "\""));
  }
  if (!value->is_string()) return WrongType(context, key, "a string");
  return value->get<std::string>();
}

absl::StatusOr<uint64_t> SpecUint(const json& spec, absl::string_view key, uint64_t fallback,
                                  absl::string_view context) {
  const json* value = Field(spec, key);
  if (value == nullptr) return fallback;
  if (!value->is_number_unsigned()) return WrongType(context, key, "a non-negative integer");
  return value->get<uint64_t>();
}

absl::StatusOr<std::string> SpecChar(const json& spec, absl::string_view key,
                                     std::optional<std::string> fallback,
                                     absl::string_view context) {
  absl::StatusOr<std::string> value = SpecString(spec, key, std::move(fallback), context);
  if (!value.ok()) return value.status();
  if (value->empty() || CountCodePoints(*value) != 1 || FindInvalidUtf8(*value).has_value()) {
    return WrongType(context, key, "a single character");
  }
  return value;
}

absl::StatusOr<const json*> SpecArray(const json& spec, absl::string_view key,
                                      absl::string_view context) {
  const json* value = Field(spec, key);
  if (value == nullptr || !value->is_array()) return WrongType(context, key, "an array");
  return value;
}

absl::StatusOr<SpecPattern> SpecPattern::Parse(const json& spec, absl::string_view key,
                                               absl::string_view context) {
  const json* value = Field(spec, key);
  if (value == nullptr || !value->is_object() || value->size() != 1) {
    return WrongType(context, key, "{\"String\": ...} or {\"Regex\": ...}");
  }
  SpecPattern pattern;
  if (const json* literal = Field(*value, "String"); literal != nullptr && literal->is_string()) {
    pattern.literal_ = literal->get<std::string>();
    return pattern;
  }
  if (const json* regex = Field(*value, "Regex"); regex != nullptr && regex->is_string()) {
    absl::StatusOr<std::shared_ptr<const Regex>> compiled =
        Regex::Compile(regex->get<std::string>());
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": ", compiled.status().message()));
    }
    pattern.regex_ = *std::move(compiled);
    return pattern;
  }
  return WrongType(context, key, "{\"String\": ...} or {\"Regex\": ...}");
}

absl::Status SpecPattern::FindAll(absl::string_view text,
                                  std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  if (regex_ != nullptr) {
    KILN_ASSIGN_OR_RETURN(out, regex_->FindAll(text));
    return absl::OkStatus();
  }
  // The crate's empty literal never yields a non-empty match.
  if (literal_.empty()) return absl::OkStatus();
  size_t pos = 0;
  while (true) {
    const size_t at = text.find(literal_, pos);
    if (at == absl::string_view::npos) break;
    out.emplace_back(at, at + literal_.size());
    pos = at + literal_.size();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SpecPattern::ReplaceAll(absl::string_view text,
                                                    absl::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  if (absl::Status status = FindAll(text, matches); !status.ok()) return status;
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text.data() + prev, begin - prev);
    out.append(content.data(), content.size());
    prev = end;
  }
  out.append(text.data() + prev, text.size() - prev);
  return out;
}

}  // namespace kiln::tokenizer_internal
