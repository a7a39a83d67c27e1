// Drives one load phase (phase.h) against kiln.v1.Inference/Generate with gRPC's asynchronous
// API: every stream is a small state machine on a completion queue, so a few threads carry
// hundreds of concurrent streams.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/loadgen/phase.h"
#include "clients/loadgen/workload.h"
#include "grpcpp/channel.h"

namespace kiln::loadgen {

// InvalidArgument for a config that ValidatePhaseConfig refuses, or no channel. Request
// failures are results, not errors.
absl::StatusOr<PhaseResult> RunPhase(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                                     const PhaseConfig& config, PromptSource& prompts,
                                     LiveCounters* live = nullptr);

}  // namespace kiln::loadgen
