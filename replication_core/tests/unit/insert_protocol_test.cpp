#include "rtable/replication_core/insert_protocol.h"

#include <gtest/gtest.h>

#include "rtable/replication_core/dedup_window.h"
#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/part_name.h"
#include "rtable/replication_core/row_format.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

class InsertProtocol : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(createTableIfNotExists(*keeper_, paths_, "metadata v1"), Registration::kCreated);
    ASSERT_EQ(createReplicaIfNotExists(*keeper_, paths_), Registration::kCreated);
  }

  LogEntry getEntry(const BlockNumberLock& lock, const std::string& dedup_id) {
    LogEntry entry;
    entry.create_time = 1764558000;
    entry.source_replica = paths_.replica;
    entry.block_id = dedup_id;
    entry.new_part_name =
        PartName{lock.partition, lock.block_number, lock.block_number, 0, 0}.format();
    return entry;
  }

  // Allocation + commit, as an insert of one block does.
  std::string insert(const std::string& partition, const std::string& dedup_id) {
    auto allocation = allocator_.allocate(*keeper_, partition, dedup_id);
    EXPECT_TRUE(allocation) << allocation.error().toString();
    if (auto* duplicate = std::get_if<Duplicate>(&*allocation))
      return "duplicate of " + duplicate->existing_part;
    const auto& lock = std::get<BlockNumberLock>(*allocation);
    const LogEntry entry = getEntry(lock, dedup_id);
    auto committed = commitPart(*keeper_, paths_, entry, lock);
    EXPECT_TRUE(committed);
    return entry.new_part_name;
  }

  bool exists(const std::string& path) {
    auto stat = keeper_->exists(path);
    EXPECT_TRUE(stat) << stat.error().toString();
    return stat && stat->has_value();
  }

  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::unique_ptr<Keeper> keeper_ = server_->connect();
  TablePaths paths_{"/rtable/tables/uid", 1, "r1"};
  BlockNumberAllocator allocator_{paths_};
};

TEST_F(InsertProtocol, TableAndReplicaRegistrationIsIdempotent) {
  EXPECT_EQ(keeper_->get(paths_.activeGeneration())->data, "1");
  for (const auto& node :
       {paths_.log(), paths_.blockNumbers(), paths_.dedupHashes(), paths_.quorum(),
        paths_.leaderElection(), paths_.temp(), paths_.columns()}) {
    EXPECT_TRUE(keeper_->exists(node)->has_value()) << node;
  }
  EXPECT_EQ(createTableIfNotExists(*keeper_, paths_, "metadata v1"), Registration::kAlreadyThere);
  auto other = createTableIfNotExists(*keeper_, paths_, "metadata v2");
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, KeeperCode::kBadArguments);
  EXPECT_NE(other.error().detail.find("metadata v1"), std::string::npos);

  EXPECT_EQ(createReplicaIfNotExists(*keeper_, paths_), Registration::kAlreadyThere);
  EXPECT_EQ(keeper_->get(paths_.isLost())->data, "0");
  // A replica joining after the log has entries starts lost: it clones instead of replaying.
  insert("all", "all_1_1");
  TablePaths second = paths_;
  second.replica = "r2";
  EXPECT_EQ(createReplicaIfNotExists(*keeper_, second), Registration::kCreated);
  EXPECT_EQ(keeper_->get(second.isLost())->data, "1");
  EXPECT_EQ(keeper_->get(paths_.replicas())->data, "last added replica: r2");
}

TEST_F(InsertProtocol, ActivationIsExclusivePerLiveSession) {
  ASSERT_TRUE(activateReplica(*keeper_, paths_, "host: 127.0.0.2\nport: 8123\n"));
  ASSERT_TRUE(activateReplica(*keeper_, paths_, "host: 127.0.0.2\nport: 8123\n"));  // retried
  EXPECT_EQ(keeper_->get(paths_.host())->data, "host: 127.0.0.2\nport: 8123\n");
  auto second_process = server_->connect();
  auto refused = activateReplica(*second_process, paths_, "host: 127.0.0.3\n");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().detail.find("second process"), std::string::npos);
  keeper_.reset();  // the first process's session ends
  EXPECT_TRUE(activateReplica(*second_process, paths_, "host: 127.0.0.3\n"));
}

