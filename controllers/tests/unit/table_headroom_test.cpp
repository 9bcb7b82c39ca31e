// The swap decision (issue 20): which counters are watched, the thresholds, the growth rate, the
// stuck table. On the fake ZooKeeper, which keeps the real server's int32 counters.
#include "rtable/controllers/table_headroom.h"

#include <gtest/gtest.h>

#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono_literals;

CounterHeadroom counter(std::string name, double ratio,
                        std::optional<double> exhaustion_seconds = std::nullopt) {
  const auto left = static_cast<int64_t>(ratio * 2147483648.0);
  return {std::move(name), left, ratio, false, exhaustion_seconds};
}

TEST(JudgeHeadroom, AboveEveryThresholdNamesTheLowestCounter) {
  auto verdict = judgeHeadroom(
      {counter("log", 0.9), counter("queue/r1", 0.5), counter("block_numbers/a", 0.7)},
      HeadroomPolicy{});
  EXPECT_FALSE(verdict.low);
  EXPECT_EQ(verdict.reason, HeadroomReason::kAboveThreshold);
  EXPECT_EQ(verdict.counter.name, "queue/r1");
  EXPECT_EQ(verdict.message,
            "queue/r1: 1073741824 sequential creates left (50.0000% of the int32 counter); "
            "threshold 5%");
}

TEST(JudgeHeadroom, AnyCounterUnderTheThresholdIsLow) {
  auto verdict = judgeHeadroom(
      {counter("log", 0.9), counter("block_numbers/202612", 0.04), counter("queue/r1", 0.06)},
      HeadroomPolicy{});
  EXPECT_TRUE(verdict.low);
  EXPECT_EQ(verdict.reason, HeadroomReason::kBelowThreshold);
  EXPECT_EQ(verdict.counter.name, "block_numbers/202612");
  HeadroomPolicy ten_percent;
  ten_percent.threshold_percent = 10;
  EXPECT_EQ(
      judgeHeadroom({counter("log", 0.9), counter("queue/r1", 0.06)}, ten_percent).counter.name,
      "queue/r1");
}

TEST(JudgeHeadroom, AStuckCounterComesFirst) {
  CounterHeadroom stuck{"log", 0, 0.0, true, std::nullopt};
  auto verdict = judgeHeadroom({counter("block_numbers/a", 0.01), stuck}, HeadroomPolicy{});
  EXPECT_TRUE(verdict.low);
  EXPECT_EQ(verdict.reason, HeadroomReason::kExhausted);
  EXPECT_EQ(verdict.counter.name, "log");
  EXPECT_EQ(headroomReasonName(verdict.reason), "Exhausted");
}

TEST(JudgeHeadroom, ProjectedExhaustionWithinTheDaysIsLowUnlessTheDaysAreZero) {
  const double six_days = 6 * 86400.0;
  auto verdict = judgeHeadroom(
      {counter("log", 0.5, 30 * 86400.0), counter("queue/r2", 0.6, six_days)}, HeadroomPolicy{});
  EXPECT_TRUE(verdict.low);
  EXPECT_EQ(verdict.reason, HeadroomReason::kExhaustionSoon);
  EXPECT_EQ(verdict.counter.name, "queue/r2");
  EXPECT_EQ(verdict.exhaustion_seconds, six_days);
  EXPECT_EQ(verdict.message,
            "queue/r2: 1288490188 sequential creates left (60.0000% of the int32 counter); at its "
            "growth rate it runs out in 6.0 days (exhaustionDays 7)");

  HeadroomPolicy percentage_only;
  percentage_only.exhaustion_days = 0;
  verdict = judgeHeadroom({counter("log", 0.5, six_days)}, percentage_only);
  EXPECT_FALSE(verdict.low);
  EXPECT_EQ(verdict.exhaustion_seconds, six_days);  // still reported
  // Eight days out: not yet.
  EXPECT_FALSE(judgeHeadroom({counter("log", 0.5, 8 * 86400.0)}, HeadroomPolicy{}).low);
}

