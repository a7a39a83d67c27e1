#include "models/mtp.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/logging.h"

namespace kiln {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Tensors sharing one head prefix, by the name after the prefix.
struct Group {
  std::string prefix;
  std::map<std::string, const TensorRecord*> members;
};

// The family-specific tensors of a head: the embedding norm, the hidden norm, the projection,
// the final norm, and copies of the main embedding / lm_head that some layouts ship.
struct HeadNames {
  std::string embedding_norm, hidden_norm, proj, final_norm;
  std::vector<std::string> copies;
};

// The carried set split into candidate heads. Keys: (layout, index in the family).
struct Candidates {
  std::map<std::pair<MtpLayout, int64_t>, Group> groups;
  Group qwen3_next_shared;  // mtp.{fc, pre_fc_norm_*, norm}: shared by every Qwen3-Next head
  std::vector<const TensorRecord*> unused;
};

// "<index>.<rest>" → index, rest.
std::optional<std::pair<int64_t, std::string>> SplitIndex(absl::string_view name) {
  const size_t dot = name.find('.');
  int64_t index = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &index) ||
      index < 0) {
    return std::nullopt;
  }
  return std::make_pair(index, std::string(name.substr(dot + 1)));
}

Candidates GroupCarried(const ModelConfig& config, std::span<const TensorRecord* const> carried) {
  Candidates out;
  for (const TensorRecord* record : carried) {
    absl::string_view name = record->name;
    bool taken = false;
    auto add = [&](MtpLayout layout, absl::string_view family_prefix, int64_t index_offset) {
      if (taken || !absl::ConsumePrefix(&name, family_prefix)) return;
      std::optional<std::pair<int64_t, std::string>> split = SplitIndex(name);
      name = record->name;
      if (!split.has_value() || split->first < index_offset) return;
      Group& group = out.groups[{layout, split->first - index_offset}];
      group.prefix = absl::StrCat(family_prefix, split->first, ".");
      group.members[split->second] = record;
      taken = true;
    };
    // DeepSeek/GLM heads continue the main layer numbering.
    add(MtpLayout::kDeepSeek, "model.layers.", config.num_hidden_layers);
    add(MtpLayout::kMiMo, "model.mtp_layers.", 0);
    add(MtpLayout::kQwen3Next, "mtp.layers.", 0);
    if (!taken && absl::StartsWith(name, "mtp.")) {
      out.qwen3_next_shared.prefix = "mtp.";
      out.qwen3_next_shared.members[std::string(name.substr(4))] = record;
      taken = true;
    }
    if (!taken) out.unused.push_back(record);
  }
  return out;
}

HeadNames NamesOf(MtpLayout layout) {
  switch (layout) {
    case MtpLayout::kDeepSeek:
      return {"enorm.weight",
              "hnorm.weight",
              "eh_proj.weight",
              "shared_head.norm.weight",
              {"embed_tokens.weight", "shared_head.head.weight"}};
    case MtpLayout::kQwen3Next:
      return {"pre_fc_norm_embedding.weight",
              "pre_fc_norm_hidden.weight",
              "fc.weight",
              "norm.weight",
              {}};
    case MtpLayout::kMiMo:
      return {"token_layernorm.weight",
              "hidden_layernorm.weight",
              "input_proj.weight",
              "final_layernorm.weight",
              {}};
  }
  return {};
}

// The main architecture's decoder block in both layouts: name after the layer prefix → spec.
std::map<std::string, ParamSpec> BlockSpecs(const ModelConfig& config) {
  ModelConfig one = config;
  one.num_hidden_layers = 1;
  std::map<std::string, ParamSpec> specs;
  for (WeightLayout layout : {WeightLayout::kHuggingFace, WeightLayout::kEngine}) {
    for (ParamSpec& spec : BuildParamManifest(one, layout)) {
      if (spec.layer != 0) continue;
      std::string suffix = spec.name.substr(std::string("model.layers.0.").size());
      specs.emplace(std::move(suffix), std::move(spec));
    }
  }
  return specs;
}