TEST_F(InsertProtocol, AnInsertCommitsAGetEntryTheDedupIdAndThePart) {
  auto allocation = allocator_.allocate(*keeper_, "202612", "202612_1_2");
  ASSERT_TRUE(allocation);
  const auto lock = std::get<BlockNumberLock>(*allocation);
  EXPECT_EQ(lock.block_number, 0);
  EXPECT_EQ(lock.path, paths_.blockNumbers("202612") + "/block-0000000000");
  EXPECT_TRUE(keeper_->exists(lock.path)->has_value());

  const LogEntry entry = getEntry(lock, "202612_1_2");
  auto committed = commitPart(*keeper_, paths_, entry, lock);
  ASSERT_TRUE(committed);
  EXPECT_EQ(committed->log_entry_path, paths_.log() + "/log-0000000000");
  EXPECT_EQ(LogEntry::parse(keeper_->get(committed->log_entry_path)->data), entry);
  EXPECT_EQ(keeper_->get(paths_.dedupHash("202612_1_2"))->data, "202612_0_0_0");
  EXPECT_TRUE(keeper_->exists(paths_.part("202612_0_0_0"))->has_value());
  EXPECT_FALSE(keeper_->exists(lock.path)->has_value());
  EXPECT_EQ(partIsCommitted(*keeper_, paths_, "202612_0_0_0"), true);

  // Block numbers grow per partition.
  EXPECT_EQ(insert("202612", "202612_3_4"), "202612_1_1_0");
  EXPECT_EQ(insert("202611", "202611_5_6"), "202611_0_0_0");
}

// The commit carries metadata only: the log entry, the dedup id's part name, an empty parts node
// and the reserve; no row data goes into ZooKeeper (it holds every node in memory and is shared by
// every table).
TEST_F(InsertProtocol, ACommitWritesNoRowDataToZooKeeper) {
  auto allocation = allocator_.allocate(*keeper_, "202612", "202612_1_2");
  ASSERT_TRUE(allocation);
  const auto lock = std::get<BlockNumberLock>(*allocation);
  const std::string data = "reserve 1";
  const LogEntry entry = getEntry(lock, "202612_1_2");
  auto committed = commitPart(*keeper_, paths_, entry, lock, data);
  ASSERT_TRUE(committed) << committed.error().cause.toString();
  EXPECT_EQ(keeper_->get(paths_.part("202612_0_0_0"))->data, "");
  EXPECT_EQ(keeper_->get(paths_.dedupHash("202612_1_2"))->data, "202612_0_0_0");
  EXPECT_EQ(keeper_->get(committed->log_entry_path)->data, entry.format());
  ASSERT_TRUE(committed->reserve_path);  // the multi's last op
  EXPECT_EQ(keeper_->get(*committed->reserve_path)->data, data);
  // Nothing else under this replica's node (part images were removed: docs/formats.md).
  auto children = keeper_->children(paths_.replicaRoot());
  ASSERT_TRUE(children);
  for (const auto& name : children->names) {
    EXPECT_TRUE(name == "host" || name == "is_lost" || name == "log_pointer" || name == "queue" ||
                name == "parts" || name == "is_active")
        << name;
  }
}

TEST_F(InsertProtocol, SteadyInsertsCostTwoRequests) {
  insert("all", "all_0_1");  // creates the partition node once
  const int64_t before = server_->requestCountForTest();
  insert("all", "all_0_2");
  EXPECT_EQ(server_->requestCountForTest() - before, 2);
}

// The table swap's attach allocates a batch: new partitions' nodes and every lock in one multi.
TEST_F(InsertProtocol, ManyAllocationsInNewPartitionsCostOneRequest) {
  const int64_t before = server_->requestCountForTest();
  auto locks =
      allocator_.allocateMany(*keeper_, {{"202611", "a1"}, {"202612", "a2"}, {"202612", "a3"}});
  ASSERT_TRUE(locks) << locks.error().toString();
  EXPECT_EQ(server_->requestCountForTest() - before, 1);
  ASSERT_EQ(locks->size(), 3u);
  EXPECT_EQ((*locks)[0].partition, "202611");
  EXPECT_EQ((*locks)[2].partition, "202612");
  EXPECT_NE((*locks)[1].block_number, (*locks)[2].block_number);
  for (const auto& lock : *locks) EXPECT_TRUE(exists(lock.path)) << lock.path;
}

