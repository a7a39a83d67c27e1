#include "models/lifecycle.h"

#include <atomic>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "models/bind.h"
#include "models/rope.h"

namespace kiln {
namespace {

std::atomic<uint64_t> g_post_load_runs{0};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A 1-D record (a norm weight) as a one-row WeightView.
WeightView AsVector(const TensorRecord& record) {
  return WeightView{record.dtype, 1, record.elements(), record.data};
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

absl::StatusOr<std::optional<DType>> ParseComputeDType(absl::string_view text) {
  if (text.empty()) return std::nullopt;
  absl::StatusOr<DType> dtype = ParseDTypeApiName(absl::AsciiStrToLower(text));
  if (!dtype.ok() || (*dtype != DType::kF32 && *dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not supported (use \"\", \"bf16\" or \"f32\")"));
  }
  return *dtype;
}

PreparedModel::~PreparedModel() = default;

// The preparation stage. Runs once per load; the PreparedModel it returns is the only object with
// Forward(), so a model that skipped it cannot run. Everything a forward reads is described here
// and prepared by the backend in one call: packed linears (biases in their epilogue), norms, the
// embedding (in place where the backend reads host memory) and the RoPE table.
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
  const StepCapacity& capacity = options.step_capacity;
  if (capacity.max_rows < 1 || capacity.max_sequences < 1 || capacity.max_logits_rows < 1) {
    return absl::InvalidArgumentError("step capacity must be positive");
  }
  auto model = std::unique_ptr<PreparedModel>(new PreparedModel());
  model->config_ = c;
  model->compute_dtype_ = compute;
  model->backend_ = backend;
  model->capacity_ = capacity;

  // Every tensor is described first and prepared in one call, so the backend can pack
  // concurrently and place everything at once; the slots say where each result goes.
  // A file written quantized (`kiln tensorize --prepack --quantize`) keeps its quantization for
  // every linear, those it stores plain included, unless the load asks for another.
  Quantization quantize = options.quantize;
  for (const TensorRecord& record : bound.source.records()) {
    if (quantize != Quantization::kNone) break;
    if (record.packed != nullptr) quantize = record.packed->quantization;
  }
  PreparePlan plan;
  std::vector<std::unique_ptr<PackedLinear>*> linear_slots;
  std::vector<std::string> linear_records;  // the one record a linear came from, or empty
  std::vector<TensorView*> constant_slots;
  auto pack = [&](std::string name, std::vector<const TensorRecord*> blocks,
                  std::vector<const TensorRecord*> biases,
                  std::unique_ptr<PackedLinear>* slot) -> absl::Status {
    LinearPackSpec spec;
    spec.name = std::move(name);
    spec.compute_dtype = compute;
    spec.quantization = quantize;
    // A weight stored packed is handed over as its image (one record: engine layout).
    if (blocks.size() == 1 && blocks.front()->packed != nullptr) {
      spec.prepacked = blocks.front()->packed.get();
      model->parameter_count_ += blocks.front()->elements();
    } else {
      for (const TensorRecord* block : blocks) {
        KILN_ASSIGN_OR_RETURN(WeightView view, AsMatrix(*block));
        spec.row_blocks.push_back(view);
        model->parameter_count_ += block->elements();
      }
    }
    linear_records.push_back(blocks.size() == 1 ? blocks.front()->name : "");
    if (!biases.empty() && biases.front() != nullptr) {
      for (const TensorRecord* bias : biases) {
        std::vector<float> values = ToF32(bias);
        spec.bias.insert(spec.bias.end(), values.begin(), values.end());
        model->parameter_count_ += bias->elements();
      }
    }
    plan.linears.push_back(std::move(spec));
    linear_slots.push_back(slot);
    return absl::OkStatus();
  };
  // Norm weights, kept as fp32. Absent ones (q/k norms of architectures without them) stay empty.
  auto norm = [&](std::string name, const TensorRecord* record, TensorView* slot) {
    if (record == nullptr) return;
    plan.constants.push_back({std::move(name), AsVector(*record), DType::kF32,
                              /*source_outlives_model=*/true});
    constant_slots.push_back(slot);
    model->parameter_count_ += record->elements();
  };

  const BoundParams& top = bound.model_params;
  auto role = [](const BoundParams& params, ParamRole r) { return params[static_cast<int>(r)]; };
  const TensorRecord* embedding = role(top, ParamRole::kEmbedding);
  KILN_ASSIGN_OR_RETURN(WeightView embedding_view, AsMatrix(*embedding));
  // The embedding keeps its stored dtype: Embed converts the few rows a step reads.
  plan.constants.push_back(
      {"embedding", embedding_view, embedding_view.dtype, /*source_outlives_model=*/true});
  constant_slots.push_back(&model->embedding_);
  const size_t embedding_constant = plan.constants.size() - 1;
  model->parameter_count_ += embedding->elements();
  // Tied: the embedding is the LM head, unless the file ships it packed (a --prepack file does,
  // so that it is not packed at load).
  const TensorRecord* lm_head = role(top, ParamRole::kLmHead);
  if (lm_head == nullptr || (c.tie_word_embeddings && lm_head->packed == nullptr)) {
    lm_head = embedding;
  }
  {
    const int64_t before = model->parameter_count_;
    KILN_RETURN_IF_ERROR(pack("lm_head", {lm_head}, {}, &model->lm_head_));
    if (c.tie_word_embeddings || lm_head == embedding) {
      model->parameter_count_ = before;  // tied: counted once
    }
    if (lm_head == embedding) linear_records.back() = "lm_head.weight";
  }
  norm("norm", role(top, ParamRole::kFinalNorm), &model->final_norm_);
  const std::vector<float> inv_freq =
      RopeInverseFrequencies(c.head_dim, c.rope_theta, c.rope_scaling);
  plan.constants.push_back({"rope.inv_freq",
                            WeightView{DType::kF32, 1, static_cast<int64_t>(inv_freq.size()),
                                       reinterpret_cast<const std::byte*>(inv_freq.data())},
                            DType::kF32, /*source_outlives_model=*/false});
  constant_slots.push_back(&model->rope_inv_freq_);

  // One preparation path for the main decoder layers and the MTP heads' blocks. Hugging Face
  // layout: separate q/k/v and gate/up stacked at pack time; engine layout: already fused.
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
    norm(prefix + "input_norm", role(p, ParamRole::kInputNorm), &layer.input_norm);
    norm(prefix + "post_attention_norm", role(p, ParamRole::kPostAttentionNorm),
         &layer.post_attention_norm);
    norm(prefix + "q_norm", role(p, ParamRole::kQNorm), &layer.q_norm);
    norm(prefix + "k_norm", role(p, ParamRole::kKNorm), &layer.k_norm);
    return absl::OkStatus();
  };
  model->layers_.resize(bound.layers.size());  // sized before: the slots point into it
  for (size_t i = 0; i < bound.layers.size(); ++i) {
    KILN_RETURN_IF_ERROR(
        pack_block(bound.layers[i], absl::StrCat("layers.", i, "."), model->layers_[i]));
  }
  // MTP heads: the projection as one linear, the block like a main layer, norms as fp32. Their
  // embedding / lm_head copies are not prepared; the main ones are used.
  model->mtp_heads_.resize(bound.mtp_heads.size());
  for (size_t i = 0; i < bound.mtp_heads.size(); ++i) {
    const MtpHeadParams& params = bound.mtp_heads[i];
    PreparedModel::MtpHead& head = model->mtp_heads_[i];
    const std::string prefix = absl::StrCat("mtp.", i, ".");
    head.info = params.info;
    KILN_RETURN_IF_ERROR(pack(prefix + "proj", {params.proj}, {}, &head.proj));
    norm(prefix + "embedding_norm", params.embedding_norm, &head.embedding_norm);
    norm(prefix + "hidden_norm", params.hidden_norm, &head.hidden_norm);
    norm(prefix + "final_norm", params.final_norm, &head.final_norm);
    KILN_RETURN_IF_ERROR(pack_block(params.block, prefix, head.block));
  }

