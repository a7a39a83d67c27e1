// ThreadSanitizer builds only (the `tsan` preset links this into every test binary and
// kiln-server). Debian's abseil is not built with -fsanitize=thread, so TSan cannot see the
// happens-before edges of absl::Mutex, absl::CondVar and what is built on them (absl::Notification,
// gRPC's own locks) and would report every access they guard as a race. These definitions take
// the place of the library's (an executable's symbols come first in dynamic linking), call the
// library's own through dlsym(RTLD_NEXT), and tell TSan that an unlock releases and a lock
// acquires the mutex.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);

namespace {

template <typename Function>
Function Real(const char* mangled_name) {
  void* symbol = dlsym(RTLD_NEXT, mangled_name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in the abseil library\n", mangled_name);
    std::abort();
  }
  return reinterpret_cast<Function>(symbol);
}

// The library's symbol for each wrapped member function (Itanium ABI: `this` first), looked up
// once.
#define KILN_REAL(type, mangled_name) static const auto real = Real<type>(mangled_name)

#define KILN_STRINGIZE_INNER(x) #x
#define KILN_STRINGIZE(x) KILN_STRINGIZE_INNER(x)
static_assert(std::string_view(KILN_STRINGIZE(ABSL_OPTION_INLINE_NAMESPACE_NAME)) == "debian3",
              "the mangled names below are those of Debian bookworm's abseil 20220623");

// A condition is evaluated with the mutex held, in the waiting thread or in the one unlocking
// it, inside the library, where TSan sees neither the lock nor the unlock around it: each
// evaluation acquires before and releases after.
// The unlocking thread reads this from the waiter's stack: made visible to it by a release.
struct AnnotatedCondition {
  AnnotatedCondition(const absl::Condition* condition, absl::Mutex* mutex)
      : condition(condition), mutex(mutex) {
    __tsan_release(this);
  }
  const absl::Condition* condition;
  absl::Mutex* mutex;
};

bool EvalAnnotated(void* argument) {
  __tsan_acquire(argument);
  const auto* annotated = static_cast<const AnnotatedCondition*>(argument);
  __tsan_acquire(annotated->mutex);
  const bool holds = annotated->condition->Eval();
  __tsan_release(annotated->mutex);
  return holds;
}

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Time;

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  KILN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  KILN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  KILN_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  KILN_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  KILN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  KILN_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& condition) {
  KILN_REAL(void (*)(Mutex*, const Condition&),
            "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated{&condition, this};
  real(this, Condition(&EvalAnnotated, &annotated));
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& condition) {
  KILN_REAL(void (*)(Mutex*, const Condition&),
            "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated{&condition, this};
  real(this, Condition(&EvalAnnotated, &annotated));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& condition, Duration timeout) {
  KILN_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated{&condition, this};
  const bool result = real(this, Condition(&EvalAnnotated, &annotated), timeout);
  __tsan_acquire(this);  // held either way
  return result;
}

bool Mutex::LockWhenWithDeadline(const Condition& condition, Time deadline) {
  KILN_REAL(bool (*)(Mutex*, const Condition&, Time),
            "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated{&condition, this};
  const bool result = real(this, Condition(&EvalAnnotated, &annotated), deadline);
  __tsan_acquire(this);
  return result;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& condition, Duration timeout) {
  KILN_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated{&condition, this};
  const bool result = real(this, Condition(&EvalAnnotated, &annotated), timeout);
  __tsan_acquire(this);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& condition, Time deadline) {
  KILN_REAL(bool (*)(Mutex*, const Condition&, Time),
            "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated{&condition, this};
  const bool result = real(this, Condition(&EvalAnnotated, &annotated), deadline);
  __tsan_acquire(this);
  return result;
}

// Waiting releases the mutex and takes it again.
void Mutex::Await(const Condition& condition) {
  KILN_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  AnnotatedCondition annotated{&condition, this};
  __tsan_release(this);
  real(this, Condition(&EvalAnnotated, &annotated));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& condition, Duration timeout) {
  KILN_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated{&condition, this};
  __tsan_release(this);
  const bool result = real(this, Condition(&EvalAnnotated, &annotated), timeout);
  __tsan_acquire(this);
  return result;
}

bool Mutex::AwaitWithDeadline(const Condition& condition, Time deadline) {
  KILN_REAL(bool (*)(Mutex*, const Condition&, Time),
            "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated{&condition, this};
  __tsan_release(this);
  const bool result = real(this, Condition(&EvalAnnotated, &annotated), deadline);
  __tsan_acquire(this);
  return result;
}

void CondVar::Wait(Mutex* mutex) {
  KILN_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mutex);
  real(this, mutex);
  __tsan_acquire(mutex);
}

bool CondVar::WaitWithTimeout(Mutex* mutex, Duration timeout) {
  KILN_REAL(bool (*)(CondVar*, Mutex*, Duration),
            "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mutex);
  const bool result = real(this, mutex, timeout);
  __tsan_acquire(mutex);
  return result;
}

bool CondVar::WaitWithDeadline(Mutex* mutex, Time deadline) {
  KILN_REAL(bool (*)(CondVar*, Mutex*, Time),
            "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mutex);
  const bool result = real(this, mutex, deadline);
  __tsan_acquire(mutex);
  return result;
}

// absl::Notification, BlockingCounter and Barrier lock their mutex inside the library, where
// the wrappers above do not reach: they get their own. A Notification is synchronized on its
// flag's address, which the inline HasBeenNotified loads with acquire (the flag follows the
// mutex: {Mutex mutex_; std::atomic<bool> notified_yet_;}).
static_assert(sizeof(Mutex) == sizeof(void*) && sizeof(Notification) == 2 * sizeof(void*),
              "absl::Notification is not {Mutex, atomic<bool>}");

const void* NotificationFlag(const Notification* notification) {
  return reinterpret_cast<const char*>(notification) + sizeof(Mutex);
}

void Notification::Notify() {
  KILN_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(const_cast<void*>(NotificationFlag(this)));
  real(this);
}

void Notification::WaitForNotification() const {
  KILN_REAL(void (*)(const Notification*),
            "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<void*>(NotificationFlag(this)));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  KILN_REAL(bool (*)(const Notification*, Duration),
            "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<void*>(NotificationFlag(this)));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  KILN_REAL(bool (*)(const Notification*, Time),
            "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<void*>(NotificationFlag(this)));
  return notified;
}

bool BlockingCounter::DecrementCount() {
  KILN_REAL(bool (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter14DecrementCountEv");
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  KILN_REAL(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv");
  real(this);
  __tsan_acquire(this);
}

// Every thread's work before the barrier happens before every thread's work after it. Block
// may delete the barrier (it returns true in one thread): the annotations use its address only.
bool Barrier::Block() {
  KILN_REAL(bool (*)(Barrier*), "_ZN4absl7debian37Barrier5BlockEv");
  __tsan_release(this);
  const bool last = real(this);
  __tsan_acquire(this);
  return last;
}

ABSL_NAMESPACE_END
}  // namespace absl
