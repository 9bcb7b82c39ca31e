#include "rtable/replication_core/replication_log.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

std::string getEntry(const std::string& part) {
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.source_replica = "r1";
  entry.new_part_name = part;
  return entry.format();
}

class ReplicationLog : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(createTableIfNotExists(*keeper_, r1_, "metadata"));
    ASSERT_TRUE(createReplicaIfNotExists(*keeper_, r1_));
  }
  // Appends entries to the shared log, as inserts on any replica do.
  void appendLog(int count, int first_block) {
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE(keeper_->create(r1_.logEntryPrefix(), getEntry(fmt::format("all_{0}_{0}_0", first_block + i)),
                                  CreateMode::kPersistentSequential));
    }
  }
  std::vector<std::string> queueTexts(const TablePaths& paths) {
    auto entries = loadQueue(*keeper_, paths);
    EXPECT_TRUE(entries) << entries.error().toString();
    std::vector<std::string> parts;
    for (const auto& e : *entries) parts.push_back(e.entry.new_part_name);
    return parts;
  }

  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::unique_ptr<Keeper> keeper_ = server_->connect();
  TablePaths r1_{"/t", 1, "r1"};
};

TEST_F(ReplicationLog, PullCopiesEntriesVerbatimAndMovesThePointerInTheSameMulti) {
  appendLog(5, 0);
  LogPuller puller(r1_);
  auto pulled = puller.pull(*keeper_);
  ASSERT_TRUE(pulled) << pulled.error().toString();
  ASSERT_EQ(pulled->size(), 5u);
  EXPECT_EQ((*pulled)[0].node_name, "queue-0000000000");
  EXPECT_EQ((*pulled)[4].entry.new_part_name, "all_4_4_0");
  EXPECT_EQ(puller.lastPullMultis(), 3u);  // batches of 1, 2, 2
  EXPECT_EQ(keeper_->get(r1_.logPointer())->data, "5");
  EXPECT_EQ(keeper_->get(r1_.queue() + "/queue-0000000002")->data, getEntry("all_2_2_0"));
  EXPECT_EQ(queueTexts(r1_), (std::vector<std::string>{"all_0_0_0", "all_1_1_0", "all_2_2_0",
                                                       "all_3_3_0", "all_4_4_0"}));

  auto nothing = puller.pull(*keeper_);
  ASSERT_TRUE(nothing);
  EXPECT_TRUE(nothing->empty());
  EXPECT_EQ(puller.lastPullMultis(), 0u);
}

TEST_F(ReplicationLog, EntriesThatNeedNoWorkOnlyMoveThePointer) {
  appendLog(4, 0);
  LogPuller puller(r1_);
  auto pulled = puller.pull(*keeper_, [](const LogEntry& e) {
    return e.new_part_name == "all_1_1_0" || e.new_part_name == "all_2_2_0";
  });
  ASSERT_TRUE(pulled);
  EXPECT_EQ(queueTexts(r1_), (std::vector<std::string>{"all_0_0_0", "all_3_3_0"}));
  EXPECT_EQ(keeper_->get(r1_.logPointer())->data, "4");
}

TEST_F(ReplicationLog, ACatchUpTakesFewRoundTrips) {
  appendLog(1, 0);
  LogPuller puller(r1_);
  ASSERT_TRUE(puller.pull(*keeper_));
  appendLog(300, 1);
  auto pulled = puller.pull(*keeper_);
  ASSERT_TRUE(pulled);
  EXPECT_EQ(pulled->size(), 300u);
  // Batches 2, 4, 8, 16, 32, 64, 100, 74.
  EXPECT_EQ(puller.lastPullMultis(), 8u);
  EXPECT_EQ(keeper_->get(r1_.logPointer())->data, "301");
  EXPECT_EQ(queueTexts(r1_).size(), 301u);
}

