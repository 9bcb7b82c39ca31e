// The cluster backup protocol (seed 001) on a real ZooKeeper 3.8, with three replicas of one table
// in this process (real TableReplicas fetching from each other over HTTP) as the hosts and the
// initiator polled as the operator polls it: barriers, one manifest, each data file written once
// (the writer election under contention: every replica holds every part), incremental reuse,
// error propagation, a dead host, concurrency refusal, and the table swap kept apart.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "rtable/backup/backup_agent.h"
#include "rtable/backup/backup_deletion.h"
#include "rtable/backup/backup_host.h"
#include "rtable/backup/backup_initiator.h"
#include "rtable/backup/backup_manifest.h"
#include "rtable/backup/backup_reader.h"
#include "rtable/backup/filesystem_storage.h"
#include "rtable/backup/replica_backup_source.h"
#include "rtable/backup/restore.h"
#include "rtable/common/testing/files.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/common/testing/wait.h"
#include "rtable/replication_core/http_api.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/table_replica.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/testing/local_zookeeper.h"

namespace rtable::backup {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

core::testing::LocalZooKeeper& zookeeper() {
  static std::unique_ptr<core::testing::LocalZooKeeper> zk = [] {
    auto started = core::testing::LocalZooKeeper::start();
    if (!started) throw std::runtime_error(started.error());
    return std::move(*started);
  }();
  return *zk;
}

core::KeeperFactory zookeeperFactory() {
  return []() -> core::KeeperResult<std::unique_ptr<core::Keeper>> {
    auto client = zookeeper().connect();
    if (!client) return std::unexpected(client.error());
    return std::unique_ptr<core::Keeper>(std::move(*client));
  };
}

// An in-memory destination that counts the writes of each object.
class CountingStorage final : public BackupStorage {
 public:
  std::string location() const override { return "memory://test"; }
  StorageResult<std::optional<uint64_t>> size(const std::string& name) override {
    std::lock_guard lock(mu_);
    auto it = objects_.find(name);
    if (it == objects_.end()) return std::optional<uint64_t>{};
    return std::optional<uint64_t>{it->second.size()};
  }
  StorageResult<void> putFile(const std::string& name, const fs::path& source) override {
    auto bytes = common::testing::readFile(source);
    return putBytes(name, bytes);
  }
  StorageResult<void> putBytes(const std::string& name, std::string_view bytes) override {
    std::lock_guard lock(mu_);
    objects_[name] = std::string(bytes);
    ++writes_[name];
    return {};
  }
  StorageResult<std::string> read(const std::string& name) override {
    std::lock_guard lock(mu_);
    auto it = objects_.find(name);
    if (it == objects_.end()) {
      return std::unexpected(
          StorageError{StorageError::Kind::kNotFound, name + ": no such object"});
    }
    return it->second;
  }
  StorageResult<void> readToFile(const std::string& name, const fs::path& target) override {
    auto bytes = read(name);
    if (!bytes) return std::unexpected(bytes.error());
    common::testing::writeFile(target, *bytes);
    return {};
  }
  StorageResult<std::vector<std::string>> list(const std::string& prefix) override {
    std::lock_guard lock(mu_);
    std::vector<std::string> names;
    for (const auto& [name, _] : objects_) {
      if (name.starts_with(prefix)) names.push_back(name);
    }
    return names;
  }
  StorageResult<void> remove(const std::string& name) override {
    std::lock_guard lock(mu_);
    objects_.erase(name);
    return {};
  }
  std::map<std::string, int> writes() {
    std::lock_guard lock(mu_);
    return writes_;
  }
  void clearWriteCounts() {
    std::lock_guard lock(mu_);
    writes_.clear();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> objects_;
  std::map<std::string, int> writes_;
};

// A source that fails on demand.
class FailingSource final : public BackupTableSource {
 public:
  explicit FailingSource(BackupTableSource& real) : real_(real) {}
  int64_t generation() const override { return real_.generation(); }
  std::string metadataText() const override { return real_.metadataText(); }
  bool catchUp(std::chrono::milliseconds timeout) override { return real_.catchUp(timeout); }
  std::expected<Frozen, std::string> freeze() override {
    return std::unexpected("cannot hold the parts: disk on fire");
  }

 private:
  BackupTableSource& real_;
};

class BackupProtocol : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-backup-protocol-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    common::testing::writeFile(dir_ / "secret", "backup-secret\n");
    table_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (const char* name : {"r1", "r2", "r3"}) open(name);
  }
  void TearDown() override {
    servers_.clear();
    replicas_.clear();
    restored_.clear();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  core::TableSpec spec(const std::string& table, const std::string& name, uint16_t port) {
    auto parsed = core::TableSpec::parseYaml(fmt::format(R"(
table: {}
columns: [{{name: d, type: Date}}, {{name: x, type: UInt64}}, {{name: s, type: String}}]
partitionBy: toYYYYMM(d)
orderBy: [x]
zookeeper: {{connect: "{}", root: /rtable-backup-test/tables}}
replica: {{name: {}, host: 127.0.0.1}}
ports: {{http: {}}}
dataDir: {}
replication: {{secretFile: {}}}
)",
                                                         table, zookeeper().connectString(), name,
                                                         port, (dir_ / table / name).string(),
                                                         (dir_ / "secret").string()));
    EXPECT_TRUE(parsed) << parsed.error();
    return *parsed;
  }

  void open(const std::string& name) { openInto(name, table_, replicas_); }

