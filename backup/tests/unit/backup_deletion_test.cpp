// Deleting a backup's data: the request's round trip; deleteBackupData on the in-memory storage
// (the backup's manifest first, then only the data files no other backup refers to, idempotent,
// stopped by an unreadable manifest or a lost lock); deleteIfAsked on the in-memory ZooKeeper
// (one deleter per destination, none while a backup on it is alive or just started, a request
// for another table left alone); and a backup's start refused while a deletion holds the
// destination.
#include "rtable/backup/backup_deletion.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rtable/backup/backup_initiator.h"
#include "rtable/backup/backup_manifest.h"
#include "rtable/backup/file_infos.h"
#include "rtable/backup/testing/fake_storage.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::backup {
namespace {

using testing::FakeStorage;

constexpr const char* kRoot = "/rtable/backups";
constexpr const char* kTableRoot = "/rtable/tables/analytics.events";

// Stores a backup named `name` whose files have the given contents, as a backup would: the data
// files (shared by content), then the manifest.
void storeBackup(FakeStorage& storage, const std::string& name,
                 const std::vector<std::string>& contents) {
  BackupManifest manifest;
  manifest.name = name;
  manifest.uid = "uid-" + name;
  manifest.tables.push_back({"events", 1, "columns\n", "events-0", 1, {}});
  for (std::size_t i = 0; i < contents.size(); ++i) {
    const core::Hash128 checksum = core::hash128(contents[i]);
    const std::string data = dataFileName(contents[i].size(), checksum);
    ASSERT_TRUE(storage.putBytes(data, contents[i]));
    manifest.files.push_back(
        {fmt::format("events/all_1_1_0/c{}.bin", i), contents[i].size(), checksum, data});
  }
  ASSERT_TRUE(storage.putBytes(manifestName(name), manifest.format()));
}

std::vector<std::string> objects(FakeStorage& storage) {
  return storage.list("").value();
}

std::string dataOf(const std::string& content) {
  return dataFileName(content.size(), core::hash128(content));
}

TEST(DeletionRequest, RoundTripsAndRefusalsNameTheField) {
  DeletionRequest request;
  request.backup = "analytics.nightly-202612060300";
  request.destination.kind = DestinationRef::Kind::kS3;
  request.destination.endpoint = "http://127.0.0.1:8333";
  request.destination.bucket = "backups";
  request.destination.credentials_secret = "s3-backup";
  request.table_roots = {kTableRoot};
  request.requested_ms = 1765000000000;
  auto parsed = DeletionRequest::parse(request.format());
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, request);
  request.state = DeletionRequest::State::kDone;
  request.deleter = "events-1";
  request.files_removed = 3;
  request.bytes_removed = 4096;
  request.message = "deleted";
  EXPECT_EQ(DeletionRequest::parse(request.format()).value(), request);

  auto refused = [&](auto change) {
    auto doc = nlohmann::json::parse(request.format());
    change(doc);
    auto result = DeletionRequest::parse(doc.dump());
    return result ? std::string("accepted") : result.error();
  };
  EXPECT_EQ(refused([](auto& d) { d["backup"] = "../x"; }), "backup: '../x' is not a plain name");
  EXPECT_EQ(refused([](auto& d) { d["tableRoots"] = nlohmann::json::array(); }),
            "tableRoots: at least one table root is required");
  EXPECT_EQ(refused([](auto& d) { d["state"] = "running"; }),
            "state: '\"running\"' is none of pending, done, failed");
  EXPECT_EQ(DeletionRequest::parse("[]").error(), "not a JSON object");
}

