#include "rtable/replication_core/table_replica.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <set>
#include <thread>

#include "rtable/common/testing/fake_clock.h"
#include "rtable/common/testing/files.h"
#include "rtable/replication_core/fail_points.h"
#include "rtable/replication_core/insert_protocol.h"
#include "rtable/replication_core/part_journal.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/testing/fake_keeper.h"
#include "rtable/replication_core/testing/hooked_keeper.h"

namespace rtable::core {
namespace {
namespace fs = std::filesystem;

class TableReplicaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-replica-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    auto spec = TableSpec::parseYaml(fmt::format(R"(
table: events
columns: [{{name: d, type: Date}}, {{name: x, type: UInt64}}, {{name: s, type: Nullable(String)}}]
partitionBy: toYYYYMM(d)
orderBy: [x]
deduplication: {{window: 100, windowSeconds: 3600}}
zookeeper: {{connect: fake}}
replica: {{name: r1}}
dataDir: {}
)",
                                                 dir_.string()));
    ASSERT_TRUE(spec) << spec.error();
    spec_ = *spec;
    open();
  }
  void TearDown() override {
    clearFaultsForTest();
    table_.reset();
    fs::remove_all(dir_);
  }

  void open(TableReplicaOptions options = {}) {
    table_.reset();
    options.background = false;
    registry_ = std::make_unique<prometheus::Registry>();
    auto server = server_;
    auto hooks = hooks_;
    auto opened = TableReplica::open(
        spec_,
        [server, hooks]() -> KeeperResult<std::unique_ptr<Keeper>> {
          return testing::hookKeeper(std::shared_ptr<Keeper>(server->connect()), hooks);
        },
        *registry_, options);
    ASSERT_TRUE(opened) << opened.error();
    table_ = std::move(*opened);
  }

  // Rows (date, x) with s = "v<x>".
  Block rows(std::vector<std::pair<std::string, uint64_t>> values) {
    Block block = spec_.schema.emptyBlock();
    for (const auto& [date, x] : values) {
      std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*parseDate(date));
      std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(x);
      std::get<std::vector<std::string>>(block.columns[2].values).push_back(fmt::format("v{}", x));
      block.columns[2].null_map.push_back(0);
    }
    return block;
  }

  std::expected<InsertResult, InsertError> insert(Block block, std::string token = "") {
    auto pending = table_->beginInsert(InsertOptions{token});
    EXPECT_TRUE(pending->add(std::move(block)));
    return table_->commit(*pending);
  }

  // Three single-row parts, held (no checkpoint for an hour), merged by one background round.
  // Returns the options, for reopening.
  TableReplicaOptions mergeThreeHeldParts() {
    TableReplicaOptions options;
    options.replication.merge_min_parts = 3;
    options.replication.merge_max_parts = 3;
    options.parts.checkpoint_interval = std::chrono::hours(1);
    open(options);
    for (uint64_t x = 1; x <= 3; ++x) EXPECT_TRUE(insert(rows({{"2026-12-01", x}})));
    EXPECT_EQ(table_->runBackgroundRoundForTest(), 1u);
    return options;
  }

  // Merges of exactly three neighbouring parts, and blocks 0 and 1 inserted here (2 was reserved
  // and given up, a gap): a test then says which block 3 is and which runs of three may be merged.
  void openMergingThreeWithTwoBlocks() {
    TableReplicaOptions options;
    options.replication.merge_min_parts = 3;
    options.replication.merge_max_parts = 3;
    // Reserves released at once: the tests place other inserts' locks themselves.
    options.replication.reserve_idle = std::chrono::milliseconds(0);
    open(options);
    ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));      // block 0
    ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));      // block 1
    ASSERT_EQ(table_->runBackgroundRoundForTest(), 0u);  // gives block 2's reserve up
  }
  // The next block of partition 202612, allocated (locked, not committed) for `replica`.
  BlockNumberLock holdNextBlock(const TablePaths& replica) {
    BlockNumberAllocator allocator(replica);
    auto held = allocator.allocate(*observer_, "202612", "202612_77_77");
    EXPECT_TRUE(held && std::holds_alternative<BlockNumberLock>(*held));
    return held && std::holds_alternative<BlockNumberLock>(*held) ? std::get<BlockNumberLock>(*held)
                                                                  : BlockNumberLock{};
  }

  // The value of the replica's metric `name` (a gauge or a counter).
  double metric(const std::string& name) const {
    for (const auto& family : registry_->Collect()) {
      if (family.name != name || family.metric.empty()) continue;
      const auto& sample = family.metric.front();
      return family.type == prometheus::MetricType::Counter ? sample.counter.value
                                                            : sample.gauge.value;
    }
    ADD_FAILURE() << "no metric " << name;
    return -1;
  }

  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  // A clock a test may give the replica: a member, so that it outlives the replica TearDown stops.
  common::testing::FakeClock fake_clock_;
  // Every session of the replica goes through these; a test sets them to step in.
  std::shared_ptr<testing::KeeperHooks> hooks_ = std::make_shared<testing::KeeperHooks>();
  std::unique_ptr<Keeper> observer_ = server_->connect();
  fs::path dir_;
  TableSpec spec_;
  std::unique_ptr<prometheus::Registry> registry_;
  std::unique_ptr<TableReplica> table_;
  TablePaths paths_{"/rtable/tables/events", 1, "r1"};
};

TEST_F(TableReplicaTest, AnInsertIsVisibleAndARetryIsDeduplicated) {
  auto first = insert(rows({{"2026-12-01", 2}, {"2026-12-02", 1}, {"2026-11-30", 3}}));
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->rows, 3u);
  EXPECT_EQ(first->blocks, 2u);  // two months
  EXPECT_EQ(first->deduplicated_blocks, 0u);
  EXPECT_EQ(first->parts, (std::vector<std::string>{"202612_0_0_0", "202611_0_0_0"}));
  EXPECT_EQ(table_->rowCount(), 3u);
  EXPECT_EQ(observer_->children(paths_.log())->names.size(), 2u);

  auto retry = insert(rows({{"2026-12-01", 2}, {"2026-12-02", 1}, {"2026-11-30", 3}}));
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->rows, 0u);
  EXPECT_EQ(retry->deduplicated_blocks, 2u);
  EXPECT_EQ(retry->parts, first->parts);
  EXPECT_EQ(table_->rowCount(), 3u);
  // The same rows in another order are the same part after sorting: deduplicated too.
  auto reordered = insert(rows({{"2026-12-02", 1}, {"2026-12-01", 2}}));
  ASSERT_TRUE(reordered);
  EXPECT_EQ(reordered->deduplicated_blocks, 1u);
  EXPECT_TRUE(fs::is_empty(dir_ / "staging"));
}

// A commit that takes a second or more is counted (and logged with its time split): here
// ZooKeeper's answer to the commit multi (the one creating the log entry) is held 1.1 s.
TEST_F(TableReplicaTest, ASlowCommitIsCounted) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  EXPECT_EQ(metric("rtable_slow_insert_commits_total"), 0);
  bool held = false;
  hooks_->after = [&](const testing::KeeperCall& call) {
    if (call.operation != "multi" || !call.ops) return;
    for (const Op& op : *call.ops) {
      const auto* create = std::get_if<op::Create>(&op);
      if (create && create->path.starts_with(paths_.log() + "/log-")) {
        held = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));
        return;
      }
    }
  };
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  hooks_->after = nullptr;
  ASSERT_TRUE(held);
  EXPECT_EQ(metric("rtable_slow_insert_commits_total"), 1);
}

TEST_F(TableReplicaTest, WithATokenTheTokenDecides) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}}), "batch-7"));
  auto same_token_other_rows = insert(rows({{"2026-12-01", 99}}), "batch-7");
  ASSERT_TRUE(same_token_other_rows);
  EXPECT_EQ(same_token_other_rows->deduplicated_blocks, 1u);
  auto other_token_same_rows = insert(rows({{"2026-12-01", 1}}), "batch-8");
  ASSERT_TRUE(other_token_same_rows);
  EXPECT_EQ(other_token_same_rows->deduplicated_blocks, 0u);
  EXPECT_EQ(table_->rowCount(), 2u);
}

