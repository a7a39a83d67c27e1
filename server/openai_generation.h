// One OpenAI generation request in flight: its choices (n per prompt) as engine requests, and
// their updates turned into one chat.completion / text_completion, or into a stream of chunks
// ending in "data: [DONE]". A client that goes away cancels every choice (the engine frees their
// KV blocks within a step); an engine error or a shutdown ends the stream with an error event.
#pragma once

#include <memory>
#include <vector>

#include "engine/engine.h"
#include "http/http_server.h"
#include "server/metrics.h"
#include "server/openai_format.h"
#include "server/registry.h"

namespace kiln {

struct OpenAiGeneration {
  OpenAiEnvelope envelope;
  bool stream = false;
  bool include_usage = false;  // streams: a last chunk with the usage
  OpenAiLogprobs logprobs;
  std::vector<GenerationRequest> choices;  // in choice order
  std::vector<int> prompt_of_choice;       // the prompt each choice continues (for usage)
};

// Submits every choice to the model's engine, then answers `response`. Errors before anything
// was sent (a full queue, say) are whole error responses; nothing is submitted then, or what
// was is cancelled.
void RunOpenAiGeneration(ModelSnapshot model, OpenAiGeneration generation,
                         std::shared_ptr<ResponseStream> response, ServerMetrics* metrics);

}  // namespace kiln
