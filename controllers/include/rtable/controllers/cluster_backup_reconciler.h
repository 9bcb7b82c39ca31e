// The ClusterBackup controller (DESIGN.md 2.7, 3): one ClusterBackup is one run of the cluster
// backup protocol (backup/), with the operator as its initiator. Level-based: each reconcile reads
// the object and ZooKeeper and moves the run one step.
//
//   Pending    the tables are resolved (spec.table, or every ReplicatedTable in the namespace the
//              selector matches), their live replicas (is_active in the active generation) are the
//              hosts, and the operation is started (BackupInitiator::start). A table swap or
//              another backup of a table running: stays Pending (condition Waiting says which),
//              retried every 5 s.
//   Running    followed as its hosts move (a watch on its stage nodes requeues it) and polled
//              every second: each host's stage, bytes written and reused. An operator that
//              restarted resumes the operation from ZooKeeper (its alive node recreated).
//   Completed  the manifest was written last; status says where, the tables' generation, parts
//              and rows, files, bytes written and bytes reused from earlier backups.
//   Failed     a host's error, a host gone, an operation lost: status.error and the Failed
//              condition (reason: HostGone, AccessDenied, NoBucket, NoSpace, ...) say which.
// The operation's nodes and the tables' backup locks are removed once it ended; a deleted
// ClusterBackup's running operation is failed first.
//
// Events: Started, Waiting, Completed, Failed. Thread safety: reconcile() may run on several
// workers for different keys.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "rtable/backup/backup_initiator.h"
#include "rtable/controllers/backup_metrics.h"
#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/operator/controller.h"
#include "rtable/operator/event_recorder.h"
#include "rtable/operator/kube_client.h"
#include "rtable/operator/operator_process.h"
#include "rtable/operator/resource.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers {

// group rtable.io, version v1alpha1, clusterbackups.
op::ResourceType clusterBackups();

// A ClusterBackup's name in its destination (backups/<name>/): "<namespace>.<name>".
std::string backupNameFor(const op::ObjectKey& key);
// Where a ClusterBackup's spec sends it, as the replicas receive it.
backup::DestinationRef destinationOf(const ClusterBackupSpec& spec);
// An S3 location as the replicas receive it (the credentials by their Secret's name only).
backup::DestinationRef s3DestinationRef(const BackupDestination::S3& s3);
// A claim as the replicas receive it: they open it under their own mount of it.
backup::DestinationRef volumeDestinationRef(const BackupDestination::PersistentVolumeClaim& claim);
// Why the replicas of table `table` (namespace `ns`, its spec) cannot open `destination`, as
// (reason, message), or nullopt when they can as far as the operator sees. An S3 destination's
// Secret must exist with both keys (CredentialsNotFound) and be mounted by the table's pods, i.e.
// listed in its spec.backupCredentials (CredentialsNotMounted). A volume destination's claim must
// exist (ClaimNotFound), be ReadWriteMany when the table has more than one replica (ClaimNotShared:
// its pods may run on several nodes) and be listed in spec.backupVolumes (ClaimNotMounted).
std::optional<std::pair<std::string, std::string>> mountProblem(
    op::KubeClient& client, const std::string& ns, const std::string& table,
    const ReplicatedTableSpec& spec, const backup::DestinationRef& destination);

// On a ClusterBackup whose deletionPolicy is Delete: its data is removed from the destination
// before the object goes (backup_deletion.h).
inline constexpr std::string_view kBackupDataFinalizer = "rtable.io/backup-data";

struct ClusterBackupReconcilerOptions {
  std::string field_manager = "rtable-operator";
  // A new ZooKeeper session as `config` says: its connect string, the identities of the backup's
  // tables (their nodes refuse everyone else) and the operation they share (its nodes take their
  // ids). Each running backup holds its own (its alive node lives in it). Unset: rtable's
  // ZooKeeper client.
  std::function<core::KeeperResult<std::unique_ptr<core::Keeper>>(
      const core::ZooKeeperConfig& config)>
      new_session;
  op::EventRecorder* events = nullptr;  // must outlive the reconciler
  // Where the backup metrics go (BackupMetrics); null: none. Must outlive the reconciler.
  prometheus::Registry* registry = nullptr;
  std::function<std::chrono::system_clock::time_point()> wall_clock;
  backup::StageSyncOptions sync;
  // Requeues a ClusterBackup (the controller's queue): called when a host of its running backup
  // moved, so that the initiator takes its part in a barrier within milliseconds rather than at
  // the next poll. Unset: polls only.
  std::function<void(const op::ObjectKey&)> wake;
  // The poll covers a lost watch.
  std::chrono::milliseconds poll_period{1000};
  std::chrono::milliseconds busy_retry{5000};
  // A deletion no replica finished in this long is given up: the object goes, the data stays
  // (a Warning Event says so).
  std::chrono::milliseconds deletion_give_up{3600 * 1000};
};

class ClusterBackupReconciler {
 public:
  ClusterBackupReconciler(op::KubeClient& client, ClusterBackupReconcilerOptions options = {});

  op::ReconcileOutcome reconcile(const op::ObjectKey& key);

 private:
  struct Running {
    op::ObjectKey key;
    std::unique_ptr<backup::BackupInitiator> initiator;
  };
  op::ReconcileOutcome start(const op::ObjectKey& key, const nlohmann::json& object);
  // A deleted ClusterBackup (deletionTimestamp set): its run stops, then its data goes as its
  // deletionPolicy says, then the finalizer.
  op::ReconcileOutcome finalize(const op::ObjectKey& key, const nlohmann::json& object);
  op::ReconcileOutcome removeFinalizer(const op::ObjectKey& key, const nlohmann::json& object);
  // Fails and cleans up the run of `key`, if this operator follows one.
  void stopRunning(const op::ObjectKey& key, const std::string& why);
  op::ReconcileOutcome follow(const op::ObjectKey& key, const nlohmann::json& object,
                              Running& running);
  op::ReconcileOutcome patchStatus(const op::ObjectKey& key, const nlohmann::json& object,
                                   nlohmann::json status);
  void event(const nlohmann::json& object, op::EventType type, std::string_view reason,
             const std::string& message);
  core::KeeperFactory factoryFor(core::ZooKeeperConfig config) const;

  // The backup's tables and schedule, for the metrics.
  void recordFailure(const nlohmann::json& object, const std::string& reason);

  op::KubeClient& client_;
  ClusterBackupReconcilerOptions options_;
  std::unique_ptr<BackupMetrics> metrics_;  // null without options_.registry
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Running>> running_;  // by the ClusterBackup's uid
};

struct ClusterBackupControllerOptions {
  ClusterBackupReconcilerOptions reconciler;
  std::string watch_namespace;  // "": every namespace
  int workers = 2;
};

// Adds the ClusterBackup informer and controller to `process`, which adopts them.
std::expected<void, std::string> addClusterBackupController(op::OperatorProcess& process,
                                                            ClusterBackupControllerOptions options);

}  // namespace rtable::controllers
