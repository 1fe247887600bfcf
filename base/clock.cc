#include "base/clock.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace dattn {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool WaitUntil(absl::CondVar* cv, absl::Mutex* mu, absl::Time deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv->WaitWithDeadline(mu, deadline);
  }
  void SleepUntil(absl::Time deadline) const override {
    const absl::Duration left = deadline - absl::Now();
    if (left > absl::ZeroDuration()) absl::SleepFor(left);
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const RealClock* const clock = new RealClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::NoteDeadline(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  latest_deadline_ = std::max(latest_deadline_, deadline);
}

bool FakeClock::AwaitDeadlineAfter(absl::Time t, absl::Duration timeout) const {
  const absl::Time give_up = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto past_t = [this, t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return latest_deadline_ > t; };
  return mu_.AwaitWithDeadline(absl::Condition(&past_t), give_up);
}

bool FakeClock::WaitUntil(absl::CondVar* cv, absl::Mutex* mu, absl::Time deadline) const {
  NoteDeadline(deadline);
  if (Now() >= deadline) return true;
  // A signal ends the wait at once; otherwise the fake time is looked at again every kPoll.
  if (!cv->WaitWithTimeout(mu, kPoll)) return false;
  return Now() >= deadline;
}

void FakeClock::SleepUntil(absl::Time deadline) const {
  NoteDeadline(deadline);
  while (Now() < deadline) absl::SleepFor(kPoll);
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += std::max(d, absl::ZeroDuration());
}

}  // namespace dattn
