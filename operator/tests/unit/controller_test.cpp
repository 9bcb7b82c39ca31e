// The controller loop on simulated time: errors retry with the per-key backoff, requeue_after
// waits and resets the backoff, terminal errors stop, exceptions count as errors, one key is never
// reconciled by two workers at once, and the controller_runtime_* metrics count it all.
#include "rtable/operator/controller.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

#include "rtable/common/testing/fake_clock.h"
#include "runtime_test_support.h"

namespace rtable::op {
namespace {

using namespace std::chrono_literals;
using common::testing::FakeClock;
using testing::eventually;

// The value of one sample: a counter or a gauge, or a histogram's sample count.
double metricValue(prometheus::Registry& registry, const std::string& name,
                   const std::map<std::string, std::string>& labels) {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      bool match = true;
      for (const auto& [key, value] : labels) {
        bool found = false;
        for (const auto& pair : metric.label) found |= pair.name == key && pair.value == value;
        match &= found;
      }
      if (!match) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return metric.counter.value;
        case prometheus::MetricType::Gauge:
          return metric.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(metric.histogram.sample_count);
        default:
          return -1;
      }
    }
  }
  return -1;
}

// Reconcile attempts with the simulated time at which each started.
class Attempts {
 public:
  explicit Attempts(const common::Clock& clock) : clock_(clock) {}
  void record() {
    std::lock_guard lock(mu_);
    times_.push_back(clock_.now());
  }
  std::size_t count() const {
    std::lock_guard lock(mu_);
    return times_.size();
  }
  common::Clock::TimePoint at(std::size_t i) const {
    std::lock_guard lock(mu_);
    return times_.at(i);
  }

 private:
  const common::Clock& clock_;
  mutable std::mutex mu_;
  std::vector<common::Clock::TimePoint> times_;
};

ControllerOptions options(const std::string& name, const common::Clock& clock,
                          prometheus::Registry* registry = nullptr, int workers = 1) {
  ControllerOptions o;
  o.name = name;
  o.clock = &clock;
  o.registry = registry;
  o.max_concurrent_reconciles = workers;
  // 10 ms doubling, without the overall token bucket: delays are exact.
  o.rate_limiter = std::make_unique<ExponentialFailureRateLimiter>(10ms, 1s);
  return o;
}

// Nothing happens for a moment of real time (the workers would have acted by then).
void quietly() {
  std::this_thread::sleep_for(50ms);
}

TEST(ControllerTest, ErrorsRetryWithExponentialBackoffThenSucceed) {
  FakeClock clock;
  prometheus::Registry registry;
  Attempts attempts(clock);
  std::vector<ObjectKey> keys;
  std::mutex keys_mu;
  Controller controller(options("tables", clock, &registry), [&](const ObjectKey& key) {
    {
      std::lock_guard lock(keys_mu);
      keys.push_back(key);
    }
    attempts.record();
    if (attempts.count() <= 3) {
      return ReconcileOutcome(std::unexpected(ReconcileError::retryable("not yet")));
    }
    return ReconcileOutcome(ReconcileResult::done());
  });
  controller.start();
  controller.queue().add("default/t1");
  ASSERT_TRUE(eventually([&] { return attempts.count() == 1; }));
  // Waits of 10, 20 and 40 ms after the three failures.
  for (auto delay : {10ms, 20ms, 40ms}) {
    const std::size_t before = attempts.count();
    ASSERT_TRUE(eventually([&] { return controller.queue().waitingLen() == 1; }));
    clock.advance(delay - 1ms);
    quietly();
    EXPECT_EQ(attempts.count(), before);
    clock.advance(1ms);
    ASSERT_TRUE(eventually([&] { return attempts.count() == before + 1; }));
    EXPECT_EQ(attempts.at(before) - attempts.at(before - 1), delay);
  }
  ASSERT_TRUE(eventually([&] { return controller.queue().numRequeues("default/t1") == 0; }));
  EXPECT_EQ(keys.front(), (ObjectKey{"default", "t1"}));
  controller.stop();

  const std::map<std::string, std::string> tables{{"controller", "tables"}};
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_total",
                        {{"controller", "tables"}, {"result", "error"}}),
            3);
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_total",
                        {{"controller", "tables"}, {"result", "success"}}),
            1);
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_errors_total", tables), 3);
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_time_seconds", tables), 4);
  EXPECT_EQ(metricValue(registry, "controller_runtime_max_concurrent_reconciles", tables), 1);
  EXPECT_EQ(metricValue(registry, "controller_runtime_active_workers", tables), 0);
  EXPECT_EQ(metricValue(registry, "workqueue_retries_total", {{"name", "tables"}}), 3);
}

TEST(ControllerTest, RequeueAfterWaitsAndResetsTheBackoff) {
  FakeClock clock;
  prometheus::Registry registry;
  Attempts attempts(clock);
  Controller controller(options("poll", clock, &registry), [&](const ObjectKey&) {
    attempts.record();
    switch (attempts.count()) {
      case 1:
        return ReconcileOutcome(std::unexpected(ReconcileError::retryable("once")));
      case 2:
        return ReconcileOutcome(ReconcileResult::after(30s));
      default:
        return ReconcileOutcome(ReconcileResult::done());
    }
  });
  controller.start();
  controller.queue().add("default/p");
  ASSERT_TRUE(eventually([&] { return controller.queue().waitingLen() == 1; }));
  EXPECT_EQ(controller.queue().numRequeues("default/p"), 1);
  clock.advance(10ms);
  ASSERT_TRUE(eventually([&] { return attempts.count() == 2; }));
  ASSERT_TRUE(eventually([&] { return controller.queue().waitingLen() == 1; }));
  EXPECT_EQ(controller.queue().numRequeues("default/p"), 0);  // forgotten
  clock.advance(29s);
  quietly();
  EXPECT_EQ(attempts.count(), 2u);
  clock.advance(1s);
  ASSERT_TRUE(eventually([&] { return attempts.count() == 3; }));
  EXPECT_EQ(attempts.at(2) - attempts.at(1), 30s);
  controller.stop();
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_total",
                        {{"controller", "poll"}, {"result", "requeue_after"}}),
            1);
}