TEST_F(TableReplicaTest, StartReconcilesDiskWithZooKeeper) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  table_.reset();
  // A part written but never committed (a crash before the commit multi) ...
  fs::copy(dir_ / "202612_1_1_0", dir_ / "202612_5_5_0", fs::copy_options::recursive);
  // ... a committed part whose directory is gone, long after a checkpoint emptied the journal ...
  fs::remove_all(dir_ / "202612_0_0_0");
  fs::remove_all(dir_ / "journal");
  // ... and an insert that was still staging.
  fs::create_directories(dir_ / "staging" / "insert-3" / "x");
  open();
  EXPECT_TRUE(fs::exists(dir_ / "detached" / "unexpected_202612_5_5_0"));
  EXPECT_FALSE(fs::exists(dir_ / "staging" / "insert-3"));
  auto state = table_->state();
  EXPECT_EQ(state.unexpected_parts, std::vector<std::string>{"202612_5_5_0"});
  EXPECT_EQ(state.lost_parts, std::vector<std::string>{"202612_0_0_0"});
  // The lost part is no longer listed for this replica, and a fetch of it is queued.
  EXPECT_FALSE(*observer_->exists(paths_.part("202612_0_0_0")));
  ASSERT_EQ(state.queue.size(), 1u);
  EXPECT_EQ(state.queue[0].entry.type, LogEntry::Type::kGetPart);
  EXPECT_EQ(state.queue[0].entry.new_part_name, "202612_0_0_0");
  EXPECT_EQ(state.active_parts, 1u);
  EXPECT_EQ(table_->rowCount(), 1u);
  ASSERT_TRUE(state.log);
  EXPECT_EQ(state.log->maxIndex(), 1);
}

TEST_F(TableReplicaTest, MergesReplaceSmallPartsAndKeepTheRows) {
  TableReplicaOptions options;
  options.replication.merge_min_parts = 3;
  options.replication.merge_max_parts = 3;
  open(options);
  for (uint64_t x = 10; x > 5; --x) ASSERT_TRUE(insert(rows({{"2026-12-01", x}})));
  ASSERT_TRUE(insert(rows({{"2026-11-01", 1}})));
  EXPECT_EQ(table_->activeParts().size(), 6u);
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 1u);
  auto parts = table_->activeParts();
  std::vector<std::string> names;
  for (const auto& p : parts) names.push_back(p->name.format());
  EXPECT_EQ(names, (std::vector<std::string>{"202611_0_0_0", "202612_0_2_1", "202612_3_3_0",
                                             "202612_4_4_0"}));
  EXPECT_EQ(table_->rowCount(), 6u);
  EXPECT_FALSE(fs::exists(dir_ / "202612_0_0_0"));
  // The merge went through the log, and ZooKeeper lists the merged part instead of its sources.
  auto zk_parts = observer_->children(paths_.parts())->names;
  std::sort(zk_parts.begin(), zk_parts.end());
  EXPECT_EQ(zk_parts, names);
  EXPECT_EQ(observer_->children(paths_.log())->names.size(), 7u);
  // The merged part holds the rows sorted by x.
  auto merged = readDataPart(*parts[1], spec_.schema);
  ASSERT_TRUE(merged) << merged.error();
  EXPECT_EQ(std::get<std::vector<uint64_t>>(merged->columns[1].values),
            (std::vector<uint64_t>{8, 9, 10}));
  // A restart keeps the merged part and nothing else.
  open(options);
  EXPECT_EQ(table_->rowCount(), 6u);
  EXPECT_TRUE(table_->state().unexpected_parts.empty());
  auto on_disk = readPart(dir_ / "202612_0_2_1", spec_.schema);
  ASSERT_TRUE(on_disk) << on_disk.error();
  EXPECT_EQ(std::get<std::vector<uint64_t>>(on_disk->columns[1].values),
            (std::vector<uint64_t>{8, 9, 10}));
}

// A merge whose registration was applied but got no answer runs again before a full round asked
// ZooKeeper about it (the queue runs on every wake; uncertain parts are asked about once a
// period). The earlier attempt is settled first. Before, the second registration, refused (the
// part node is there), discarded what both attempts share (the directory, the held part), and
// the first was then published without its files: the part was lost on this replica.
TEST_F(TableReplicaTest, AMergeRunAgainBeforeItsLostAnswerIsResolvedKeepsTheMergedPart) {
  TableReplicaOptions options;
  options.replication.merge_min_parts = 3;
  options.replication.merge_max_parts = 3;
  open(options);
  for (uint64_t x = 3; x >= 1; --x) ASSERT_TRUE(insert(rows({{"2026-12-01", x}})));
  const std::string merged = "202612_0_2_1";
  bool lost = false;
  hooks_->before = [&](const testing::KeeperCall& call) -> std::optional<KeeperError> {
    if (lost || call.operation != "multi" || call.path != paths_.part(merged)) return std::nullopt;
    lost = true;
    EXPECT_TRUE(observer_->multi(*call.ops));  // applied; the answer is lost
    return KeeperError{KeeperCode::kConnectionLoss, call.path, "connection lost", {}};
  };
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 0u);
  hooks_->before = nullptr;
  ASSERT_TRUE(lost);
  EXPECT_EQ(table_->state().uncertain_parts, std::vector<std::string>{merged});
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the failed entry's backoff
  table_->executeQueueForTest();
  EXPECT_TRUE(table_->state().queue.empty());
  EXPECT_TRUE(table_->state().uncertain_parts.empty());
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(table_->rowCount(), 3u);
  auto part = table_->activePart(*PartName::parse(merged));
  ASSERT_NE(part, nullptr);
  auto read = readDataPart(*part, spec_.schema);
  ASSERT_TRUE(read) << read.error();
  EXPECT_EQ(std::get<std::vector<uint64_t>>(read->columns[1].values),
            (std::vector<uint64_t>{1, 2, 3}));
  // A restart finds it too, on disk or in the journal.
  open(options);
  EXPECT_EQ(table_->rowCount(), 3u);
  EXPECT_TRUE(table_->state().lost_parts.empty());
  EXPECT_NE(table_->activePart(*PartName::parse(merged)), nullptr);
}

// Opened frozen (TableHost does so until it knows whether a table swap runs): no merge is
// assigned from the first background round on, until merges are unfrozen.
TEST_F(TableReplicaTest, OpenedWithMergesFrozenItAssignsNoneUntilUnfrozen) {
  TableReplicaOptions options;
  options.replication.merge_min_parts = 3;
  for (uint64_t x = 1; x <= 4; ++x) ASSERT_TRUE(insert(rows({{"2026-12-01", x}})));
  options.merges_frozen = true;
  open(options);
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 0u);
  EXPECT_EQ(table_->activeParts().size(), 4u);
  table_->freezeMerges(false);
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 1u);
  EXPECT_LT(table_->activeParts().size(), 4u);
}

TEST_F(TableReplicaTest, ARoundAssignsSeveralDisjointMerges) {
  TableReplicaOptions options;
  options.replication.merge_min_parts = 3;
  options.replication.merge_max_parts = 3;
  options.replication.max_queued_merges = 2;
  open(options);
  for (uint64_t x = 0; x < 9; ++x) ASSERT_TRUE(insert(rows({{"2026-12-01", x}})));
  // Nine parts, windows of three, at most two merges queued: two merges in one round.
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 2u);
  std::vector<std::string> names;
  for (const auto& p : table_->activeParts()) names.push_back(p->name.format());
  EXPECT_EQ(names.size(), 5u);
  EXPECT_EQ(table_->rowCount(), 9u);
  EXPECT_EQ(table_->checkQueueInvariant(), "");
}