TEST(CounterGrowth, ProjectsOnlyOnceSampledLongEnoughAndWhileGrowing) {
  CounterGrowth growth(3600s, 600s);
  const auto t0 = std::chrono::system_clock::time_point(std::chrono::seconds(1'800'000'000));
  EXPECT_FALSE(growth.observe("ns/t/1/log", 1000, 5000, t0));
  // 100 creates a second, but only 5 minutes sampled: a burst is not a trend yet.
  EXPECT_FALSE(growth.observe("ns/t/1/log", 31000, 5000, t0 + 300s));
  auto left = growth.observe("ns/t/1/log", 61000, 100'000, t0 + 600s);
  ASSERT_TRUE(left);
  EXPECT_DOUBLE_EQ(*left, 1000.0);  // 100'000 left at 100/s
  // A counter that stopped growing over the window projects nothing.
  CounterGrowth still(3600s, 0s);
  EXPECT_FALSE(still.observe("ns/t/1/log", 5, 10, t0));
  EXPECT_FALSE(still.observe("ns/t/1/log", 5, 10, t0 + 60s));

  // A forgotten table starts sampling again.
  growth.forget("ns/t/");
  EXPECT_FALSE(growth.observe("ns/t/1/log", 70000, 5000, t0 + 700s));
}

TEST(ReadWatchedCounters, ReadsTheLogEachPartitionAndEachReplicasQueue) {
  auto server = core::testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  core::TablePaths paths{"/rtable/tables/t", 1, "r1"};
  ASSERT_TRUE(core::createTableIfNotExists(*keeper, paths, "metadata"));
  ASSERT_TRUE(core::createReplicaIfNotExists(*keeper, paths));
  core::TablePaths r2 = paths;
  r2.replica = "r2";
  ASSERT_TRUE(core::createReplicaIfNotExists(*keeper, r2));
  for (const char* partition : {"202611", "202612"}) {
    ASSERT_TRUE(keeper->create(paths.blockNumbers(partition), "", core::CreateMode::kPersistent));
  }
  ASSERT_TRUE(server->setSequentialCounterForTest(paths.blockNumbers("202612"), 2147483000));
  ASSERT_TRUE(server->setSequentialCounterForTest(r2.queue(), 7));
  ASSERT_TRUE(server->setSequentialCounterForTest(paths.log(), 2147483647));
  ASSERT_TRUE(keeper->create(paths.logEntryPrefix(), "e", core::CreateMode::kPersistentSequential));

  auto counters = readWatchedCounters(*keeper, paths);
  ASSERT_TRUE(counters) << counters.error().toString();
  std::map<std::string, int64_t> left;
  std::map<std::string, bool> exhausted;
  for (const auto& [name, value] : *counters) {
    left[name] = value.createsLeft();
    exhausted[name] = value.exhausted();
  }
  EXPECT_EQ(counters->front().name, "log");
  EXPECT_EQ(left, (std::map<std::string, int64_t>{{"log", 0},
                                                  {"block_numbers/202611", 2147483648},
                                                  {"block_numbers/202612", 648},
                                                  {"queue/r1", 2147483648},
                                                  {"queue/r2", 2147483641}}));
  EXPECT_TRUE(exhausted["log"]);
  EXPECT_FALSE(exhausted["block_numbers/202612"]);
}

// The log cleaner may delete log-2147483647 (and a block number lock or queue entry at that name
// goes the same way): a counter at the last name is exhausted all the same, for each kind of
// watched counter, and the verdict is Exhausted, not BelowThreshold.
TEST(CounterHeadroom, ACounterAtTheLastNameIsExhaustedWhetherOrNotTheNameExists) {
  core::TablePaths paths{"/rtable/tables/t", 1, "r1"};
  const std::vector<std::pair<std::string, std::string>> watched = {
      {"log", paths.log()},
      {"block_numbers/202612", paths.blockNumbers("202612")},
      {"queue/r1", paths.queue()}};
  for (const auto& [name, path] : watched) {
    SCOPED_TRACE(name);
    auto server = core::testing::FakeKeeperServer::create();
    auto keeper = server->connect();
    ASSERT_TRUE(core::createTableIfNotExists(*keeper, paths, "metadata"));
    ASSERT_TRUE(core::createReplicaIfNotExists(*keeper, paths));
    ASSERT_TRUE(keeper->create(paths.blockNumbers("202612"), "", core::CreateMode::kPersistent));
    ASSERT_TRUE(server->setSequentialCounterForTest(path, 2147483647));  // the name not taken
    auto counters = readWatchedCounters(*keeper, paths);
    ASSERT_TRUE(counters) << counters.error().toString();
    std::vector<CounterHeadroom> headrooms;
    for (const auto& read : *counters) headrooms.push_back(counterHeadroom(read));
    for (const auto& headroom : headrooms) {
      EXPECT_EQ(headroom.exhausted, headroom.name == name) << headroom.name;
      if (headroom.name != name) continue;
      EXPECT_EQ(headroom.creates_left, 0);
      EXPECT_EQ(headroom.ratio, 0.0);
    }
    const HeadroomVerdict verdict = judgeHeadroom(headrooms, HeadroomPolicy{});
    EXPECT_TRUE(verdict.low);
    EXPECT_EQ(verdict.reason, HeadroomReason::kExhausted);
    EXPECT_EQ(verdict.counter.name, name);
  }
}

TEST(CounterHeadroom, OneNameBeforeTheLastIsOneCreateLeft) {
  auto server = core::testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  core::TablePaths paths{"/rtable/tables/t", 1, "r1"};
  ASSERT_TRUE(core::createTableIfNotExists(*keeper, paths, "metadata"));
  ASSERT_TRUE(server->setSequentialCounterForTest(paths.log(), 2147483646));
  auto counters = readWatchedCounters(*keeper, paths);
  ASSERT_TRUE(counters) << counters.error().toString();
  const CounterHeadroom log = counterHeadroom(counters->front());
  EXPECT_FALSE(log.exhausted);
  EXPECT_EQ(log.creates_left, 2);
  EXPECT_EQ(judgeHeadroom({log}, HeadroomPolicy{}).reason, HeadroomReason::kBelowThreshold);
}

}  // namespace
}  // namespace rtable::controllers
