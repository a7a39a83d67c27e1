// `kiln models list | load | unload | get`: the Models service.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli.h"
#include "clients/cli_flags.h"
#include "clients/cli_grpc.h"
#include "kiln/v1/kiln.grpc.pb.h"
#include "loaders/tensorizer_verify.h"
#include "models/kv_pool.h"
#include "models/lifecycle.h"

namespace kiln::cli {
namespace {

std::string Bytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string Count(int64_t count) {
  if (count >= 1'000'000'000) return absl::StrFormat("%.2fB", count / 1e9);
  if (count >= 1'000'000) return absl::StrFormat("%.1fM", count / 1e6);
  if (count >= 1'000) return absl::StrFormat("%.1fK", count / 1e3);
  return absl::StrCat(count);
}

std::string Ms(double seconds) { return absl::StrFormat("%.1f ms", seconds * 1e3); }

void PrintTensors(const char* label,
                  const google::protobuf::RepeatedPtrField<kiln::v1::TensorInfo>& tensors) {
  for (const kiln::v1::TensorInfo& tensor : tensors) {
    std::cout << "    " << label << " " << tensor.name() << " (" << Bytes(tensor.bytes()) << ")";
    if (!tensor.head().empty()) std::cout << " head " << tensor.head();
    if (!tensor.origin().empty()) std::cout << " from " << tensor.origin();
    std::cout << "\n";
  }
}

void PrintModel(const kiln::v1::ModelInfo& model, bool verbose) {
  const auto row = [](const char* key, const std::string& value) {
    if (!value.empty()) std::cout << absl::StrFormat("%-14s%s\n", key, value);
  };
  row("name", model.name());
  row("state", kiln::v1::ModelState_Name(model.state()));
  if (model.state() == kiln::v1::FAILED) row("error", model.error());
  row("path", model.path());
  row("backend", model.backend_description().empty()
                     ? model.backend()
                     : absl::StrCat(model.backend(), " (", model.backend_description(), ")"));
  row("architecture", model.architecture());
  row("format", model.format());
  row("dtype", model.dtype());
  if (!model.quantization().empty() && model.quantization() != "none") {
    row("quantization", model.linears() > 0
                            ? absl::StrCat(model.quantization(), " (", model.quantized_linears(),
                                           " of ", model.linears(), " linears)")
                            : model.quantization());
  }
  if (model.adopted_linears() > 0) {
    row("prepacked", absl::StrCat(model.adopted_linears(), " of ", model.linears(),
                                  " linears adopted from the file, ",
                                  model.adopted_in_place_linears(), " read where they lie"));
  }
  row("parameters",
      absl::StrCat(Count(model.parameter_count()), " (", model.parameter_count(), ")"));
  row("memory", absl::StrCat(Bytes(model.bytes_in_memory()), " (", model.bytes_in_memory(), ")"));
  if (model.vocab_size() > 0) row("vocab", absl::StrCat(model.vocab_size()));
  if (model.max_context() > 0) row("max context", absl::StrCat(model.max_context()));
  if (model.has_kv_pool() && model.kv_pool().blocks() > 0) {
    const kiln::v1::KvPoolInfo& pool = model.kv_pool();
    row("KV pool", absl::StrCat(Bytes(pool.bytes()), " of ", pool.dtype(), ", ", pool.blocks(),
                                " blocks of ", pool.block_size(), " positions"));
  }
  if (model.mtp_heads() > 0) {
    row("MTP heads", absl::StrCat(model.mtp_heads(), " (", model.default_num_draft_tokens(),
                                  " draft tokens per step for a greedy request alone)"));
  }
  row("loader", model.loader());
  if (model.has_load_timings()) {
    const kiln::v1::LoadTimings& t = model.load_timings();
    row("load timings",
        absl::StrCat("open ", Ms(t.open_seconds()), ", bind ", Ms(t.bind_seconds()), ", post-load ",
                     Ms(t.post_load_seconds()), ", total ", Ms(t.total_seconds())));
  }
  if (model.has_load_report()) {
    const kiln::v1::LoadReport& r = model.load_report();
    row("load report",
        absl::StrCat("placed ", r.placed_size(), ", missing ", r.missing_size(), ", carried ",
                     r.carried_size(), ", restored ", r.restored_size(), ", unplaced ",
                     r.unplaced_size(), ", warnings ", r.warnings_size()));
    if (verbose) PrintTensors("placed", r.placed());
    PrintTensors("missing", r.missing());
    PrintTensors("carried", r.carried());
    PrintTensors("restored", r.restored());
    PrintTensors("unplaced", r.unplaced());
    for (const std::string& warning : r.warnings()) std::cout << "    warning " << warning << "\n";
  }
}

// Runs one Models call with the admin token and the deadline.
template <typename Request, typename Response>
absl::Status CallModels(grpc::Status (kiln::v1::Models::Stub::*method)(grpc::ClientContext*,
                                                                       const Request&, Response*),
                        const Request& request, Response* response) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel();
  if (!channel.ok()) return channel.status();
  grpc::ClientContext context;
  SetDeadline(&context);
  if (absl::Status status = AddAdminToken(&context); !status.ok()) return status;
  std::unique_ptr<kiln::v1::Models::Stub> stub = kiln::v1::Models::NewStub(*channel);
  return FromGrpc(((*stub).*method)(&context, request, response));
}

int PrintJson(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) return ReportError(json.status());
  std::cout << *json << "\n";
  return kExitOk;
}

}  // namespace

int ModelsList(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "no arguments"); !status.ok()) {
    return UsageError("models list", status.message());
  }
  kiln::v1::ListModelsResponse response;
  if (absl::Status status =
          CallModels(&kiln::v1::Models::Stub::ListModels, kiln::v1::ListModelsRequest(), &response);
      !status.ok()) {
    return ReportError(status);
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(response);
  if (response.models().empty()) {
    std::cout << "no models loaded\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "BACKEND", "ARCHITECTURE", "DTYPE", "PARAMS", "MEMORY", "PATH"}};
  for (const kiln::v1::ModelInfo& model : response.models()) {
    rows.push_back({model.name(), kiln::v1::ModelState_Name(model.state()), model.backend(),
                    model.architecture(),
                    model.quantization().empty() || model.quantization() == "none"
                        ? model.dtype()
                        : absl::StrCat(model.dtype(), "/", model.quantization()),
                    Count(model.parameter_count()), Bytes(model.bytes_in_memory()), model.path()});
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const std::vector<std::string>& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const std::vector<std::string>& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i],
                      i + 1 < row.size() ? std::string(widths[i] - row[i].size() + 2, ' ') : "");
    }
    std::cout << line << "\n";
  }
  return kExitOk;
}