  // Opens replica `name` of `table` (served over HTTP: replicas fetch from each other) into `into`.
  void openInto(const std::string& name, const std::string& table_name,
                std::map<std::string, std::shared_ptr<core::TableReplica>>& into) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto port = common::testing::findFreeLoopbackPort();
      ASSERT_TRUE(port) << port.error();
      core::TableReplicaOptions options;
      options.parts.journal_part_bytes = 0;
      auto table = core::TableReplica::open(
          spec(table_name, name, static_cast<uint16_t>(*port)), zookeeperFactory(),
          *registries_.emplace_back(std::make_unique<prometheus::Registry>()), options);
      ASSERT_TRUE(table) << table.error();
      auto shared = std::shared_ptr<core::TableReplica>(std::move(*table));
      auto http =
          core::ReplicaHttpServer::start(*shared, "127.0.0.1", static_cast<uint16_t>(*port), 2);
      if (!http) continue;
      servers_.push_back(std::move(*http));
      into[name] = shared;
      if (&into == &replicas_) {
        sources_[name] = std::make_unique<ReplicaBackupSource>([shared] { return shared; });
      }
      return;
    }
    FAIL() << "no free port for " << name;
  }

  void insert(const std::string& replica, uint64_t from, uint64_t count,
              const std::string& date = "2026-12-01", const std::string& token = "") {
    auto& table = *replicas_.at(replica);
    core::Block block = table.spec().schema.emptyBlock();
    for (uint64_t x = from; x < from + count; ++x) {
      std::get<std::vector<uint16_t>>(block.columns[0].values).push_back(*core::parseDate(date));
      std::get<std::vector<uint64_t>>(block.columns[1].values).push_back(x);
      std::get<std::vector<std::string>>(block.columns[2].values).push_back(fmt::format("v{}", x));
    }
    core::InsertOptions options;
    options.deduplication_token = token;
    auto pending = table.beginInsert(options);
    ASSERT_TRUE(pending->add(std::move(block)));
    auto committed = table.commit(*pending);
    ASSERT_TRUE(committed) << committed.error().message;
  }

  void syncAll() {
    for (auto& [name, replica] : replicas_) ASSERT_TRUE(replica->syncQueue(60s)) << name;
  }

  BackupOperation operation(const std::string& uid, const std::string& name,
                            std::vector<std::string> hosts = {"r1", "r2", "r3"}) {
    BackupOperation op;
    op.uid = uid;
    op.name = name;
    op.started_ms = 1;
    const auto& any = *replicas_.begin()->second;
    op.tables.push_back({table_, any.spec().tableRoot(), any.paths().generation, hosts});
    op.destination.path = "/unused";
    return op;
  }

  BackupPaths paths(const std::string& uid) {
    return BackupPaths{BackupPaths::rootFor("/rtable-backup-test/tables"), uid};
  }

  static StageSyncOptions fastSync() {
    StageSyncOptions options;
    options.sync_period = 50ms;
    options.host_lost_timeout = 2s;
    options.initiator_lost_timeout = 2s;
    options.stage_timeout = 60s;
    return options;
  }

  struct Outcome {
    std::map<std::string, BackupResult<HostStats>> hosts;
    BackupProgress progress;
  };
  // Runs the operation: its hosts in threads (`sources` may replace a host's source), the
  // initiator polled until the end, then cleaned up.
  Outcome run(const BackupOperation& op, BackupStorage& storage,
              std::map<std::string, BackupTableSource*> sources = {},
              std::vector<std::string> hosts_to_run = {}) {
    if (hosts_to_run.empty()) hosts_to_run = op.hosts();
    BackupInitiator initiator(zookeeperFactory(), paths(op.uid), op, fastSync());
    auto started = initiator.start();
    EXPECT_TRUE(started) << started.error().message;
    Outcome outcome;
    std::mutex mu;
    std::vector<std::thread> threads;
    for (const auto& host : hosts_to_run) {
      BackupTableSource* source = sources.contains(host) ? sources[host] : sources_.at(host).get();
      threads.emplace_back([&, host, source] {
        BackupHostOptions options;
        options.sync = fastSync();
        BackupHost runner(paths(op.uid), op, host, *source, storage, zookeeperFactory(), options);
        auto result = runner.run();
        std::lock_guard lock(mu);
        outcome.hosts.emplace(host, std::move(result));
      });
    }
    bool ended = common::testing::waitFor(
        [&] {
          std::this_thread::sleep_for(20ms);
          auto progress = initiator.poll();
          EXPECT_TRUE(progress) << progress.error().toString();
          if (!progress) return true;
          outcome.progress = *progress;
          return progress->phase != BackupProgress::Phase::kRunning;
        },
        90s);
    EXPECT_TRUE(ended);
    for (auto& thread : threads) thread.join();
    auto cleaned = initiator.cleanUp();
    EXPECT_TRUE(cleaned) << cleaned.error().toString();
    return outcome;
  }

  std::string table_;
  fs::path dir_;
  std::vector<std::unique_ptr<prometheus::Registry>> registries_;
  std::map<std::string, std::shared_ptr<core::TableReplica>> replicas_;
  std::map<std::string, std::shared_ptr<core::TableReplica>> restored_;  // BackupRestore's
  std::map<std::string, std::unique_ptr<BackupTableSource>> sources_;
  std::vector<std::unique_ptr<core::ReplicaHttpServer>> servers_;
};