  KILN_ASSIGN_OR_RETURN(model->weights_, backend->Prepare(plan));
  PreparedWeights& prepared = model->weights_;
  if (prepared.linears.size() != linear_slots.size() ||
      prepared.constants.size() != constant_slots.size() ||
      prepared.zero_copy.size() != constant_slots.size()) {
    return absl::InternalError(absl::StrCat("backend ", backend->name(),
                                            " prepared a different number of tensors than asked"));
  }
  for (size_t i = 0; i < linear_slots.size(); ++i) {
    if (prepared.linears[i]->quantization() != Quantization::kNone) {
      model->quantization_ = prepared.linears[i]->quantization();
      ++model->quantized_linears_;
    }
    if (prepared.linears[i]->adopted()) ++model->adopted_linears_;
    if (prepared.linears[i]->adopted_in_place()) ++model->adopted_in_place_linears_;
    *linear_slots[i] = std::move(prepared.linears[i]);
    if (!linear_records[i].empty()) {
      model->linears_by_record_.emplace_back(linear_records[i], linear_slots[i]->get());
    }
  }
  model->linear_count_ = static_cast<int>(linear_slots.size());
  prepared.linears.clear();
  for (size_t i = 0; i < constant_slots.size(); ++i) *constant_slots[i] = prepared.constants[i];
  model->embedding_zero_copy_ = prepared.zero_copy[embedding_constant];

