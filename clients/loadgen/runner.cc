#include "clients/loadgen/runner.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/alarm.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "kiln/v1/kiln.grpc.pb.h"

namespace kiln::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

Clock::duration ToClock(absl::Duration duration) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(duration));
}

class Phase {
 public:
  Phase(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const PhaseConfig& config,
        PromptSource& prompts, LiveCounters* live);
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
  // A new call, counted in flight at once, issued after `delay`.
  void Schedule(absl::Duration delay);
  // Issues `call` if the phase still issues requests (else drops it); returns whether it did.
  bool Issue(Call* call);
  void OnResponse(Call* call);
  void Complete(Call* call);
  bool MayIssueLocked(Clock::time_point now, bool* warmup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Release() ABSL_LOCKS_EXCLUDED(mutex_);

  const PhaseConfig config_;
  LiveCounters* const live_;
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  Clock::time_point start_, warmup_end_, issue_end_;

  absl::Mutex mutex_;
  PromptSource& prompts_ ABSL_GUARDED_BY(mutex_);
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t counted_issued_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
  size_t next_queue_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mutex_);
  Clock::time_point last_counted_end_ ABSL_GUARDED_BY(mutex_);
  bool counted_any_ ABSL_GUARDED_BY(mutex_) = false;
};

Phase::Phase(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const PhaseConfig& config,
             PromptSource& prompts, LiveCounters* live)
    : config_(config), live_(live), prompts_(prompts) {
  for (const std::shared_ptr<grpc::Channel>& channel : channels) {
    stubs_.push_back(v1::Inference::NewStub(channel));
  }
  for (int i = 0; i < std::max(1, config.threads); ++i) {
    cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
  }
}

PhaseResult Phase::Run() {
  start_ = Clock::now();
  warmup_end_ = start_ + ToClock(config_.warmup);
  issue_end_ = warmup_end_ + ToClock(config_.duration);
  last_counted_end_ = warmup_end_;
  std::vector<std::thread> threads;
  for (const std::unique_ptr<grpc::CompletionQueue>& cq : cqs_) {
    threads.emplace_back([this, queue = cq.get()] { Poll(queue); });
  }

  if (config_.concurrency > 0) {
    for (int i = 0; i < config_.concurrency; ++i) Schedule(absl::ZeroDuration());
  } else {
    // Open loop: arrivals follow their own clock; a slow server does not slow them down.
    PoissonArrivals arrivals(config_.rate, config_.seed);
    Clock::time_point next = start_;
    while (true) {
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(arrivals.NextGapSeconds()));
      std::this_thread::sleep_until(next);
      if (config_.max_concurrency > 0) {
        absl::MutexLock lock(&mutex_);
        auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
          return in_flight_ < config_.max_concurrency;
        };
        mutex_.Await(absl::Condition(&has_room));
      }
      auto* call = new Call();
      {
        absl::MutexLock lock(&mutex_);
        ++in_flight_;
      }
      if (!Issue(call)) break;
    }
  }

  {
    absl::MutexLock lock(&mutex_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return in_flight_ == 0; };
    mutex_.Await(absl::Condition(&done));
  }
  for (const std::unique_ptr<grpc::CompletionQueue>& cq : cqs_) cq->Shutdown();
  for (std::thread& thread : threads) thread.join();

  PhaseResult result;
  result.config = config_;
  absl::MutexLock lock(&mutex_);
  result.records = std::move(records_);
  std::sort(result.records.begin(), result.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.id < b.id; });
  // With a duration, the window spans at least the whole issuing period, even if the last
  // request ended earlier (an open loop may have had no arrival near its end).
  Clock::time_point end = last_counted_end_;
  if (config_.duration > absl::ZeroDuration() && counted_any_) end = std::max(end, issue_end_);
  result.measured_seconds = Seconds(end - warmup_end_);
  return result;
}

void Phase::Poll(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) Proceed(static_cast<Call*>(tag), ok);
}

void Phase::Schedule(absl::Duration delay) {
  auto* call = new Call();
  {
    absl::MutexLock lock(&mutex_);
    ++in_flight_;
    call->cq = cqs_[next_queue_ % cqs_.size()].get();
  }
  if (delay <= absl::ZeroDuration()) {
    Issue(call);
    return;
  }
  call->step = Call::Step::kDelayed;
  call->alarm = std::make_unique<grpc::Alarm>();
  call->alarm->Set(call->cq, std::chrono::system_clock::now() + absl::ToChronoNanoseconds(delay),
                   call);
}