TEST_F(BackupProtocol, ThreeReplicasWriteOneBackupWithEachFileOnce) {
  insert("r1", 0, 100);
  insert("r2", 100, 50, "2026-11-05");
  insert("r3", 150, 25);
  syncAll();
  CountingStorage storage;
  auto outcome = run(operation("u1", "first"), storage);
  ASSERT_EQ(outcome.progress.phase, BackupProgress::Phase::kCompleted)
      << (outcome.progress.error ? outcome.progress.error->toString() : "");
  for (const auto& [host, result] : outcome.hosts) {
    EXPECT_TRUE(result) << host << ": " << result.error().toString();
  }

  auto text = storage.read(manifestName("first"));
  ASSERT_TRUE(text) << text.error().message;
  auto manifest = BackupManifest::parse(*text);
  ASSERT_TRUE(manifest) << manifest.error();
  ASSERT_EQ(manifest->tables.size(), 1u);
  const ManifestTable& table = manifest->tables[0];
  EXPECT_EQ(table.rows, 175u);
  // The parts of one replica at one moment: the same as every replica's now (nothing changed).
  std::vector<std::string> names;
  for (const auto& part : replicas_.at("r1")->activeParts()) names.push_back(part->name.format());
  std::vector<std::string> manifest_names;
  for (const auto& part : table.parts) manifest_names.push_back(part.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(manifest_names, names);
  // Every data file stored exactly once though all three replicas hold every part.
  auto writes = storage.writes();
  std::size_t data_objects = 0;
  for (const auto& [name, count] : writes) {
    EXPECT_EQ(count, 1) << name;
    if (name.starts_with("data/")) ++data_objects;
  }
  EXPECT_EQ(data_objects, manifest->data_files);
  EXPECT_EQ(manifest->bytes_written, manifest->data_bytes);
  EXPECT_EQ(manifest->bytes_reused, 0u);
  EXPECT_EQ(outcome.progress.totals.bytes_written, manifest->data_bytes);
  ASSERT_TRUE(outcome.progress.summary);
  EXPECT_EQ(
      outcome.progress.summary->tables,
      (std::vector<BackupSummary::Table>{{table_, table.generation, table.parts.size(), 175}}));
  EXPECT_EQ(outcome.progress.summary->data_bytes, manifest->data_bytes);
  EXPECT_EQ(outcome.progress.summary->manifest, manifestName("first"));
  for (const auto& file : manifest->files) {
    if (file.data_file.empty()) continue;
    auto bytes = storage.read(file.data_file);
    ASSERT_TRUE(bytes) << file.name;
    EXPECT_EQ(core::hash128(*bytes), file.checksum) << file.name;
  }
  // The operation's nodes and the table's lock are gone.
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  EXPECT_FALSE((*keeper)->exists(paths("u1").operation())->has_value());
  EXPECT_FALSE(
      (*keeper)->exists(core::backupLockPath(replicas_.at("r1")->spec().tableRoot()))->has_value());
}

TEST_F(BackupProtocol, TheBackupsPartsReadBackAsTheTablesRowsAndADamagedFileIsNamed) {
  insert("r1", 0, 100);
  insert("r2", 100, 100, "2026-10-07");
  insert("r3", 200, 100);
  syncAll();
  CountingStorage storage;
  ASSERT_EQ(run(operation("u1", "readable"), storage).progress.phase,
            BackupProgress::Phase::kCompleted);
  auto manifest = readManifest(storage, "readable");
  ASSERT_TRUE(manifest) << manifest.error().message;
  const core::TableSchema& schema = replicas_.at("r1")->spec().schema;
  std::multiset<uint64_t> xs;
  for (const auto& part : manifest->tables.at(0).parts) {
    fs::path dir = dir_ / "restored" / part.name;
    auto made = materializePart(storage, *manifest, table_, part.name, dir);
    ASSERT_TRUE(made) << made.error();
    auto verified = core::verifyPart(dir, schema);
    ASSERT_TRUE(verified) << verified.error();
    EXPECT_EQ(verified->total, part.checksum);
    auto block = core::readPart(dir, schema);
    ASSERT_TRUE(block) << block.error();
    for (uint64_t x : std::get<std::vector<uint64_t>>(block->columns[1].values)) xs.insert(x);
  }
  ASSERT_EQ(xs.size(), 300u);
  EXPECT_EQ(std::set<uint64_t>(xs.begin(), xs.end()).size(), 300u) << "a row twice";

  // One flipped byte in a data file: the file is named, nothing is left behind.
  const ManifestFile* victim = nullptr;
  for (const auto& file : manifest->files) {
    if (file.size > 8 && !file.name.ends_with("checksums.txt")) victim = &file;
  }
  ASSERT_NE(victim, nullptr);
  std::string bytes = *storage.read(victim->data_file);
  bytes[bytes.size() / 2] ^= 0x20;
  ASSERT_TRUE(storage.putBytes(victim->data_file, bytes));
  std::string part = victim->name.substr(table_.size() + 1);
  part = part.substr(0, part.find('/'));
  fs::path dir = dir_ / "damaged";
  auto made = materializePart(storage, *manifest, table_, part, dir);
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().find(victim->name + ": checksum"), std::string::npos) << made.error();
  EXPECT_NE(made.error().find("is damaged"), std::string::npos) << made.error();
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(BackupProtocol, ASecondBackupOfAnUnchangedTableWritesOnlyItsManifest) {
  insert("r1", 0, 300);
  syncAll();
  CountingStorage storage;
  auto first = run(operation("u1", "first"), storage);
  ASSERT_EQ(first.progress.phase, BackupProgress::Phase::kCompleted);
  storage.clearWriteCounts();
  auto second = run(operation("u2", "second"), storage);
  ASSERT_EQ(second.progress.phase, BackupProgress::Phase::kCompleted);
  auto writes = storage.writes();
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes.begin()->first, manifestName("second"));
  auto manifest = BackupManifest::parse(*storage.read(manifestName("second")));
  ASSERT_TRUE(manifest);
  EXPECT_EQ(manifest->bytes_written, 0u);
  EXPECT_EQ(manifest->bytes_reused, manifest->data_bytes);
  EXPECT_GT(manifest->data_bytes, 0u);
}

