// Drives one load phase (phase.h) against kiln.v1.Inference/Generate with gRPC's asynchronous
// API: every stream is a small state machine on a completion queue, so a few threads carry
// hundreds of concurrent streams.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/loadgen/phase.h"
#include "clients/loadgen/workload.h"
#include "grpcpp/channel.h"

namespace kiln::loadgen {

// InvalidArgument for a config that ValidatePhaseConfig refuses, or no channel. Request
// failures are results, not errors.
//
// Requests planned to be cancelled (config.cancel_fraction) are, with ClientContext::TryCancel,
// once they received their number of tokens. Those planned to be disconnected
// (config.disconnect_fraction) each go over a TCP connection of their own to `address` (HOST:PORT,
// plain TCP: socket_channel.h), shut down under the call at that point; with such requests
// `address` must be set (InvalidArgument), and must resolve (Unavailable).
absl::StatusOr<PhaseResult> RunPhase(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                                     const PhaseConfig& config, PromptSource& prompts,
                                     LiveCounters* live = nullptr, const std::string& address = "");

}  // namespace kiln::loadgen