TEST(DestinationLock, OnePerPlaceWhateverTheCredentials) {
  DestinationRef a;
  a.kind = DestinationRef::Kind::kS3;
  a.endpoint = "http://s3:8333";
  a.bucket = "backups";
  a.prefix = "cluster-a";
  a.credentials_secret = "one";
  DestinationRef b = a;
  b.credentials_secret = "other";
  b.prefix = "cluster-a/";
  EXPECT_TRUE(sameDestination(a, b));
  EXPECT_EQ(destinationLockPath(kRoot, a), destinationLockPath(kRoot, b));
  b.prefix = "cluster-b";
  EXPECT_FALSE(sameDestination(a, b));
  EXPECT_NE(destinationLockPath(kRoot, a), destinationLockPath(kRoot, b));
  EXPECT_TRUE(destinationLockPath(kRoot, a).starts_with("/rtable/backups/destinations/"));

  DestinationRef claim;
  claim.kind = DestinationRef::Kind::kVolume;
  claim.claim_name = "backups";
  claim.path = "cluster-a";
  DestinationRef same_claim = claim;
  EXPECT_TRUE(sameDestination(claim, same_claim));
  EXPECT_EQ(destinationLockPath(kRoot, claim), destinationLockPath(kRoot, same_claim));
  same_claim.path = "cluster-b";
  EXPECT_FALSE(sameDestination(claim, same_claim));
  EXPECT_NE(destinationLockPath(kRoot, claim), destinationLockPath(kRoot, same_claim));
  DestinationRef filesystem;
  filesystem.path = "cluster-a";  // the same text as another kind's: still another place
  EXPECT_FALSE(sameDestination(claim, filesystem));
  EXPECT_NE(destinationLockPath(kRoot, claim), destinationLockPath(kRoot, filesystem));
}

TEST(DeleteBackupData, RemovesTheManifestFirstThenOnlyWhatNoOtherBackupUses) {
  FakeStorage storage;
  storeBackup(storage, "b1", {"shared", "only b1", "only b1"});
  storeBackup(storage, "b2", {"shared", "only b2"});
  // A backup that failed before its manifest: its data file is referenced by nobody.
  ASSERT_TRUE(storage.putBytes(dataOf("orphan!"), "orphan!"));

  auto stats = deleteBackupData(storage, "b1");
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_TRUE(stats->manifest_removed);
  EXPECT_EQ(stats->files_removed, 2u);  // "only b1" (stored once) and the orphan
  EXPECT_EQ(stats->bytes_removed, std::string("only b1").size() + std::string("orphan!").size());
  EXPECT_EQ(stats->files_kept, 2u);
  std::vector<std::string> expected = {manifestName("b2"), dataOf("shared"), dataOf("only b2")};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(objects(storage), expected);

  // Again: nothing left of b1, nothing else touched.
  stats = deleteBackupData(storage, "b1");
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_FALSE(stats->manifest_removed);
  EXPECT_EQ(stats->files_removed, 0u);
  EXPECT_EQ(objects(storage), expected);

  // The last backup: the destination is empty afterwards.
  ASSERT_TRUE(deleteBackupData(storage, "b2"));
  EXPECT_EQ(objects(storage), std::vector<std::string>{});
}

TEST(DeleteBackupData, AnUnreadableManifestOrALostLockStopsIt) {
  FakeStorage storage;
  storeBackup(storage, "b1", {"only b1"});
  storeBackup(storage, "b2", {"only b2"});
  ASSERT_TRUE(storage.putBytes(manifestName("b2"), "{not json"));
  auto stopped = deleteBackupData(storage, "b1");
  ASSERT_FALSE(stopped);
  EXPECT_EQ(stopped.error().kind, StorageError::Kind::kCorrupt);
  EXPECT_NE(stopped.error().message.find("the manifest of backup b2 cannot be read"),
            std::string::npos)
      << stopped.error().message;
  // b1's manifest went (it was to go), but no data file: b2's files are unknown.
  EXPECT_TRUE(storage.size(dataOf("only b1")).value());
  EXPECT_TRUE(storage.size(dataOf("only b2")).value());

  storeBackup(storage, "b2", {"only b2"});
  int asked = 0;
  auto lost = deleteBackupData(storage, "b1", [&] { return ++asked < 1; });
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().kind, StorageError::Kind::kUnavailable);
  EXPECT_TRUE(storage.size(dataOf("only b1")).value()) << "removed after the lock was lost";
}