TEST_F(TableReplicaTest, MergesNeverCoverABlockThatAnInsertStillHolds) {
  openMergingThreeWithTwoBlocks();
  // Another insert (another replica's, say) holds block 3 and has not committed.
  const BlockNumberLock lock = holdNextBlock(paths_);
  ASSERT_EQ(lock.block_number, 3);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 3}})));  // block 4
  ASSERT_TRUE(insert(rows({{"2026-12-01", 4}})));  // block 5, reserved by the one before
  // Every run of three neighbours spans block 3: merging would hide its rows when it commits.
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 0u);
  EXPECT_EQ(table_->activeParts().size(), 4u);
  // Given up: the gap is final, and merging across it is fine.
  ASSERT_TRUE(observer_->remove(lock.path));
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 1u);
  EXPECT_EQ(table_->rowCount(), 4u);
}

// A pull whose multi ZooKeeper applied without the answer reaching us (a restart, a dropped
// connection) created queue nodes that memory never got. Before they were reloaded, the leader
// merged across such an entry's block and every replica lost its rows (seen in CI).
TEST_F(TableReplicaTest, APullWhoseAnswerWasLostStillQueuesItsEntries) {
  openMergingThreeWithTwoBlocks();
  // Replica r2 commits block 3; r1 (this replica, the leader) has to fetch it.
  TablePaths r2 = paths_;
  r2.replica = "r2";
  ASSERT_TRUE(createReplicaIfNotExists(*observer_, r2));
  const BlockNumberLock lock = holdNextBlock(r2);
  ASSERT_EQ(lock.block_number, 3);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 3}})));  // block 4
  // Pulled up to here (own entries only); block 3 is still locked, so nothing is merged.
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 0u);
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.source_replica = "r2";
  entry.block_id = "202612_77_77";
  entry.new_part_name = "202612_3_3_0";
  ASSERT_TRUE(commitPart(*observer_, r2, entry, lock));

  server_->loseNextMultiAnswersForTest(1);  // the pull's multi: applied, unanswered
  // Blocks 0, 1 and 4 are here, 3 is not: no run of three neighbours may be merged.
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 0u);
  EXPECT_EQ(table_->runBackgroundRoundForTest(), 0u);
  const auto state = table_->state();
  ASSERT_EQ(state.queue.size(), 1u);
  EXPECT_EQ(state.queue[0].entry.new_part_name, "202612_3_3_0");
  EXPECT_EQ(table_->checkQueueInvariant(), "");
}

TEST_F(TableReplicaTest, AnExhaustedLogStopsInsertsWithAClearError) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_TRUE(server_->setSequentialCounterForTest(paths_.log(), 2147483647));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));  // takes log-2147483647
  auto stuck = insert(rows({{"2026-12-01", 3}}));
  ASSERT_FALSE(stuck);
  EXPECT_EQ(stuck.error().kind, InsertError::Kind::kLogExhausted);
  EXPECT_NE(stuck.error().message.find("2147483647"), std::string::npos);
  EXPECT_EQ(table_->rowCount(), 2u);
  EXPECT_FALSE(fs::exists(dir_ / "202612_2_2_0"));
  auto state = table_->state();
  EXPECT_TRUE(state.log && state.log->exhausted());
}

TEST_F(TableReplicaTest, ZooKeeperTroubleFailsTheInsertAndWritesNothing) {
  server_->failNextRequestsForTest(1);
  auto failed = insert(rows({{"2026-12-01", 1}}));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().kind, InsertError::Kind::kUnavailable);
  EXPECT_NE(failed.error().message.find("retrying the same insert is safe"), std::string::npos);
  EXPECT_EQ(table_->rowCount(), 0u);
  auto retried = insert(rows({{"2026-12-01", 1}}));
  ASSERT_TRUE(retried);
  EXPECT_EQ(retried->rows, 1u);
}

// Reserves released at once, so that each insert allocates its block number in a multi of its own.
void releaseReserves(TableReplica& table) {
  table.runBackgroundRoundForTest();
}

TEST_F(TableReplicaTest, ACommitLostWithTheConnectionGivesItsBlockLockUp) {
  TableReplicaOptions options;
  options.replication.reserve_idle = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  releaseReserves(*table_);
  // The allocation goes through; the commit is lost with the connection, and the session lives on.
  server_->failNextRequestsForTest(1, 1);
  auto failed = insert(rows({{"2026-12-01", 2}}));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().kind, InsertError::Kind::kUnavailable);
  EXPECT_NE(failed.error().message.find("not committed"), std::string::npos)
      << failed.error().message;
  // Left in place, the lock would keep merges off block 1 for as long as the session lives.
  EXPECT_TRUE(observer_->children(paths_.blockNumbers("202612"))->names.empty());
  EXPECT_FALSE(fs::exists(dir_ / "202612_1_1_0"));
  auto retried = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(retried) << retried.error().message;
  EXPECT_EQ(retried->rows, 1u);
  EXPECT_EQ(table_->rowCount(), 2u);
}

// The same with the number the last commit reserved: there is no allocation, the commit is lost.
TEST_F(TableReplicaTest, ACommitLostWithTheConnectionGivesItsReservedBlockUp) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_EQ(observer_->children(paths_.blockNumbers("202612"))->names.size(), 1u);  // the reserve
  server_->failNextRequestsForTest(1);
  auto failed = insert(rows({{"2026-12-01", 2}}));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().kind, InsertError::Kind::kUnavailable);
  EXPECT_TRUE(observer_->children(paths_.blockNumbers("202612"))->names.empty());
  auto retried = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(retried) << retried.error().message;
  EXPECT_EQ(retried->rows, 1u);
  EXPECT_EQ(table_->rowCount(), 2u);
}

TEST_F(TableReplicaTest, AnAllocationLostWithTheConnectionGivesItsBlockLockUp) {
  TableReplicaOptions options;
  options.replication.reserve_idle = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  releaseReserves(*table_);
  // The allocation is applied, its answer lost; the session lives on.
  server_->loseNextMultiAnswersForTest(1);
  auto failed = insert(rows({{"2026-12-01", 2}}));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().kind, InsertError::Kind::kUnavailable);
  ASSERT_EQ(observer_->children(paths_.blockNumbers("202612"))->names.size(), 1u);
  // Left in place, the lock would keep merges off block 1 for as long as the session lives.
  table_->runBackgroundRoundForTest();
  EXPECT_TRUE(observer_->children(paths_.blockNumbers("202612"))->names.empty());
  auto retried = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(retried) << retried.error().message;
  EXPECT_EQ(retried->rows, 1u);
  EXPECT_EQ(table_->rowCount(), 2u);
}

// Bytes of journal records under the table's journal directory (files may have a zero-filled rest).
uint64_t journalBytes(const fs::path& data_dir) {
  uint64_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(data_dir / "journal")) {
    for (const auto& part : decodeJournal(common::testing::readFile(entry.path())).parts)
      bytes += part.encodeRecord().size();
  }
  return bytes;
}

// A single-row part is written without fsync and journaled. A power loss can take such a part's
// files after the commit; the journal gives them back on start, or the acknowledged row is gone.
TEST_F(TableReplicaTest, ACommittedPartLostWithThePageCacheIsWrittenAgainFromTheJournal) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::hours(1);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  EXPECT_GT(journalBytes(dir_), 0u);
  // Held in memory: a crash now leaves no directory of either part.
  EXPECT_FALSE(fs::exists(dir_ / "202612_0_0_0"));
  EXPECT_FALSE(fs::exists(dir_ / "202612_1_1_0"));
  // A crash leaves the journal as it is; a clean stop would checkpoint it.
  fs::copy(dir_ / "journal", dir_ / "journal-at-crash");
  table_.reset();
  EXPECT_EQ(journalBytes(dir_), 0u);
  fs::remove_all(dir_ / "journal");
  fs::rename(dir_ / "journal-at-crash", dir_ / "journal");
  ASSERT_TRUE(fs::remove_all(dir_ / "202612_1_1_0") > 0);
  fs::resize_file(dir_ / "202612_0_0_0" / "x.bin", 3);
  open(options);
  EXPECT_EQ(table_->rowCount(), 2u);
  const ReplicaState state = table_->state();
  EXPECT_TRUE(state.broken_parts.empty());
  EXPECT_TRUE(state.lost_parts.empty());
  // Start-up leaves the parts durable by themselves and the journal empty.
  EXPECT_EQ(journalBytes(dir_), 0u);
}