TEST_F(BackupProtocol, OneHostsErrorStopsEveryHostAndNoManifestIsWritten) {
  insert("r1", 0, 10);
  syncAll();
  CountingStorage storage;
  FailingSource failing(*sources_.at("r2"));
  auto outcome = run(operation("u1", "broken"), storage, {{"r2", &failing}});
  ASSERT_EQ(outcome.progress.phase, BackupProgress::Phase::kFailed);
  ASSERT_TRUE(outcome.progress.error);
  EXPECT_EQ(outcome.progress.error->host, "r2");
  EXPECT_EQ(outcome.progress.error->stage, stage::kExtractingData);
  EXPECT_NE(outcome.progress.error->message.find("disk on fire"), std::string::npos);
  for (const auto& [host, result] : outcome.hosts) {
    ASSERT_FALSE(result) << host;
    EXPECT_EQ(result.error().host, "r2") << host << ": " << result.error().toString();
  }
  EXPECT_FALSE(storage.read(manifestName("broken")));
}

TEST_F(BackupProtocol, AHostThatNeverComesFailsTheBackupNamingIt) {
  insert("r1", 0, 10);
  syncAll();
  CountingStorage storage;
  auto outcome = run(operation("u1", "lonely"), storage, {}, {"r1", "r2"});
  ASSERT_EQ(outcome.progress.phase, BackupProgress::Phase::kFailed);
  ASSERT_TRUE(outcome.progress.error);
  EXPECT_EQ(outcome.progress.error->host, "r3");
  EXPECT_EQ(outcome.progress.error->reason, "HostGone");
  EXPECT_NE(outcome.progress.error->message.find("gone"), std::string::npos)
      << outcome.progress.error->toString();
  EXPECT_FALSE(storage.read(manifestName("lonely")));
}

// On the real ZooKeeper: the multi that creates an operation checks the destination's lock, an
// ephemeral node of the deleting replica's session, and the session's end frees it.
TEST_F(BackupProtocol, ABackupWaitsWhileADeletionHoldsItsDestination) {
  const BackupOperation op = operation("u1", "a");
  const std::string backups_root = paths("u1").root;
  auto deleter = zookeeper().connect();
  ASSERT_TRUE(deleter);
  ASSERT_TRUE(core::createAncestorsAndSelf(**deleter, destinationLocksPath(backups_root)));
  ASSERT_TRUE((*deleter)->create(destinationLockPath(backups_root, op.destination), "r2",
                                 core::CreateMode::kEphemeral));
  BackupInitiator initiator(zookeeperFactory(), paths("u1"), op, fastSync());
  auto refused = initiator.start();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, StartRefusal::Kind::kBusy);
  EXPECT_EQ(refused.error().message,
            "the data of a deleted backup is being removed from /unused; the backup starts when "
            "that ends");
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  EXPECT_FALSE((*keeper)->exists(paths("u1").operation())->has_value());
  EXPECT_FALSE((*keeper)->exists(core::backupLockPath(op.tables[0].table_root))->has_value());

  deleter->reset();  // the deleting replica's session ends
  auto started = initiator.start();
  ASSERT_TRUE(started) << started.error().message;
  ASSERT_TRUE(initiator.cleanUp());
}

TEST_F(BackupProtocol, ASecondBackupOfTheTableIsRefusedWhileOneRunsAndASwapWaits) {
  const std::string root = replicas_.at("r1")->spec().tableRoot();
  BackupInitiator first(zookeeperFactory(), paths("u1"), operation("u1", "a"), fastSync());
  ASSERT_TRUE(first.start());
  BackupInitiator second(zookeeperFactory(), paths("u2"), operation("u2", "b"), fastSync());
  auto refused = second.start();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, StartRefusal::Kind::kBusy);
  EXPECT_NE(refused.error().message.find("backup u1 runs"), std::string::npos)
      << refused.error().message;

  // The swap driver will not begin while the backup holds the table.
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  core::SwapDriver driver(**keeper, root);
  auto swap = driver.begin("test");
  ASSERT_FALSE(swap);
  EXPECT_NE(swap.error().detail.find("cluster backup (u1)"), std::string::npos)
      << swap.error().toString();
  EXPECT_FALSE((*keeper)->exists(core::swapPath(root))->has_value());

  ASSERT_TRUE(first.cleanUp());
  // Now the swap begins, and a backup waits for it.
  ASSERT_TRUE(driver.begin("test"));
  auto waits = second.start();
  ASSERT_FALSE(waits);
  EXPECT_EQ(waits.error().kind, StartRefusal::Kind::kBusy);
  EXPECT_NE(waits.error().message.find("table swap runs"), std::string::npos);
}