  // The execution context and its arena, sized once for the largest step.
  const bool mtp = !model->mtp_heads_.empty();
  ContextOptions context_options;
  context_options.limits = {capacity.max_rows, capacity.max_sequences};
  context_options.scratch_bytes = StepBuffers::Bytes(c, capacity, mtp);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> context,
                        backend->CreateContext(context_options));
  model->scratch_bytes_ = context_options.scratch_bytes;
  model->buffers_ = StepBuffers::Carve(context->scratch(), c, capacity, mtp);
  {
    absl::MutexLock lock(&model->mutex_);
    model->context_ = std::move(context);
  }
  // The KV pool: every layer's keys and values, and one layer slot per MTP head.
  KvPoolOptions pool_options = options.kv_pool;
  // "auto": keys and values as the model computes (bf16 models keep a bf16 cache, as vLLM's).
  if (!pool_options.dtype.has_value()) {
    pool_options.dtype = model->compute_dtype_ == DType::kBF16 ? DType::kBF16 : DType::kF32;
  }
  const int64_t pool_layers = c.num_hidden_layers + static_cast<int64_t>(model->mtp_heads_.size());
  if (pool_options.bytes == 0) {
    int64_t context = pool_options.default_context;
    if (c.max_position_embeddings > 0) {
      context = std::min<int64_t>(context, c.max_position_embeddings);
    }
    pool_options.bytes =
        KvPoolDefaultBytes(*backend, pool_layers, c.kv_dim(), pool_options.default_sequences,
                           context, *pool_options.dtype);
  }
  KILN_ASSIGN_OR_RETURN(model->kv_pool_,
                        KvPool::Create(*backend, pool_layers, c.kv_dim(), pool_options));
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
  Backend& loaded_on = *backend;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> model,
                        PostLoad(std::move(bound), std::move(backend), options));
  loaded_on.FinishLoadOnThisThread();
  model->timings().bind_seconds = bind_seconds;
  model->timings().post_load_seconds = SecondsSince(start);
  LOG(INFO) << "post-load on backend " << model->backend_name() << " ("
            << model->backend_description() << "): prepared " << model->weight_bytes()
            << " bytes as " << DTypeName(model->compute_dtype())
            << (model->quantization() != Quantization::kNone
                    ? absl::StrCat(", ", QuantizationName(model->quantization()), " in ",
                                   model->quantized_linears(), " of ", model->linear_count(),
                                   " linears")
                    : "")
            << (model->adopted_linears() > 0
                    ? absl::StrCat(", ", model->adopted_linears(), " of ", model->linear_count(),
                                   " linears adopted as packed in the file (",
                                   model->adopted_in_place_linears(), " read where they lie)")
                    : "")
            << (model->embedding_zero_copy() ? ", embedding read in place" : "") << ", arena "
            << model->scratch_bytes() << " bytes, KV pool " << model->kv_pool().bytes()
            << " bytes (" << model->kv_pool().num_blocks() << " blocks of "
            << model->kv_pool().block_size() << " positions), in "
            << model->timings().post_load_seconds << " s";
  return model;
}

}  // namespace kiln
