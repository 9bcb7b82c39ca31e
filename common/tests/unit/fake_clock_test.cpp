#include "rtable/common/testing/fake_clock.h"

#include <gtest/gtest.h>

namespace rtable::common::testing {
namespace {

using namespace std::chrono_literals;

TEST(FakeClock, MovesOnlyByAdvance) {
  FakeClock clock;
  const Clock::TimePoint start = clock.now();
  EXPECT_EQ(clock.now(), start);
  clock.advance(90s);
  EXPECT_EQ(clock.now() - start, 90s);
  // Far enough from the epoch that a delay subtracted from now() stays after it.
  EXPECT_GT(start.time_since_epoch(), std::chrono::hours(24));
}

TEST(FakeClock, WaitUntilAPassedDeadlineReturnsAtOnce) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock lock(mu);
  const auto deadline = clock.now() + 5s;
  clock.advance(5s);
  const auto before = std::chrono::steady_clock::now();
  clock.waitUntil(cv, lock, deadline);
  EXPECT_LT(std::chrono::steady_clock::now() - before, 1s);
  EXPECT_TRUE(lock.owns_lock());
}

TEST(SteadyClock, FollowsTheSteadyClock) {
  const auto before = std::chrono::steady_clock::now();
  const auto now = SteadyClock::instance().now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, std::chrono::steady_clock::now());
}

}  // namespace
}  // namespace rtable::common::testing
