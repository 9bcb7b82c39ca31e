#include "rtable/metrics/replica_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <memory>

namespace rtable::metrics {
namespace {

TEST(ReplicaMetrics, SeriesCarryTheTableLabels) {
  prometheus::Registry registry;
  ReplicaMetrics metrics(registry, ReplicaLabels{"events", "events-0", 3});
  metrics.log_counter.Set(42);
  metrics.inserts.Increment();
  metrics.zookeeperRequestDuration("multi").Observe(0.002);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find(R"(rtable_log_counter{generation="3",replica="events-0",table="events"} 42)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rtable_inserts_total{"), std::string::npos);
  EXPECT_NE(
      text.find(
          R"(rtable_zookeeper_request_duration_seconds_bucket{generation="3",operation="multi")"),
      std::string::npos);
  EXPECT_NE(text.find("rtable_log_counter_exhaustion_seconds{generation=\"3\",replica=\"events-0\","
                      "table=\"events\"} +Inf"),
            std::string::npos)
      << text;
}

// A generation closed by a table swap must stop reporting: its last (low) headroom would keep
// RtableLogCounterHeadroomLow firing for a generation that no longer exists.
TEST(ReplicaMetrics, DestroyingOneRemovesItsSeriesAndLeavesTheOthers) {
  prometheus::Registry registry;
  auto closed = std::make_unique<ReplicaMetrics>(registry, ReplicaLabels{"events", "events-0", 1});
  ReplicaMetrics serving(registry, ReplicaLabels{"events", "events-0", 2});
  closed->log_counter_headroom_ratio.Set(0.01);
  closed->zookeeperRequestDuration("multi").Observe(0.002);
  closed->zookeeperErrors("create", "ZNODEEXISTS").Increment();
  closed->queueEntries("get").Set(1);
  closed->queuePostponed("covered_by_future_part").Increment();
  closed->queueExecuting("fetch").Set(1);
  closed->poolSize("fetch").Set(8);
  closed->queueEntries("get").Set(2);  // the same series again: removed once
  serving.log_counter_headroom_ratio.Set(1);
  serving.queueEntries("get").Set(3);
  auto text = [&] { return prometheus::TextSerializer().Serialize(registry.Collect()); };
  ASSERT_NE(text().find(R"(generation="1")"), std::string::npos) << text();

  closed.reset();
  const std::string after = text();
  EXPECT_EQ(after.find(R"(generation="1")"), std::string::npos) << after;
  EXPECT_NE(after.find(R"(rtable_log_counter_headroom_ratio{generation="2",replica="events-0",)"
                       R"(table="events"} 1)"),
            std::string::npos)
      << after;
  EXPECT_NE(after.find(R"(rtable_replication_queue_entries{generation="2",replica="events-0",)"
                       R"(table="events",type="get"} 3)"),
            std::string::npos)
      << after;
}

TEST(CounterRateEstimator, ProjectsExhaustionFromTheWindow) {
  CounterRateEstimator estimator(100);
  EXPECT_TRUE(std::isinf(estimator.secondsToExhaustion(10)));
  estimator.addSample(0, 1000);
  estimator.addSample(10, 1100);  // 10 per second
  EXPECT_DOUBLE_EQ(estimator.ratePerSecond(), 10);
  EXPECT_DOUBLE_EQ(estimator.secondsToExhaustion(500), 50);
  // Old samples leave the window: the rate follows the recent growth.
  estimator.addSample(200, 1100);
  estimator.addSample(210, 1100);
  EXPECT_EQ(estimator.ratePerSecond(), 0);
  EXPECT_TRUE(std::isinf(estimator.secondsToExhaustion(500)));
}

}  // namespace
}  // namespace rtable::metrics
