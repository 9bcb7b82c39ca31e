// Generations of a table (DESIGN.md 2.2, 2.6): a replica opens the generation <root>/active names,
// a second generation opens beside the first, and the first's parts are attached into it by hard
// link through `attach` log entries, once, on every replica: from its own copy where it has one,
// fetched from a replica of the new generation where it does not.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <sys/stat.h>

#include <map>
#include <thread>

#include "rtable/common/testing/files.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/replication_core/fail_points.h"
#include "rtable/replication_core/http_api.h"
#include "rtable/replication_core/replication_log.h"
#include "rtable/replication_core/table_replica.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::core {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr std::string_view kSecret = "generation-secret";
constexpr const char* kRoot = "/rtable/tables/events";

// Replicas of one table on the fake ZooKeeper, each generation of each with its own HTTP server
// (so that a replica of generation 2 can fetch from another's). Parts are files (no held parts).
class TableGenerations : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-generations-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    common::testing::writeFile(root_ / "secret", std::string(kSecret) + "\n");
  }
  void TearDown() override {
    servers_.clear();
    // A later generation first: it may link from the earlier one's parts.
    while (!replicas_.empty()) replicas_.pop_back();
    if (!HasFailure()) fs::remove_all(root_);
  }

  TableSpec spec(const std::string& name, uint16_t port) {
    auto parsed = TableSpec::parseYaml(fmt::format(R"(
table: events
columns: [{{name: d, type: Date}}, {{name: x, type: UInt64}}, {{name: s, type: String}}]
partitionBy: toYYYYMM(d)
orderBy: [x]
zookeeper: {{connect: fake}}
replica: {{name: {}, host: 127.0.0.1}}
ports: {{http: {}}}
dataDir: {}
replication: {{secretFile: {}}}
)",
                                                   name, port, (root_ / name).string(),
                                                   (root_ / "secret").string()));
    EXPECT_TRUE(parsed) << parsed.error();
    return *parsed;
  }

  std::expected<std::unique_ptr<TableReplica>, std::string> tryOpen(const std::string& name,
                                                                    TableReplicaOptions options,
                                                                    uint16_t port = 1) {
    options.parts.journal_part_bytes = 0;
    auto server = server_;
    return TableReplica::open(
        spec(name, port),
        [server]() -> KeeperResult<std::unique_ptr<Keeper>> { return server->connect(); },
        *registries_.emplace_back(std::make_unique<prometheus::Registry>()), options);
  }

  // A replica with its HTTP server.
  TableReplica& open(const std::string& name, TableReplicaOptions options = {}) {
    TableReplica* opened = nullptr;
    for (int attempt = 0; attempt < 5 && !opened; ++attempt) {
      auto port = common::testing::findFreeLoopbackPort();
      EXPECT_TRUE(port) << port.error();
      if (!port) break;
      auto table = tryOpen(name, options, static_cast<uint16_t>(*port));
      EXPECT_TRUE(table) << table.error();
      if (!table) break;
      auto http = ReplicaHttpServer::start(**table, "127.0.0.1", static_cast<uint16_t>(*port), 2);
      if (!http) continue;  // the port was taken meanwhile
      replicas_.push_back(std::move(*table));
      servers_.push_back(std::move(*http));
      opened = replicas_.back().get();
    }
    EXPECT_NE(opened, nullptr);
    return *opened;
  }

  static TableReplicaOptions generation(int64_t g, const TableReplica* attach_from = nullptr) {
    TableReplicaOptions options;
    options.generation = g;
    options.attach_from = attach_from;
    return options;
  }

  static void insert(TableReplica& table, uint64_t x, const std::string& date = "2026-12-01") {
    Block block = table.spec().schema.emptyBlock();
    std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*parseDate(date));
    std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(x);
    std::get<std::vector<std::string>>(block.columns[2].values).push_back(fmt::format("v{}", x));
    auto pending = table.beginInsert({});
    ASSERT_TRUE(pending->add(std::move(block)));
    auto committed = table.commit(*pending);
    ASSERT_TRUE(committed) << committed.error().message;
  }

  // Checksum -> (partition, rows) of every active part: what a generation holds, whatever the
  // parts are named.
  static std::multimap<std::string, std::pair<std::string, uint64_t>> contents(
      TableReplica& table) {
    std::multimap<std::string, std::pair<std::string, uint64_t>> parts;
    for (const auto& part : table.activeParts()) {
      parts.emplace(part->checksums.total.hex(), std::pair(part->name.partition_id, part->rows));
    }
    return parts;
  }

  static ino_t inode(const fs::path& file) {
    struct stat st{};
    EXPECT_EQ(::stat(file.c_str(), &st), 0) << file;
    return st.st_ino;
  }

  std::shared_ptr<testing::FakeKeeperServer> server_ = testing::FakeKeeperServer::create();
  std::unique_ptr<Keeper> observer_ = server_->connect();
  std::vector<std::unique_ptr<prometheus::Registry>> registries_;
  std::vector<std::unique_ptr<TableReplica>> replicas_;
  std::vector<std::unique_ptr<ReplicaHttpServer>> servers_;
  fs::path root_;
};