TEST_F(BackupProtocol, AnOperatorThatDiesMidBackupIsReplacedAndTheBackupCompletes) {
  insert("r1", 0, 60);
  syncAll();
  CountingStorage storage;
  BackupOperation op = operation("u-resume", "resumed");
  StageSyncOptions sync = fastSync();
  sync.initiator_lost_timeout = 30s;  // the replicas wait this long for a new operator
  auto first = std::make_unique<BackupInitiator>(zookeeperFactory(), paths(op.uid), op, sync);
  ASSERT_TRUE(first->start());
  std::map<std::string, BackupResult<HostStats>> results;
  std::mutex mu;
  std::vector<std::thread> hosts;
  for (const auto& host : op.hosts()) {
    hosts.emplace_back([&, host] {
      BackupHostOptions options;
      options.sync = sync;
      BackupHost runner(paths(op.uid), op, host, *sources_.at(host), storage, zookeeperFactory(),
                        options);
      auto result = runner.run();
      std::lock_guard lock(mu);
      results.emplace(host, std::move(result));
    });
  }
  // The replicas reach the first barrier and wait there for the initiator, which dies (its
  // session, and so its alive node, end with it).
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        auto progress = first->poll();
        std::this_thread::sleep_for(20ms);
        if (!progress) return false;
        for (const auto& [host, state] : progress->hosts) {
          if (state.stage.empty()) return false;
        }
        return true;
      },
      30s));
  first.reset();
  // The next operator process resumes the operation from ZooKeeper and sees it through.
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  ASSERT_TRUE(common::testing::waitFor(
      [&] { return !(*keeper)->exists(paths(op.uid).alive(""))->has_value(); }, 30s));
  BackupInitiator second(zookeeperFactory(), paths(op.uid), op, sync);
  ASSERT_TRUE(second.resume());
  // Alive again: the replicas see the initiator back before they would give up on it.
  EXPECT_TRUE((*keeper)->exists(paths(op.uid).alive(""))->has_value());
  BackupProgress last;
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        std::this_thread::sleep_for(20ms);
        auto progress = second.poll();
        if (!progress) return false;
        last = *progress;
        return progress->phase != BackupProgress::Phase::kRunning;
      },
      60s));
  for (auto& thread : hosts) thread.join();
  ASSERT_EQ(last.phase, BackupProgress::Phase::kCompleted)
      << (last.error ? last.error->toString() : "");
  for (const auto& [host, result] : results) {
    EXPECT_TRUE(result) << host << ": " << result.error().toString();
  }
  ASSERT_TRUE(second.cleanUp());
  auto manifest = readManifest(storage, "resumed");
  ASSERT_TRUE(manifest) << manifest.error().message;
  EXPECT_EQ(manifest->tables.at(0).rows, 60u);
}

TEST_F(BackupProtocol, ADeadOperationsLockIsTakenOver) {
  {
    BackupInitiator dead(zookeeperFactory(), paths("u1"), operation("u1", "a"), fastSync());
    ASSERT_TRUE(dead.start());
    // Its process dies: the session (and the alive node) go, the lock stays.
  }
  BackupInitiator next(zookeeperFactory(), paths("u2"), operation("u2", "b"), fastSync());
  auto started = next.start();
  ASSERT_TRUE(started) << started.error().message;
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  auto lock = (*keeper)->get(core::backupLockPath(replicas_.at("r1")->spec().tableRoot()));
  ASSERT_TRUE(lock);
  EXPECT_EQ(lock->data, "u2");
  ASSERT_TRUE(next.cleanUp());
}

TEST_F(BackupProtocol, EachReplicasAgentJoinsTheOperationsThatNameItAndOnlyThose) {
  insert("r1", 0, 40);
  syncAll();
  CountingStorage storage;
  std::vector<std::unique_ptr<BackupAgent>> agents;
  for (const auto& [name, replica] : replicas_) {
    BackupAgentOptions options;
    options.poll_period = 100ms;
    options.host.sync = fastSync();
    agents.push_back(std::make_unique<BackupAgent>(
        zookeeperFactory(), paths("any").root, replica->spec().tableRoot(), name,
        *sources_.at(name),
        [&storage](const BackupOperation&) -> StorageResult<std::unique_ptr<BackupStorage>> {
          // Each host gets its own handle on the one destination.
          struct Handle final : BackupStorage {
            explicit Handle(CountingStorage& s) : s(s) {}
            std::string location() const override { return s.location(); }
            StorageResult<std::optional<uint64_t>> size(const std::string& n) override {
              return s.size(n);
            }
            StorageResult<void> putFile(const std::string& n, const fs::path& p) override {
              return s.putFile(n, p);
            }
            StorageResult<void> putBytes(const std::string& n, std::string_view b) override {
              return s.putBytes(n, b);
            }
            StorageResult<std::string> read(const std::string& n) override { return s.read(n); }
            StorageResult<void> readToFile(const std::string& n, const fs::path& p) override {
              return s.readToFile(n, p);
            }
            StorageResult<std::vector<std::string>> list(const std::string& p) override {
              return s.list(p);
            }
            StorageResult<void> remove(const std::string& n) override { return s.remove(n); }
            CountingStorage& s;
          };
          return std::make_unique<Handle>(storage);
        },
        options));
  }
  // An agent of another table with a replica named like ours: not its operation.
  BackupAgentOptions other_options;
  other_options.poll_period = 100ms;
  BackupAgent other(
      zookeeperFactory(), paths("any").root, "/rtable-backup-test/tables/other", "r1",
      *sources_.at("r1"),
      [](const BackupOperation&) -> StorageResult<std::unique_ptr<BackupStorage>> {
        return std::unexpected(StorageError{StorageError::Kind::kOther, "no"});
      },
      other_options);
  for (auto& agent : agents) agent->start();
  other.start();

  BackupOperation op = operation("u-agents", "by-agents");
  BackupInitiator initiator(zookeeperFactory(), paths(op.uid), op, fastSync());
  ASSERT_TRUE(initiator.start());
  BackupProgress last;
  ASSERT_TRUE(common::testing::waitFor(
      [&] {
        std::this_thread::sleep_for(20ms);
        auto progress = initiator.poll();
        if (!progress) return false;
        last = *progress;
        return progress->phase != BackupProgress::Phase::kRunning;
      },
      60s));
  ASSERT_EQ(last.phase, BackupProgress::Phase::kCompleted)
      << (last.error ? last.error->toString() : "");
  ASSERT_TRUE(initiator.cleanUp());
  for (auto& agent : agents) agent->stop();
  other.stop();
  for (auto& agent : agents) {
    EXPECT_EQ(agent->outcomesForTest(),
              (std::map<std::string, std::string>{{"u-agents", "completed"}}));
  }
  EXPECT_TRUE(other.outcomesForTest().empty());
  auto manifest = BackupManifest::parse(*storage.read(manifestName("by-agents")));
  ASSERT_TRUE(manifest);
  EXPECT_EQ(manifest->tables.at(0).rows, 40u);
}

