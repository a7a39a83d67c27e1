#include "clients/loadgen/runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "clients/loadgen/socket_channel.h"
#include "grpcpp/alarm.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "kiln/v1/kiln.grpc.pb.h"

namespace kiln::loadgen {
namespace {

using Clock = PhaseLedger::Clock;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

class Phase {
 public:
  Phase(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const PhaseConfig& config,
        PromptSource& prompts, LiveCounters* live, std::optional<SocketTarget> socket_target);
  PhaseResult Run();

 private:
  // One Generate stream. Exactly one operation of a call is pending at any time, so the call
  // itself is the completion-queue tag and `step` says which operation completed.
  struct Call {
    enum class Step { kDelayed, kStarted, kRead, kFinished };
    Step step = Step::kDelayed;
    grpc::CompletionQueue* cq = nullptr;
    v1::Inference::Stub* stub = nullptr;
    std::unique_ptr<grpc::Alarm> alarm;
    // A request to be disconnected: its own connection, and the stub over it (declared before
    // the context and the reader, which are destroyed first).
    std::unique_ptr<DroppableChannel> own_channel;
    std::unique_ptr<v1::Inference::Stub> own_stub;
    grpc::ClientContext context;
    v1::GenerateRequest request;
    v1::GenerateResponse response;
    std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader;
    grpc::Status status;
    RequestRecord record;
    Clock::time_point start, last_tokens;
  };

  void Poll(grpc::CompletionQueue* cq);
  void Proceed(Call* call, bool ok);
  // A new call, reserved in flight at once, issued after `delay`.
  void Schedule(absl::Duration delay);
  // Issues a reserved `call` if the phase still issues requests (else drops it); returns
  // whether it did.
  bool Issue(Call* call);
  void OnResponse(Call* call);
  // Cancels the call or drops its connection once it received its planned number of tokens.
  void MaybeFault(Call* call);
  void Complete(Call* call);

  PhaseLedger ledger_;
  const std::optional<SocketTarget> socket_target_;
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::atomic<size_t> next_queue_{0};
};

Phase::Phase(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const PhaseConfig& config,
             PromptSource& prompts, LiveCounters* live, std::optional<SocketTarget> socket_target)
    : ledger_(config, prompts, live), socket_target_(std::move(socket_target)) {
  for (const std::shared_ptr<grpc::Channel>& channel : channels) {
    stubs_.push_back(v1::Inference::NewStub(channel));
  }
  for (int i = 0; i < std::max(1, config.threads); ++i) {
    cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
  }
}

PhaseResult Phase::Run() {
  ledger_.Start();
  std::vector<std::thread> threads;
  for (const std::unique_ptr<grpc::CompletionQueue>& cq : cqs_) {
    threads.emplace_back([this, queue = cq.get()] { Poll(queue); });
  }
  const PhaseConfig& config = ledger_.config();
  if (config.concurrency > 0) {
    for (int i = 0; i < config.concurrency; ++i) Schedule(absl::ZeroDuration());
  } else {
    ledger_.RunArrivals([this] { return Issue(new Call()); });
  }
  ledger_.AwaitIdle();
  for (const std::unique_ptr<grpc::CompletionQueue>& cq : cqs_) cq->Shutdown();
  for (std::thread& thread : threads) thread.join();
  return ledger_.TakeResult();
}

void Phase::Poll(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) Proceed(static_cast<Call*>(tag), ok);
}

void Phase::Schedule(absl::Duration delay) {
  auto* call = new Call();
  ledger_.Reserve();
  if (delay <= absl::ZeroDuration()) {
    Issue(call);
    return;
  }
  call->cq = cqs_[next_queue_.load(std::memory_order_relaxed) % cqs_.size()].get();
  call->step = Call::Step::kDelayed;
  call->alarm = std::make_unique<grpc::Alarm>();
  call->alarm->Set(call->cq, std::chrono::system_clock::now() + absl::ToChronoNanoseconds(delay),
                   call);
}

bool Phase::Issue(Call* call) {
  RequestSpec spec;
  if (!ledger_.Admit(&spec, &call->record)) {
    delete call;
    return false;
  }
  const size_t queue = next_queue_.fetch_add(1, std::memory_order_relaxed);
  call->cq = cqs_[queue % cqs_.size()].get();
  call->stub = stubs_[queue % stubs_.size()].get();
  const PhaseConfig& config = ledger_.config();
  call->start = Clock::now();
  call->last_tokens = call->start;
  if (call->record.planned_fault == ClientFault::kDisconnect) {
    absl::StatusOr<std::unique_ptr<DroppableChannel>> own = DroppableChannel::Open(
        *socket_target_, std::min(config.request_timeout, absl::Seconds(10)));
    if (!own.ok()) {
      // Ends as a failure, through the queue (never recursively from here).
      call->status =
          grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(own.status().message()));
      call->step = Call::Step::kFinished;
      call->alarm = std::make_unique<grpc::Alarm>();
      call->alarm->Set(call->cq, std::chrono::system_clock::now(), call);
      return true;
    }
    call->own_channel = *std::move(own);
    call->own_stub = v1::Inference::NewStub(call->own_channel->channel());
    call->stub = call->own_stub.get();
  }
  v1::GenerateRequest& request = call->request;
  request.set_model(config.model);
  if (spec.is_text) {
    request.set_prompt(std::move(spec.text));
  } else {
    request.mutable_prompt_token_ids()->mutable_ids()->Add(spec.ids.begin(), spec.ids.end());
  }
  request.mutable_stopping()->set_max_tokens(spec.max_tokens);
  request.mutable_stopping()->set_ignore_eos(config.ignore_eos);
  request.mutable_sampling()->set_temperature(config.temperature);
  call->context.set_deadline(std::chrono::system_clock::now() +
                             absl::ToChronoNanoseconds(config.request_timeout));
  call->step = Call::Step::kStarted;
  call->reader = call->stub->PrepareAsyncGenerate(&call->context, call->request, call->cq);
  call->reader->StartCall(call);
  return true;
}