TEST_F(TableGenerations, AReplicaOpensTheGenerationActiveNames) {
  {
    TableReplica& first = open("r1");
    EXPECT_EQ(first.paths().generation, 1);
    insert(first, 1);
  }
  auto active = observer_->get(std::string(kRoot) + "/active");
  ASSERT_TRUE(active);
  EXPECT_EQ(active->data, "1");
  servers_.clear();
  replicas_.clear();

  // The swap moved the table on: a replica (re)started now serves generation 2, with its files
  // in generation-2/ beside generation 1's.
  ASSERT_TRUE(observer_->set(std::string(kRoot) + "/active", "2", -1));
  TableReplica& second = open("r1");
  EXPECT_EQ(second.paths().generation, 2);
  EXPECT_EQ(second.state().generation, 2);
  EXPECT_EQ(second.rowCount(), 0u);
  insert(second, 2);
  EXPECT_TRUE(fs::exists(root_ / "r1" / "generation-2"));
  auto listed = observer_->children(std::string(kRoot) + "/2/replicas/r1/parts");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->names.size(), 1u);
  // Generation 1's parts stay where they were, untouched by generation 2's store.
  auto old_parts = observer_->children(std::string(kRoot) + "/1/replicas/r1/parts");
  ASSERT_TRUE(old_parts);
  ASSERT_EQ(old_parts->names.size(), 1u);
  EXPECT_TRUE(fs::exists(root_ / "r1" / old_parts->names[0]));
}

TEST_F(TableGenerations, AnActiveValueThatIsNoGenerationIsRefusedClearly) {
  open("r1");
  servers_.clear();
  replicas_.clear();
  ASSERT_TRUE(observer_->set(std::string(kRoot) + "/active", "two", -1));
  auto opened = tryOpen("r1", {});
  ASSERT_FALSE(opened);
  EXPECT_NE(opened.error().find("'two' is not a generation number"), std::string::npos)
      << opened.error();
  EXPECT_NE(opened.error().find("/active"), std::string::npos) << opened.error();
}

