#include "rtable/replication_core/replication_log.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/fake_keeper.h"
#include "rtable/replication_core/testing/hooked_keeper.h"

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
      ASSERT_TRUE(keeper_->create(r1_.logEntryPrefix(),
                                  getEntry(fmt::format("all_{0}_{0}_0", first_block + i)),
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

// A replica's own inserts: the pull takes the entries the commits remembered instead of reading
// them back, and copies them (here: not skipped) exactly as if it had read them.
TEST_F(ReplicationLog, EntriesThisReplicaWroteAreNotReadBack) {
  LogPuller puller(r1_);
  ASSERT_TRUE(puller.pull(*keeper_));  // batches grow from 1: start with a warm puller
  for (int i = 0; i < 4; ++i) {
    auto created = keeper_->create(r1_.logEntryPrefix(), getEntry(fmt::format("all_{0}_{0}_0", i)),
                                   CreateMode::kPersistentSequential);
    ASSERT_TRUE(created);
    if (i != 2) puller.remember(*created, getEntry(fmt::format("all_{0}_{0}_0", i)));
  }
  auto pulled = puller.pull(*keeper_);
  ASSERT_TRUE(pulled) << pulled.error().toString();
  EXPECT_EQ(puller.lastPullReads(), 1u);  // all_2_2_0, written by "another replica"
  EXPECT_EQ(queueTexts(r1_),
            (std::vector<std::string>{"all_0_0_0", "all_1_1_0", "all_2_2_0", "all_3_3_0"}));
  ASSERT_EQ(pulled->size(), 4u);
  EXPECT_EQ((*pulled)[3].entry.new_part_name, "all_3_3_0");
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
  for (int i = 0; i < 7; ++i)
    ASSERT_TRUE(keeper_->remove(fmt::format("{}{:010d}", r1_.logEntryPrefix(), i)));
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
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", getEntry("all_1_1_0"),
                              CreateMode::kPersistentSequential));
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", "format version: 4\nnonsense\n",
                              CreateMode::kPersistentSequential));
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", getEntry("all_2_2_0"),
                              CreateMode::kPersistentSequential));
  EXPECT_EQ(queueTexts(r1_), (std::vector<std::string>{"all_1_1_0", "all_2_2_0"}));
  EXPECT_EQ(keeper_->children(r1_.queue())->names.size(), 2u);
}

TEST_F(ReplicationLog, CloneCopiesTheSourcesPartsQueueAndPointer) {
  ASSERT_TRUE(activateReplica(*keeper_, r1_, "host: r1\n"));
  for (const auto* part : {"all_1_1_0", "all_2_2_0", "all_1_2_1", "all_3_3_0"}) {
    ASSERT_TRUE(keeper_->create(r1_.part(part), "", CreateMode::kPersistent));
  }
  ASSERT_TRUE(keeper_->create(r1_.queue() + "/queue-", getEntry("all_4_4_0"),
                              CreateMode::kPersistentSequential));
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

// A part committed by the lost replica just before it went away, whose log entry the source had
// not pulled yet: the source neither has it nor queues it, but the log after the cloned pointer
// names it. It belongs to the table (its rows were acknowledged), so it is no stray.
TEST_F(ReplicationLog, CloneCountsThePartsOfTheLogAfterThePointerAsTheTables) {
  ASSERT_TRUE(activateReplica(*keeper_, r1_, "host: r1\n"));
  appendLog(3, 0);  // all_0_0_0 .. all_2_2_0, pulled by r1
  for (const auto* part : {"all_0_0_0", "all_1_1_0", "all_2_2_0"}) {
    ASSERT_TRUE(keeper_->create(r1_.part(part), "", CreateMode::kPersistent));
  }
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "3"));
  LogEntry merge;
  merge.type = LogEntry::Type::kMergeParts;
  merge.new_part_name = "all_0_1_1";
  merge.source_parts = {"all_0_0_0", "all_1_1_0"};
  ASSERT_TRUE(
      keeper_->create(r1_.logEntryPrefix(), merge.format(), CreateMode::kPersistentSequential));
  appendLog(1, 7);  // log-4: all_7_7_0, committed by the lost replica r2, not pulled by r1 yet

  TablePaths r2 = r1_;
  r2.replica = "r2";
  auto r2_keeper = server_->connect();
  ASSERT_TRUE(createReplicaIfNotExists(*r2_keeper, r2));
  auto cloned = cloneReplica(*r2_keeper, r2, "r1");
  ASSERT_TRUE(cloned) << cloned.error().toString();
  EXPECT_EQ(r2_keeper->get(r2.logPointer())->data, "3");
  EXPECT_TRUE(cloned->source_parts.containingPart(*PartName::parse("all_7_7_0")))
      << "the clone would detach a part only the log names";
  EXPECT_TRUE(cloned->source_parts.containingPart(*PartName::parse("all_0_1_1")));
  EXPECT_FALSE(cloned->source_parts.containingPart(*PartName::parse("all_5_5_0")));
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

