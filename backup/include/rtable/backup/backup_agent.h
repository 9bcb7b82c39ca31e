// A replica's watcher of cluster backups: looks at <backups root> (on a child watch, and every
// `poll_period` in case a watch was lost), and runs BackupHost for each operation that names
// this replica and that it has not started yet, one at a time, in its own thread. With
// restoreInto, it also looks at the table's restore request and restores when elected. A replica
// that restarts mid-operation does not rejoin it (its started| node exists): the operation
// fails cleanly, and the operator starts a new one.
//
// Thread safety: construct, then start(); stop() (or the destructor) ends the thread, stopping a
// running operation (which then fails, naming this replica).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "rtable/backup/backup_deletion.h"
#include "rtable/backup/backup_host.h"
#include "rtable/backup/backup_storage.h"
#include "rtable/backup/restore.h"

namespace rtable::backup {

// Opens the destination an operation names (credentials come from the replica's side).
using StorageFactory =
    std::function<StorageResult<std::unique_ptr<BackupStorage>>(const BackupOperation&)>;

struct BackupAgentOptions {
  std::chrono::milliseconds poll_period{5000};
  BackupHostOptions host;
  DeletionOptions deletion;
};

class BackupAgent {
 public:
  // `source` must outlive the agent. `table_root` is this replica's table (<zk root>/<uid>).
  BackupAgent(core::KeeperFactory factory, std::string backups_root, std::string table_root,
              std::string host, BackupTableSource& source, StorageFactory storage,
              BackupAgentOptions options = {});
  ~BackupAgent();

  // Restores too (restore.h): the table this replica serves is `target` (must outlive the
  // agent); `refuse_inserts` is told, at each look, why inserts must wait (nullopt: they need
  // not). Before start().
  void restoreInto(RestoreTarget& target, DestinationOpener open,
                   std::function<void(std::optional<std::string>)> refuse_inserts,
                   RestoreOptions options = {});

  void start();
  void stop();

  // One look at the operations, running whatever names this replica, in the calling thread.
  void runOnceForTest() { lookAndRun(); }
  // Operations this agent ran, and how each ended ("completed" or the error).
  std::map<std::string, std::string> outcomesForTest() const;

 private:
  void loop();
  void lookAndRun();
  void lookAtRestore();
  // Deletes the data of deleted backups of this replica's table (backup_deletion.h).
  void lookAtDeletions();
  // A watch callback that wakes the loop.
  core::WatchCallback waker();
  void runOperation(const BackupOperation& operation);

  const core::KeeperFactory factory_;
  const std::string backups_root_;
  const std::string table_root_;
  const std::string host_;
  BackupTableSource& source_;
  const StorageFactory storage_;
  const BackupAgentOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool wake_ = false;
  std::set<std::string> seen_;                   // operation node names looked at
  std::map<std::string, std::string> outcomes_;  // uid -> outcome
  BackupHost* running_ = nullptr;                // guarded by mu_
  RestoreTarget* restore_target_ = nullptr;      // set before start()
  DestinationOpener restore_open_;
  std::function<void(std::optional<std::string>)> refuse_inserts_;
  RestoreOptions restore_options_;
  bool restore_ended_ = false;            // loop thread only
  std::shared_ptr<core::Keeper> keeper_;  // the watch's session (loop thread only)
  std::thread thread_;
};

}  // namespace rtable::backup
