// GenerateRequest → engine request and engine update → GenerateResponse. Pure translation: the
// engine validates sampling values and prompt ids itself and names the field.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "kiln/v1/kiln.pb.h"
#include "server/registry.h"
#include "server/request_limits.h"

namespace kiln {

struct GenerateDefaults {
  // For stopping.max_tokens = 0, cut to the room the prompt leaves in the model's context.
  int32_t max_tokens = 256;
};

// InvalidArgument naming the field for a malformed request or one beyond `limits` or the
// model's context; FailedPrecondition when a text prompt is sent to a model without a tokenizer.
absl::StatusOr<GenerationRequest> ToGenerationRequest(const v1::GenerateRequest& request,
                                                      const ModelSnapshot& model,
                                                      const GenerateDefaults& defaults,
                                                      const RequestLimits& limits);

// One engine update as one response; finish reason, usage and timings on the last one.
// `tokenizer` (may be null) gives logprob entries their token text.
void ToGenerateResponse(const GenerationUpdate& update, const Tokenizer* tokenizer,
                        v1::GenerateResponse* response);

}  // namespace kiln