TEST_F(TableReplicaTest, TheJournalIsCheckpointedInTheBackgroundAndSkipsBigParts) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  EXPECT_GT(journalBytes(dir_), 0u);
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(journalBytes(dir_), 0u);
  options.parts.journal_part_bytes = 0;  // every part is "big": its files are fsynced instead
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  EXPECT_EQ(journalBytes(dir_), 0u);
  EXPECT_EQ(table_->rowCount(), 2u);
}

// Part directories in the table's data directory.
std::vector<std::string> partDirs(const fs::path& data_dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(data_dir)) {
    const std::string name = entry.path().filename().string();
    if (PartName::parse(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A small part's durability is its journal record on this replica's disk: nothing of its rows
// goes into ZooKeeper, which every table shares and which holds every node in memory.
TEST_F(TableReplicaTest, ASmallInsertIsJournaledHereAndNothingOfItGoesToZooKeeper) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::hours(1);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 7}})));
  EXPECT_GT(journalBytes(dir_), 0u);
  EXPECT_TRUE(partDirs(dir_).empty());
  EXPECT_FALSE(observer_->exists(paths_.partImages())->has_value());
  // Its parts node holds the part's 32-hex-digit checksum (what fetches are checked against),
  // never its rows.
  EXPECT_EQ(observer_->get(paths_.part("202612_0_0_0"))->data.size(), 32u);
  EXPECT_EQ(table_->rowCount(), 1u);
}

// rtable up to 2026-12-04 kept small parts in ZooKeeper (replicas/<me>/part_images/<part>) until a
// checkpoint wrote them out. A replica stopped with some there is upgraded: start-up writes the
// committed ones out, fsynced, and removes the node with every image, also one of a part
// ZooKeeper no longer lists (a merge or a drop took it), which is not restored.
TEST_F(TableReplicaTest, PartImagesAnEarlierVersionLeftInZooKeeperAreWrittenOutOnStartAndRemoved) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::hours(1);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  // The journal records are the images' format.
  std::map<std::string, std::string> images;
  for (const auto& entry : fs::directory_iterator(dir_ / "journal")) {
    for (const auto& part : decodeJournal(common::testing::readFile(entry.path())).parts) {
      images[part.name] = part.encodeRecord();
    }
  }
  ASSERT_EQ(images.size(), 2u);
  // As the earlier version left it after a crash: the parts only in ZooKeeper.
  table_.reset();
  for (const auto& dir : partDirs(dir_)) fs::remove_all(dir_ / dir);
  ASSERT_TRUE(observer_->create(paths_.partImages(), "", CreateMode::kPersistent));
  for (const auto& [name, data] : images) {
    ASSERT_TRUE(observer_->create(paths_.partImage(name), data, CreateMode::kPersistent));
  }
  ASSERT_TRUE(observer_->create(paths_.partImage("202612_5_5_0"), images.begin()->second,
                                CreateMode::kPersistent));
  open(options);
  EXPECT_EQ(table_->rowCount(), 2u);
  EXPECT_EQ(partDirs(dir_), (std::vector<std::string>{"202612_0_0_0", "202612_1_1_0"}));
  for (const auto& dir : partDirs(dir_)) EXPECT_TRUE(verifyPart(dir_ / dir, spec_.schema)) << dir;
  EXPECT_FALSE(observer_->exists(paths_.partImages())->has_value());
  const ReplicaState state = table_->state();
  EXPECT_TRUE(state.lost_parts.empty());
  EXPECT_TRUE(state.unexpected_parts.empty());
}

TEST_F(TableReplicaTest, ASmallPartIsHeldInMemoryUntilACheckpointWritesItOut) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 7}})));
  auto held = table_->activeParts();
  ASSERT_EQ(held.size(), 1u);
  ASSERT_TRUE(held[0]->image);
  EXPECT_TRUE(partDirs(dir_).empty());
  auto read = readDataPart(*held[0], spec_.schema);
  ASSERT_TRUE(read) << read.error();
  EXPECT_EQ(std::get<std::vector<uint64_t>>(read->columns[1].values), std::vector<uint64_t>{7});

  table_->runBackgroundRoundForTest();
  auto written = table_->activeParts();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_FALSE(written[0]->image);
  EXPECT_EQ(written[0]->rows, 1u);
  auto verified = verifyPart(dir_ / "202612_0_0_0", spec_.schema);
  ASSERT_TRUE(verified) << verified.error();
  EXPECT_EQ(*verified, held[0]->checksums);  // the bytes it had in memory
  EXPECT_EQ(journalBytes(dir_), 0u);
  // A reader that took the part before keeps its image.
  EXPECT_TRUE(readDataPart(*held[0], spec_.schema));
}

// A checkpoint that cannot write its parts out keeps them held and the journal whole, and the
// metrics say so: an alert can tell a journal that only grows.
TEST_F(TableReplicaTest, AFailedCheckpointKeepsThePartsHeldAndTheMetricsShowIt) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-11-30", 1}})));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  // Where the checkpoint writes held parts before renaming them in: a file in its way.
  fs::remove_all(dir_ / "staging");
  common::testing::writeFile(dir_ / "staging", "in the way");
  ASSERT_TRUE(fs::is_regular_file(dir_ / "staging"));

  table_->runBackgroundRoundForTest();
  EXPECT_EQ(metric("rtable_part_journal_checkpoint_failures_total"), 1);
  EXPECT_EQ(metric("rtable_parts_in_memory"), 2);
  EXPECT_EQ(metric("rtable_part_journal_bytes"), static_cast<double>(journalBytes(dir_)));
  EXPECT_GT(journalBytes(dir_), 0u);
  EXPECT_TRUE(partDirs(dir_).empty());
  EXPECT_EQ(table_->rowCount(), 2u);

  fs::remove(dir_ / "staging");
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(metric("rtable_part_journal_checkpoint_failures_total"), 1);
  EXPECT_EQ(metric("rtable_parts_in_memory"), 0);
  EXPECT_EQ(metric("rtable_part_journal_bytes"), 0);
  EXPECT_EQ(journalBytes(dir_), 0u);
  EXPECT_EQ(partDirs(dir_), (std::vector<std::string>{"202611_0_0_0", "202612_0_0_0"}));
}

// Memory stays bounded: past held_parts_max_bytes a small part is written as files, fsynced, and
// the next background round checkpoints early.
TEST_F(TableReplicaTest, PastTheHeldBytesLimitSmallPartsAreWrittenAndACheckpointStartsEarly) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::hours(1);
  options.parts.held_parts_max_bytes = 1;
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-11-30", 1}})));
  EXPECT_TRUE(partDirs(dir_).empty());  // held: nothing was held before it
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  EXPECT_EQ(partDirs(dir_), std::vector<std::string>{"202612_0_0_0"});  // full: written
  EXPECT_EQ(table_->rowCount(), 2u);
  const uint64_t journaled = journalBytes(dir_);
  EXPECT_GT(journaled, 0u);

  table_->runBackgroundRoundForTest();  // an hour early
  EXPECT_EQ(partDirs(dir_), (std::vector<std::string>{"202611_0_0_0", "202612_0_0_0"}));
  EXPECT_EQ(journalBytes(dir_), 0u);
  EXPECT_EQ(metric("rtable_parts_in_memory"), 0);
  EXPECT_EQ(metric("rtable_parts_in_memory_bytes"), 0);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 3}})));
  EXPECT_EQ(partDirs(dir_).size(), 2u);  // room again: held
  table_->runBackgroundRoundForTest();   // not due: the hour has not passed, and there is room
  EXPECT_EQ(partDirs(dir_).size(), 2u);
  EXPECT_EQ(metric("rtable_parts_in_memory"), 1);
  EXPECT_GT(metric("rtable_parts_in_memory_bytes"), 0);
  EXPECT_EQ(table_->rowCount(), 3u);
}