// Another allocator made one partition's node meanwhile: the batch still gets its locks.
TEST_F(InsertProtocol, ManyAllocationsWhereAPartitionNodeExistsStillAllocateEveryLock) {
  BlockNumberAllocator other{paths_};
  ASSERT_TRUE(other.allocate(*keeper_, "202612", "b1"));
  auto locks = allocator_.allocateMany(*keeper_, {{"202611", "a1"}, {"202612", "a2"}});
  ASSERT_TRUE(locks) << locks.error().toString();
  ASSERT_EQ(locks->size(), 2u);
  EXPECT_EQ(keeper_->children(paths_.blockNumbers("202612"))->names.size(), 2u);
  EXPECT_EQ(keeper_->children(paths_.blockNumbers("202611"))->names.size(), 1u);
  // An id in the dedup window fails the whole batch: no lock is left (an empty partition node
  // may be, as an insert's allocation leaves one).
  insert("202610", "a9");
  auto refused = allocator_.allocateMany(*keeper_, {{"202609", "a8"}, {"202610", "a9"}});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, KeeperCode::kNodeExists);
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("202609"))->names.empty());
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("202610"))->names.empty());
}

TEST_F(InsertProtocol, TheSameIdAgainIsADuplicateOfTheFirstPart) {
  EXPECT_EQ(insert("all", "all_7_7"), "all_0_0_0");
  EXPECT_EQ(insert("all", "all_7_7"), "duplicate of all_0_0_0");
  EXPECT_EQ(keeper_->children(paths_.log())->names.size(), 1u);
  // The duplicate allocated no block number.
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("all"))->names.empty());
  EXPECT_EQ(insert("all", "all_7_8"), "all_1_1_0");
}

TEST_F(InsertProtocol, ALockWhoseAllocationAnswerWasLostIsReleasedAndNoOtherLock) {
  // An insert of the same rows holds its lock (a client's retry on another connection).
  auto held = allocator_.allocate(*keeper_, "all", "all_5_5");
  ASSERT_TRUE(held);
  server_->loseNextMultiAnswersForTest(1);
  auto lost = allocator_.allocate(*keeper_, "all", "all_5_5");
  ASSERT_FALSE(lost);
  EXPECT_TRUE(lost.error().isConnectionLevel());
  // The server made the lost allocation's lock, and the session lives on.
  ASSERT_EQ(keeper_->children(paths_.blockNumbers("all"))->names.size(), 2u);
  EXPECT_EQ(allocator_.lostLocksForTest(), 1u);

  allocator_.releaseLostLocks(*keeper_);
  EXPECT_EQ(allocator_.lostLocksForTest(), 0u);
  auto left = keeper_->children(paths_.blockNumbers("all"));
  ASSERT_EQ(left->names.size(), 1u);
  const auto& lock = std::get<BlockNumberLock>(*held);
  EXPECT_EQ(paths_.blockNumbers("all") + "/" + left->names[0], lock.path);
  EXPECT_TRUE(commitPart(*keeper_, paths_, getEntry(lock, "all_5_5"), lock));
}

TEST_F(InsertProtocol, AnAllocationThatNeverReachedTheServerIsLookedForAgainLater) {
  insert("all", "all_6_5");             // the partition node exists: the multi goes first
  server_->failNextRequestsForTest(1);  // not applied
  ASSERT_FALSE(allocator_.allocate(*keeper_, "all", "all_6_6"));
  allocator_.releaseLostLocks(*keeper_);
  // Nothing to release, but a request lost with its connection may still reach the leader late.
  EXPECT_EQ(allocator_.lostLocksForTest(), 1u);
  EXPECT_EQ(insert("all", "all_6_7"), "all_1_1_0");
  allocator_.releaseLostLocks(*keeper_);
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("all"))->names.empty());
  // A new session: the old one's ephemerals went with it, there is nothing left to look for.
  keeper_ = server_->connect();
  allocator_.releaseLostLocks(*keeper_);
  EXPECT_EQ(allocator_.lostLocksForTest(), 0u);
}