TEST_F(ReplicationLog, AReplicaThatNeverPulledStartsAtTheOldestEntryLeft) {
  appendLog(10, 0);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(keeper_->remove(fmt::format("{}{:010d}", r1_.logEntryPrefix(), i)));
  LogPuller puller(r1_);
  auto pulled = puller.pull(*keeper_);
  ASSERT_TRUE(pulled);
  EXPECT_EQ(queueTexts(r1_), (std::vector<std::string>{"all_7_7_0", "all_8_8_0", "all_9_9_0"}));
  EXPECT_EQ(keeper_->get(r1_.logPointer())->data, "10");
}

TEST_F(ReplicationLog, TwoPullersOfOneReplicaNeverCopyAnEntryTwice) {
  appendLog(3, 0);
  LogPuller first(r1_);
  LogPuller second(r1_);
  ASSERT_TRUE(first.pull(*keeper_));
  appendLog(1, 3);
  ASSERT_TRUE(second.pull(*keeper_));
  appendLog(2, 4);
  ASSERT_TRUE(first.pull(*keeper_));
  EXPECT_EQ(queueTexts(r1_), (std::vector<std::string>{"all_0_0_0", "all_1_1_0", "all_2_2_0",
                                                       "all_3_3_0", "all_4_4_0", "all_5_5_0"}));
}

TEST_F(ReplicationLog, LoadQueueDropsEntriesThatDoNotParse) {
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", getEntry("all_1_1_0"), CreateMode::kPersistentSequential));
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", "format version: 4\nnonsense\n", CreateMode::kPersistentSequential));
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", getEntry("all_2_2_0"), CreateMode::kPersistentSequential));
  EXPECT_EQ(queueTexts(r1_), (std::vector<std::string>{"all_1_1_0", "all_2_2_0"}));
  EXPECT_EQ(keeper_->children(r1_.queue())->names.size(), 2u);
}

TEST_F(ReplicationLog, CloneCopiesTheSourcesPartsQueueAndPointer) {
  ASSERT_TRUE(activateReplica(*keeper_, r1_, "host: r1\n"));
  for (const auto* part : {"all_1_1_0", "all_2_2_0", "all_1_2_1", "all_3_3_0"}) {
    ASSERT_TRUE(keeper_->create(r1_.part(part), "", CreateMode::kPersistent));
  }
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", getEntry("all_4_4_0"), CreateMode::kPersistentSequential));
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "7"));
  appendLog(1, 0);  // the log has history: a new replica starts lost and must be cloned

  TablePaths r2 = r1_;
  r2.replica = "r2";
  auto r2_keeper = server_->connect();
  ASSERT_TRUE(createReplicaIfNotExists(*r2_keeper, r2));
  EXPECT_EQ(r2_keeper->get(r2.isLost())->data, "1");
  auto source = chooseCloneSource(*r2_keeper, r2);
  ASSERT_TRUE(source);
  EXPECT_EQ(*source, std::optional<std::string>("r1"));

  auto cloned = cloneReplica(*r2_keeper, r2, "r1");
  ASSERT_TRUE(cloned) << cloned.error().toString();
  // all_1_1_0 and all_2_2_0 are covered by all_1_2_1: only the parts a reader sees are fetched.
  EXPECT_EQ(queueTexts(r2), (std::vector<std::string>{"all_1_2_1", "all_3_3_0", "all_4_4_0"}));
  EXPECT_EQ(cloned->entries.size(), 3u);
  EXPECT_EQ(cloned->source_parts.parts(),
            (std::vector<PartName>{*PartName::parse("all_1_2_1"), *PartName::parse("all_3_3_0"),
                                   *PartName::parse("all_4_4_0")}));
  EXPECT_EQ(r2_keeper->get(r2.logPointer())->data, "7");
  EXPECT_EQ(r2_keeper->get(r2.isLost())->data, "0");
}