// Anyone who reaches ZooKeeper can write an operation that names this table's replicas and a
// destination of their choosing (the backups' root is shared by every table). A real one comes
// with the table's backup lock naming it, made in the same multi, in the table's own tree, which
// only holders of the table's identity can write (BackupInitiator::start).
TEST_F(BackupProtocol, AnOperationTheTablesLockDoesNotNameIsNotRun) {
  const BackupOperation forged = operation("u-forged", "exfiltrated");
  const BackupPaths where = paths(forged.uid);
  const std::string table_root = replicas_.at("r1")->spec().tableRoot();
  auto keeper = zookeeperFactory()();
  ASSERT_TRUE(keeper);
  ASSERT_TRUE(core::createAncestorsAndSelf(**keeper, where.root));
  ASSERT_TRUE((*keeper)->multi(
      {core::op::Create{where.operation(), forged.format()}, core::op::Create{where.stage(), ""},
       core::op::Create{where.parts(), ""}, core::op::Create{where.fileInfos(), ""},
       core::op::Create{where.writingFiles(), ""}}));
  int opened = 0;
  auto agentOf = [&] {
    return std::make_unique<BackupAgent>(
        zookeeperFactory(), where.root, table_root, "r1", *sources_.at("r1"),
        [&](const BackupOperation&) -> StorageResult<std::unique_ptr<BackupStorage>> {
          ++opened;
          return std::unexpected(StorageError{StorageError::Kind::kOther, "not opened in tests"});
        });
  };
  auto agent = agentOf();
  agent->runOnceForTest();
  EXPECT_EQ(opened, 0);
  EXPECT_TRUE(agent->outcomesForTest().empty());
  EXPECT_FALSE((*keeper)->exists(where.started("r1"))->has_value());

  // The same operation with the lock naming it is joined.
  ASSERT_TRUE((*keeper)->create(core::backupLockPath(table_root), forged.uid,
                                core::CreateMode::kPersistent));
  auto joined = agentOf();
  joined->runOnceForTest();
  EXPECT_EQ(opened, 1);
  EXPECT_EQ(joined->outcomesForTest().size(), 1u);
  EXPECT_TRUE((*keeper)->exists(where.started("r1"))->has_value());
  ASSERT_TRUE((*keeper)->remove(core::backupLockPath(table_root)));
  ASSERT_TRUE(core::removeRecursive(**keeper, where.operation()));
}

// Restore (restore.h): a backup in a real directory, read back into a new table of three
// replicas by one of them, the others fetching.
class BackupRestore : public BackupProtocol {
 protected:
  void SetUp() override {
    BackupProtocol::SetUp();
    destination_.path = (dir_ / "destination").string();
    fs::create_directories(destination_.path);  // a mounted volume: rtable never creates it
  }

  void backUp(const std::string& name) {
    FilesystemStorage storage(destination_.path);
    auto outcome = run(operation("u-" + name, name), storage);
    ASSERT_EQ(outcome.progress.phase, BackupProgress::Phase::kCompleted)
        << (outcome.progress.error ? outcome.progress.error->toString() : "");
  }

  void openRestored() {
    for (const char* name : {"r1", "r2", "r3"}) openInto(name, table_ + "-restored", restored_);
  }
  std::string restoredRoot() { return restored_.at("r1")->spec().tableRoot(); }

  // `table` "": the backup's only table.
  void request(const std::string& backup, const std::string& table_root,
               std::optional<std::string> table = std::nullopt) {
    RestoreRequest request;
    request.backup = backup;
    request.table = table.value_or(table_);
    request.destination = destination_;
    request.requested_ms = 1;
    auto keeper = zookeeper().connect();
    ASSERT_TRUE(keeper);
    auto created = (*keeper)->create(restoreRequestPath(table_root), request.format(),
                                     core::CreateMode::kPersistent);
    ASSERT_TRUE(created) << created.error().toString();
  }

  static DestinationOpener opener() {
    return [](const DestinationRef& destination) -> StorageResult<std::unique_ptr<BackupStorage>> {
      return std::make_unique<FilesystemStorage>(destination.path);
    };
  }