TEST_F(InsertProtocol, ARaceOnOneIdCommitsOnceAndTheLoserLearnsThePart) {
  auto first = allocator_.allocate(*keeper_, "all", "all_9_9");
  auto second = allocator_.allocate(*keeper_, "all", "all_9_9");  // both pass the check
  ASSERT_TRUE(first && second);
  const auto lock1 = std::get<BlockNumberLock>(*first);
  const auto lock2 = std::get<BlockNumberLock>(*second);
  ASSERT_TRUE(commitPart(*keeper_, paths_, getEntry(lock1, "all_9_9"), lock1));
  auto lost = commitPart(*keeper_, paths_, getEntry(lock2, "all_9_9"), lock2);
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().failure, CommitFailure::kDuplicate);
  ASSERT_TRUE(lost.error().duplicate);
  EXPECT_EQ(lost.error().duplicate->existing_part, "all_0_0_0");
  // Nothing of the loser's commit was applied: its lock is still there, for it to remove.
  EXPECT_TRUE(keeper_->exists(lock2.path)->has_value());
  EXPECT_EQ(keeper_->children(paths_.log())->names.size(), 1u);
}

TEST_F(InsertProtocol, ALockLostWithTheSessionFailsTheCommit) {
  auto allocation = allocator_.allocate(*keeper_, "all", "all_1_1");
  const auto lock = std::get<BlockNumberLock>(*allocation);
  server_->expireSession(keeper_->sessionId());
  auto refused = commitPart(*keeper_, paths_, getEntry(lock, "all_1_1"), lock);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().failure, CommitFailure::kUnknownOutcome);
  keeper_ = std::move(*keeper_->startNewSession());
  EXPECT_EQ(partIsCommitted(*keeper_, paths_, "all_0_0_0"), false);
  auto lost = commitPart(*keeper_, paths_, getEntry(lock, "all_1_1"), lock);
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().failure, CommitFailure::kLockLost);
  EXPECT_FALSE(keeper_->exists(paths_.dedupHash("all_1_1"))->has_value());
}

TEST_F(InsertProtocol, AConnectionLossLeavesTheOutcomeToBeAsked) {
  auto allocation = allocator_.allocate(*keeper_, "all", "all_1_1");
  const auto lock = std::get<BlockNumberLock>(*allocation);
  server_->failNextRequestsForTest(1);
  auto unknown = commitPart(*keeper_, paths_, getEntry(lock, "all_1_1"), lock);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().failure, CommitFailure::kUnknownOutcome);
  EXPECT_EQ(partIsCommitted(*keeper_, paths_, "all_0_0_0"), false);
  ASSERT_TRUE(commitPart(*keeper_, paths_, getEntry(lock, "all_1_1"), lock));
  EXPECT_EQ(partIsCommitted(*keeper_, paths_, "all_0_0_0"), true);
}

TEST_F(InsertProtocol, AnExhaustedLogCounterIsNamed) {
  ASSERT_TRUE(server_->setSequentialCounterForTest(paths_.log(), 2147483647));
  EXPECT_EQ(insert("all", "all_1_1"), "all_0_0_0");  // takes log-2147483647
  auto allocation = allocator_.allocate(*keeper_, "all", "all_2_2");
  const auto lock = std::get<BlockNumberLock>(*allocation);
  auto stuck = commitPart(*keeper_, paths_, getEntry(lock, "all_2_2"), lock);
  ASSERT_FALSE(stuck);
  EXPECT_EQ(stuck.error().failure, CommitFailure::kLogExhausted);
  EXPECT_EQ(stuck.error().cause.path, paths_.logEntryPrefix());
}

TEST(BlockDedupId, DependsOnTheValuesOnly) {
  auto block = [](std::vector<uint32_t> values, std::vector<uint8_t> nulls) {
    Block b;
    Column c = Column::empty("x", *DataType::parse("Nullable(UInt32)"));
    c.values = std::move(values);
    c.null_map = std::move(nulls);
    b.columns.push_back(std::move(c));
    return b;
  };
  const std::string id = blockDedupId("202612", block({1, 2}, {0, 0}));
  EXPECT_TRUE(id.starts_with("202612_"));
  EXPECT_EQ(id, blockDedupId("202612", block({1, 2}, {0, 0})));
  EXPECT_NE(id, blockDedupId("202612", block({1, 3}, {0, 0})));
  EXPECT_NE(id, blockDedupId("202612", block({1, 2}, {0, 1})));
  EXPECT_NE(id, blockDedupId("202611", block({1, 2}, {0, 0})));
  EXPECT_EQ(tokenDedupId("all", "t", 0), tokenDedupId("all", "t", 0));
  EXPECT_NE(tokenDedupId("all", "t", 0), tokenDedupId("all", "t", 1));
}