TEST_F(TableReplicaTest, HeldPartsThatAMergeTakesAreNeverWrittenOut) {
  const TableReplicaOptions options = mergeThreeHeldParts();
  // The merge's small result is held and journaled too.
  EXPECT_TRUE(partDirs(dir_).empty());
  ASSERT_EQ(table_->activeParts().size(), 1u);
  EXPECT_TRUE(table_->activeParts()[0]->image);
  table_.reset();  // a clean stop checkpoints: only the part still held is written
  EXPECT_EQ(partDirs(dir_), std::vector<std::string>{"202612_0_2_1"});
  open(options);
  EXPECT_EQ(table_->rowCount(), 3u);
  EXPECT_TRUE(table_->state().unexpected_parts.empty());
}

// A merge result held in memory is as durable as a synced part: after a crash that took the
// directory the checkpoint would have written, the journal gives it back. Its sources, which
// ZooKeeper no longer lists for this replica, are not restored.
TEST_F(TableReplicaTest, AHeldMergeResultIsWrittenAgainFromTheJournalAfterACrash) {
  const TableReplicaOptions options = mergeThreeHeldParts();
  EXPECT_TRUE(partDirs(dir_).empty());
  fs::copy(dir_ / "journal", dir_ / "journal-at-crash");
  table_.reset();
  fs::remove_all(dir_ / "202612_0_2_1");
  fs::remove_all(dir_ / "journal");
  fs::rename(dir_ / "journal-at-crash", dir_ / "journal");
  open(options);
  EXPECT_EQ(table_->rowCount(), 3u);
  EXPECT_EQ(partDirs(dir_), std::vector<std::string>{"202612_0_2_1"});
  EXPECT_TRUE(table_->state().lost_parts.empty());
  EXPECT_TRUE(table_->state().unexpected_parts.empty());
}

// Inserts and checkpoints at the same time (the sanitizer builds run this too). Afterwards, as a
// crash would find it: every active part has a directory, or its record is in a journal file.
// (The moment a checkpoint meets a commit still running is pinned down by the next test.)
TEST_F(TableReplicaTest, InsertsRacingCheckpointsLeaveEveryPartOnDiskOrInTheJournal) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);
  options.replication.merge_min_parts = 1000;  // parts stay as inserted
  open(options);
  std::atomic<bool> inserting{true};
  std::thread checkpoints([&] {
    while (inserting) table_->runBackgroundRoundForTest();
  });
  std::vector<std::thread> inserters;
  for (int t = 0; t < 3; ++t) {
    inserters.emplace_back([&, t] {
      for (uint64_t i = 0; i < 40; ++i) EXPECT_TRUE(insert(rows({{"2026-12-01", 1000 * t + i}})));
    });
  }
  for (auto& inserter : inserters) inserter.join();
  inserting = false;
  checkpoints.join();
  std::set<std::string> journaled;
  for (const auto& entry : fs::directory_iterator(dir_ / "journal")) {
    for (const auto& part : decodeJournal(common::testing::readFile(entry.path())).parts)
      journaled.insert(part.name);
  }
  const auto active = table_->activeParts();
  EXPECT_EQ(active.size(), 120u);
  std::size_t held = 0;
  for (const auto& part : active) {
    if (part->image) {
      ++held;
      EXPECT_TRUE(journaled.contains(part->name.format()))
          << part->name.format() << " is only in memory";
    } else {
      EXPECT_TRUE(verifyPart(part->dir, spec_.schema)) << part->name.format();
    }
  }
  EXPECT_LT(held, active.size()) << "no checkpoint wrote anything out";
  EXPECT_EQ(table_->rowCount(), 120u);
}

// A commit whose answer was lost leaves its part held and uncertain. The checkpoint that drops
// the part's journal record must write it out first: ZooKeeper may list it (here it does).
TEST_F(TableReplicaTest, ACheckpointWritesOutAHeldPartWhoseCommitIsUncertain) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);  // every round
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));  // block 0, reserves block 1
  server_->loseNextMultiAnswersForTest(1);         // the commit of block 1: applied, unanswered
  server_->failNextRequestsForTest(8, 1);          // and every question about it after that
  auto uncertain = insert(rows({{"2026-12-01", 2}}));
  ASSERT_FALSE(uncertain);
  EXPECT_EQ(uncertain.error().kind, InsertError::Kind::kUnknownOutcome)
      << uncertain.error().message;
  ASSERT_EQ(table_->state().uncertain_parts, std::vector<std::string>{"202612_1_1_0"});
  EXPECT_FALSE(fs::exists(dir_ / "202612_1_1_0"));
  // The round checkpoints first, then learns that the commit was applied.
  table_->runBackgroundRoundForTest();
  EXPECT_TRUE(table_->state().uncertain_parts.empty());
  EXPECT_EQ(journalBytes(dir_), 0u);
  const auto active = table_->activeParts();
  ASSERT_EQ(active.size(), 2u);
  EXPECT_EQ(active[1]->name.format(), "202612_1_1_0");
  EXPECT_FALSE(active[1]->image) << "its journal record is gone: memory must not be its only copy";
  EXPECT_TRUE(verifyPart(dir_ / "202612_1_1_0", spec_.schema));
  EXPECT_EQ(table_->rowCount(), 2u);
}

// A retry refused by the commit (its number came from a reserve, which skips the dedup check)
// wrote nothing, and no checkpoint writes it later.
TEST_F(TableReplicaTest, ABlockTheCommitFoundToBeADuplicateLeavesNoPartBehind) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  auto retried = insert(rows({{"2026-12-01", 1}}));
  ASSERT_TRUE(retried);
  EXPECT_EQ(retried->deduplicated_blocks, 1u);
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(partDirs(dir_), std::vector<std::string>{"202612_0_0_0"});
  EXPECT_EQ(table_->rowCount(), 1u);
}

// A one-part insert's commit reserves the partition's next block number; the next insert into
// it needs one ZooKeeper round trip instead of two.
TEST_F(TableReplicaTest, AOnePartInsertCommitsWithTheBlockNumberTheLastOneReserved) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_EQ(observer_->children(paths_.blockNumbers("202612"))->names,
            std::vector<std::string>{"block-0000000001"});
  const int64_t before = server_->requestCountForTest();
  auto second = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(second);
  EXPECT_EQ(second->parts, std::vector<std::string>{"202612_1_1_0"});
  EXPECT_EQ(server_->requestCountForTest() - before, 1);  // the commit multi alone
  // A retry of it is refused by the commit (its block number was reserved, not checked).
  auto retried = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(retried);
  EXPECT_EQ(retried->deduplicated_blocks, 1u);
  EXPECT_EQ(retried->parts, std::vector<std::string>{"202612_1_1_0"});
  EXPECT_EQ(table_->rowCount(), 2u);
  EXPECT_TRUE(fs::is_empty(dir_ / "staging") || !fs::exists(dir_ / "staging"));
  // Unused, the reserve is given up so that merges can cover the blocks after it.
  TableReplicaOptions options;
  options.replication.reserve_idle = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 3}})));
  EXPECT_EQ(observer_->children(paths_.blockNumbers("202612"))->names.size(), 1u);
  table_->runBackgroundRoundForTest();
  EXPECT_TRUE(observer_->children(paths_.blockNumbers("202612"))->names.empty());
}

TEST_F(TableReplicaTest, AnInsertAfterADropTakesANumberAboveItThoughOneWasReserved) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));  // reserves block 1
  ASSERT_TRUE(table_->dropPartition("202612"));    // removes the reserve with the range
  auto after = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(after->rows, 1u);
  ASSERT_EQ(after->parts.size(), 1u);
  const auto part = PartName::parse(after->parts[0]);
  ASSERT_TRUE(part);
  EXPECT_GT(part->min_block, 1);
  table_->runBackgroundRoundForTest();  // executes the drop
  EXPECT_EQ(table_->rowCount(), 1u);
}

