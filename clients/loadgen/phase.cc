#include "clients/loadgen/phase.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/time/clock.h"

namespace kiln::loadgen {
namespace {

using Clock = PhaseLedger::Clock;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

Clock::duration ToClock(absl::Duration duration) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(duration));
}

}  // namespace

absl::Status ValidatePhaseConfig(const PhaseConfig& config) {
  if ((config.concurrency > 0) == (config.rate > 0)) {
    return absl::InvalidArgumentError("set exactly one of a concurrency and a rate");
  }
  if (config.duration <= absl::ZeroDuration() && config.requests <= 0) {
    return absl::InvalidArgumentError("set a duration or a number of requests");
  }
  if (config.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the warm-up must not be negative");
  }
  for (double fraction : {config.cancel_fraction, config.disconnect_fraction}) {
    if (!(fraction >= 0 && fraction <= 1)) {
      return absl::InvalidArgumentError("fault fractions must lie in [0, 1]");
    }
  }
  if (config.cancel_fraction + config.disconnect_fraction > 1) {
    return absl::InvalidArgumentError("the cancel and disconnect fractions sum to more than 1");
  }
  return absl::OkStatus();
}

void PhaseLedger::Start() {
  start_ = Clock::now();
  start_unix_seconds_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  warmup_end_ = start_ + ToClock(config_.warmup);
  issue_end_ = warmup_end_ + ToClock(config_.duration);
  absl::MutexLock lock(&mutex_);
  last_counted_end_ = warmup_end_;
}

void PhaseLedger::Reserve() {
  absl::MutexLock lock(&mutex_);
  ++in_flight_;
}

bool PhaseLedger::MayIssueLocked(Clock::time_point now, bool* warmup) {
  if (config_.duration > absl::ZeroDuration() && now >= issue_end_) return false;
  *warmup = now < warmup_end_;
  if (!*warmup && config_.requests > 0) {
    if (counted_issued_ >= config_.requests) return false;
    ++counted_issued_;
  }
  return true;
}

bool PhaseLedger::Admit(RequestSpec* spec, RequestRecord* record) {
  const Clock::time_point now = Clock::now();
  bool warmup = false;
  {
    absl::MutexLock lock(&mutex_);
    if (!MayIssueLocked(now, &warmup)) {
      --in_flight_;
      return false;
    }
    *spec = prompts_.Next();
    record->id = next_id_++;
    const FaultPlanner::Plan plan = faults_.Next(spec->max_tokens);
    record->planned_fault = plan.fault;
    record->fault_after_tokens = plan.after_tokens;
    record->start_seconds = Seconds(now - start_);
    last_start_seconds_ = std::max(last_start_seconds_, record->start_seconds);
  }
  record->warmup = warmup;
  record->input_tokens = spec->input_tokens;
  if (live_ != nullptr) {
    live_->started.fetch_add(1, std::memory_order_relaxed);
    live_->in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

void PhaseLedger::Finish(RequestRecord record, Clock::time_point end) {
  if (live_ != nullptr) {
    live_->completed.fetch_add(1, std::memory_order_relaxed);
    live_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (record.failed()) live_->errors.fetch_add(1, std::memory_order_relaxed);
    if (record.fault == ClientFault::kCancel) {
      live_->cancelled.fetch_add(1, std::memory_order_relaxed);
    }
    if (record.fault == ClientFault::kDisconnect) {
      live_->disconnected.fetch_add(1, std::memory_order_relaxed);
    }
  }
  absl::MutexLock lock(&mutex_);
  if (!record.warmup) {
    last_counted_end_ = std::max(last_counted_end_, end);
    counted_any_ = true;
  }
  records_.push_back(std::move(record));
}

void PhaseLedger::Release() {
  absl::MutexLock lock(&mutex_);
  --in_flight_;
}

void PhaseLedger::RunArrivals(const std::function<bool()>& issue) {
  // Arrivals follow their own clock; a slow server does not slow them down.
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
    Reserve();
    if (!issue()) break;
  }
}

void PhaseLedger::AwaitIdle() {
  absl::MutexLock lock(&mutex_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return in_flight_ == 0; };
  mutex_.Await(absl::Condition(&done));
}

PhaseResult PhaseLedger::TakeResult() {
  PhaseResult result;
  result.config = config_;
  absl::MutexLock lock(&mutex_);
  result.records = std::move(records_);
  records_.clear();
  std::sort(result.records.begin(), result.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.id < b.id; });
  // With a duration, the window spans at least the whole issuing period, even if the last
  // request ended earlier (an open loop may have had no arrival near its end).
  Clock::time_point end = last_counted_end_;
  if (config_.duration > absl::ZeroDuration() && counted_any_) end = std::max(end, issue_end_);
  result.measured_seconds = Seconds(end - warmup_end_);
  result.issue_end_seconds =
      config_.duration > absl::ZeroDuration() ? Seconds(issue_end_ - start_) : last_start_seconds_;
  result.start_unix_seconds = start_unix_seconds_;
  return result;
}

}  // namespace kiln::loadgen