TEST(BlockDedupId, TheSameRowsInAnyFormatGiveTheSameId) {
  auto schema = TableSchema::create({{"d", *DataType::parse("Date")},
                                     {"s", *DataType::parse("String")},
                                     {"n", *DataType::parse("Nullable(Int32)")}},
                                    *PartitionKey::parse("toYYYYMM(d)"), {"s"});
  ASSERT_TRUE(schema);
  auto idOf = [&](RowFormat format, std::string_view text) {
    RowParser parser(*schema, format);
    Block rows = schema->emptyBlock();
    auto sink = [&](Block&& block) { rows.append(block); };
    EXPECT_TRUE(parser.feed(text, sink));
    EXPECT_TRUE(parser.finish(sink));
    return blockDedupId("202612", rows.select(schema->sortPermutation(rows)));
  };
  const std::string json = idOf(RowFormat::kJSONEachRow, R"({"d":"2026-12-01","s":"b\tc","n":-4})"
                                                         "\n"
                                                         R"({"n":null,"s":"a","d":"2026-12-02"})"
                                                         "\n");
  EXPECT_EQ(json, idOf(RowFormat::kTabSeparated, "2026-12-01\tb\\tc\t-4\n2026-12-02\ta\t\\N\n"));
  EXPECT_EQ(json, idOf(RowFormat::kCSV, "2026-12-02,a,\\N\n\"2026-12-01\",\"b\tc\",-4\n"));
  EXPECT_NE(json, idOf(RowFormat::kTabSeparated, "2026-12-01\tb\\tc\t-5\n2026-12-02\ta\t\\N\n"));
}

class DedupWindowTest : public InsertProtocol {
 protected:
  void createIdsAt(int count, int64_t first_ms, int64_t step_ms) {
    for (int i = 0; i < count; ++i) {
      server_->setTimeForTest(first_ms + i * step_ms);
      ASSERT_TRUE(keeper_->create(paths_.dedupHash("all_" + std::to_string(next_id_++)), "p",
                                  CreateMode::kPersistent));
    }
  }
  std::vector<std::string> ids() {
    auto names = keeper_->children(paths_.dedupHashes())->names;
    std::sort(names.begin(), names.end());
    return names;
  }
  int next_id_ = 10;
};

TEST_F(DedupWindowTest, KeepsTheNewestNThatAreYoungEnough) {
  createIdsAt(8, 1'000'000, 1000);  // all_10 .. all_17, one a second
  DedupWindowCleaner by_count(paths_, DedupWindow{5, std::chrono::seconds(3600)});
  auto result = by_count.run(*keeper_);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->removed, 3u);
  EXPECT_EQ(ids(), (std::vector<std::string>{"all_13", "all_14", "all_15", "all_16", "all_17"}));

  // Age is measured from the newest id, not the clock: 2 s back from all_17 keeps 15, 16, 17.
  DedupWindowCleaner by_age(paths_, DedupWindow{100, std::chrono::seconds(2)});
  server_->setTimeForTest(9'999'999'999);
  ASSERT_TRUE(by_age.run(*keeper_));
  EXPECT_EQ(ids(), (std::vector<std::string>{"all_15", "all_16", "all_17"}));
}

TEST_F(DedupWindowTest, AQuietTableKeepsItsLastIdsAndRunsCostOneListing) {
  createIdsAt(3, 1'000'000, 1000);
  DedupWindowCleaner cleaner(paths_, DedupWindow{10, std::chrono::seconds(1)});
  ASSERT_TRUE(cleaner.run(*keeper_));
  EXPECT_EQ(ids(), (std::vector<std::string>{"all_11", "all_12"}));
  const int64_t before = server_->requestCountForTest();
  ASSERT_TRUE(cleaner.run(*keeper_));
  EXPECT_EQ(server_->requestCountForTest() - before, 1);
  EXPECT_EQ(ids().size(), 2u);
}