TEST_F(LogCleanup, ADroppedReplicaNoLongerHoldsTheLog) {
  appendLog(30, 0);
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "30"));
  ASSERT_TRUE(keeper_->set(r2_.logPointer(), "4"));  // r2 is stopped, within the kept log
  ASSERT_TRUE(keeper_->create(r2_.part("all_0_0_0"), "", CreateMode::kPersistent));
  ASSERT_TRUE(keeper_->create(r2_.queue() + "/queue-", getEntry("all_5_5_0"),
                              CreateMode::kPersistentSequential));
  ASSERT_EQ(clearOldLogs(*keeper_, r1_, LogRetention{5, 1000})->removed, 4u);

  auto dropped = dropReplica(*keeper_, r1_, "r2");
  ASSERT_TRUE(dropped) << dropped.error().toString();
  EXPECT_EQ(*dropped, ReplicaRemoval::kRemoved);
  EXPECT_FALSE(*keeper_->exists(r2_.replicaRoot()));
  EXPECT_EQ(keeper_->children(r1_.replicas())->names, std::vector<std::string>{"r1"});
  auto cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 1000});
  ASSERT_TRUE(cleaned);
  EXPECT_EQ(logIndexes().front(), 25);
  // Idempotent: a second removal finds nothing.
  EXPECT_EQ(*dropReplica(*keeper_, r1_, "r2"), ReplicaRemoval::kNotThere);
}

TEST_F(LogCleanup, ALiveReplicaIsNotDropped) {
  std::unique_ptr<Keeper> r2_session = server_->connect();
  ASSERT_TRUE(activateReplica(*r2_session, r2_, "host: r2\n"));
  auto dropped = dropReplica(*keeper_, r1_, "r2");
  ASSERT_FALSE(dropped);
  EXPECT_EQ(dropped.error().code, KeeperCode::kBadArguments);
  EXPECT_NE(dropped.error().detail.find("'r2' is active"), std::string::npos)
      << dropped.error().detail;
  // Nothing changed, not even is_lost.
  EXPECT_EQ(keeper_->get(r2_.isLost())->data, "0");
  EXPECT_TRUE(*keeper_->exists(r2_.queue()));
  // Once its session is gone, it can be removed.
  r2_session.reset();
  EXPECT_EQ(*dropReplica(*keeper_, r1_, "r2"), ReplicaRemoval::kRemoved);
}

TEST_F(LogCleanup, AReplicaLeftHalfDroppedIsIgnoredByCleanupAndRepairedAtItsStart) {
  appendLog(30, 0);
  ASSERT_TRUE(keeper_->set(r1_.logPointer(), "30"));
  ASSERT_TRUE(keeper_->set(r2_.logPointer(), "4"));
  // What a dropReplica cut short after its first steps leaves: lost, without parts/ and queue/.
  ASSERT_TRUE(keeper_->set(r2_.isLost(), "1"));
  ASSERT_TRUE(removeRecursive(*keeper_, r2_.parts()));
  ASSERT_TRUE(removeRecursive(*keeper_, r2_.queue()));
  ASSERT_TRUE(keeper_->remove(r2_.logPointer()));
  auto cleaned = clearOldLogs(*keeper_, r1_, LogRetention{5, 1000});
  ASSERT_TRUE(cleaned) << cleaned.error().toString();
  EXPECT_EQ(logIndexes().front(), 25);
  // Its process starts again instead of the removal finishing: it gets its nodes back, lost.
  auto registered = createReplicaIfNotExists(*keeper_, r2_);
  ASSERT_TRUE(registered) << registered.error().toString();
  EXPECT_EQ(*registered, Registration::kAlreadyThere);
  EXPECT_TRUE(*keeper_->exists(r2_.queue()));
  EXPECT_TRUE(*keeper_->exists(r2_.parts()));
  EXPECT_TRUE(*keeper_->exists(r2_.logPointer()));
  EXPECT_EQ(keeper_->get(r2_.isLost())->data, "1");
}

TEST_F(LogCleanup, AMissingPartIsLostForeverOnlyWhenNoReplicaHasOrCanMakeIt) {
  auto search = [&](const std::string& name) {
    auto state = searchForMissingPart(*keeper_, r1_, *PartName::parse(name));
    EXPECT_TRUE(state) << state.error().toString();
    return *state;
  };
  EXPECT_EQ(search("all_1_1_0"), MissingPart::kLostForever);
  // r2 is not active, but lists the part: it may come back.
  ASSERT_TRUE(keeper_->create(r2_.part("all_1_1_0"), "", CreateMode::kPersistent));
  EXPECT_EQ(search("all_1_1_0"), MissingPart::kOnSomeReplica);
  // A part covering it counts too.
  ASSERT_TRUE(keeper_->create(r1_.part("all_0_4_1"), "", CreateMode::kPersistent));
  EXPECT_EQ(search("all_2_2_0"), MissingPart::kOnSomeReplica);
  // A merge result none has yet, with its first and last sources still around: may be merged.
  ASSERT_TRUE(keeper_->create(r2_.part("all_5_5_0"), "", CreateMode::kPersistent));
  ASSERT_TRUE(keeper_->create(r1_.part("all_7_7_0"), "", CreateMode::kPersistent));
  EXPECT_EQ(search("all_5_7_1"), MissingPart::kMayStillBeMerged);
  // Without its last source it can never be made.
  EXPECT_EQ(search("all_5_8_1"), MissingPart::kLostForever);
  // Another partition's parts say nothing about it.
  EXPECT_EQ(search("202612_1_1_0"), MissingPart::kLostForever);
}