TEST_F(TableReplicaTest, TheDedupWindowForgetsOldIds) {
  spec_.deduplication = DedupWindow{2, std::chrono::seconds(3600)};
  open();
  // A second apart: ids created in the same millisecond would be ordered by name, not by age.
  for (uint64_t x = 1; x <= 3; ++x) {
    server_->setTimeForTest(1'000'000 + static_cast<int64_t>(x) * 1000);
    ASSERT_TRUE(insert(rows({{"2026-12-01", x}})));
  }
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(observer_->children(paths_.dedupHashes())->names.size(), 2u);
  auto again = insert(rows({{"2026-12-01", 1}}));  // forgotten: inserted again
  ASSERT_TRUE(again);
  EXPECT_EQ(again->rows, 1u);
  auto recent = insert(rows({{"2026-12-01", 3}}));  // still remembered
  ASSERT_TRUE(recent);
  EXPECT_EQ(recent->deduplicated_blocks, 1u);
}

TEST_F(TableReplicaTest, AnExpiredSessionIsReplacedAndTheReplicaReactivated) {
  auto is_active = observer_->exists(paths_.isActive());
  ASSERT_TRUE(is_active && *is_active);
  server_->expireSession((*is_active)->ephemeral_owner);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  auto renewed = observer_->exists(paths_.isActive());
  ASSERT_TRUE(renewed && *renewed);
  EXPECT_NE((*renewed)->ephemeral_owner, (*is_active)->ephemeral_owner);
}

// While its session was gone the replica was inactive, and the leader marked it lost. Until it is
// a copy of a live replica it commits nothing: the clone would detach a part the source does not
// have, with its acknowledged rows.
TEST_F(TableReplicaTest, AReplicaMarkedLostWhileWithoutASessionTakesNoInsertUntilCloned) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  ASSERT_EQ(table_->runBackgroundRoundForTest(), 0u);  // pulls its own entry: log_pointer 1
  // r2: live, not lost, with the table's one part: the clone source.
  TablePaths r2 = paths_;
  r2.replica = "r2";
  ASSERT_TRUE(createReplicaIfNotExists(*observer_, r2));
  ASSERT_TRUE(observer_->set(r2.isLost(), "0"));
  ASSERT_TRUE(observer_->set(r2.logPointer(), "1"));
  ASSERT_TRUE(observer_->create(r2.part("202612_0_0_0"), "", CreateMode::kPersistent));
  ASSERT_TRUE(activateReplica(*observer_, r2, "r2:8123"));

  auto is_active = observer_->exists(paths_.isActive());
  ASSERT_TRUE(is_active && *is_active);
  server_->expireSession((*is_active)->ephemeral_owner);
  ASSERT_TRUE(observer_->set(paths_.isLost(), "1"));  // the leader's cleanup, while r1 was away

  auto refused = insert(rows({{"2026-12-01", 2}}));
  ASSERT_FALSE(refused) << "a lost replica committed an insert";
  EXPECT_EQ(refused.error().kind, InsertError::Kind::kUnavailable);
  EXPECT_NE(refused.error().message.find("is lost"), std::string::npos) << refused.error().message;
  EXPECT_FALSE(table_->writable());
  EXPECT_EQ(table_->rowCount(), 1u);

  table_->runBackgroundRoundForTest();  // clones r2
  EXPECT_EQ(observer_->get(paths_.isLost())->data, "0");
  EXPECT_TRUE(table_->writable());
  auto accepted = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(accepted) << accepted.error().message;
  EXPECT_EQ(table_->rowCount(), 2u);
}

// R1, ClickHouse's MergePredicate: a merge takes only parts this replica knew before it read the
// block locks. Here, right after the leader's lock read, another replica allocates block 4 and an
// insert here commits block 5: a merge of parts 2 and 5 (the cheapest) would cover block 4, whose
// insert is still in flight, and its row would never be visible on any replica.
TEST_F(TableReplicaTest, AMergeTakesNoPartThatArrivedAfterTheBlockLocksWereRead) {
  TableReplicaOptions options;
  options.replication.merge_min_parts = 2;
  options.replication.merge_max_parts = 2;
  options.replication.reserve_idle = std::chrono::milliseconds(0);
  open(options);
  auto fifty = [&](uint64_t first) {
    std::vector<std::pair<std::string, uint64_t>> values;
    for (uint64_t x = first; x < first + 50; ++x) values.emplace_back("2026-12-01", x);
    return rows(values);
  };
  // Blocks 0 and 1 (50 rows each) and 2 (one row), each reserving the next number.
  ASSERT_EQ(insert(fifty(0))->parts, std::vector<std::string>{"202612_0_0_0"});
  ASSERT_EQ(insert(fifty(100))->parts, std::vector<std::string>{"202612_1_1_0"});
  ASSERT_EQ(insert(rows({{"2026-12-01", 500}}))->parts, std::vector<std::string>{"202612_2_2_0"});
  bool armed = true;
  BlockNumberLock in_flight;
  std::vector<std::string> here;
  hooks_->after = [&](const testing::KeeperCall& call) {
    if (!armed || call.operation != "children" || call.path != paths_.blockNumbers("202612"))
      return;
    armed = false;
    in_flight = holdNextBlock(TablePaths{paths_.table_root, 1, "r2"});
    auto inserted = insert(rows({{"2026-12-01", 600}}));
    if (inserted) here = inserted->parts;
  };
  // The round gives reserve 3 up, then assigns merges.
  table_->runBackgroundRoundForTest();
  hooks_->after = nullptr;
  ASSERT_FALSE(armed) << "the merge selection never read the block locks";
  ASSERT_EQ(in_flight.block_number, 4);
  ASSERT_EQ(here, std::vector<std::string>{"202612_5_5_0"});
  std::size_t merges = 0;
  auto log = observer_->children(paths_.log());
  ASSERT_TRUE(log);
  for (const auto& node : log->names) {
    auto entry = LogEntry::parse(observer_->get(paths_.log() + "/" + node)->data);
    ASSERT_TRUE(entry);
    if (entry->type != LogEntry::Type::kMergeParts) continue;
    ++merges;
    EXPECT_FALSE(PartName::parse(entry->new_part_name)->contains(PartName{"202612", 4, 4, 0, 0}))
        << entry->new_part_name << " covers block 4, still being inserted elsewhere";
  }
  EXPECT_GT(merges, 0u) << "no merge at all proves nothing";
}