// Async inserts leave an id per insert: thousands to remove per run, a multi per hundred.
TEST_F(DedupWindowTest, OldIdsGoInMultisOfAHundred) {
  createIdsAt(255, 1'000'000, 10);  // all_10 .. all_264
  DedupWindowCleaner cleaner(paths_, DedupWindow{5, std::chrono::seconds(3600)});
  const int64_t before = server_->requestCountForTest();
  auto result = cleaner.run(*keeper_);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->removed, 250u);
  EXPECT_EQ(ids(),
            (std::vector<std::string>{"all_260", "all_261", "all_262", "all_263", "all_264"}));
  // A listing, the stats (the fake counts each get of the pipelined batch), three multis of
  // removes: not a remove per id (506 requests).
  EXPECT_LE(server_->requestCountForTest() - before, 1 + 256 + 3);
}

// An id changed since the cleaner read it fails its multi and stays; the rest of that hundred go
// one by one.
TEST_F(DedupWindowTest, AnIdChangedSinceItWasReadStaysAndTheOthersGo) {
  createIdsAt(5, 1'000'000, 10);  // all_10 .. all_14, read (and kept) by the first run
  DedupWindowCleaner cleaner(paths_, DedupWindow{5, std::chrono::seconds(3600)});
  ASSERT_TRUE(cleaner.run(*keeper_));
  ASSERT_TRUE(keeper_->set(paths_.dedupHash("all_12"), "changed", -1));
  createIdsAt(150, 2'000'000, 10);  // all_15 .. all_164, newer
  auto result = cleaner.run(*keeper_);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->removed, 149u);
  EXPECT_EQ(ids(), (std::vector<std::string>{"all_12", "all_160", "all_161", "all_162", "all_163",
                                             "all_164"}));
}

// A commit that reserves creates the partition's next lock in the same multi; the next insert
// commits with it, its dedup check being the commit's create of the dedup node.
TEST_F(InsertProtocol, ACommitReservesTheNextBlockNumberForItsPartition) {
  auto allocation = allocator_.allocate(*keeper_, "all", "all_1_1");
  ASSERT_TRUE(allocation);
  const auto first = std::get<BlockNumberLock>(*allocation);
  auto data = allocator_.startReserving("all");
  ASSERT_TRUE(data);
  EXPECT_FALSE(allocator_.startReserving("all"));  // one reserve per partition
  auto committed = commitPart(*keeper_, paths_, getEntry(first, "all_1_1"), first, data);
  ASSERT_TRUE(committed) << committed.error().cause.toString();
  ASSERT_TRUE(committed->reserve_path);
  allocator_.finishReserving(keeper_->sessionId(), "all", *data, committed->reserve_path, false);
  EXPECT_EQ(allocator_.reservedForTest(), std::vector<std::string>{*committed->reserve_path});
  EXPECT_EQ(keeper_->get(*committed->reserve_path)->data, *data);

  EXPECT_FALSE(allocator_.takeReserved(keeper_->sessionId() + 1, "all"));  // another session's
  EXPECT_FALSE(allocator_.takeReserved(keeper_->sessionId(), "other"));
  auto reserved = allocator_.takeReserved(keeper_->sessionId(), "all");
  ASSERT_TRUE(reserved);
  EXPECT_EQ(reserved->block_number, first.block_number + 1);
  EXPECT_TRUE(allocator_.reservedForTest().empty());
  // The same rows again: the commit's create of the dedup node refuses them.
  auto duplicate = commitPart(*keeper_, paths_, getEntry(*reserved, "all_1_1"), *reserved);
  ASSERT_FALSE(duplicate);
  EXPECT_EQ(duplicate.error().failure, CommitFailure::kDuplicate);
  ASSERT_TRUE(duplicate.error().duplicate);
  EXPECT_EQ(duplicate.error().duplicate->existing_part, "all_0_0_0");
  EXPECT_TRUE(keeper_->exists(reserved->path)->has_value());  // nothing of the multi applied
  EXPECT_TRUE(commitPart(*keeper_, paths_, getEntry(*reserved, "all_2_2"), *reserved));
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("all"))->names.empty());
}