void Phase::Proceed(Call* call, bool ok) {
  switch (call->step) {
    case Call::Step::kDelayed:
      if (ok) {
        Issue(call);
      } else {  // the alarm was cancelled: nothing was issued
        delete call;
        ledger_.Release();
      }
      return;
    case Call::Step::kStarted:
    case Call::Step::kRead:
      if (ok) {
        if (call->step == Call::Step::kRead) OnResponse(call);
        call->step = Call::Step::kRead;
        call->reader->Read(&call->response, call);
      } else {  // the stream ended (or never started): collect its status
        call->step = Call::Step::kFinished;
        call->reader->Finish(&call->status, call);
      }
      return;
    case Call::Step::kFinished:
      Complete(call);
      return;
  }
}

void Phase::OnResponse(Call* call) {
  const v1::GenerateResponse& response = call->response;
  RequestRecord& record = call->record;
  const int tokens = response.token_ids_size();
  if (tokens > 0) {
    const Clock::time_point now = Clock::now();
    if (record.ttft_seconds < 0) {
      record.ttft_seconds = Seconds(now - call->start);
    } else {
      // Several tokens in one response arrived together: each gets an equal share of the gap.
      record.itl_seconds.insert(record.itl_seconds.end(), tokens,
                                Seconds(now - call->last_tokens) / tokens);
    }
    call->last_tokens = now;
    record.output_tokens += tokens;
    ledger_.AddOutputTokens(tokens);
  }
  if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    record.finish_reason = v1::FinishReason_Name(response.finish_reason());
  }
  if (response.has_usage() && response.usage().prompt_tokens() > 0) {
    record.input_tokens = response.usage().prompt_tokens();
  }
  MaybeFault(call);
}

void Phase::MaybeFault(Call* call) {
  RequestRecord& record = call->record;
  if (record.planned_fault == ClientFault::kNone || record.fault != ClientFault::kNone ||
      record.output_tokens < record.fault_after_tokens || !record.finish_reason.empty()) {
    return;
  }
  record.fault = record.planned_fault;
  if (record.fault == ClientFault::kCancel) {
    call->context.TryCancel();  // the pending read ends, then Finish says CANCELLED
  } else {
    call->own_channel->Drop();  // gRPC's reads end: the call fails UNAVAILABLE
  }
}

void Phase::Complete(Call* call) {
  const Clock::time_point now = Clock::now();
  RequestRecord& record = call->record;
  record.e2e_seconds = Seconds(now - call->start);
  record.code = static_cast<int>(call->status.error_code());
  if (!call->status.ok()) record.error = call->status.error_message();
  if (record.fault != ClientFault::kNone) record.code_label = ClientFaultLabel(record.fault);
  const bool failed = record.failed();
  ledger_.Finish(std::move(record), now);
  delete call;
  // The replacement is in flight before this call stops counting, so nothing in flight means
  // nothing more will be issued.
  if (ledger_.config().concurrency > 0) {
    Schedule(failed ? ledger_.config().failure_backoff : absl::ZeroDuration());
  }
  ledger_.Release();
}

}  // namespace

absl::StatusOr<PhaseResult> RunPhase(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                                     const PhaseConfig& config, PromptSource& prompts,
                                     LiveCounters* live, const std::string& address) {
  if (channels.empty()) return absl::InvalidArgumentError("no channel to the server");
  if (absl::Status valid = ValidatePhaseConfig(config); !valid.ok()) return valid;
  std::optional<SocketTarget> socket_target;
  if (config.disconnect_fraction > 0) {
    if (address.empty()) {
      return absl::InvalidArgumentError("dropping connections needs the server's HOST:PORT");
    }
    absl::StatusOr<SocketTarget> resolved = ResolveSocketTarget(address);
    if (!resolved.ok()) return resolved.status();
    socket_target = *std::move(resolved);
  }
  Phase phase(channels, config, prompts, live, std::move(socket_target));
  return phase.Run();
}

}  // namespace kiln::loadgen
