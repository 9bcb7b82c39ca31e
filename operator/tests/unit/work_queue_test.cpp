#include "rtable/operator/work_queue.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <future>
#include <map>
#include <thread>

#include "rtable/common/testing/fake_clock.h"

namespace rtable::op {
namespace {

using namespace std::chrono_literals;
using common::testing::FakeClock;

WorkQueue::Options options(const common::Clock& clock,
                           std::unique_ptr<RateLimiter> limiter = nullptr) {
  WorkQueue::Options o;
  o.name = "test";
  o.clock = &clock;
  o.rate_limiter = std::move(limiter);
  return o;
}

// get() that must not block: the key is ready now.
std::optional<std::string> getNow(WorkQueue& q, const common::Clock& clock) {
  return q.getUntil(clock.now());
}

TEST(WorkQueueTest, DeduplicatesQueuedKeys) {
  FakeClock clock;
  WorkQueue q(options(clock));
  q.add("a");
  q.add("b");
  q.add("a");
  EXPECT_EQ(q.len(), 2u);
  EXPECT_EQ(getNow(q, clock), "a");  // FIFO
  EXPECT_EQ(getNow(q, clock), "b");
  EXPECT_EQ(getNow(q, clock), std::nullopt);
}

// A change (add) goes before the polls and retries whose delay has passed: with a thousand tables
// polled every 15 s, a new table is served next, not behind every poll that is due.
TEST(WorkQueueTest, AddedKeysGoBeforeDueDelayedOnes) {
  FakeClock clock;
  WorkQueue q(options(clock));
  for (const char* key : {"poll-1", "poll-2", "poll-3"}) q.addAfter(key, 1s);
  clock.advance(2s);
  EXPECT_EQ(q.len(), 3u);
  q.add("new");
  q.add("poll-3");  // a change to a key waiting behind the polls moves it up
  EXPECT_EQ(q.len(), 4u);
  EXPECT_EQ(getNow(q, clock), "new");
  EXPECT_EQ(getNow(q, clock), "poll-3");
  EXPECT_EQ(getNow(q, clock), "poll-1");
  // A change while the polls wait still goes first.
  q.add("newer");
  EXPECT_EQ(getNow(q, clock), "newer");
  EXPECT_EQ(getNow(q, clock), "poll-2");
  EXPECT_EQ(getNow(q, clock), std::nullopt);  // poll-3 was handed out once only
  for (const char* key : {"new", "poll-3", "poll-1", "newer", "poll-2"}) q.done(key);

  // Processing: a due poll queues it again behind the changes, an add() before them.
  q.add("busy");
  ASSERT_EQ(getNow(q, clock), "busy");
  q.addAfter("busy", 1s);
  clock.advance(2s);
  q.add("other");
  EXPECT_EQ(getNow(q, clock), "other");
  q.done("busy");
  q.add("third");
  EXPECT_EQ(getNow(q, clock), "third");
  EXPECT_EQ(getNow(q, clock), "busy");
  q.done("busy");
  ASSERT_EQ(getNow(q, clock), std::nullopt);
}

TEST(WorkQueueTest, KeyAddedWhileProcessingIsRequeuedAtDone) {
  FakeClock clock;
  WorkQueue q(options(clock));
  q.add("a");
  ASSERT_EQ(getNow(q, clock), "a");
  q.add("a");  // while processing: not handed out again yet
  q.add("a");
  EXPECT_EQ(q.len(), 0u);
  EXPECT_EQ(getNow(q, clock), std::nullopt);
  q.done("a");
  EXPECT_EQ(q.len(), 1u);
  EXPECT_EQ(getNow(q, clock), "a");
  q.done("a");
  EXPECT_EQ(q.len(), 0u);
}

TEST(RateLimiterTest, ExponentialBackoffGrowsAndCaps) {
  ExponentialFailureRateLimiter limiter;
  EXPECT_EQ(limiter.when("k"), 5ms);
  EXPECT_EQ(limiter.when("k"), 10ms);
  EXPECT_EQ(limiter.when("k"), 20ms);
  EXPECT_EQ(limiter.when("k"), 40ms);
  EXPECT_EQ(limiter.numRequeues("k"), 4);
  EXPECT_EQ(limiter.when("other"), 5ms);  // per key
  // 5 ms * 2^18 = 1310 s > 1000 s: capped from the 19th failure on, and stays capped.
  for (int i = 4; i < 18; ++i) limiter.when("k");
  EXPECT_EQ(limiter.when("k"), std::chrono::seconds(1000));
  for (int i = 0; i < 100; ++i) limiter.when("k");
  EXPECT_EQ(limiter.when("k"), std::chrono::seconds(1000));
  limiter.forget("k");
  EXPECT_EQ(limiter.numRequeues("k"), 0);
  EXPECT_EQ(limiter.when("k"), 5ms);
}

TEST(RateLimiterTest, TokenBucket) {
  FakeClock clock;
  BucketRateLimiter bucket(clock);  // 10 qps, burst 100
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(bucket.when("k" + std::to_string(i)), RateLimiter::Duration::zero()) << i;
  EXPECT_EQ(bucket.when("x"), 100ms);
  EXPECT_EQ(bucket.when("y"), 200ms);
  clock.advance(1s);  // refills 10 tokens: the debt of 2 is paid, 8 left
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bucket.when("z"), RateLimiter::Duration::zero()) << i;
  EXPECT_EQ(bucket.when("z"), 100ms);
  clock.advance(1h);  // refills to the burst, no further
  for (int i = 0; i < 100; ++i) ASSERT_EQ(bucket.when("w"), RateLimiter::Duration::zero());
  EXPECT_GT(bucket.when("w"), RateLimiter::Duration::zero());
}

TEST(RateLimiterTest, DefaultIsTheMaxOfBoth) {
  FakeClock clock;
  auto limiter = defaultControllerRateLimiter(clock);
  EXPECT_EQ(limiter->when("a"), 5ms);  // bucket: 0
  for (int i = 0; i < 99; ++i) limiter->when("b" + std::to_string(i));
  // The bucket is empty now (100 taken): its 100 ms beats a fresh key's 5 ms.
  EXPECT_EQ(limiter->when("c"), 100ms);
  EXPECT_EQ(limiter->numRequeues("a"), 1);
  limiter->forget("a");
  EXPECT_EQ(limiter->numRequeues("a"), 0);
}

TEST(WorkQueueTest, RateLimitedAddWaitsForTheBackoff) {
  FakeClock clock;
  WorkQueue q(options(clock));
  q.addRateLimited("k");  // 5 ms
  EXPECT_EQ(q.numRequeues("k"), 1);
  EXPECT_EQ(q.len(), 0u);
  EXPECT_EQ(q.waitingLen(), 1u);
  EXPECT_EQ(getNow(q, clock), std::nullopt);
  clock.advance(4ms);
  EXPECT_EQ(getNow(q, clock), std::nullopt);
  clock.advance(1ms);
  EXPECT_EQ(q.len(), 1u);
  ASSERT_EQ(getNow(q, clock), "k");
  q.done("k");

  q.addRateLimited("k");  // 10 ms now
  clock.advance(9ms);
  EXPECT_EQ(getNow(q, clock), std::nullopt);
  clock.advance(1ms);
  ASSERT_EQ(getNow(q, clock), "k");
  q.forget("k");
  q.done("k");
  q.addRateLimited("k");  // back to 5 ms
  clock.advance(5ms);
  EXPECT_EQ(getNow(q, clock), "k");
}

TEST(WorkQueueTest, AddAfterKeepsTheEarlierTime) {
  FakeClock clock;
  WorkQueue q(options(clock));
  q.addAfter("k", 10s);
  q.addAfter("k", 2s);
  q.addAfter("k", 20s);
  EXPECT_EQ(q.waitingLen(), 1u);
  clock.advance(2s);
  EXPECT_EQ(getNow(q, clock), "k");
  q.done("k");
  clock.advance(30s);
  EXPECT_EQ(getNow(q, clock), std::nullopt);  // the later times were merged away
  q.addAfter("now", 0s);
  EXPECT_EQ(getNow(q, clock), "now");
}

TEST(WorkQueueTest, BlockedGetWakesWhenTheDelayPasses) {
  FakeClock clock;
  WorkQueue q(options(clock));
  q.addAfter("k", 1min);
  auto got = std::async(std::launch::async, [&] { return q.get(); });
  EXPECT_EQ(got.wait_for(20ms), std::future_status::timeout);  // simulated time has not moved
  clock.advance(1min);
  ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(got.get(), "k");
}

TEST(WorkQueueTest, ShutDownWakesEveryWaiter) {
  WorkQueue q(WorkQueue::Options{});  // the real clock
  std::vector<std::future<std::optional<std::string>>> waiters;
  for (int i = 0; i < 4; ++i)
    waiters.push_back(std::async(std::launch::async, [&] { return q.get(); }));
  q.addAfter("later", 1h);
  EXPECT_EQ(waiters[0].wait_for(20ms), std::future_status::timeout);
  q.shutDown();
  for (auto& w : waiters) {
    ASSERT_EQ(w.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(w.get(), std::nullopt);
  }
  EXPECT_TRUE(q.shuttingDown());
  q.add("ignored");
  EXPECT_EQ(q.len(), 0u);
  EXPECT_EQ(q.get(), std::nullopt);
}

TEST(WorkQueueTest, NoKeyIsProcessedByTwoWorkersAtOnce) {
  constexpr int kWorkers = 8;
  constexpr int kKeys = 16;
  constexpr int kAddsPerProducer = 2000;
  WorkQueue q(WorkQueue::Options{});
  std::array<std::atomic<int>, kKeys> in_flight{};
  std::array<std::atomic<int>, kKeys> added{};      // versions handed to add()
  std::array<std::atomic<int>, kKeys> processed{};  // the latest version a worker started after
  std::atomic<int> overlaps{0};
  std::atomic<int> processings{0};

  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&] {
      while (auto key = q.get()) {
        const int k = std::stoi(*key);
        if (in_flight[k].fetch_add(1) != 0) overlaps.fetch_add(1);
        // Everything added before this get() is covered by this processing.
        processed[k].store(added[k].load());
        if (processings.fetch_add(1) % 7 == 0) {
          added[k].fetch_add(1);
          q.add(*key);  // a reconcile that requeues itself
        }
        std::this_thread::yield();
        in_flight[k].fetch_sub(1);
        q.done(*key);
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < 2; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kAddsPerProducer; ++i) {
        const int k = (i * 7 + p) % kKeys;
        added[k].fetch_add(1);
        q.add(std::to_string(k));
      }
    });
  }
  for (auto& t : producers) t.join();
  // Every key must eventually be processed after its last add.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  auto caught_up = [&] {
    for (int k = 0; k < kKeys; ++k) {
      if (processed[k].load() != added[k].load() || in_flight[k].load() != 0) return false;
    }
    return q.len() == 0;
  };
  while (!caught_up() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  q.shutDown();
  for (auto& t : workers) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_TRUE(caught_up());
  EXPECT_GE(processings.load(), kKeys);
}