TEST_F(InsertProtocol, AnIdleReserveIsReleasedAndAnUncertainOneTreatedAsLost) {
  auto allocation = allocator_.allocate(*keeper_, "all", "all_1_1");
  const auto lock = std::get<BlockNumberLock>(*allocation);
  auto data = allocator_.startReserving("all");
  auto committed = commitPart(*keeper_, paths_, getEntry(lock, "all_1_1"), lock, data);
  ASSERT_TRUE(committed);
  allocator_.finishReserving(keeper_->sessionId(), "all", *data, committed->reserve_path, false);
  allocator_.releaseIdleReserves(*keeper_, std::chrono::hours(1));
  EXPECT_EQ(allocator_.reservedForTest().size(), 1u);  // not idle yet
  allocator_.releaseIdleReserves(*keeper_, std::chrono::seconds(0));
  EXPECT_TRUE(allocator_.reservedForTest().empty());
  // Left in place, the lock would keep merges off the blocks inserted after it.
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("all"))->names.empty());

  // A commit without an answer may have created its reserve: it is looked for like a lost
  // allocation's lock, by its data.
  auto second = allocator_.allocate(*keeper_, "all", "all_2_2");
  const auto lock2 = std::get<BlockNumberLock>(*second);
  data = allocator_.startReserving("all");
  server_->loseNextMultiAnswersForTest(1);
  auto unknown = commitPart(*keeper_, paths_, getEntry(lock2, "all_2_2"), lock2, data);
  ASSERT_FALSE(unknown);
  ASSERT_EQ(unknown.error().failure, CommitFailure::kUnknownOutcome);
  allocator_.finishReserving(keeper_->sessionId(), "all", *data, std::nullopt, true);
  EXPECT_TRUE(allocator_.reservedForTest().empty());
  EXPECT_EQ(allocator_.lostLocksForTest(), 1u);
  ASSERT_EQ(keeper_->children(paths_.blockNumbers("all"))->names.size(), 1u);
  allocator_.releaseLostLocks(*keeper_);
  EXPECT_TRUE(keeper_->children(paths_.blockNumbers("all"))->names.empty());
  EXPECT_EQ(allocator_.lostLocksForTest(), 0u);
}

// A block's dedup id is compared with ids written by earlier versions (a retry across an upgrade
// must still be deduplicated): the hash of these rows must never change.
TEST(BlockDedupId, IsStableAcrossVersions) {
  auto schema = TableSchema::create({{"id", *DataType::parse("UInt64")},
                                     {"user", *DataType::parse("String")},
                                     {"n", *DataType::parse("Nullable(UInt32)")}},
                                    PartitionKey{}, {});
  ASSERT_TRUE(schema) << schema.error();
  RowParser parser(*schema, RowFormat::kJSONEachRow);
  Block rows = schema->emptyBlock();
  auto keep = [&](Block&& block) { rows = std::move(block); };
  ASSERT_TRUE(parser.feed(R"({"id":1,"user":"ann","n":7}
{"id":2,"user":"a much longer user name, past the small string size","n":null}
)",
                          keep));
  ASSERT_TRUE(parser.finish(keep));
  ASSERT_EQ(rows.rows(), 2u);
  EXPECT_EQ(blockDedupId("all", rows), "all_3055817003681417274_5365204917636798176");
}

TEST(Hasher128, ManySmallUpdatesHashAsTheirConcatenation) {
  std::string all;
  Hasher128 pieces;
  for (int i = 0; i < 5000; ++i) {
    const std::string piece(static_cast<std::size_t>(i % 37), static_cast<char>('a' + i % 26));
    pieces.updateString(piece);
    const uint64_t size = piece.size();
    all.append(reinterpret_cast<const char*>(&size), sizeof(size));
    all += piece;
    if (i == 2500) {  // one update larger than any buffer in between
      const std::string big(100000, 'z');
      pieces.update(big);
      all += big;
    }
  }
  EXPECT_EQ(pieces.digest().hex(), hash128(all).hex());
  EXPECT_EQ(pieces.digest().hex(), hash128(all).hex());  // digest() leaves the state as it was
}

}  // namespace
}  // namespace rtable::core