TEST_F(TableGenerations, PartsAreAttachedIntoTheNextGenerationByHardLinkOnceOnEveryReplica) {
  TableReplica& r1 = open("r1", generation(1));
  TableReplica& r2 = open("r2", generation(1));
  for (uint64_t x = 1; x <= 4; ++x) insert(r1, x, x % 2 ? "2026-11-01" : "2026-12-01");
  ASSERT_TRUE(r2.syncQueue(30s));
  ASSERT_EQ(contents(r2), contents(r1));

  TableReplica& r1_next = open("r1", generation(2, &r1));
  TableReplica& r2_next = open("r2", generation(2, &r2));
  auto attached = r1_next.attachPartsOf(r1);
  ASSERT_TRUE(attached) << attached.error();
  EXPECT_EQ(attached->attached, 4u);
  EXPECT_EQ(attached->already, 0u);
  ASSERT_TRUE(r2_next.syncQueue(30s));

  // Every replica of generation 2 holds what generation 1 held, under generation 2's own block
  // numbers, in files that are generation 1's (hard links: no data was rewritten).
  EXPECT_EQ(contents(r1_next), contents(r1));
  EXPECT_EQ(contents(r2_next), contents(r1));
  EXPECT_EQ(r2_next.rowCount(), 4u);
  for (auto* pair : {&r1, &r2}) {
    TableReplica& next = pair == &r1 ? r1_next : r2_next;
    for (const auto& part : next.activeParts()) {
      auto old = pair->activePartWithChecksum(part->name.partition_id, part->checksums.total.hex());
      ASSERT_NE(old, nullptr) << part->name.format();
      EXPECT_EQ(inode(part->dir / "x.bin"), inode(old->dir / "x.bin")) << part->dir;
      EXPECT_EQ(part->dir.parent_path(), root_ / next.spec().replica / "generation-2");
    }
  }
  auto log = observer_->children(std::string(kRoot) + "/2/log");
  ASSERT_TRUE(log);
  EXPECT_EQ(log->names.size(), 4u);

  // Again (an operator that crashed after the attach): nothing is attached twice.
  auto again = r1_next.attachPartsOf(r1);
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(again->attached, 0u);
  EXPECT_EQ(again->already, 4u);
  EXPECT_EQ(again->parts, attached->parts);
  ASSERT_TRUE(r2_next.syncQueue(30s));
  EXPECT_EQ(r1_next.rowCount(), 4u);
  EXPECT_EQ(r2_next.rowCount(), 4u);
  log = observer_->children(std::string(kRoot) + "/2/log");
  ASSERT_TRUE(log);
  EXPECT_EQ(log->names.size(), 4u);

  // Generation 2 takes inserts of its own, numbered after the attached parts.
  insert(r2_next, 5);
  ASSERT_TRUE(r1_next.syncQueue(30s));
  EXPECT_EQ(r1_next.rowCount(), 5u);
  EXPECT_EQ(r1.rowCount(), 4u);
}

TEST_F(TableGenerations, AReplicaWithoutTheOldPartFetchesTheAttachedOne) {
  TableReplica& r1 = open("r1", generation(1));
  insert(r1, 1);
  insert(r1, 2);
  TableReplica& r1_next = open("r1", generation(2, &r1));
  // r3 never had generation 1: its attach entries have no local source.
  TableReplica& r3_next = open("r3", generation(2));
  auto attached = r1_next.attachPartsOf(r1);
  ASSERT_TRUE(attached) << attached.error();
  EXPECT_EQ(attached->attached, 2u);
  ASSERT_TRUE(r3_next.syncQueue(30s));
  EXPECT_EQ(contents(r3_next), contents(r1));
  EXPECT_EQ(r3_next.state().queue.size(), 0u);
}

// The swap's write pause grows with the parts attached (issue 20's benchmark): their block
// numbers and log entries go to ZooKeeper in batches, one multi for many parts, not a few round
// trips each. Background work is off, so that every request counted is the attach's.
TEST_F(TableGenerations, ManyPartsAreAttachedInBatchesNotRoundTripsEach) {
  TableReplicaOptions quiet = generation(1);
  quiet.background = false;
  TableReplica& r1 = open("r1", quiet);
  constexpr int kParts = 300;  // one per partition, two batches
  for (int i = 0; i < kParts; ++i) {
    insert(r1, static_cast<uint64_t>(i), fmt::format("{}-{:02d}-01", 2000 + i / 12, 1 + i % 12));
  }
  ASSERT_EQ(r1.activeParts().size(), static_cast<std::size_t>(kParts));
  TableReplicaOptions next = generation(2, &r1);
  next.background = false;
  TableReplica& r1_next = open("r1", next);

  const int64_t before = server_->requestCountForTest();
  auto attached = r1_next.attachPartsOf(r1);
  const int64_t requests = server_->requestCountForTest() - before;
  ASSERT_TRUE(attached) << attached.error();
  EXPECT_EQ(attached->attached, static_cast<std::size_t>(kParts));
  // One listing of the dedup window, and a few writes per batch (one part at a time took a
  // partition node, an allocation and a commit each: three per part; a dedup read per part
  // before the listing).
  EXPECT_LE(requests, 20);
  EXPECT_EQ(contents(r1_next), contents(r1));
  auto log = observer_->children(std::string(kRoot) + "/2/log");
  ASSERT_TRUE(log);
  EXPECT_EQ(log->names.size(), static_cast<std::size_t>(kParts));
}