// R2: a killed process's last commit can reach ZooKeeper after the next process started. Start-up
// asks which parts are committed only once the previous session has ended (its is_active gone):
// a commit landing after that question would leave its part listed here and nowhere on disk,
// while a client's retry of the insert is deduplicated against it.
TEST_F(TableReplicaTest, StartUpAsksWhichPartsAreCommittedOnlyAfterThePreviousSessionEnded) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::hours(1);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  table_.reset();
  // What a killed process leaves: its session, alive until it times out, with is_active and a
  // block lock; the part's journal record, appended before the commit was sent; the commit on its
  // way.
  std::shared_ptr<Keeper> old_session = server_->connect();
  ASSERT_TRUE(activateReplica(*old_session, paths_, "host: old\nport: 1\n"));
  BlockNumberAllocator allocator(paths_);
  auto allocated = allocator.allocate(*old_session, "202612", "202612_7_7");
  ASSERT_TRUE(allocated && std::holds_alternative<BlockNumberLock>(*allocated));
  const BlockNumberLock lock = std::get<BlockNumberLock>(*allocated);
  const PartName name{"202612", lock.block_number, lock.block_number, 0, 0};
  auto image = encodePart(spec_.schema, rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(image) << image.error();
  {
    auto journal = PartJournal::open(dir_ / "journal");
    ASSERT_TRUE(journal) << journal.error();
    ASSERT_TRUE((*journal)->append(name.format(), *image));
  }
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.source_replica = "r1";
  entry.block_id = "202612_7_7";
  entry.new_part_name = name.format();
  // The next process starts. Once it has met the old is_active, the old commit lands, and the old
  // session ends.
  std::atomic<bool> met{false};
  hooks_->after = [&](const testing::KeeperCall& call) {
    if (call.operation == "multi" && call.path == paths_.isActive()) met = true;
  };
  std::thread starting([&] { open(options); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!met && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(met);
  auto landed = commitPart(*old_session, paths_, entry, lock);
  EXPECT_TRUE(landed) << landed.error().cause.toString();
  server_->expireSession(old_session->sessionId());
  starting.join();
  hooks_->after = nullptr;
  ASSERT_TRUE(table_);
  EXPECT_EQ(table_->rowCount(), 2u);
  const ReplicaState state = table_->state();
  EXPECT_TRUE(state.unexpected_parts.empty());
  EXPECT_TRUE(state.lost_parts.empty());
}

// A commit whose answer was lost is fenced before it is given up: its block lock goes first, so
// the commit cannot land after the insert was told "not committed" (the client's retry would be
// deduplicated against a part this replica gave up).
TEST_F(TableReplicaTest, AnUnansweredCommitIsFencedBeforeItIsGivenUp) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));
  enum { kCapture, kLand, kDone } step = kCapture;
  std::vector<Op> commit;
  std::optional<bool> landed;
  hooks_->before = [&](const testing::KeeperCall& call) -> std::optional<KeeperError> {
    if (step != kCapture || call.operation != "multi" ||
        !call.path.starts_with(paths_.logEntryPrefix())) {
      return std::nullopt;
    }
    commit = *call.ops;  // sent; the connection drops before ZooKeeper has it
    step = kLand;
    return KeeperError{KeeperCode::kConnectionLoss, call.path, "connection lost", {}};
  };
  hooks_->after = [&](const testing::KeeperCall&) {
    if (step != kLand) return;
    step = kDone;
    landed = observer_->multi(commit).has_value();  // it reaches ZooKeeper after all
  };
  auto lost = insert(rows({{"2026-12-01", 2}}));
  hooks_->before = nullptr;
  hooks_->after = nullptr;
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().kind, InsertError::Kind::kUnavailable) << lost.error().message;
  ASSERT_TRUE(landed.has_value());
  EXPECT_FALSE(*landed) << "the commit landed after the replica gave its part up";
  auto retried = insert(rows({{"2026-12-01", 2}}));
  ASSERT_TRUE(retried) << retried.error().message;
  EXPECT_EQ(retried->deduplicated_blocks, 0u);
  EXPECT_EQ(table_->rowCount(), 2u);
  std::set<std::string> listed;
  auto children = observer_->children(paths_.parts());
  ASSERT_TRUE(children);
  for (const auto& part : children->names) listed.insert(part);
  std::set<std::string> here;
  for (const auto& part : table_->activeParts()) here.insert(part->name.format());
  EXPECT_EQ(listed, here);
}

// B1: a failed sync is never trusted on retry. The kernel may drop pages a failed sync could not
// write, and the next sync then succeeds without them: the held parts stay held (read from
// memory) and the next checkpoint writes them again before their journal records go.
TEST_F(TableReplicaTest, AfterAFailedSyncTheNextCheckpointWritesTheHeldPartsAgain) {
  TableReplicaOptions options;
  options.parts.checkpoint_interval = std::chrono::milliseconds(0);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-11-30", 1}})));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  injectFaultForTest(Fault{FailPoint::kSyncfs, dir_.string(), EIO});
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(faultHitsForTest(), 1u);
  clearFaultsForTest();
  EXPECT_EQ(metric("rtable_part_journal_checkpoint_failures_total"), 1);
  EXPECT_EQ(metric("rtable_parts_in_memory"), 2);
  EXPECT_GT(journalBytes(dir_), 0u);
  for (const auto& part : table_->activeParts()) {
    EXPECT_TRUE(part->image) << part->name.format() << " is read from files no sync made durable";
  }
  // What the failed sync may have lost on the disk: one of the files it was to write.
  ASSERT_EQ(partDirs(dir_), (std::vector<std::string>{"202611_0_0_0", "202612_0_0_0"}));
  fs::resize_file(dir_ / "202612_0_0_0" / "x.bin", 0);
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(metric("rtable_part_journal_checkpoint_failures_total"), 1);
  EXPECT_EQ(metric("rtable_parts_in_memory"), 0);
  EXPECT_EQ(journalBytes(dir_), 0u);
  for (const auto& dir : partDirs(dir_)) EXPECT_TRUE(verifyPart(dir_ / dir, spec_.schema)) << dir;
  table_.reset();
  open(options);
  EXPECT_EQ(table_->rowCount(), 2u);
  EXPECT_TRUE(table_->state().broken_parts.empty());
}

// Time is a seam: checkpoints and reserves follow the injected clock, not the machine's.
TEST_F(TableReplicaTest, CheckpointsAndReservesFollowTheInjectedClock) {
  common::testing::FakeClock& clock = fake_clock_;
  TableReplicaOptions options;
  options.clock = &clock;
  options.parts.checkpoint_interval = std::chrono::seconds(5);
  options.replication.reserve_idle = std::chrono::seconds(1);
  open(options);
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}})));  // block 0, reserves block 1
  const std::vector<std::string> reserve{"block-0000000001"};
  EXPECT_EQ(observer_->children(paths_.blockNumbers("202612"))->names, reserve);
  table_->runBackgroundRoundForTest();
  EXPECT_GT(journalBytes(dir_), 0u) << "checkpointed before its interval";
  EXPECT_EQ(observer_->children(paths_.blockNumbers("202612"))->names, reserve);
  clock.advance(std::chrono::seconds(1));
  table_->runBackgroundRoundForTest();
  EXPECT_TRUE(observer_->children(paths_.blockNumbers("202612"))->names.empty())
      << "the idle reserve stayed";
  EXPECT_GT(journalBytes(dir_), 0u);
  clock.advance(std::chrono::seconds(4));
  table_->runBackgroundRoundForTest();
  EXPECT_EQ(journalBytes(dir_), 0u) << "no checkpoint once its interval passed";
  EXPECT_EQ(table_->rowCount(), 1u);
}

// --- Async inserts: many inserts committed as one part, each deduplicated alone ---------------

class AsyncInsertTest : public TableReplicaTest {
 protected:
  // The pieces an async insert of these rows (with this token) queues.
  std::vector<InsertPiece> pieces(Block block, std::string token = "") {
    auto pending = table_->beginInsert(InsertOptions{std::move(token)});
    EXPECT_TRUE(pending->add(std::move(block)));
    auto taken = pending->takePieces();
    EXPECT_TRUE(taken);
    return taken ? std::move(*taken) : std::vector<InsertPiece>{};
  }
  // Queues each insert, flushes them as one batch, and returns each one's outcome.
  std::vector<std::expected<InsertResult, InsertError>> batch(
      std::vector<std::vector<InsertPiece>> inserts) {
    std::vector<std::shared_ptr<AsyncInsertTicket>> tickets;
    for (auto& insert : inserts) {
      auto ticket = table_->enqueueAsync(std::move(insert), InsertOptions{}, nullptr);
      EXPECT_TRUE(ticket) << ticket.error().message;
      if (ticket) tickets.push_back(*ticket);
    }
    table_->flushAsyncInserts();
    std::vector<std::expected<InsertResult, InsertError>> results;
    for (auto& ticket : tickets) {
      const auto& outcome = ticket->wait();
      EXPECT_EQ(outcome.inserts_in_flush, inserts.size());
      results.push_back(outcome.result);
    }
    return results;
  }
  std::size_t logEntries() { return observer_->children(paths_.log())->names.size(); }
  std::size_t dedupIds() { return observer_->children(paths_.dedupHashes())->names.size(); }

