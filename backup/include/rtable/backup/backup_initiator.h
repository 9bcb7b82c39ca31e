// The initiator's side of one cluster backup (seed 001): the operator starts the operation, takes
// part in every stage barrier as host "", and follows it to its end. Non-blocking: a reconciler
// calls poll() on each pass and requeues, or at once when onChange says a host moved.
//
// start() creates, in one multi, the operation node (the BackupOperation every replica reads), its
// subtree, and for each table the lock <table root>/backup, checked against a running table swap
// (<table root>/swap): a backup and a swap never overlap, and a second backup of a table while one
// runs is refused. A lock whose operation has no live host left (a dead operator's) is taken over.
//
// Thread safety: one thread drives an initiator.
#pragma once

#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "rtable/backup/backup_host.h"
#include "rtable/backup/backup_operation.h"
#include "rtable/backup/stage_sync.h"

namespace rtable::backup {

struct StartRefusal {
  enum class Kind {
    kBusy,    // a table swap or another backup runs on a table: try again later
    kFailed,  // ZooKeeper said no for another reason
  };
  Kind kind = Kind::kFailed;
  std::string message;
};

struct BackupProgress {
  enum class Phase { kRunning, kCompleted, kFailed };
  Phase phase = Phase::kRunning;
  std::optional<BackupError> error;
  struct Host {
    std::string stage;  // the last stage it reached ("" before any)
    bool alive = false;
    HostStats stats;  // from its "writing backup" result
  };
  std::map<std::string, Host> hosts;  // the replicas
  HostStats totals;
  std::optional<BackupSummary> summary;  // once completed
};

class BackupInitiator {
 public:
  BackupInitiator(core::KeeperFactory factory, BackupPaths paths, BackupOperation operation,
                  StageSyncOptions options = {});

  // Creates the operation and joins it.
  std::expected<void, StartRefusal> start();
  // Joins an operation this initiator (an earlier process) started: after an operator restart.
  BackupResult<void> resume();
  // One look: publishes the initiator's stage for every stage all replicas reached, and says
  // where the operation is. A replica gone past its timeout fails it (the error node is set).
  BackupResult<BackupProgress> poll();
  // Called (on ZooKeeper's thread, keep it short) when a host reached a stage, finished or failed
  // after a poll(): the caller polls again at once instead of at its next period.
  void onChange(std::function<void()> listener) { sync_.setChangeListener(std::move(listener)); }
  // After completion or failure: the table locks go and the operation's nodes are removed.
  BackupResult<void> cleanUp();
  // Fails the operation (a user deleted the backup, or the operator gave up).
  void fail(const std::string& message);

  const BackupOperation& operation() const { return operation_; }

 private:
  const core::KeeperFactory factory_;
  const BackupPaths paths_;
  const BackupOperation operation_;
  const StageSyncOptions options_;
  BackupStageSync sync_;
  std::map<std::string, common::Clock::TimePoint> missing_since_;
};

}  // namespace rtable::backup