// What a complete block lacks, by name; empty if complete. Either layout per projection.
std::vector<std::string> MissingBlockParams(const ModelConfig& c, const MtpHeadParams& head,
                                            const std::string& prefix) {
  auto has = [&](ParamRole role) { return head.block[static_cast<int>(role)] != nullptr; };
  std::vector<std::string> missing;
  auto need = [&](bool present, absl::string_view suffix) {
    if (!present) missing.push_back(absl::StrCat(prefix, suffix));
  };
  need(has(ParamRole::kInputNorm), "input_layernorm.weight");
  need(has(ParamRole::kPostAttentionNorm), "post_attention_layernorm.weight");
  if (has(ParamRole::kQKV)) {
    if (c.qkv_bias) need(has(ParamRole::kQKVBias), "self_attn.qkv_proj.bias");
  } else {
    need(has(ParamRole::kQ), "self_attn.q_proj.weight");
    need(has(ParamRole::kK), "self_attn.k_proj.weight");
    need(has(ParamRole::kV), "self_attn.v_proj.weight");
    if (c.qkv_bias) {
      need(has(ParamRole::kQBias), "self_attn.q_proj.bias");
      need(has(ParamRole::kKBias), "self_attn.k_proj.bias");
      need(has(ParamRole::kVBias), "self_attn.v_proj.bias");
    }
  }
  need(has(ParamRole::kO), "self_attn.o_proj.weight");
  if (c.o_proj_bias) need(has(ParamRole::kOBias), "self_attn.o_proj.bias");
  if (c.qk_norm) {
    need(has(ParamRole::kQNorm), "self_attn.q_norm.weight");
    need(has(ParamRole::kKNorm), "self_attn.k_norm.weight");
  }
  if (!has(ParamRole::kGateUp)) {
    need(has(ParamRole::kGate), "mlp.gate_proj.weight");
    need(has(ParamRole::kUp), "mlp.up_proj.weight");
  }
  need(has(ParamRole::kDown), "mlp.down_proj.weight");
  return missing;
}

// Roles that do not belong to the config's block (biases it has no use for, a second copy of a
// fused projection) are left to the unused set rather than silently taken.
bool RoleInUse(const ModelConfig& c, ParamRole role, const MtpHeadParams& head) {
  auto has = [&](ParamRole r) { return head.block[static_cast<int>(r)] != nullptr; };
  switch (role) {
    case ParamRole::kQBias:
    case ParamRole::kKBias:
    case ParamRole::kVBias:
    case ParamRole::kQKVBias:
      return c.qkv_bias;
    case ParamRole::kOBias:
      return c.o_proj_bias;
    case ParamRole::kQNorm:
    case ParamRole::kKNorm:
      return c.qk_norm;
    case ParamRole::kQ:
    case ParamRole::kK:
    case ParamRole::kV:
      return !has(ParamRole::kQKV);
    case ParamRole::kGate:
    case ParamRole::kUp:
      return !has(ParamRole::kGateUp);
    default:
      return true;
  }
}

class Restorer {
 public:
  Restorer(const ModelConfig& config, LoadReport& report)
      : config_(config), report_(report), block_specs_(BlockSpecs(config)) {}

  absl::StatusOr<MtpRestoration> Run(std::span<const TensorRecord* const> carried) {
    Candidates candidates = GroupCarried(config_, carried);
    out_.unused = std::move(candidates.unused);
    for (auto& [key, group] : candidates.groups) {
      const auto [layout, index] = key;
      const Group* shared =
          layout == MtpLayout::kQwen3Next ? &candidates.qwen3_next_shared : nullptr;
      absl::Status status = TryHead(layout, index, group, shared);
      if (!status.ok()) return status;
    }
    // Qwen3-Next tensors shared by the heads: restored once, with the heads that use them.
    if (!candidates.qwen3_next_shared.members.empty()) {
      std::vector<std::string> users;
      for (const MtpHeadParams& head : out_.heads) {
        if (head.info.layout == MtpLayout::kQwen3Next) users.push_back(head.info.name);
      }
      for (const auto& [suffix, record] : candidates.qwen3_next_shared.members) {
        if (users.empty() || !shared_taken_.contains(record)) {
          out_.unused.push_back(record);
        } else {
          Restore(*record, absl::StrJoin(users, " + "));
        }
      }
    }
    CheckAgainstConfig();
    return std::move(out_);
  }

