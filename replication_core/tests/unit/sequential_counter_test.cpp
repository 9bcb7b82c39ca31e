#include "rtable/replication_core/sequential_counter.h"

#include <gtest/gtest.h>

#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

Stat statWith(int32_t cversion, int32_t num_children) {
  Stat stat;
  stat.cversion = cversion;
  stat.num_children = num_children;
  return stat;
}

TEST(SequentialCounter, DecodesTheSeedsNegativeCversion) {
  // Seed 002: counter 2147483644 with 10 children shows as cversion -18.
  auto counter = SequentialCounter::fromStat(statWith(-18, 10));
  EXPECT_EQ(counter.counter(), 2147483644);
  EXPECT_EQ(counter.maxIndex(), 2147483643);
  EXPECT_EQ(counter.createsLeft(), 4);
  EXPECT_FALSE(counter.exhausted());
  EXPECT_DOUBLE_EQ(counter.headroomRatio(), 4.0 / 2147483648.0);
}

TEST(SequentialCounter, NewParentHasAllNamesLeft) {
  auto counter = SequentialCounter::fromStat(statWith(0, 0));
  EXPECT_EQ(counter.counter(), 0);
  EXPECT_EQ(counter.maxIndex(), -1);
  EXPECT_EQ(counter.createsLeft(), 2147483648);
  EXPECT_DOUBLE_EQ(counter.headroomRatio(), 1.0);
}

TEST(SequentialCounter, CountsCreatesNotChildren) {
  // 10 creates then 7 deletes: counter 10, 3 children, cversion 10 * 2 - 3.
  auto counter = SequentialCounter::fromStat(statWith(17, 3));
  EXPECT_EQ(counter.counter(), 10);
  EXPECT_EQ(counter.maxIndex(), 9);
}

TEST(SequentialCounter, PastTwoToTheThirtyTheCversionWraps) {
  // Counter 2^30 with no children: 2^31 does not fit an int32 and shows as INT32_MIN.
  auto counter = SequentialCounter::fromStat(statWith(INT32_MIN, 0));
  EXPECT_EQ(counter.counter(), int64_t{1} << 30);
}

TEST(SequentialCounter, TheLastNameIsEitherFreeOrTaken) {
  // Counter 2147483647 with 1 child: cversion = (2147483647 * 2 - 1) mod 2^32 = -3.
  auto free = SequentialCounter::fromStat(statWith(-3, 1), /*last_name_taken=*/false);
  EXPECT_EQ(free.counter(), 2147483647);
  EXPECT_FALSE(free.exhausted());
  EXPECT_EQ(free.createsLeft(), 1);
  EXPECT_EQ(free.maxIndex(), 2147483646);

  auto taken = SequentialCounter::fromStat(statWith(-3, 1), /*last_name_taken=*/true);
  EXPECT_TRUE(taken.exhausted());
  EXPECT_EQ(taken.createsLeft(), 0);
  EXPECT_EQ(taken.maxIndex(), 2147483647);
  EXPECT_EQ(taken.headroomRatio(), 0.0);
}

TEST(SequentialCounter, ReadLooksForTheLastNameOnlyAtTheLimit) {
  auto server = testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  ASSERT_TRUE(createAncestorsAndSelf(*keeper, "/t/log"));
  ASSERT_TRUE(server->setSequentialCounterForTest("/t/log", 2147483647));
  auto before = SequentialCounter::read(*keeper, "/t/log", "log-");
  ASSERT_TRUE(before);
  EXPECT_FALSE(before->exhausted());
  EXPECT_EQ(before->createsLeft(), 1);

  ASSERT_TRUE(keeper->create("/t/log/log-", "", CreateMode::kPersistentSequential));
  auto after = SequentialCounter::read(*keeper, "/t/log", "log-");
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->exhausted());

  auto missing = SequentialCounter::read(*keeper, "/nope", "log-");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, KeeperCode::kNoNode);
}

}  // namespace
}  // namespace rtable::core