// Two replicas registering at once (every replica opens the next generation at a swap's first
// step): the one whose multi finds the replicas node's version moved reads it again and registers,
// instead of failing with a bad version.
TEST(CreateReplica, ARaceOnTheReplicasVersionIsRetried) {
  auto server = testing::FakeKeeperServer::create();
  std::shared_ptr<Keeper> session = server->connect();
  const TablePaths r1{"/t", 1, "r1"};
  const TablePaths r2{"/t", 1, "r2"};
  ASSERT_TRUE(createTableIfNotExists(*session, r1, "metadata"));
  auto hooks = std::make_shared<testing::KeeperHooks>();
  int raced = 0;
  hooks->before = [&](const testing::KeeperCall& call) -> std::optional<KeeperError> {
    // r2 registers between r1's read of the replicas node and r1's multi, twice.
    if (call.operation == "multi" && call.path == r1.replicaRoot() && raced < 2) {
      ++raced;
      const bool bumped = raced == 1 ? createReplicaIfNotExists(*session, r2).has_value()
                                     : session->set(r1.replicas(), "bumped", -1).has_value();
      EXPECT_TRUE(bumped);
    }
    return std::nullopt;
  };
  auto keeper = testing::hookKeeper(session, hooks);
  auto created = createReplicaIfNotExists(*keeper, r1);
  ASSERT_TRUE(created) << created.error().toString();
  EXPECT_EQ(*created, Registration::kCreated);
  EXPECT_EQ(raced, 2);
  EXPECT_TRUE(*session->exists(r1.queue()));
  EXPECT_TRUE(*session->exists(r2.queue()));
}

TEST(RemoveRecursive, RemovesADeepWideSubtreeAndToleratesAMissingRoot) {
  auto server = testing::FakeKeeperServer::create();
  auto keeper = server->connect();
  ASSERT_TRUE(createAncestorsAndSelf(*keeper, "/a/b/c"));
  for (int i = 0; i < 250; ++i) {
    ASSERT_TRUE(keeper->create(fmt::format("/a/b/c/n{}", i), "x", CreateMode::kPersistent));
  }
  ASSERT_TRUE(keeper->create("/a/b/d", "", CreateMode::kPersistent));
  ASSERT_TRUE(keeper->create("/a/keep", "", CreateMode::kPersistent));
  ASSERT_TRUE(removeRecursive(*keeper, "/a/b"));
  EXPECT_FALSE(*keeper->exists("/a/b"));
  EXPECT_TRUE(*keeper->exists("/a/keep"));
  EXPECT_TRUE(removeRecursive(*keeper, "/a/b"));
  EXPECT_TRUE(removeRecursive(*keeper, "/nothing/here"));
}

}  // namespace
}  // namespace rtable::core

namespace rtable::core {
namespace {

// At the int32 limit ZooKeeper creates one more entry, log--2147483648, after log-2147483647: it
// must come last, not first (a real ZooKeeper 3.8 did this in table_swap_process_tests, and
// replicas that read it as -2147483648 never pulled it, while log cleanup removed it).
TEST(LogEntryNames, TheWrappedCounterComesAfterTheLimit) {
  EXPECT_EQ(logEntryIndex("log-0000000042"), 42);
  EXPECT_EQ(logEntryIndex("log-2147483647"), 2147483647);
  EXPECT_EQ(logEntryIndex("log--2147483648"), int64_t{2147483648});
  EXPECT_GT(*logEntryIndex("log--2147483648"), *logEntryIndex("log-2147483647"));
  EXPECT_EQ(logEntryIndex("log-4294967296"), std::nullopt);
  EXPECT_EQ(logEntryIndex("queue-0000000001"), std::nullopt);
  for (int64_t index : {int64_t{0}, int64_t{42}, int64_t{2147483647}, int64_t{2147483648}}) {
    EXPECT_EQ(logEntryIndex(logEntryName(index)), index) << logEntryName(index);
  }
  EXPECT_EQ(logEntryName(2147483648), "log--2147483648");
  EXPECT_EQ(logEntryName(7), "log-0000000007");
}

}  // namespace
}  // namespace rtable::core
