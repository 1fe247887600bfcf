// Time as a seam: the daemons read the time and wait for deadlines through a Clock, so that tests
// can run their timeouts (a worker's dead-after, a heartbeat interval, a drain timeout) on a
// FakeClock that they advance, instead of sleeping for real.
//
// A Clock is used for protocol time: ages, intervals, deadlines and the timestamps of records.
// Waits that only poll for something outside the process (a gRPC client's cancellation) stay on
// real time and do not go through a Clock.
//
// Thread-safety: every method of both clocks may be called from any thread.
#ifndef DATTN_BASE_CLOCK_H_
#define DATTN_BASE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dattn {

class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;

  // Waits on `cv` until it is signalled (or wakes spuriously) or the clock reaches `deadline`;
  // `mu` is held on entry and on return and released while waiting. Returns true when `deadline`
  // had passed. Callers re-check their condition in a loop, as with any condition variable.
  virtual bool WaitUntil(absl::CondVar* cv, absl::Mutex* mu, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // Blocks until the clock reaches `deadline`.
  virtual void SleepUntil(absl::Time deadline) const = 0;

  // The process's wall clock (absl::Now); never destroyed.
  static const Clock* Real();
};

// A clock that moves only when told. Waits end when a test advances it past their deadline: a
// waiter checks the time every kPoll of real time, so a waiting thread notices an Advance within
// about a millisecond.
class FakeClock final : public Clock {
 public:
  static constexpr absl::Duration kPoll = absl::Milliseconds(1);

  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1767225600));  // 2026-01-01.

  absl::Time Now() const override;
  bool WaitUntil(absl::CondVar* cv, absl::Mutex* mu, absl::Time deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SleepUntil(absl::Time deadline) const override;

  // Moves the clock forward by `d` (>= 0).
  void Advance(absl::Duration d);

  // Blocks (on real time, up to `timeout`) until some thread waits in WaitUntil or SleepUntil for
  // a deadline later than `t`; false on timeout. A test calls it before Advance to know that the
  // thread it means to wake has already fixed its deadline: otherwise a thread slow to get there
  // would compute its deadline from the advanced time and sleep on.
  bool AwaitDeadlineAfter(absl::Time t, absl::Duration timeout = absl::Seconds(10)) const;

 private:
  void NoteDeadline(absl::Time deadline) const;

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time latest_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // Max waited.
};

}  // namespace dattn

#endif  // DATTN_BASE_CLOCK_H_