class DeleteIfAsked : public ::testing::Test {
 protected:
  void SetUp() override {
    keeper_ = server_->connect();
    destination_.path = "/backups";
    storeBackup(storage_, "analytics.b1", {"shared", "only b1"});
    storeBackup(storage_, "analytics.b2", {"shared"});
  }
  void ask(const std::string& uid, const std::string& table_root = kTableRoot) {
    DeletionRequest request;
    request.backup = "analytics.b1";
    request.destination = destination_;
    request.table_roots = {table_root};
    ASSERT_TRUE(core::createAncestorsAndSelf(*keeper_, deletionsPath(table_root)));
    ASSERT_TRUE(keeper_->create(deletionRequestPath(table_root, uid), request.format(),
                                core::CreateMode::kPersistent));
  }
  DeletionRequest stored(const std::string& uid, const std::string& table_root = kTableRoot) {
    return DeletionRequest::parse(keeper_->get(deletionRequestPath(table_root, uid))->data).value();
  }
  std::expected<std::size_t, std::string> look(const DeletionOptions& options = {}) {
    auto replica = server_->connect();
    return deleteIfAsked(*replica, kRoot, kTableRoot, "events-1", opener(), options);
  }
  DestinationOpener opener() {
    return
        [this](const DestinationRef& destination) -> StorageResult<std::unique_ptr<BackupStorage>> {
          EXPECT_EQ(destination, destination_);
          ++opened_;
          return std::unique_ptr<BackupStorage>(new ForwardingStorage(storage_));
        };
  }
  // The test's storage behind a unique_ptr the deleter owns.
  class ForwardingStorage final : public BackupStorage {
   public:
    explicit ForwardingStorage(BackupStorage& target) : target_(target) {}
    std::string location() const override { return target_.location(); }
    StorageResult<std::optional<uint64_t>> size(const std::string& n) override {
      return target_.size(n);
    }
    StorageResult<void> putFile(const std::string& n, const std::filesystem::path& s) override {
      return target_.putFile(n, s);
    }
    StorageResult<void> putBytes(const std::string& n, std::string_view b) override {
      return target_.putBytes(n, b);
    }
    StorageResult<std::string> read(const std::string& n) override { return target_.read(n); }
    StorageResult<void> readToFile(const std::string& n, const std::filesystem::path& t) override {
      return target_.readToFile(n, t);
    }
    StorageResult<std::vector<std::string>> list(const std::string& p) override {
      return target_.list(p);
    }
    StorageResult<void> remove(const std::string& n) override { return target_.remove(n); }

   private:
    BackupStorage& target_;
  };
  // A backup operation on the destination, as BackupInitiator::start writes it.
  BackupOperation operation(const std::string& uid) {
    BackupOperation op;
    op.uid = uid;
    op.name = "analytics." + uid;
    op.tables.push_back({"events", kTableRoot, 1, {"events-0"}});
    op.destination = destination_;
    return op;
  }

  std::shared_ptr<core::testing::FakeKeeperServer> server_ =
      core::testing::FakeKeeperServer::create();
  std::unique_ptr<core::Keeper> keeper_;
  FakeStorage storage_;
  DestinationRef destination_;
  int opened_ = 0;
};

TEST_F(DeleteIfAsked, AReplicaOfTheTableDeletesAndRecordsWhatItRemoved) {
  EXPECT_EQ(look().value(), 0u);  // no request: nothing, not even a lock
  ask("uid-1");
  ask("uid-2", "/rtable/tables/analytics.other");  // another table's: not this replica's
  // Where requests lay before they moved into the tables' trees (open to anyone): not taken.
  DeletionRequest legacy;
  legacy.backup = "analytics.b2";
  legacy.destination = destination_;
  legacy.table_roots = {kTableRoot};
  ASSERT_TRUE(core::createAncestorsAndSelf(*keeper_, kRoot + std::string("/deletions")));
  ASSERT_TRUE(keeper_->create(legacyDeletionRequestPath(kRoot, "uid-3"), legacy.format(),
                              core::CreateMode::kPersistent));
  ASSERT_EQ(look().value(), 1u);
  const DeletionRequest done = stored("uid-1");
  EXPECT_EQ(done.state, DeletionRequest::State::kDone);
  EXPECT_EQ(done.deleter, "events-1");
  EXPECT_EQ(done.files_removed, 1u);
  EXPECT_EQ(done.bytes_removed, std::string("only b1").size());
  EXPECT_EQ(done.message,
            "deleted backup analytics.b1 from /backups: 1 data files (7 bytes) removed, 1 kept "
            "for other backups");
  EXPECT_FALSE(storage_.size(manifestName("analytics.b1")).value());
  EXPECT_TRUE(storage_.size(manifestName("analytics.b2")).value());
  EXPECT_EQ(stored("uid-2", "/rtable/tables/analytics.other").state,
            DeletionRequest::State::kPending);
  EXPECT_FALSE(keeper_->exists(destinationLockPath(kRoot, destination_))->has_value());
  // Done stays done.
  EXPECT_EQ(look().value(), 0u);
}