TEST(ControllerTest, RequeueWithoutDelayGoesThroughTheRateLimiter) {
  FakeClock clock;
  prometheus::Registry registry;
  Attempts attempts(clock);
  Controller controller(options("again", clock, &registry), [&](const ObjectKey&) {
    attempts.record();
    return ReconcileOutcome(ReconcileResult{attempts.count() == 1, {}});
  });
  controller.start();
  controller.queue().add("k");
  ASSERT_TRUE(eventually([&] { return controller.queue().waitingLen() == 1; }));
  clock.advance(10ms);
  ASSERT_TRUE(eventually([&] { return attempts.count() == 2; }));
  controller.stop();
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_total",
                        {{"controller", "again"}, {"result", "requeue"}}),
            1);
  EXPECT_EQ(
      metricValue(registry, "controller_runtime_reconcile_errors_total", {{"controller", "again"}}),
      0);
}

TEST(ControllerTest, TerminalErrorsAreNotRetried) {
  FakeClock clock;
  prometheus::Registry registry;
  Attempts attempts(clock);
  Controller controller(options("invalid", clock, &registry), [&](const ObjectKey&) {
    attempts.record();
    return ReconcileOutcome(std::unexpected(ReconcileError::terminalError("bad spec")));
  });
  controller.start();
  controller.queue().add("default/bad");
  ASSERT_TRUE(eventually([&] { return attempts.count() == 1; }));
  clock.advance(1h);
  quietly();
  EXPECT_EQ(attempts.count(), 1u);
  EXPECT_EQ(controller.queue().waitingLen(), 0u);
  // A new event brings it back.
  controller.queue().add("default/bad");
  ASSERT_TRUE(eventually([&] { return attempts.count() == 2; }));
  controller.stop();
  EXPECT_EQ(metricValue(registry, "controller_runtime_terminal_reconcile_errors_total",
                        {{"controller", "invalid"}}),
            2);
}

TEST(ControllerTest, AnExceptionIsAnError) {
  FakeClock clock;
  prometheus::Registry registry;
  Attempts attempts(clock);
  Controller controller(options("throws", clock, &registry),
                        [&](const ObjectKey&) -> ReconcileOutcome {
                          attempts.record();
                          if (attempts.count() == 1) throw std::runtime_error("bug");
                          return ReconcileResult::done();
                        });
  controller.start();
  controller.queue().add("k");
  ASSERT_TRUE(eventually([&] { return controller.queue().waitingLen() == 1; }));
  clock.advance(10ms);
  ASSERT_TRUE(eventually([&] { return attempts.count() == 2; }));
  controller.stop();
  EXPECT_EQ(metricValue(registry, "controller_runtime_reconcile_panics_total",
                        {{"controller", "throws"}}),
            1);
}

TEST(ControllerTest, OneKeyIsNeverReconciledByTwoWorkersAtOnce) {
  prometheus::Registry registry;
  constexpr int kKeys = 4;
  std::array<std::atomic<int>, kKeys> in_flight{};
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> reconciles{0};
  ControllerOptions o;
  o.name = "concurrent";
  o.max_concurrent_reconciles = 4;
  o.registry = &registry;
  Controller controller(std::move(o), [&](const ObjectKey& key) {
    const int i = std::stoi(key.name);
    if (in_flight[i].fetch_add(1) != 0) ++overlaps;
    const int now = ++running;
    int seen = max_running.load();
    while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(2ms);
    --running;
    in_flight[i].fetch_sub(1);
    ++reconciles;
    return ReconcileOutcome(ReconcileResult::done());
  });
  controller.start();
  EXPECT_EQ(metricValue(registry, "controller_runtime_max_concurrent_reconciles",
                        {{"controller", "concurrent"}}),
            4);
  std::mt19937 random(7);
  for (int i = 0; i < 2000; ++i) {
    controller.queue().add("default/" + std::to_string(random() % kKeys));
    if (i % 8 == 0) std::this_thread::sleep_for(100us);
  }
  ASSERT_TRUE(eventually(
      [&] { return controller.queue().len() == 0 && controller.activeWorkers() == 0; }, 30s));
  controller.stop();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GT(max_running.load(), 1);  // different keys do run in parallel
  EXPECT_LE(max_running.load(), 4);
  EXPECT_GT(reconciles.load(), kKeys);
}

TEST(ControllerTest, StopWaitsForRunningReconciles) {
  std::atomic<bool> inside{false};
  std::atomic<bool> finished{false};
  ControllerOptions o;
  o.name = "slow";
  Controller controller(std::move(o), [&](const ObjectKey&) {
    inside = true;
    std::this_thread::sleep_for(100ms);
    finished = true;
    return ReconcileOutcome(ReconcileResult::done());
  });
  controller.start();
  controller.queue().add("k");
  ASSERT_TRUE(eventually([&] { return inside.load(); }));
  controller.stop();
  EXPECT_TRUE(finished.load());
  controller.queue().add("k");  // ignored after shutdown
  EXPECT_EQ(controller.queue().len(), 0u);
}

}  // namespace
}  // namespace rtable::op
