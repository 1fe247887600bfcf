#include "base/clock.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

TEST(ClockTest, RealClockWaitsForItsDeadline) {
  const Clock* clock = Clock::Real();
  absl::Mutex mu;
  absl::CondVar cv;
  absl::MutexLock lock(&mu);
  const absl::Time start = clock->Now();
  EXPECT_TRUE(clock->WaitUntil(&cv, &mu, start + absl::Milliseconds(20)));
  EXPECT_GE(clock->Now() - start, absl::Milliseconds(20));
}

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(absl::Seconds(90));
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(90));
  clock.Advance(-absl::Seconds(1));  // Never backwards.
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(90));
}

// A thread waiting for an hour of fake time wakes as soon as the clock is advanced past it, not
// before.
TEST(FakeClockTest, WaitsEndWhenTheClockPassesTheirDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  absl::CondVar cv;
  std::atomic<bool> expired{false};
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    const absl::Time deadline = clock.Now() + absl::Hours(1);
    while (!clock.WaitUntil(&cv, &mu, deadline)) {
    }
    expired = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(expired.load());
  clock.Advance(absl::Minutes(59));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(expired.load());
  clock.Advance(absl::Minutes(2));
  waiter.join();
  EXPECT_TRUE(expired.load());
}

TEST(FakeClockTest, SleepUntilReturnsOnceAdvanced) {
  FakeClock clock;
  const absl::Time deadline = clock.Now() + absl::Seconds(30);
  std::thread sleeper([&] { clock.SleepUntil(deadline); });
  clock.Advance(absl::Seconds(31));
  sleeper.join();
  EXPECT_GE(clock.Now(), deadline);
}

}  // namespace
}  // namespace dattn