TEST_F(ReplicationLog, CloneSourceIsALiveReplicaThatIsNotLost) {
  TablePaths r2 = r1_;
  r2.replica = "r2";
  TablePaths r3 = r1_;
  r3.replica = "r3";
  ASSERT_TRUE(createReplicaIfNotExists(*keeper_, r2));
  ASSERT_TRUE(createReplicaIfNotExists(*keeper_, r3));
  // r1 is not active; r2 is active but lost; nobody to clone from for r3.
  ASSERT_TRUE(activateReplica(*keeper_, r2, "host: r2\n"));
  ASSERT_TRUE(keeper_->set(r2.isLost(), "1"));
  auto none = chooseCloneSource(*keeper_, r3);
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, std::nullopt);
  ASSERT_TRUE(keeper_->set(r2.isLost(), "0"));
  ASSERT_TRUE(keeper_->set(r2.logPointer(), "12"));
  auto some = chooseCloneSource(*keeper_, r3);
  ASSERT_TRUE(some);
  EXPECT_EQ(*some, std::optional<std::string>("r2"));
}

class LogCleanup : public ReplicationLog {
 protected:
  void SetUp() override {
    ReplicationLog::SetUp();
    ASSERT_TRUE(createReplicaIfNotExists(*keeper_, r2_));
    ASSERT_TRUE(activateReplica(*keeper_, r1_, "host: r1\n"));
  }
  std::vector<int64_t> logIndexes() {
    std::vector<int64_t> indexes;
    const auto listed = keeper_->children(r1_.log());
    for (const auto& name : listed->names) indexes.push_back(*logEntryIndex(name));
    std::sort(indexes.begin(), indexes.end());
    return indexes;
  }
  TablePaths r2_{"/t", 1, "r2"};
};

TEST_F(LogCleanup, RemovesWhatEveryLiveReplicaPulledAndKeepsTheNewest) {
  std::unique_ptr<Keeper> r2_session = server_->connect();
  ASSERT_TRUE(activateReplica(*r2_session, r2_, "host: r2\n"));
  appendLog(30, 0);
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "25"));
  ASSERT_TRUE(keeper_->set(r2_.logPointer(), "12"));
  auto cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 1000});
  ASSERT_TRUE(cleaned) << cleaned.error().toString();
  EXPECT_EQ(cleaned->removed, 12u);  // r2 still needs 12 onwards
  EXPECT_EQ(logIndexes().front(), 12);
  ASSERT_TRUE(keeper_->set(r2_.logPointer(), "30"));
  cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 1000});
  ASSERT_TRUE(cleaned);
  // Everything pulled, but the newest 5 stay.
  EXPECT_EQ(logIndexes(), (std::vector<int64_t>{25, 26, 27, 28, 29}));
  EXPECT_TRUE(cleaned->marked_lost.empty());
}

TEST_F(LogCleanup, AnInactiveReplicaTooFarBehindIsMarkedLost) {
  appendLog(30, 0);
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "30"));
  ASSERT_TRUE(keeper_->set(r2_.logPointer(), "15"));  // r2 is not active
  // Within the newest 20: r2 holds the log back.
  auto cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 20});
  ASSERT_TRUE(cleaned);
  EXPECT_EQ(logIndexes().front(), 15);
  EXPECT_TRUE(cleaned->marked_lost.empty());
  appendLog(20, 30);
  // Now 15 is older than the newest 20: r2 is lost and lets go.
  cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 20});
  ASSERT_TRUE(cleaned);
  EXPECT_EQ(cleaned->marked_lost, std::vector<std::string>{"r2"});
  EXPECT_EQ(keeper_->get(r2_.isLost())->data, "1");
  EXPECT_EQ(logIndexes().front(), 30);
}

TEST_F(LogCleanup, NoReplicaIsMarkedLostWhenAllWouldBe) {
  appendLog(40, 0);
  // r1's session ends: nobody is active, both pointers are old.
  keeper_.reset();
  keeper_ = server_->connect();
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "3"));
  ASSERT_TRUE(keeper_->set(r2_.logPointer(), "5"));
  auto cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 10});
  ASSERT_TRUE(cleaned);
  EXPECT_TRUE(cleaned->marked_lost.empty());
  EXPECT_EQ(keeper_->get(r1_.isLost())->data, "0");
  EXPECT_EQ(logIndexes().front(), 3);
}

}  // namespace
}  // namespace rtable::core