bool Phase::MayIssueLocked(Clock::time_point now, bool* warmup) {
  if (config_.duration > absl::ZeroDuration() && now >= issue_end_) return false;
  *warmup = now < warmup_end_;
  if (!*warmup && config_.requests > 0) {
    if (counted_issued_ >= config_.requests) return false;
    ++counted_issued_;
  }
  return true;
}

bool Phase::Issue(Call* call) {
  RequestSpec spec;
  const Clock::time_point now = Clock::now();
  bool warmup = false;
  {
    absl::MutexLock lock(&mutex_);
    if (!MayIssueLocked(now, &warmup)) {
      --in_flight_;
      delete call;
      return false;
    }
    spec = prompts_.Next();
    call->record.id = next_id_++;
    const size_t queue = next_queue_++;
    call->cq = cqs_[queue % cqs_.size()].get();
    call->stub = stubs_[queue % stubs_.size()].get();
  }
  call->record.warmup = warmup;
  call->record.start_seconds = Seconds(now - start_);
  call->record.input_tokens = spec.input_tokens;
  v1::GenerateRequest& request = call->request;
  request.set_model(config_.model);
  if (spec.is_text) {
    request.set_prompt(std::move(spec.text));
  } else {
    request.mutable_prompt_token_ids()->mutable_ids()->Add(spec.ids.begin(), spec.ids.end());
  }
  request.mutable_stopping()->set_max_tokens(spec.max_tokens);
  request.mutable_stopping()->set_ignore_eos(config_.ignore_eos);
  request.mutable_sampling()->set_temperature(config_.temperature);
  call->context.set_deadline(std::chrono::system_clock::now() +
                             absl::ToChronoNanoseconds(config_.request_timeout));
  if (live_ != nullptr) {
    live_->started.fetch_add(1, std::memory_order_relaxed);
    live_->in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  call->start = Clock::now();
  call->last_tokens = call->start;
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
        Release();
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
    if (live_ != nullptr) live_->output_tokens.fetch_add(tokens, std::memory_order_relaxed);
  }
  if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    record.finish_reason = v1::FinishReason_Name(response.finish_reason());
  }
  if (response.has_usage() && response.usage().prompt_tokens() > 0) {
    record.input_tokens = response.usage().prompt_tokens();
  }
}

void Phase::Complete(Call* call) {
  const Clock::time_point now = Clock::now();
  RequestRecord& record = call->record;
  record.e2e_seconds = Seconds(now - call->start);
  record.code = static_cast<int>(call->status.error_code());
  if (!call->status.ok()) record.error = call->status.error_message();
  if (live_ != nullptr) {
    live_->completed.fetch_add(1, std::memory_order_relaxed);
    live_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (!record.ok()) live_->errors.fetch_add(1, std::memory_order_relaxed);
  }
  const bool failed = !record.ok();
  {
    absl::MutexLock lock(&mutex_);
    if (!record.warmup) {
      last_counted_end_ = std::max(last_counted_end_, now);
      counted_any_ = true;
    }
    records_.push_back(std::move(record));
  }
  delete call;
  // The replacement is in flight before this call stops counting, so in_flight_ reaches 0 only
  // once nothing more will be issued.
  if (config_.concurrency > 0) {
    Schedule(failed ? config_.failure_backoff : absl::ZeroDuration());
  }
  Release();
}

void Phase::Release() {
  absl::MutexLock lock(&mutex_);
  --in_flight_;
}

}  // namespace

absl::StatusOr<PhaseResult> RunPhase(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                                     const PhaseConfig& config, PromptSource& prompts,
                                     LiveCounters* live) {
  if (channels.empty()) return absl::InvalidArgumentError("no channel to the server");
  if ((config.concurrency > 0) == (config.rate > 0)) {
    return absl::InvalidArgumentError("set exactly one of a concurrency and a rate");
  }
  if (config.duration <= absl::ZeroDuration() && config.requests <= 0) {
    return absl::InvalidArgumentError("set a duration or a number of requests");
  }
  if (config.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the warm-up must not be negative");
  }
  Phase phase(channels, config, prompts, live);
  return phase.Run();
}

}  // namespace kiln::loadgen