 private:
  absl::Status CheckShape(const MtpHeadInfo& info, const TensorRecord& record,
                          const std::vector<int64_t>& expected) {
    if (record.shape == expected) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "MTP head ", info.name, ": ", record.name, " has shape ", ShapeString(record.shape),
        " but ", config_.architecture_name, " expects ", ShapeString(expected)));
  }

  void Restore(const TensorRecord& record, const std::string& head) {
    report_.restored.push_back({record.name, record.byte_size, record.origin, head, ""});
  }

  void Warn(std::string warning) {
    LOG(WARNING) << warning;
    report_.warnings.push_back(std::move(warning));
  }

  absl::Status TryHead(MtpLayout layout, int64_t index, const Group& group, const Group* shared) {
    const HeadNames names = NamesOf(layout);
    // Family tensors live in the group itself, except Qwen3-Next's shared ones.
    const Group& family = shared != nullptr ? *shared : group;
    auto find = [&](const std::string& suffix) -> const TensorRecord* {
      auto it = family.members.find(suffix);
      return it == family.members.end() ? nullptr : it->second;
    };
    MtpHeadParams head;
    head.info.layout = layout;
    head.info.name = absl::StrCat("mtp.", index, " (", MtpLayoutName(layout), ")");
    head.info.hidden_first = layout == MtpLayout::kMiMo;
    head.info.zero_embedding_at_start = layout != MtpLayout::kQwen3Next;
    head.info.next_hidden_normed = layout != MtpLayout::kDeepSeek;
    head.proj = find(names.proj);
    // Without its input projection the group is not a head (e.g. a stray extra layer).
    if (head.proj == nullptr && (shared == nullptr || shared->members.empty())) {
      for (const auto& [suffix, record] : group.members) out_.unused.push_back(record);
      return absl::OkStatus();
    }
    head.embedding_norm = find(names.embedding_norm);
    head.hidden_norm = find(names.hidden_norm);
    head.final_norm = find(names.final_norm);

    std::vector<const TensorRecord*> taken;
    std::vector<std::string> missing;
    const int64_t h = config_.hidden_size;
    struct Part {
      const TensorRecord* record;
      const std::string& suffix;
      std::vector<int64_t> shape;
    };
    for (const Part& part :
         {Part{head.embedding_norm, names.embedding_norm, {h}},
          Part{head.hidden_norm, names.hidden_norm, {h}}, Part{head.proj, names.proj, {h, 2 * h}},
          Part{head.final_norm, names.final_norm, {h}}}) {
      if (part.record == nullptr) {
        missing.push_back(family.prefix + part.suffix);
        continue;
      }
      if (absl::Status s = CheckShape(head.info, *part.record, part.shape); !s.ok()) return s;
      if (shared == nullptr) taken.push_back(part.record);
    }
    for (const std::string& copy : names.copies) {
      const TensorRecord* record = find(copy);
      if (record == nullptr) continue;
      if (absl::Status s = CheckShape(head.info, *record, {config_.vocab_size, h}); !s.ok()) {
        return s;
      }
      taken.push_back(record);  // the main embedding / lm_head are used instead
    }

    std::vector<const TensorRecord*> leftover;
    for (const auto& [suffix, record] : group.members) {
      auto spec = block_specs_.find(suffix);
      if (spec == block_specs_.end()) continue;
      if (absl::Status s = CheckShape(head.info, *record, spec->second.shape); !s.ok()) return s;
      head.block[static_cast<int>(spec->second.role)] = record;
    }
    for (const auto& [suffix, record] : group.members) {
      auto spec = block_specs_.find(suffix);
      if (spec != block_specs_.end() && RoleInUse(config_, spec->second.role, head)) {
        taken.push_back(record);
      } else if (std::find(taken.begin(), taken.end(), record) == taken.end()) {
        leftover.push_back(record);
      }
    }
    for (const std::string& name : MissingBlockParams(config_, head, group.prefix)) {
      missing.push_back(name);
    }
    if (!missing.empty()) {
      Warn(absl::StrCat("MTP head ", head.info.name, " is incomplete and was not restored: ",
                        "the checkpoint lacks ", absl::StrJoin(missing, ", ")));
      for (const auto& [suffix, record] : group.members) out_.unused.push_back(record);
      return absl::OkStatus();
    }
    // Drop roles the block does not use so that PostLoad never packs them.
    for (int r = 0; r < kNumParamRoles; ++r) {
      if (!RoleInUse(config_, static_cast<ParamRole>(r), head)) head.block[r] = nullptr;
    }
    for (const TensorRecord* record : taken) Restore(*record, head.info.name);
    for (const TensorRecord* record : leftover) out_.unused.push_back(record);
    if (shared != nullptr) {
      for (const TensorRecord* r :
           {head.embedding_norm, head.hidden_norm, head.proj, head.final_norm}) {
        shared_taken_.insert(r);
      }
    }
    out_.heads.push_back(std::move(head));
    return absl::OkStatus();
  }

  void CheckAgainstConfig() {
    const int64_t advertised = config_.num_mtp_layers;
    const int64_t found = static_cast<int64_t>(out_.heads.size());
    if (advertised > found) {
      Warn(absl::StrCat("config.json advertises ", advertised,
                        " MTP layers (num_nextn_predict_layers) but the checkpoint has ", found,
                        " complete MTP heads; speculative decoding has ",
                        found == 0 ? "no MTP drafts" : "fewer MTP heads than advertised"));
    } else if (found > 0 && advertised == 0) {
      Warn(absl::StrCat("the checkpoint has ", found, " MTP heads that config.json does not ",
                        "advertise (num_nextn_predict_layers); restored anyway"));
    } else if (found > advertised) {
      Warn(absl::StrCat("the checkpoint has ", found, " MTP heads, config.json advertises ",
                        advertised, "; all are restored"));
    }
  }

  const ModelConfig& config_;
  LoadReport& report_;
  const std::map<std::string, ParamSpec> block_specs_;
  MtpRestoration out_;
  absl::flat_hash_set<const TensorRecord*> shared_taken_;
};

}  // namespace

absl::string_view MtpLayoutName(MtpLayout layout) {
  switch (layout) {
    case MtpLayout::kDeepSeek:
      return "deepseek";
    case MtpLayout::kQwen3Next:
      return "qwen3-next";
    case MtpLayout::kMiMo:
      return "mimo";
  }
  return "?";
}

absl::StatusOr<MtpRestoration> RestoreMtpHeads(const ModelConfig& config,
                                               std::span<const TensorRecord* const> carried,
                                               LoadReport& report) {
  return Restorer(config, report).Run(carried);
}

}  // namespace kiln
