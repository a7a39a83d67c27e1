// The post_processor of a tokenizer.json for a single sequence (internal to tokenizer/): what it
// puts before and after the ids when special tokens are added. TemplateProcessing (its `single`
// template), BertProcessing and RobertaProcessing ([cls] $A [sep]), ByteLevel (ids unchanged)
// and Sequence of these.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace kiln::tokenizer_internal {

struct SinglePostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// A null spec gives an empty processor. An unknown "type" is an error naming it.
absl::StatusOr<SinglePostProcessor> ParsePostProcessor(const nlohmann::json& spec);

}  // namespace kiln::tokenizer_internal