  // One look by `replica` of the restored table.
  std::expected<std::optional<RestoreRequest>, std::string> look(const std::string& replica,
                                                                 RestoreTarget* target = nullptr,
                                                                 std::size_t batch = 2) {
    auto keeper = zookeeper().connect();
    EXPECT_TRUE(keeper);
    auto shared = restored_.at(replica);
    ReplicaRestoreTarget own([shared] { return shared; });
    RestoreOptions options;
    options.batch = batch;
    return restoreIfAsked(**keeper, restoredRoot(), replica, target ? *target : own, opener(),
                          options);
  }

  RestoreRequest stored(const std::string& table_root) {
    auto keeper = zookeeper().connect();
    EXPECT_TRUE(keeper);
    auto read = readRestoreRequest(**keeper, table_root);
    EXPECT_TRUE(read && *read) << (read ? "no request" : read.error());
    return read && *read ? (*read)->request : RestoreRequest{};
  }

  // Every row's (x, s) of a replica's active parts.
  static std::multiset<std::pair<uint64_t, std::string>> rowsOf(const core::TableReplica& table) {
    std::multiset<std::pair<uint64_t, std::string>> rows;
    for (const auto& part : table.activeParts()) {
      auto block = core::readDataPart(*part, table.spec().schema);
      EXPECT_TRUE(block) << block.error();
      if (!block) continue;
      const auto& xs = std::get<std::vector<uint64_t>>(block->columns[1].values);
      const auto& ss = std::get<std::vector<std::string>>(block->columns[2].values);
      for (std::size_t i = 0; i < xs.size(); ++i) rows.emplace(xs[i], ss[i]);
    }
    return rows;
  }

  DestinationRef destination_;
};

TEST_F(BackupRestore, ABackupRestoresIntoANewTableOnEveryReplicaEachRowOnce) {
  insert("r1", 0, 100);
  insert("r2", 100, 50, "2026-11-05");
  insert("r3", 150, 10, "2026-10-01");
  // Two parts with equal contents (two inserts with their own tokens): both are the table's.
  insert("r3", 500, 10, "2026-09-01", "first");
  insert("r1", 500, 10, "2026-09-01", "second");
  syncAll();
  const auto source_rows = rowsOf(*replicas_.at("r1"));
  ASSERT_EQ(source_rows.size(), 180u);
  backUp("nightly");
  openRestored();
  request("nightly", restoredRoot());

  // Every replica looks at once: one restores (in batches of 2), the others leave it to it.
  std::map<std::string, std::expected<std::optional<RestoreRequest>, std::string>> looks;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (const char* name : {"r1", "r2", "r3"}) {
    threads.emplace_back([&, name] {
      auto result = look(name);
      std::lock_guard lock(mu);
      looks.emplace(name, std::move(result));
    });
  }
  for (auto& thread : threads) thread.join();
  int restorers = 0;
  for (const auto& [name, result] : looks) {
    ASSERT_TRUE(result) << name << ": " << result.error();
    ASSERT_TRUE(result->has_value()) << name;
    if ((*result)->state == RestoreRequest::State::kDone) ++restorers;
  }
  EXPECT_GE(restorers, 1);
  RestoreRequest done = stored(restoredRoot());
  ASSERT_EQ(done.state, RestoreRequest::State::kDone) << done.message;
  auto manifest = readManifest(*opener()(destination_).value(), "nightly");
  ASSERT_TRUE(manifest);
  EXPECT_EQ(done.parts_total, manifest->tables.at(0).parts.size());
  EXPECT_EQ(done.parts_done, done.parts_total);
  EXPECT_EQ(done.rows_done, 180u);
  EXPECT_FALSE(restoreRefusal(done));
  // Every replica of the new table holds the backed-up rows, each once (the two equal parts
  // included), fetched from the restorer.
  for (auto& [name, replica] : restored_) {
    ASSERT_TRUE(replica->syncQueue(60s)) << name;
    EXPECT_EQ(rowsOf(*replica), source_rows) << name;
  }
  // Looking again changes nothing.
  auto again = look("r2");
  ASSERT_TRUE(again && *again);
  EXPECT_EQ((*again)->state, RestoreRequest::State::kDone);
  EXPECT_EQ(rowsOf(*restored_.at("r2")), source_rows);
}

// A target whose attach succeeds and then reports a failure, as a restorer that died after its
// attach but before it recorded the batch.
class AttachThenFail final : public RestoreTarget {
 public:
  AttachThenFail(RestoreTarget& real, int fail_at) : real_(real), fail_at_(fail_at) {}
  std::string metadataText() const override { return real_.metadataText(); }
  bool catchUp(std::chrono::milliseconds timeout) override { return real_.catchUp(timeout); }
  std::size_t activePartCount() const override { return real_.activePartCount(); }
  std::filesystem::path stagingDir() const override { return real_.stagingDir(); }
  std::expected<void, std::string> attach(const std::vector<StagedPart>& parts) override {
    auto attached = real_.attach(parts);
    if (!attached) return attached;
    if (++calls_ == fail_at_) return std::unexpected("the restorer died (test)");
    return {};
  }

 private:
  RestoreTarget& real_;
  const int fail_at_;
  int calls_ = 0;
};

