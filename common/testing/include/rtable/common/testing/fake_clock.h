// FakeClock: simulated monotonic time for tests. Time moves only by advance().
//
// waitUntil() cannot be woken by advance() without knowing the waiter's mutex, so it waits in
// short real-time slices (1 ms) and the caller's loop re-checks: outcomes stay deterministic, only
// the wake-up latency is real.
#pragma once

#include <atomic>

#include "rtable/common/clock.h"

namespace rtable::common::testing {

class FakeClock final : public Clock {
 public:
  FakeClock();
  TimePoint now() const override { return TimePoint(Duration(now_.load())); }
  void waitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override;
  void advance(Duration d) { now_.fetch_add(d.count()); }

 private:
  std::atomic<Duration::rep> now_;
};

}  // namespace rtable::common::testing
