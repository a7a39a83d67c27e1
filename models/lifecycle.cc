#include "models/lifecycle.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "models/bind.h"

namespace kiln {
namespace {

std::atomic<uint64_t> g_post_load_runs{0};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<float> ToF32(const TensorRecord* record) {
  std::vector<float> values;
  if (record == nullptr) return values;
  values.resize(static_cast<size_t>(record->elements()));
  ConvertToF32(record->dtype, record->data, record->elements(), values.data());
  return values;
}

DType ChooseComputeDType(const BoundModel& bound, const PostLoadOptions& options) {
  if (options.compute_dtype.has_value()) return *options.compute_dtype;
  const BoundParams& first = bound.layers.front();
  const TensorRecord* q = first[static_cast<int>(ParamRole::kQ)];
  if (q == nullptr) q = first[static_cast<int>(ParamRole::kQKV)];
  return q->dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

}  // namespace

uint64_t PostLoadRunCount() { return g_post_load_runs.load(); }

PreparedModel::~PreparedModel() = default;

// The packing stage. Runs once per load; the PreparedModel it returns is the only object with
// Forward(), so a model that skipped it cannot run.
absl::StatusOr<std::unique_ptr<PreparedModel>> PostLoad(BoundModel bound,
                                                        std::shared_ptr<Backend> backend,
                                                        const PostLoadOptions& options) {
  g_post_load_runs.fetch_add(1);
  const ModelConfig& c = bound.config;
  const DType compute = ChooseComputeDType(bound, options);
  if (compute != DType::kF32 && compute != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute dtype ", DTypeName(compute), " is not supported (F32 or BF16)"));
  }
  auto model = std::unique_ptr<PreparedModel>(new PreparedModel());
  model->config_ = c;
  model->compute_dtype_ = compute;
  model->backend_ = backend;

  // Every weight is described first and packed in one call, so the backend can pack them
  // concurrently; `slots` says where each packed weight goes.
  std::vector<LinearPackSpec> specs;
  std::vector<std::unique_ptr<PackedLinear>*> slots;
  auto pack = [&](std::string name, std::vector<const TensorRecord*> blocks,
                  std::vector<const TensorRecord*> biases,
                  std::unique_ptr<PackedLinear>* slot) -> absl::Status {
    LinearPackSpec spec;
    spec.name = std::move(name);
    spec.compute_dtype = compute;
    for (const TensorRecord* block : blocks) {
      KILN_ASSIGN_OR_RETURN(WeightView view, AsMatrix(*block));
      spec.row_blocks.push_back(view);
      model->parameter_count_ += block->elements();
    }
    if (!biases.empty() && biases.front() != nullptr) {
      for (const TensorRecord* bias : biases) {
        std::vector<float> values = ToF32(bias);
        spec.bias.insert(spec.bias.end(), values.begin(), values.end());
        model->parameter_count_ += bias->elements();
      }
    }
    specs.push_back(std::move(spec));
    slots.push_back(slot);
    return absl::OkStatus();
  };

  const BoundParams& top = bound.model_params;
  auto role = [](const BoundParams& params, ParamRole r) { return params[static_cast<int>(r)]; };
  const TensorRecord* embedding = role(top, ParamRole::kEmbedding);
  KILN_ASSIGN_OR_RETURN(model->embedding_, AsMatrix(*embedding));
  model->parameter_count_ += embedding->elements();
  const TensorRecord* lm_head = role(top, ParamRole::kLmHead);
  if (c.tie_word_embeddings || lm_head == nullptr) lm_head = embedding;
  {
    const int64_t before = model->parameter_count_;
    KILN_RETURN_IF_ERROR(pack("lm_head", {lm_head}, {}, &model->lm_head_));
    if (lm_head == embedding) model->parameter_count_ = before;  // tied: counted once
  }
  model->final_norm_ = ToF32(role(top, ParamRole::kFinalNorm));
  model->parameter_count_ += c.hidden_size;

  // One packing path for the main decoder layers and the MTP heads' blocks. Hugging Face layout:
  // separate q/k/v and gate/up stacked at pack time; engine layout: already fused.
  auto pack_block = [&](const BoundParams& p, const std::string& prefix,
                        PreparedModel::Layer& layer) -> absl::Status {
    if (role(p, ParamRole::kQKV) != nullptr) {
      KILN_RETURN_IF_ERROR(pack(prefix + "qkv", {role(p, ParamRole::kQKV)},
                                {role(p, ParamRole::kQKVBias)}, &layer.qkv));
    } else {
      KILN_RETURN_IF_ERROR(pack(
          prefix + "qkv", {role(p, ParamRole::kQ), role(p, ParamRole::kK), role(p, ParamRole::kV)},
          {role(p, ParamRole::kQBias), role(p, ParamRole::kKBias), role(p, ParamRole::kVBias)},
          &layer.qkv));
    }
    KILN_RETURN_IF_ERROR(
        pack(prefix + "o", {role(p, ParamRole::kO)}, {role(p, ParamRole::kOBias)}, &layer.o));
    const TensorRecord* gate_up = role(p, ParamRole::kGateUp);
    KILN_RETURN_IF_ERROR(gate_up != nullptr
                             ? pack(prefix + "gate_up", {gate_up}, {}, &layer.gate_up)
                             : pack(prefix + "gate_up",
                                    {role(p, ParamRole::kGate), role(p, ParamRole::kUp)}, {},
                                    &layer.gate_up));
    KILN_RETURN_IF_ERROR(pack(prefix + "down", {role(p, ParamRole::kDown)}, {}, &layer.down));
    layer.input_norm = ToF32(role(p, ParamRole::kInputNorm));
    layer.post_attention_norm = ToF32(role(p, ParamRole::kPostAttentionNorm));
    layer.q_norm = ToF32(role(p, ParamRole::kQNorm));
    layer.k_norm = ToF32(role(p, ParamRole::kKNorm));
    model->parameter_count_ += 2 * c.hidden_size + static_cast<int64_t>(layer.q_norm.size()) +
                               static_cast<int64_t>(layer.k_norm.size());
    return absl::OkStatus();
  };
  model->layers_.resize(bound.layers.size());  // sized before: `slots` point into it
  for (size_t i = 0; i < bound.layers.size(); ++i) {
    KILN_RETURN_IF_ERROR(
        pack_block(bound.layers[i], absl::StrCat("layers.", i, "."), model->layers_[i]));
  }
  // MTP heads: the projection as one linear, the block like a main layer, norms as fp32. Their
  // embedding / lm_head copies are not packed; the main ones are used.
  model->mtp_heads_.resize(bound.mtp_heads.size());
  for (size_t i = 0; i < bound.mtp_heads.size(); ++i) {
    const MtpHeadParams& params = bound.mtp_heads[i];
    PreparedModel::MtpHead& head = model->mtp_heads_[i];
    const std::string prefix = absl::StrCat("mtp.", i, ".");
    head.info = params.info;
    KILN_RETURN_IF_ERROR(pack(prefix + "proj", {params.proj}, {}, &head.proj));
    head.embedding_norm = ToF32(params.embedding_norm);
    head.hidden_norm = ToF32(params.hidden_norm);
    head.final_norm = ToF32(params.final_norm);
    model->parameter_count_ += 3 * c.hidden_size;
    KILN_RETURN_IF_ERROR(pack_block(params.block, prefix, head.block));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<PackedLinear>> packed,
                        backend->PackLinears(specs));
  for (size_t i = 0; i < packed.size(); ++i) *slots[i] = std::move(packed[i]);
  model->rope_ = std::make_unique<cpu::RopeTable>(c.head_dim, c.rope_theta, c.rope_scaling);
  model->report_ = std::move(bound.report);
  model->source_ = std::move(bound.source);  // after this, `bound`'s record pointers are unused
  return model;
}

absl::StatusOr<std::unique_ptr<PreparedModel>> BuildPreparedModel(WeightSource source,
                                                                  const ModelConfig& config,
                                                                  std::shared_ptr<Backend> backend,
                                                                  const PostLoadOptions& options) {
  if (backend == nullptr) return absl::InvalidArgumentError("no backend to pack weights for");
  auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(BoundModel bound, Bind(std::move(source), config));
  KILN_RETURN_IF_ERROR(RestoreCarried(bound));
  const double bind_seconds = SecondsSince(start);
  LOG(INFO) << config.architecture_name << ": " << bound.report.Summary();

  start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> model,
                        PostLoad(std::move(bound), std::move(backend), options));
  model->timings().bind_seconds = bind_seconds;
  model->timings().post_load_seconds = SecondsSince(start);
  LOG(INFO) << "post-load on " << model->backend_name() << ": packed " << model->weight_bytes()
            << " bytes as " << DTypeName(model->compute_dtype()) << " in "
            << model->timings().post_load_seconds << " s";
  return model;
}

}  // namespace kiln
