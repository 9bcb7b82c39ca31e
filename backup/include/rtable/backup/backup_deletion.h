// Deleting a backup's data (a ClusterBackup deleted with deletionPolicy Delete, DESIGN.md 2.7).
//
// The operator writes a DeletionRequest to <table root>/backup_deletions/<uid> of one of the
// backup's tables; a replica of that table takes it (it can open the destination: it mounts the
// path, or the S3 credentials). Inside the table's tree the request carries the table's ACL: only
// holders of its identity (the operator, its replicas) can write one, so a replica deletes backup
// data only when asked by them. (Before, requests lay in <backups root>/deletions, where anyone
// reaching ZooKeeper could have asked.) The replica holds the destination's lock, the ephemeral
// <backups root>/destinations/<key>, for the whole run, and goes on only when no backup operation
// on the same destination is alive. BackupInitiator::start checks the lock in the multi that
// creates an operation, so from then on no backup writes to the destination, and none can reuse a
// data file the deletion removes: ZooKeeper orders the lock's create and every operation's
// create, and the deletion looks at the operations after its create.
//
// What is removed (deleteBackupData): the backup's manifest first (from then on it is not a
// backup), the rest of backups/<name>/, then every data file that no remaining manifest refers to
// (files shared with other backups stay; files of backups that failed before their manifest go
// too). A run cut short is finished by the next (each step is idempotent).
//
// Thread safety: DeletionRequest is a value; deleteIfAsked may run in several threads and
// processes at once (the lock keeps one deleter per destination).
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/backup/backup_operation.h"
#include "rtable/backup/backup_storage.h"
#include "rtable/backup/restore.h"
#include "rtable/replication_core/keeper.h"

namespace rtable::backup {

struct DeletionRequest {
  enum class State { kPending, kDone, kFailed };
  std::string backup;  // the backup's name in the destination: backups/<backup>/
  DestinationRef destination;
  std::vector<std::string> table_roots;  // replicas of these tables may delete
  State state = State::kPending;
  std::string message;  // kFailed: why
  std::string deleter;  // the replica that finished it
  uint64_t files_removed = 0;
  uint64_t bytes_removed = 0;
  int64_t requested_ms = 0;
  int64_t finished_ms = 0;

  std::string format() const;
  // The error names the field.
  static std::expected<DeletionRequest, std::string> parse(std::string_view text);
  friend bool operator==(const DeletionRequest&, const DeletionRequest&) = default;
};

// <table root>/backup_deletions, and the request of operation `uid` in it.
std::string deletionsPath(std::string_view table_root);
std::string deletionRequestPath(std::string_view table_root, std::string_view uid);
// Where requests were written before they moved into the tables (an upgraded operator removes
// the one it made there).
std::string legacyDeletionRequestPath(std::string_view backups_root, std::string_view uid);
// <backups root>/destinations: exists before any operation starts (the lock check needs it).
std::string destinationLocksPath(std::string_view backups_root);
// The destination's lock: <backups root>/destinations/<key>, the key a hash of where the
// destination is (kind, endpoint, bucket, prefix, path; not the credentials).
std::string destinationLockPath(std::string_view backups_root, const DestinationRef& destination);
// Whether two refs name the same place (credentials aside).
bool sameDestination(const DestinationRef& a, const DestinationRef& b);

struct DeletionStats {
  uint64_t files_removed = 0;  // data files
  uint64_t bytes_removed = 0;  // their bytes (from their names)
  uint64_t files_kept = 0;     // data files other backups refer to
  bool manifest_removed = false;
};

// Removes backup `name` from `storage` as the header comment says. `keep_going` is asked before
// each removal; false stops the run (kUnavailable "stopped"): the caller lost its lock. A
// manifest that cannot be read stops the run (kCorrupt, naming it): the files it refers to are
// unknown, so no data file can be called unreferenced.
StorageResult<DeletionStats> deleteBackupData(BackupStorage& storage, const std::string& name,
                                              const std::function<bool()>& keep_going = {});

struct DeletionOptions {
  // An operation on the destination without a live host is taken for dead only once it is older
  // than this (by ZooKeeper's clock): its initiator joins just after creating it.
  std::chrono::milliseconds dead_operation_age{120000};
};

// One look by replica `host` of the table at `table_root` at its table's deletion requests: each
// pending one that names the table is run here unless another replica holds its destination's lock
// or a backup on the destination is alive (then a later look tries again). A destination that is
// unavailable leaves the request pending; any other storage error fails it, with the reason.
// Returns how many requests this look finished (done or failed).
std::expected<std::size_t, std::string> deleteIfAsked(
    core::Keeper& keeper, const std::string& backups_root, const std::string& table_root,
    const std::string& host, const DestinationOpener& open, const DeletionOptions& options = {});
// The same for the requests `names` (children of deletionsPath) a caller listed already, with a
// watch of its own.
std::expected<std::size_t, std::string> deleteRequested(
    core::Keeper& keeper, std::vector<std::string> names, const std::string& backups_root,
    const std::string& table_root, const std::string& host, const DestinationOpener& open,
    const DeletionOptions& options = {});

}  // namespace rtable::backup
