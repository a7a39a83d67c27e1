// Drives one load phase (phase.h) against an OpenAI-compatible server's streaming
// /v1/completions or /v1/chat/completions (kiln's HTTP API, vLLM, llama.cpp's llama-server),
// with an asynchronous HTTP/1.1 client on Boost.Beast: each of `threads` threads runs an
// io_context of its own, and every request is a chain of asynchronous operations on one of them,
// so a few threads carry hundreds of concurrent streams, as the gRPC runner's completion queues
// do.
//
// Connections are kept alive: each thread keeps those whose last response allowed it, and a
// request takes one of them before it opens a new one (a closed-loop replacement runs on its
// predecessor's thread, so each slot keeps reusing a connection). A response with
// "Connection: close", or whose body ends at the end of the connection, gives its connection
// up. A kept connection that fails before any byte of a response (the server closed it while
// idle) is retried once on a fresh one. Plain HTTP only: no TLS.
//
// A request planned to be cancelled (PhaseConfig::cancel_fraction) closes its connection in order
// once it received its number of tokens, counted as content chunks: it shuts down its sending side
// (FIN) and reads, uncounted, until the server closes too (at most 2 s). One planned to be
// disconnected resets its connection (RST, an abortive close) and reads nothing more. Neither
// connection is used again.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/loadgen/openai.h"
#include "clients/loadgen/phase.h"
#include "clients/loadgen/workload.h"

namespace kiln::loadgen {

// InvalidArgument for a config that ValidatePhaseConfig refuses; Unavailable when the host does
// not resolve. Request failures are results (RequestRecord::code_label names them: "http_429",
// "truncated", "timeout", ...), not errors.
absl::StatusOr<PhaseResult> RunHttpPhase(const OpenAiTarget& target, const PhaseConfig& config,
                                         PromptSource& prompts, LiveCounters* live = nullptr);

// Resolves the host and opens one TCP connection within `timeout`: Unavailable, saying why, when
// nothing answers there.
absl::Status ProbeHttpTarget(const HttpUrl& url, absl::Duration timeout);

}  // namespace kiln::loadgen