// A batch's commit applied, its answer lost: every part of it is attached (the locks tell), and
// attaching again attaches none twice.
TEST_F(TableGenerations, ABatchWhoseCommitAnswerIsLostIsAttachedOnce) {
  TableReplicaOptions quiet = generation(1);
  quiet.background = false;
  TableReplica& r1 = open("r1", quiet);
  for (uint64_t x = 1; x <= 6; ++x) insert(r1, x, fmt::format("2026-{:02d}-01", x));
  TableReplicaOptions next = generation(2, &r1);
  next.background = false;
  TableReplica& r1_next = open("r1", next);

  // The partition nodes' multi and the allocation's go through; the commit's answer is lost.
  server_->loseNextMultiAnswersForTest(1, 2);
  auto first = r1_next.attachPartsOf(r1);
  ASSERT_TRUE(first) << first.error();
  EXPECT_EQ(first->attached, 6u);
  auto again = r1_next.attachPartsOf(r1);
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(again->attached, 0u);
  EXPECT_EQ(again->already, 6u);
  EXPECT_EQ(again->parts, first->parts);
  EXPECT_EQ(contents(r1_next), contents(r1));
  for (const auto& part : r1_next.activeParts()) EXPECT_TRUE(fs::exists(part->dir)) << part->dir;
  auto log = observer_->children(std::string(kRoot) + "/2/log");
  ASSERT_TRUE(log);
  EXPECT_EQ(log->names.size(), 6u);
}

// The other replicas' side of the same benchmark: each links the attached parts in from its own
// copies and registers them a batch at a time (one multi for many parts' nodes and queue
// entries, one syncfs and one directory fsync), not a multi and two directory fsyncs a part.
class AttachBatches : public TableGenerations {
 protected:
  // r1 and r2 of generation 1 holding `parts` parts, one per partition; generation 2 open on
  // both, r1's attached. Background work is off everywhere: the test runs r2's rounds.
  void attachOnR1(int parts) {
    TableReplicaOptions quiet = generation(1);
    quiet.background = false;
    r1_ = &open("r1", quiet);
    r2_ = &open("r2", quiet);
    for (int i = 0; i < parts; ++i) {
      insert(*r1_, static_cast<uint64_t>(i),
             fmt::format("{}-{:02d}-01", 2000 + i / 12, 1 + i % 12));
    }
    for (int round = 0; round < 5 && contents(*r2_) != contents(*r1_); ++round)
      r2_->runBackgroundRoundForTest();
    ASSERT_EQ(contents(*r2_), contents(*r1_));
    TableReplicaOptions next = generation(2, r1_);
    next.background = false;
    r1_next_ = &open("r1", next);
    next.attach_from = r2_;
    r2_next_ = &open("r2", next);
    auto attached = r1_next_->attachPartsOf(*r1_);
    ASSERT_TRUE(attached) << attached.error();
    ASSERT_EQ(attached->attached, static_cast<std::size_t>(parts));
  }
  // r2's generation 2 runs rounds (one at least) until its queue is empty (at most `rounds`).
  void drainR2(int rounds) {
    for (int round = 0; round < rounds; ++round) {
      r2_next_->runBackgroundRoundForTest();
      if (r2_next_->state().queue.empty()) return;
      std::this_thread::sleep_for(150ms);  // a failed entry's backoff
    }
    ADD_FAILURE() << "r2's queue of generation 2 is not drained";
  }
  // r2's generation 2 holds what r1 held, each part once, in hard links of r2's own files, with
  // nothing left in staging.
  void expectR2HoldsEveryPartOnce() {
    EXPECT_EQ(contents(*r2_next_), contents(*r1_));
    for (const auto& part : r2_next_->activeParts()) {
      auto old = r2_->activePartWithChecksum(part->name.partition_id, part->checksums.total.hex());
      ASSERT_NE(old, nullptr) << part->name.format();
      EXPECT_EQ(inode(part->dir / "x.bin"), inode(old->dir / "x.bin")) << part->dir;
    }
    auto nodes = observer_->children(std::string(kRoot) + "/2/replicas/r2/parts");
    ASSERT_TRUE(nodes);
    EXPECT_EQ(nodes->names.size(), r1_->activeParts().size());
    const fs::path staging = root_ / "r2" / "generation-2" / "staging";
    std::size_t staged = 0;
    for (std::error_code ec; const auto& entry : fs::directory_iterator(staging, ec)) {
      ADD_FAILURE() << "left in staging: " << entry.path();
      ++staged;
    }
    EXPECT_EQ(staged, 0u);
  }

