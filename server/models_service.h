// kiln.v1.Models: LoadModel, UnloadModel, ListModels, GetModel, Tensorize. When an admin token is
// set, every call needs metadata "authorization: Bearer <token>".
#pragma once

#include <string>

#include "kiln/v1/kiln.grpc.pb.h"
#include "server/registry.h"

namespace kiln {

class ModelsService final : public v1::Models::Service {
 public:
  // `admin_token` empty: the service is open to every client.
  ModelsService(ModelRegistry* registry, std::string admin_token)
      : registry_(registry), admin_token_(std::move(admin_token)) {}

  grpc::Status LoadModel(grpc::ServerContext* context, const v1::LoadModelRequest* request,
                         v1::ModelInfo* response) override;
  grpc::Status UnloadModel(grpc::ServerContext* context, const v1::UnloadModelRequest* request,
                           v1::UnloadModelResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;
  grpc::Status GetModel(grpc::ServerContext* context, const v1::GetModelRequest* request,
                        v1::ModelInfo* response) override;
  grpc::Status Tensorize(grpc::ServerContext* context, const v1::TensorizeRequest* request,
                         v1::TensorizeResponse* response) override;

 private:
  ModelRegistry* const registry_;
  const std::string admin_token_;
};

}  // namespace kiln
