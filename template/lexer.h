// Splits a template into tokens (internal to template/), with Jinja2's whitespace handling as
// transformers configures it: trim_blocks, lstrip_blocks, `-`/`+` modifiers, comments dropped
// and one trailing newline of the source removed (keep_trailing_newline=False).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "template/ast.h"

namespace kiln::jinja {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  Pos pos;
  std::string text;  // kText data, kName, kOp, kString (unescaped), number spelling
};

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace kiln::jinja