  void SetUp() override {
    TableReplicaTest::SetUp();
    // Only flushAsyncInserts flushes: batches are exactly what a test queued.
    spec_.async_inserts.busy_timeout = std::chrono::hours(1);
    spec_.async_inserts.stale_timeout = std::chrono::milliseconds(0);
    open();
  }
};

TEST_F(AsyncInsertTest, ABatchIsOnePartAndOneLogEntryWithAnIdPerInsert) {
  auto results = batch({pieces(rows({{"2026-12-01", 3}}), "client-a"),
                        pieces(rows({{"2026-12-01", 1}, {"2026-12-02", 2}}), "client-b"),
                        pieces(rows({{"2026-12-03", 4}}))});
  for (const auto& result : results) {
    ASSERT_TRUE(result) << result.error().message;
    EXPECT_EQ(result->parts, std::vector<std::string>{"202612_0_0_0"});
    EXPECT_EQ(result->deduplicated_blocks, 0u);
  }
  EXPECT_EQ(results[1]->rows, 2u);
  EXPECT_EQ(logEntries(), 1u);
  EXPECT_EQ(dedupIds(), 3u);
  EXPECT_EQ(table_->rowCount(), 4u);
  // The part's rows are sorted by the ORDER BY (x), whatever insert they came from.
  auto part = table_->activePart(*PartName::parse("202612_0_0_0"));
  ASSERT_TRUE(part);
  auto block = readDataPart(*part, spec_.schema);
  ASSERT_TRUE(block);
  EXPECT_EQ(std::get<std::vector<uint64_t>>(block->columns[1].values),
            (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST_F(AsyncInsertTest, ARetryInALaterBatchIsADuplicateAndOnlyTheOthersAreCommitted) {
  ASSERT_TRUE(batch({pieces(rows({{"2026-12-01", 1}}), "a")})[0]);
  auto results = batch({pieces(rows({{"2026-12-01", 1}}), "a"),  // the retry
                        pieces(rows({{"2026-12-01", 2}}), "b")});
  ASSERT_TRUE(results[0] && results[1]);
  EXPECT_EQ(results[0]->rows, 0u);
  EXPECT_EQ(results[0]->deduplicated_blocks, 1u);
  EXPECT_EQ(results[0]->parts, std::vector<std::string>{"202612_0_0_0"});  // where its rows are
  EXPECT_EQ(results[1]->rows, 1u);
  ASSERT_EQ(results[1]->parts.size(), 1u);
  EXPECT_NE(results[1]->parts[0], "202612_0_0_0");
  EXPECT_EQ(table_->rowCount(), 2u);
  EXPECT_EQ(logEntries(), 2u);
}

// The id is the one a synchronous insert of the same rows has: a retry is deduplicated across
// the two paths, with a token or by content.
TEST_F(AsyncInsertTest, SynchronousAndAsyncTriesOfOneInsertAreDeduplicatedAgainstEachOther) {
  ASSERT_TRUE(insert(rows({{"2026-12-01", 1}}), "t1"));
  ASSERT_TRUE(insert(rows({{"2026-12-01", 2}})));
  auto results =
      batch({pieces(rows({{"2026-12-01", 1}}), "t1"), pieces(rows({{"2026-12-01", 2}}))});
  for (const auto& result : results) {
    ASSERT_TRUE(result);
    EXPECT_EQ(result->deduplicated_blocks, 1u);
  }
  ASSERT_TRUE(batch({pieces(rows({{"2026-12-01", 3}}), "t3")})[0]);
  auto sync_retry = insert(rows({{"2026-12-01", 3}}), "t3");
  ASSERT_TRUE(sync_retry);
  EXPECT_EQ(sync_retry->deduplicated_blocks, 1u);
  EXPECT_EQ(table_->rowCount(), 3u);
}

TEST_F(AsyncInsertTest, TheSameInsertTwiceInOneBatchIsCommittedOnce) {
  auto results =
      batch({pieces(rows({{"2026-12-01", 1}}), "a"), pieces(rows({{"2026-12-01", 1}}), "a"),
             pieces(rows({{"2026-12-01", 5}}), "b")});
  ASSERT_TRUE(results[0] && results[1] && results[2]);
  EXPECT_EQ(results[0]->rows, 1u);
  EXPECT_EQ(results[1]->rows, 0u);
  EXPECT_EQ(results[1]->deduplicated_blocks, 1u);
  EXPECT_EQ(results[1]->parts, results[0]->parts);
  EXPECT_EQ(table_->rowCount(), 2u);
  EXPECT_EQ(dedupIds(), 2u);
}

// Committed by another replica between this batch's allocation and its commit (a reserved block
// number skips the allocation's check): the commit multi fails on that id, the part is made again
// without it, and the rest commit.
TEST_F(AsyncInsertTest, AnIdCommittedElsewhereBeforeTheCommitIsLeftOutOfThePart) {
  ASSERT_TRUE(batch({pieces(rows({{"2026-12-01", 1}}), "first")})[0]);  // reserves the next number
  auto later = pieces(rows({{"2026-12-01", 2}}), "taken");
  const std::string taken_id = later[0].dedup_id;
  ASSERT_TRUE(
      observer_->create(paths_.dedupHash(taken_id), "202612_9_9_0", CreateMode::kPersistent));
  auto results = batch({pieces(rows({{"2026-12-01", 3}}), "c"), std::move(later),
                        pieces(rows({{"2026-12-01", 4}}), "d")});
  ASSERT_TRUE(results[0] && results[1] && results[2]);
  EXPECT_EQ(results[1]->deduplicated_blocks, 1u);
  EXPECT_EQ(results[1]->parts, std::vector<std::string>{"202612_9_9_0"});
  EXPECT_EQ(results[0]->rows + results[2]->rows, 2u);
  EXPECT_EQ(results[0]->parts, results[2]->parts);
  EXPECT_EQ(table_->rowCount(), 3u);  // 1, 3, 4
  EXPECT_EQ(logEntries(), 2u);
  EXPECT_TRUE(!fs::exists(dir_ / "staging") || fs::is_empty(dir_ / "staging"));
}

TEST_F(AsyncInsertTest, AnInsertSpanningPartitionsGetsAPartInEach) {
  auto results = batch(
      {pieces(rows({{"2026-12-01", 1}, {"2026-11-01", 2}})), pieces(rows({{"2026-11-05", 3}}))});
  ASSERT_TRUE(results[0] && results[1]);
  EXPECT_EQ(results[0]->blocks, 2u);
  EXPECT_EQ(results[0]->parts, (std::vector<std::string>{"202612_0_0_0", "202611_0_0_0"}));
  EXPECT_EQ(results[1]->parts, std::vector<std::string>{"202611_0_0_0"});
  EXPECT_EQ(logEntries(), 2u);
  EXPECT_EQ(dedupIds(), 3u);
}

TEST_F(AsyncInsertTest, WithoutZooKeeperEveryInsertOfTheBatchFailsAndARetryIsSafe) {
  hooks_->before = [](const testing::KeeperCall& call) -> std::optional<KeeperError> {
    if (call.operation != "multi") return std::nullopt;
    return KeeperError{KeeperCode::kConnectionLoss, call.path, "cut by the test", {}};
  };
  auto results =
      batch({pieces(rows({{"2026-12-01", 1}}), "a"), pieces(rows({{"2026-12-01", 2}}), "b")});
  for (const auto& result : results) {
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().kind, InsertError::Kind::kUnavailable) << result.error().message;
  }
  hooks_->before = nullptr;
  table_->runBackgroundRoundForTest();  // releases the allocation's lock
  results = batch({pieces(rows({{"2026-12-01", 1}}), "a"), pieces(rows({{"2026-12-01", 2}}), "b")});
  ASSERT_TRUE(results[0] && results[1]);
  EXPECT_EQ(table_->rowCount(), 2u);
}

}  // namespace
}  // namespace rtable::core