TEST_F(DeleteIfAsked, WaitsForAnotherDeleterAndForBackupsOnTheDestination) {
  ask("uid-1");
  // Another replica holds the destination.
  ASSERT_TRUE(core::createAncestorsAndSelf(*keeper_, destinationLocksPath(kRoot)));
  auto other = server_->connect();
  ASSERT_TRUE(other->create(destinationLockPath(kRoot, destination_), "events-2",
                            core::CreateMode::kEphemeral));
  EXPECT_EQ(look().value(), 0u);
  EXPECT_EQ(opened_, 0);
  other.reset();  // its session ends: the lock goes

  // A backup on the destination that has just started (no host alive yet): wait.
  server_->setTimeForTest(1'000'000);
  BackupPaths paths{kRoot, "u9"};
  ASSERT_TRUE(
      keeper_->create(paths.operation(), operation("u9").format(), core::CreateMode::kPersistent));
  ASSERT_TRUE(keeper_->create(paths.stage(), "", core::CreateMode::kPersistent));
  server_->setTimeForTest(1'000'000 + 60'000);
  EXPECT_EQ(look().value(), 0u);
  // One with a live host: wait, however old.
  auto host = server_->connect();
  ASSERT_TRUE(host->create(paths.alive("events-0"), "", core::CreateMode::kEphemeral));
  server_->setTimeForTest(1'000'000 + 600'000);
  EXPECT_EQ(look().value(), 0u);
  EXPECT_EQ(opened_, 0);
  EXPECT_EQ(stored("uid-1").state, DeletionRequest::State::kPending);
  // Its host gone and old enough: dead, the deletion goes on.
  host.reset();
  ASSERT_EQ(look().value(), 1u);
  EXPECT_EQ(stored("uid-1").state, DeletionRequest::State::kDone);
}

TEST_F(DeleteIfAsked, ABackupDoesNotStartWhileADeletionHoldsItsDestination) {
  ASSERT_TRUE(core::createAncestorsAndSelf(*keeper_, kTableRoot));
  ASSERT_TRUE(core::createAncestorsAndSelf(*keeper_, destinationLocksPath(kRoot)));
  auto deleter = server_->connect();
  ASSERT_TRUE(deleter->create(destinationLockPath(kRoot, destination_), "events-1",
                              core::CreateMode::kEphemeral));
  auto server = server_;
  core::KeeperFactory factory = [server]() -> core::KeeperResult<std::unique_ptr<core::Keeper>> {
    return server->connect();
  };
  BackupInitiator initiator(factory, BackupPaths{kRoot, "u1"}, operation("u1"));
  auto refused = initiator.start();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, StartRefusal::Kind::kBusy);
  EXPECT_EQ(refused.error().message,
            "the data of a deleted backup is being removed from /backups; the backup starts when "
            "that ends");
  EXPECT_FALSE(keeper_->exists(BackupPaths{kRoot, "u1"}.operation())->has_value());
  EXPECT_FALSE(keeper_->exists(core::backupLockPath(kTableRoot))->has_value());

  deleter.reset();
  auto started = initiator.start();
  ASSERT_TRUE(started) << started.error().message;
}

TEST_F(DeleteIfAsked, AFailureOtherThanUnavailableFailsTheRequestWithItsReason) {
  ask("uid-1");
  DestinationOpener refusing =
      [](const DestinationRef&) -> StorageResult<std::unique_ptr<BackupStorage>> {
    return std::unexpected(StorageError{StorageError::Kind::kAccessDenied, "403 AccessDenied"});
  };
  auto replica = server_->connect();
  ASSERT_EQ(deleteIfAsked(*replica, kRoot, kTableRoot, "events-1", refusing).value(), 1u);
  EXPECT_EQ(stored("uid-1").state, DeletionRequest::State::kFailed);
  EXPECT_EQ(stored("uid-1").message, "403 AccessDenied (AccessDenied)");

  ask("uid-2");
  DestinationOpener unavailable =
      [](const DestinationRef&) -> StorageResult<std::unique_ptr<BackupStorage>> {
    return std::unexpected(StorageError{StorageError::Kind::kUnavailable, "connection refused"});
  };
  ASSERT_EQ(deleteIfAsked(*replica, kRoot, kTableRoot, "events-1", unavailable).value(), 0u);
  EXPECT_EQ(stored("uid-2").state, DeletionRequest::State::kPending);
}

}  // namespace
}  // namespace rtable::backup
