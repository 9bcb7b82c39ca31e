// Clock: the one source of monotonic time for the operator and the core, so that backoff, rate
// limits and delays can be tested with simulated time (testing::FakeClock in common_testing).
// Implementations are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace rtable::common {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
  // Blocks on `cv` (with `lock` held on entry and on return) until it is notified or this clock
  // reaches `deadline`. May return early (spurious wake-up): callers re-check in a loop.
  virtual void waitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         TimePoint deadline) const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  void waitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override {
    cv.wait_until(lock, deadline);
  }
  // A process-wide instance (stateless).
  static SteadyClock& instance();
};

}  // namespace rtable::common