  TableReplica* r1_ = nullptr;
  TableReplica* r2_ = nullptr;
  TableReplica* r1_next_ = nullptr;
  TableReplica* r2_next_ = nullptr;
};

TEST_F(AttachBatches, AnotherReplicaRegistersAttachedPartsInBatchesNotOneMultiEach) {
  constexpr int kParts = 250;
  attachOnR1(kParts);
  if (HasFatalFailure()) return;
  const int64_t before = server_->requestCountForTest();
  drainR2(3);
  const int64_t requests = server_->requestCountForTest() - before;
  expectR2HoldsEveryPartOnce();
  // Counted per node: one pipelined read per log entry, r2 (the leader here) trimming the dedup
  // window with one pipelined read per id, and a few multis: the queue's nodes and the parts'
  // registration. One entry at a time added a multi per part (3 * kParts and more in all).
  EXPECT_LE(requests, 2 * kParts + 40);
}

TEST_F(AttachBatches, APartThatCannotBeLinkedFailsAloneAndIsLinkedOnItsRetry) {
  attachOnR1(6);
  if (HasFatalFailure()) return;
  const std::string victim = r1_next_->activeParts()[2]->name.format();
  // One part's rename into place fails (a disk error): that part alone is not attached.
  injectFaultForTest(Fault{FailPoint::kRename, "r2/generation-2/" + victim, EIO});
  r2_next_->runBackgroundRoundForTest();
  EXPECT_EQ(faultHitsForTest(), 1u);
  clearFaultsForTest();
  ASSERT_EQ(r2_next_->state().queue.size(), 1u);
  EXPECT_EQ(r2_next_->state().queue[0].entry.new_part_name, victim);
  EXPECT_NE(r2_next_->state().queue[0].last_exception.find("Input/output error"), std::string::npos)
      << r2_next_->state().queue[0].last_exception;
  EXPECT_EQ(r2_next_->activeParts().size(), 5u);
  EXPECT_FALSE(fs::exists(root_ / "r2" / "generation-2" / victim));
  drainR2(5);
  expectR2HoldsEveryPartOnce();
}

TEST_F(AttachBatches, ABatchWhoseRegistrationAnswerIsLostIsRegisteredOnce) {
  attachOnR1(6);
  if (HasFatalFailure()) return;
  // The batch's sync fails first (every entry fails, nothing is left behind), so that the next
  // round's only multi is the registration.
  injectFaultForTest(Fault{FailPoint::kSyncfs, "r2/generation-2", EIO, -1});
  r2_next_->runBackgroundRoundForTest();
  EXPECT_EQ(faultHitsForTest(), 1u);
  clearFaultsForTest();
  EXPECT_TRUE(r2_next_->activeParts().empty());
  for (const auto& part : r1_next_->activeParts())
    EXPECT_FALSE(fs::exists(root_ / "r2" / "generation-2" / part->name.format()));
  ASSERT_EQ(r2_next_->state().queue.size(), 6u);
  std::this_thread::sleep_for(150ms);  // the failed entries' backoff
  // The registration applies, its answer is lost: the parts wait, held, for their nodes to tell.
  server_->loseNextMultiAnswersForTest(1);
  r2_next_->runBackgroundRoundForTest();
  auto nodes = observer_->children(std::string(kRoot) + "/2/replicas/r2/parts");
  ASSERT_TRUE(nodes);
  EXPECT_EQ(nodes->names.size(), 6u);
  EXPECT_EQ(r2_next_->activeParts().size(), 0u);
  drainR2(5);
  expectR2HoldsEveryPartOnce();
}

}  // namespace
}  // namespace rtable::core