double metricValue(prometheus::Registry& registry, const std::string& name) {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      bool labelled = false;
      for (const auto& label : metric.label)
        labelled |= label.name == "name" && label.value == "test";
      if (!labelled) continue;
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

TEST(WorkQueueTest, Metrics) {
  FakeClock clock;
  auto registry = std::make_shared<prometheus::Registry>();
  WorkQueue::Options o = options(clock);
  o.registry = registry.get();
  WorkQueue q(std::move(o));
  q.add("a");
  q.add("a");
  q.add("b");
  EXPECT_EQ(metricValue(*registry, "workqueue_adds_total"), 2);
  EXPECT_EQ(metricValue(*registry, "workqueue_depth"), 2);
  clock.advance(3s);
  ASSERT_EQ(getNow(q, clock), "a");
  EXPECT_EQ(metricValue(*registry, "workqueue_depth"), 1);
  EXPECT_EQ(metricValue(*registry, "workqueue_queue_duration_seconds"), 1);
  clock.advance(2s);
  // The in-flight gauges are refreshed by the queue's own thread.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (metricValue(*registry, "workqueue_longest_running_processor_seconds") < 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_DOUBLE_EQ(metricValue(*registry, "workqueue_longest_running_processor_seconds"), 2);
  EXPECT_DOUBLE_EQ(metricValue(*registry, "workqueue_unfinished_work_seconds"), 2);
  q.done("a");
  EXPECT_EQ(metricValue(*registry, "workqueue_work_duration_seconds"), 1);
  q.addRateLimited("a");
  EXPECT_EQ(metricValue(*registry, "workqueue_retries_total"), 1);
}

}  // namespace
}  // namespace rtable::op
