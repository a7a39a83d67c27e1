#include "server/model_info.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "models/load_report.h"

namespace kiln {
namespace {

v1::ModelState ToProtoState(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return v1::LOADING;
    case ModelState::kReady:
      return v1::READY;
    case ModelState::kUnloading:
      return v1::UNLOADING;
    case ModelState::kFailed:
      return v1::FAILED;
  }
  return v1::MODEL_STATE_UNSPECIFIED;
}

void FillTensors(const std::vector<TensorSummary>& tensors,
                 google::protobuf::RepeatedPtrField<v1::TensorInfo>* out) {
  out->Reserve(static_cast<int>(tensors.size()));
  for (const TensorSummary& tensor : tensors) {
    v1::TensorInfo* info = out->Add();
    info->set_name(tensor.name);
    info->set_bytes(tensor.bytes);
    info->set_head(tensor.head);
    info->set_origin(tensor.origin);
    info->set_reason(tensor.reason);
  }
}

}  // namespace

void FillModelInfo(const ModelSnapshot& snapshot, v1::ModelInfo* info) {
  info->set_name(snapshot.spec.name);
  info->set_state(ToProtoState(snapshot.state));
  info->set_path(snapshot.resolved_path.empty() ? snapshot.spec.path : snapshot.resolved_path);
  info->set_error(snapshot.error);
  info->set_backend(snapshot.backend);
  if (snapshot.model == nullptr) {
    // Not loaded (yet): what was asked for.
    info->set_format(snapshot.spec.format);
    info->set_dtype(snapshot.spec.dtype);
    info->set_quantization(snapshot.spec.quantize);
    return;
  }
  const PreparedModel& model = *snapshot.model;
  info->set_backend(std::string(model.backend_name()));
  info->set_backend_description(model.backend_description());
  info->set_architecture(model.config().architecture_name);
  info->set_dtype(std::string(DTypeApiName(model.compute_dtype())));
  info->set_quantization(std::string(QuantizationName(model.quantization())));
  info->set_quantized_linears(model.quantized_linears());
  info->set_linears(model.linear_count());
  info->set_adopted_linears(model.adopted_linears());
  info->set_adopted_in_place_linears(model.adopted_in_place_linears());
  info->set_parameter_count(model.parameter_count());
  info->set_bytes_in_memory(model.weight_bytes());
  info->set_format(model.provenance().format);
  const SourceProvenance& provenance = model.provenance();
  info->set_loader(absl::StrCat(
      provenance.format, provenance.format_version.empty() ? "" : " ", provenance.format_version,
      " (", LoadModeName(provenance.load_mode), provenance.encrypted ? ", decrypted" : "",
      provenance.format != "tensorizer"  ? ""
      : provenance.hash_check == "none"  ? ", hashes not verified"
      : provenance.hash_check == "crc32" ? ", CRC32s verified, SHA-256 not"
                                         : "",
      ")"));
  info->set_vocab_size(static_cast<int32_t>(model.config().vocab_size));
  info->set_max_context(snapshot.max_context);
  if (snapshot.chat_templates != nullptr) {
    for (const auto& [name, _] : snapshot.chat_templates->templates) info->add_chat_templates(name);
    for (const std::string& error : snapshot.chat_templates->errors) {
      info->add_chat_template_errors(error);
    }
  }
  info->set_mtp_heads(model.num_mtp_heads());
  if (snapshot.engine != nullptr) {
    info->set_default_num_draft_tokens(snapshot.engine->default_num_draft_tokens());
  }
  const KvPool& pool = model.kv_pool();
  const KvPoolStats pool_stats = pool.stats();
  v1::KvPoolInfo* kv = info->mutable_kv_pool();
  kv->set_bytes(pool.bytes());
  kv->set_blocks(pool.num_blocks());
  kv->set_block_size(static_cast<int32_t>(pool.block_size()));
  kv->set_dtype(std::string(DTypeApiName(pool.dtype())));
  kv->set_used_blocks(pool_stats.used_blocks);
  kv->set_cached_blocks(pool_stats.cached_blocks);
  kv->set_prefix_caching(snapshot.spec.prefix_caching);
  if (snapshot.engine != nullptr) {
    const EngineStats stats = snapshot.engine->stats();
    kv->set_preemptions(stats.preemptions);
    kv->set_prompt_tokens(stats.prompt_tokens);
    kv->set_cached_prompt_tokens(stats.cached_prompt_tokens);
  }

  v1::LoadTimings* timings = info->mutable_load_timings();
  timings->set_open_seconds(model.timings().open_seconds);
  timings->set_bind_seconds(model.timings().bind_seconds);
  timings->set_post_load_seconds(model.timings().post_load_seconds);
  timings->set_total_seconds(snapshot.load_seconds);

  const LoadReport& report = model.report();
  v1::LoadReport* out = info->mutable_load_report();
  FillTensors(report.placed, out->mutable_placed());
  FillTensors(report.missing, out->mutable_missing());
  FillTensors(report.carried, out->mutable_carried());
  FillTensors(report.restored, out->mutable_restored());
  FillTensors(report.unplaced, out->mutable_unplaced());
  FillTensors(report.ignored, out->mutable_ignored());
  for (const std::string& warning : report.warnings) out->add_warnings(warning);
}

// Both messages spell the spec with the same fields.
template <typename Message>
ModelSpec SpecFrom(const Message& m) {
  ModelSpec spec{m.name(), m.path(), m.format(), m.dtype(), m.backend(), {}};
  spec.quantize = m.quantize();
  spec.kv_cache_bytes = m.kv_cache_bytes();
  spec.kv_cache_dtype = m.kv_cache_dtype();
  spec.prefix_caching = !m.disable_prefix_caching();
  const v1::TensorizerOptions& tensorizer = m.tensorizer();
  TensorizerSpec& tz = spec.tensorizer;
  tz.config_path = tensorizer.config_path();
  tz.skip_hash_verification = tensorizer.skip_hash_verification();
  tz.hash_check = tensorizer.hash_check();
  tz.encryption_key = tensorizer.encryption_key();
  tz.encryption_passphrase = tensorizer.encryption_passphrase();
  tz.encryption_key_file = tensorizer.encryption_key_file();
  tz.encryption_passphrase_file = tensorizer.encryption_passphrase_file();
  return spec;
}

ModelSpec ModelSpecFromProto(const v1::LoadModelRequest& request) {
  ModelSpec spec = SpecFrom(request);
  spec.chat_template = request.chat_template();
  return spec;
}

ModelSpec ModelSpecFromProto(const v1::ModelConfigEntry& entry) {
  ModelSpec spec = SpecFrom(entry);
  spec.chat_template_file = entry.chat_template_file();
  return spec;
}

}  // namespace kiln
