#include "rtable/common/testing/fake_clock.h"

namespace rtable::common::testing {

namespace {
// Far from zero, so that `now() - delay` never reaches before the clock's epoch.
constexpr auto kStart = std::chrono::hours(1000);
// How long a waiter sleeps in real time before re-checking the simulated time.
constexpr auto kPollSlice = std::chrono::milliseconds(1);
}  // namespace

FakeClock::FakeClock() : now_(std::chrono::duration_cast<Duration>(kStart).count()) {}

void FakeClock::waitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          TimePoint deadline) const {
  if (now() >= deadline) return;
  cv.wait_for(lock, kPollSlice);
}

}  // namespace rtable::common::testing
