// kiln.v1 GenerateRequest: the input is the serialized protobuf, as gRPC hands it to the
// service. A message that parses is converted to the engine's request against the embedded
// default model (kiln-brown: a tokenizer, MTP heads) loaded once, and its sampling values are
// then checked as Engine::Submit checks them.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/sampling.h"
#include "fuzz/fuzz_util.h"
#include "kernels/backend_registry.h"
#include "kiln/v1/kiln.pb.h"
#include "loaders/load_model.h"
#include "server/generate_convert.h"

namespace {

kiln::ModelSnapshot LoadSnapshotOrDie() {
  const std::filesystem::path dir = kiln::fuzz::SourcePath("checkpoints/kiln-brown");
  absl::StatusOr<std::unique_ptr<kiln::Backend>> backend = kiln::CreateBackend("cpu");
  if (!backend.ok()) {
    std::fprintf(stderr, "cpu backend: %s\n", backend.status().ToString().c_str());
    std::abort();
  }
  absl::StatusOr<std::unique_ptr<kiln::PreparedModel>> model =
      kiln::LoadModel(dir, std::shared_ptr<kiln::Backend>(*std::move(backend)));
  absl::StatusOr<std::unique_ptr<kiln::Tokenizer>> tokenizer = kiln::Tokenizer::FromDirectory(dir);
  if (!model.ok() || !tokenizer.ok()) {
    std::fprintf(stderr, "kiln-brown: %s %s\n", model.status().ToString().c_str(),
                 tokenizer.status().ToString().c_str());
    std::abort();
  }
  kiln::ModelSnapshot snapshot;
  snapshot.spec.name = "default";
  snapshot.state = kiln::ModelState::kReady;
  snapshot.model = *std::move(model);
  snapshot.tokenizer = *std::move(tokenizer);
  snapshot.max_context = 4096;
  return snapshot;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::ModelSnapshot snapshot = LoadSnapshotOrDie();
  kiln::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<kiln::GenerationRequest> converted =
      kiln::ToGenerationRequest(request, snapshot, kiln::GenerateDefaults{}, kiln::RequestLimits{});
  if (!converted.ok()) return 0;
  (void)kiln::ValidateSamplingParams(converted->sampling);
  return 0;
}
