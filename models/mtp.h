// MTP (multi-token prediction) heads: finding them among the tensors the main architecture did
// not place (docs/mtp.md). Layout adapters are picked from the structure of the carried set:
// tensors are grouped by head prefix, and a group is a head when it holds its family's input
// projection; the head's decoder block is the main architecture's block, in either the Hugging
// Face or the engine (fused) layout.
#pragma once

#include <array>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/load_report.h"
#include "models/manifest.h"
#include "models/model_config.h"
#include "models/weight_source.h"

namespace kiln {

enum class MtpLayout {
  kDeepSeek,   // model.layers.{L+k}.{enorm, hnorm, eh_proj, shared_head.norm} + block (also GLM)
  kQwen3Next,  // mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm} + mtp.layers.{i}.*
  kMiMo,       // model.mtp_layers.{i}.{token_layernorm, hidden_layernorm, input_proj,
               // final_layernorm} + block
};
absl::string_view MtpLayoutName(MtpLayout layout);

// How a restored head computes its step; everything the forward pass needs besides weights.
struct MtpHeadInfo {
  std::string name;  // e.g. "mtp.0 (deepseek)"; what report.restored lists
  MtpLayout layout = MtpLayout::kDeepSeek;
  bool hidden_first = false;             // projection input is [hidden, emb] (MiMo)
  bool zero_embedding_at_start = false;  // e = 0 at position 0 (DeepSeek, GLM, MiMo)
  bool next_hidden_normed = false;       // a further draft step takes h' after the final norm
};

// The records of one head. `block` is indexed by ParamRole, like a main decoder layer.
struct MtpHeadParams {
  MtpHeadInfo info;
  const TensorRecord* embedding_norm = nullptr;
  const TensorRecord* hidden_norm = nullptr;
  const TensorRecord* proj = nullptr;  // [hidden, 2·hidden]
  const TensorRecord* final_norm = nullptr;
  std::array<const TensorRecord*, kNumParamRoles> block{};
};

struct MtpRestoration {
  std::vector<MtpHeadParams> heads;
  std::vector<const TensorRecord*> unused;  // carried tensors no head took
};

// Restores the MTP heads found in `carried`: every tensor a head takes goes to report.restored
// with the head's name. Heads the config advertises but the checkpoint lacks, heads the config
// does not advertise (restored anyway), and incomplete heads (left unused) add report.warnings.
// Fails naming the tensor when a head's tensor has the wrong shape.
absl::StatusOr<MtpRestoration> RestoreMtpHeads(const ModelConfig& config,
                                               std::span<const TensorRecord* const> carried,
                                               LoadReport& report);

}  // namespace kiln
