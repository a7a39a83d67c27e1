#include "server/models_service.h"

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "server/auth.h"
#include "server/handler_util.h"
#include "server/model_info.h"

namespace kiln {
namespace {

absl::Status RequireName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("name: a model name is required");
  return absl::OkStatus();
}

std::string Peer(const grpc::ServerContext& context) { return context.peer(); }

}  // namespace

grpc::Status ModelsService::LoadModel(grpc::ServerContext* context,
                                      const v1::LoadModelRequest* request,
                                      v1::ModelInfo* response) {
  return RunHandler("LoadModel", [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(CheckAdminToken(*context, admin_token_));
    const ModelSpec spec = ModelSpecFromProto(*request);
    LOG(INFO) << "LoadModel '" << spec.name << "' path " << spec.path << " from " << Peer(*context);
    KILN_ASSIGN_OR_RETURN(ModelSnapshot snapshot, registry_->Load(spec));
    FillModelInfo(snapshot, response);
    return absl::OkStatus();
  });
}

grpc::Status ModelsService::UnloadModel(grpc::ServerContext* context,
                                        const v1::UnloadModelRequest* request,
                                        v1::UnloadModelResponse* /*response*/) {
  return RunHandler("UnloadModel", [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(CheckAdminToken(*context, admin_token_));
    KILN_RETURN_IF_ERROR(RequireName(request->name()));
    LOG(INFO) << "UnloadModel '" << request->name() << "' from " << Peer(*context);
    return registry_->Unload(request->name());
  });
}

grpc::Status ModelsService::ListModels(grpc::ServerContext* context,
                                       const v1::ListModelsRequest* /*request*/,
                                       v1::ListModelsResponse* response) {
  return RunHandler("ListModels", [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(CheckAdminToken(*context, admin_token_));
    for (const ModelSnapshot& snapshot : registry_->List()) {
      FillModelInfo(snapshot, response->add_models());
    }
    return absl::OkStatus();
  });
}

grpc::Status ModelsService::GetModel(grpc::ServerContext* context,
                                     const v1::GetModelRequest* request, v1::ModelInfo* response) {
  return RunHandler("GetModel", [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(CheckAdminToken(*context, admin_token_));
    KILN_RETURN_IF_ERROR(RequireName(request->name()));
    KILN_ASSIGN_OR_RETURN(ModelSnapshot snapshot, registry_->Get(request->name()));
    FillModelInfo(snapshot, response);
    return absl::OkStatus();
  });
}

grpc::Status ModelsService::Tensorize(grpc::ServerContext* context,
                                      const v1::TensorizeRequest* request,
                                      v1::TensorizeResponse* response) {
  return RunHandler("Tensorize", [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(CheckAdminToken(*context, admin_token_));
    if (request->model().empty())
      return absl::InvalidArgumentError("model: a model name is required");
    LOG(INFO) << "Tensorize '" << request->model() << "' to " << request->output_path() << " from "
              << Peer(*context);
    ModelRegistry::TensorizeOptions options;
    options.output_path = request->output_path();
    options.dtype = request->dtype();
    options.overwrite = request->overwrite();
    options.prepack = request->prepack();
    KILN_ASSIGN_OR_RETURN(ModelRegistry::TensorizeResult result,
                          registry_->Tensorize(request->model(), options));
    response->set_path(result.path.string());
    response->set_bytes(result.bytes);
    response->set_tensors(result.tensors);
    response->set_packed(result.packed);
    response->set_seconds(result.seconds);
    return absl::OkStatus();
  });
}

}  // namespace kiln