int ModelsLoad(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 2, "NAME PATH"); !status.ok()) {
    return UsageError("models load", status.message());
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (absl::Status parsed = ParseComputeDType(dtype).status(); !parsed.ok()) {
    return UsageError("models load", absl::StrCat("--dtype: ", parsed.message()));
  }
  const std::string quantize = absl::GetFlag(FLAGS_quantize);
  if (absl::Status parsed = ParseQuantization(quantize).status(); !parsed.ok()) {
    return UsageError("models load", absl::StrCat("--quantize: ", parsed.message()));
  }
  const std::string kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  if (absl::Status parsed = ParseKvCacheDType(kv_cache_dtype).status(); !parsed.ok()) {
    return UsageError("models load", absl::StrCat("--kv_cache_dtype: ", parsed.message()));
  }
  if (const std::string check = absl::GetFlag(FLAGS_hash_check); !check.empty()) {
    if (absl::Status parsed = tensorizer::ParseHashCheck(check).status(); !parsed.ok()) {
      return UsageError("models load", absl::StrCat("--hash_check: ", parsed.message()));
    }
  }
  kiln::v1::LoadModelRequest request;
  request.set_name(args[0]);
  request.set_path(args[1]);
  request.set_dtype(dtype);
  request.set_quantize(quantize);
  request.set_kv_cache_dtype(kv_cache_dtype);
  request.set_backend(absl::GetFlag(FLAGS_backend));
  request.set_format(absl::GetFlag(FLAGS_format));
  if (const std::string file = absl::GetFlag(FLAGS_chat_template); !file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return UsageError("models load", absl::StrCat("--chat_template: cannot read ", file));
    request.set_chat_template(
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  }
  kiln::v1::TensorizerOptions* tensorizer = request.mutable_tensorizer();
  tensorizer->set_config_path(absl::GetFlag(FLAGS_tensorizer_config));
  tensorizer->set_encryption_key_file(absl::GetFlag(FLAGS_encryption_key_file));
  tensorizer->set_encryption_passphrase_file(absl::GetFlag(FLAGS_encryption_passphrase_file));
  tensorizer->set_skip_hash_verification(absl::GetFlag(FLAGS_skip_hash_verification));
  tensorizer->set_hash_check(absl::GetFlag(FLAGS_hash_check));
  kiln::v1::ModelInfo response;
  if (absl::Status status = CallModels(&kiln::v1::Models::Stub::LoadModel, request, &response);
      !status.ok()) {
    return ReportError(status);
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(response);
  PrintModel(response, false);
  return response.state() == kiln::v1::FAILED ? kExitError : kExitOk;
}

int ModelsUnload(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 1, "NAME"); !status.ok()) {
    return UsageError("models unload", status.message());
  }
  kiln::v1::UnloadModelRequest request;
  request.set_name(args[0]);
  kiln::v1::UnloadModelResponse response;
  if (absl::Status status = CallModels(&kiln::v1::Models::Stub::UnloadModel, request, &response);
      !status.ok()) {
    return ReportError(status);
  }
  std::cout << "unloaded " << args[0] << "\n";
  return kExitOk;
}

int ModelsGet(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 1, "NAME"); !status.ok()) {
    return UsageError("models get", status.message());
  }
  kiln::v1::GetModelRequest request;
  request.set_name(args[0]);
  kiln::v1::ModelInfo response;
  if (absl::Status status = CallModels(&kiln::v1::Models::Stub::GetModel, request, &response);
      !status.ok()) {
    return ReportError(status);
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(response);
  PrintModel(response, absl::GetFlag(FLAGS_verbose));
  return kExitOk;
}

int ModelsTensorize(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 2, "NAME OUT"); !status.ok()) {
    return UsageError("models tensorize", status.message());
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (absl::Status parsed = ParseComputeDType(dtype).status(); !parsed.ok()) {
    return UsageError("models tensorize", absl::StrCat("--dtype: ", parsed.message()));
  }
  kiln::v1::TensorizeRequest request;
  request.set_model(args[0]);
  request.set_output_path(args[1]);
  request.set_dtype(dtype);
  request.set_overwrite(absl::GetFlag(FLAGS_overwrite));
  request.set_prepack(absl::GetFlag(FLAGS_prepack));
  kiln::v1::TensorizeResponse response;
  if (absl::Status status = CallModels(&kiln::v1::Models::Stub::Tensorize, request, &response);
      !status.ok()) {
    return ReportError(status);
  }
  std::cout << "wrote " << response.path() << ": " << response.tensors() << " tensors"
            << (response.packed() > 0 ? absl::StrCat(" (", response.packed(), " packed)") : "")
            << ", " << response.bytes() << " bytes in " << response.seconds() << " s\n";
  return kExitOk;
}

}  // namespace kiln::cli
