#include "tokenizer/post_processor.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace kiln::tokenizer_internal {
namespace {

using json = nlohmann::json;

absl::Status Invalid(absl::string_view what, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat("post_processor ", what, ": ", detail));
}

// A [token, id] pair of BertProcessing / RobertaProcessing.
absl::StatusOr<int32_t> PairId(const json& spec, const char* field, absl::string_view type) {
  auto it = spec.find(field);
  if (it == spec.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer() ||
      (*it)[1].get<int64_t>() < 0 || (*it)[1].get<int64_t>() > INT32_MAX) {
    return Invalid(type, absl::StrCat("\"", field, "\" must be a [token, id] pair"));
  }
  return (*it)[1].get<int32_t>();
}

// One piece of a template: the sequence ($A) or a special token by name.
struct Piece {
  bool is_sequence = false;
  std::string name;  // "A"/"B" for a sequence, else the special token's key
};

absl::StatusOr<Piece> ParsePieceString(absl::string_view text) {
  Piece piece;
  if (!text.empty() && text[0] == '$') {
    absl::string_view rest = text.substr(1);
    rest = rest.substr(0, rest.find(':'));
    piece.is_sequence = true;
    if (rest.empty() || rest == "A" || rest == "0") {
      piece.name = "A";
    } else if (rest == "B" || rest == "1") {
      piece.name = "B";
    } else {
      return Invalid("TemplateProcessing", absl::StrCat("bad sequence piece \"", text, "\""));
    }
    return piece;
  }
  // "[CLS]:0" names [CLS] with type id 0; a colon not followed by a number is part of the name.
  size_t colon = text.rfind(':');
  uint32_t type_id = 0;
  if (colon != absl::string_view::npos && absl::SimpleAtoi(text.substr(colon + 1), &type_id)) {
    text = text.substr(0, colon);
  }
  piece.name = std::string(text);
  return piece;
}

absl::StatusOr<Piece> ParsePiece(const json& spec) {
  if (spec.is_string()) return ParsePieceString(spec.get<std::string>());
  if (spec.is_object()) {
    if (auto it = spec.find("Sequence"); it != spec.end() && it->is_object()) {
      auto id = it->find("id");
      if (id != it->end() && id->is_string() && (*id == "A" || *id == "B")) {
        return Piece{true, id->get<std::string>()};
      }
    } else if (auto it = spec.find("SpecialToken"); it != spec.end() && it->is_object()) {
      auto id = it->find("id");
      if (id != it->end() && id->is_string()) return Piece{false, id->get<std::string>()};
    }
  }
  return Invalid("TemplateProcessing", absl::StrCat("bad template piece ", spec.dump()));
}

absl::StatusOr<SinglePostProcessor> ParseTemplate(const json& spec) {
  auto single = spec.find("single");
  if (single == spec.end()) return Invalid("TemplateProcessing", "missing \"single\"");
  std::vector<Piece> pieces;
  if (single->is_string()) {
    for (absl::string_view part :
         absl::StrSplit(single->get<std::string>(), ' ', absl::SkipWhitespace())) {
      absl::StatusOr<Piece> piece = ParsePieceString(part);
      if (!piece.ok()) return piece.status();
      pieces.push_back(*std::move(piece));
    }
  } else if (single->is_array()) {
    for (const json& item : *single) {
      absl::StatusOr<Piece> piece = ParsePiece(item);
      if (!piece.ok()) return piece.status();
      pieces.push_back(*std::move(piece));
    }
  } else {
    return Invalid("TemplateProcessing", "\"single\" must be a list or a string");
  }

  const json empty = json::object();
  auto tokens_it = spec.find("special_tokens");
  const json& tokens = tokens_it == spec.end() || tokens_it->is_null() ? empty : *tokens_it;
  if (!tokens.is_object()) return Invalid("TemplateProcessing", "\"special_tokens\" not a map");

  SinglePostProcessor result;
  bool seen_sequence = false;
  for (const Piece& piece : pieces) {
    if (piece.is_sequence) {
      if (piece.name != "A") {
        return Invalid("TemplateProcessing", "the single template uses sequence $B");
      }
      if (seen_sequence) {
        return Invalid("TemplateProcessing", "the single template uses $A twice");
      }
      seen_sequence = true;
      continue;
    }
    auto token = tokens.find(piece.name);
    if (token == tokens.end() || !token->is_object()) {
      return Invalid("TemplateProcessing",
                     absl::StrCat("missing special token \"", piece.name, "\""));
    }
    auto ids = token->find("ids");
    if (ids == token->end() || !ids->is_array()) {
      return Invalid("TemplateProcessing",
                     absl::StrCat("special token \"", piece.name, "\" has no \"ids\" list"));
    }
    std::vector<int32_t>& target = seen_sequence ? result.suffix : result.prefix;
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return Invalid("TemplateProcessing",
                       absl::StrCat("special token \"", piece.name, "\" has a bad id"));
      }
      target.push_back(id.get<int32_t>());
    }
  }
  if (!seen_sequence) return Invalid("TemplateProcessing", "the single template has no $A");
  return result;
}

absl::StatusOr<SinglePostProcessor> ParseUnchecked(const json& spec) {
  if (spec.is_null()) return SinglePostProcessor{};
  if (!spec.is_object()) return Invalid("", "must be an object");
  auto type_it = spec.find("type");
  if (type_it == spec.end() || !type_it->is_string()) return Invalid("", "missing \"type\"");
  const std::string type = type_it->get<std::string>();
  if (type == "TemplateProcessing") return ParseTemplate(spec);
  if (type == "ByteLevel") return SinglePostProcessor{};
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    absl::StatusOr<int32_t> cls = PairId(spec, "cls", type);
    if (!cls.ok()) return cls.status();
    absl::StatusOr<int32_t> sep = PairId(spec, "sep", type);
    if (!sep.ok()) return sep.status();
    return SinglePostProcessor{{*cls}, {*sep}};
  }
  if (type == "Sequence") {
    auto list = spec.find("processors");
    if (list == spec.end() || !list->is_array()) {
      return Invalid("Sequence", "missing \"processors\" list");
    }
    // Each processor wraps what the previous ones produced.
    SinglePostProcessor result;
    for (const json& item : *list) {
      absl::StatusOr<SinglePostProcessor> inner = ParseUnchecked(item);
      if (!inner.ok()) return inner.status();
      result.prefix.insert(result.prefix.begin(), inner->prefix.begin(), inner->prefix.end());
      result.suffix.insert(result.suffix.end(), inner->suffix.begin(), inner->suffix.end());
    }
    return result;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported post_processor type ", type));
}

}  // namespace

absl::StatusOr<SinglePostProcessor> ParsePostProcessor(const nlohmann::json& spec) {
  try {
    return ParseUnchecked(spec);
  } catch (const json::exception& e) {
    return Invalid("", e.what());
  }
}

}  // namespace kiln::tokenizer_internal