TEST_F(BackupRestore, ARestoreCutShortIsTakenUpByAnotherReplicaAndDoublesNothing) {
  // Six partitions: six parts no merge can join.
  for (int month = 1; month <= 6; ++month) {
    insert(month % 2 ? "r1" : "r2", month * 100, 20, fmt::format("2026-{:02}-10", month));
  }
  syncAll();
  const auto source_rows = rowsOf(*replicas_.at("r1"));
  backUp("cut");
  openRestored();
  request("cut", restoredRoot(), "");
  auto shared = restored_.at("r1");
  ReplicaRestoreTarget real([shared] { return shared; });
  AttachThenFail dying(real, 2);
  auto cut = look("r1", &dying, 2);
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().find("the restorer died"), std::string::npos) << cut.error();
  // The first batch recorded, the second attached but not recorded.
  RestoreRequest running = stored(restoredRoot());
  EXPECT_EQ(running.state, RestoreRequest::State::kRunning);
  EXPECT_EQ(running.parts_done, 2u);
  EXPECT_EQ(running.parts_total, 6u);
  EXPECT_EQ(running.table, table_);  // none was named: the backup's only table
  ASSERT_TRUE(restoreRefusal(running));
  EXPECT_NE(restoreRefusal(running)->find("2 of 6 parts"), std::string::npos);

  // Another replica goes on from the record: the second batch's parts are found by their ids.
  auto resumed = look("r3");
  ASSERT_TRUE(resumed && *resumed) << (resumed ? "none" : resumed.error());
  EXPECT_EQ((*resumed)->state, RestoreRequest::State::kDone) << (*resumed)->message;
  EXPECT_EQ((*resumed)->restorer, "r3");
  for (auto& [name, replica] : restored_) {
    ASSERT_TRUE(replica->syncQueue(60s)) << name;
    EXPECT_EQ(rowsOf(*replica), source_rows) << name;
    EXPECT_EQ(replica->activeParts().size(), 6u) << name;
  }
}

TEST_F(BackupRestore, ATableWithPartsIsNotRestoredIntoAndADamagedBackupIsNamed) {
  insert("r1", 0, 30);
  insert("r2", 30, 30, "2026-08-01");
  syncAll();
  const auto source_rows = rowsOf(*replicas_.at("r1"));
  backUp("base");

  // Into the table that has rows: refused for good, nothing added.
  request("base", replicas_.at("r1")->spec().tableRoot());
  auto keeper = zookeeper().connect();
  ASSERT_TRUE(keeper);
  ReplicaRestoreTarget full_table([this] { return replicas_.at("r1"); });
  auto into_full =
      restoreIfAsked(**keeper, replicas_.at("r1")->spec().tableRoot(), "r1", full_table, opener());
  ASSERT_TRUE(into_full && *into_full) << (into_full ? "none" : into_full.error());
  EXPECT_EQ((*into_full)->state, RestoreRequest::State::kFailed);
  EXPECT_NE((*into_full)->message.find("the table is not empty"), std::string::npos)
      << (*into_full)->message;
  EXPECT_EQ(rowsOf(*replicas_.at("r1")), source_rows);

  // A data file damaged in the destination: the restore fails naming the file, attaches nothing,
  // and the table keeps refusing inserts, saying why.
  auto manifest = readManifest(*opener()(destination_).value(), "base");
  ASSERT_TRUE(manifest);
  const ManifestFile* victim = nullptr;
  for (const auto& file : manifest->files) {
    if (file.size > 8 && !file.name.ends_with("checksums.txt")) victim = &file;
  }
  ASSERT_NE(victim, nullptr);
  const fs::path damaged = fs::path(destination_.path) / victim->data_file;
  std::string bytes = common::testing::readFile(damaged);
  bytes[bytes.size() / 2] ^= 0x20;
  common::testing::writeFile(damaged, bytes);
  openRestored();
  request("base", restoredRoot());
  auto failed = look("r2");
  ASSERT_TRUE(failed && *failed) << (failed ? "none" : failed.error());
  EXPECT_EQ((*failed)->state, RestoreRequest::State::kFailed);
  EXPECT_NE((*failed)->message.find(victim->name + ": checksum"), std::string::npos)
      << (*failed)->message;
  for (auto& [name, replica] : restored_) EXPECT_TRUE(replica->activeParts().empty()) << name;
  auto refusal = restoreRefusal(*failed);
  ASSERT_TRUE(refusal);
  EXPECT_NE(refusal->find("failed"), std::string::npos) << *refusal;
  // Looked at again: failed stays failed.
  auto again = look("r1");
  ASSERT_TRUE(again && *again);
  EXPECT_EQ((*again)->state, RestoreRequest::State::kFailed);
}

TEST_F(BackupRestore, ReplicasThatJoinAfterTheRestoreFetchItsParts) {
  insert("r1", 0, 50);
  insert("r2", 50, 50, "2026-11-05");
  syncAll();
  const auto source_rows = rowsOf(*replicas_.at("r1"));
  backUp("early");
  openInto("r1", table_ + "-restored", restored_);
  request("early", restoredRoot());
  auto done = look("r1");
  ASSERT_TRUE(done && *done) << (done ? "none" : done.error());
  ASSERT_EQ((*done)->state, RestoreRequest::State::kDone) << (*done)->message;
  // As pods that start after the first one restored: they clone it.
  openInto("r2", table_ + "-restored", restored_);
  openInto("r3", table_ + "-restored", restored_);
  for (auto& [name, replica] : restored_) {
    ASSERT_TRUE(replica->syncQueue(60s)) << name << ": " << replica->checkQueueInvariant();
    EXPECT_EQ(rowsOf(*replica), source_rows) << name;
  }
}

}  // namespace
}  // namespace rtable::backup
