// The ReplicatedTable reconciler (DESIGN.md 3, issue 6), first part: from a table's spec to its
// owned Kubernetes objects and its status. Level-based and idempotent, as controller-runtime's
// reconcilers are: each call reads the table, server-side applies every owned object
// (renderTableObjects) and patches the status subresource; running it twice changes nothing, and
// a hand edit of an owned field is reverted by the next call.
//
// - A spec the operator cannot act on (it fails ReplicatedTableSpec::parse, or the name is not a
//   valid StatefulSet name) changes no object: the Ready condition says why (reason InvalidSpec),
//   and the key is not retried until the table changes (a terminal error).
// - The interserver Secret's value is generated once and then read back, never rotated by a
//   reconcile (replicas would stop trusting each other mid-flight).
// - Status (ReplicatedTableStatus): observedGeneration, replicas, readyReplicas, "ready" (x/y, the
//   printer column), the pods' selector (for the scale subresource), and conditions Ready and
//   Degraded with reason, message and lastTransitionTime (changed only when a condition's status
//   changes).
//
// - ZooKeeper (when `keeper_for` is given): the status carries the active generation, the log's
//   max index, counter and headroom (HeadroomLow below spec.headroom.thresholdPercent), and
//   replicas a scale-down left behind (ordinal >= spec.replicas, their pod gone) are removed from
//   ZooKeeper with dropReplica, retried every reconcile until done (a stale replica would hold the
//   log back until marked lost). ZooKeeper unreachable: Replicating=False, retried in 30 s.
//   Every counter that can stop the table is watched (table_headroom.h: log/, each
//   block_numbers/<partition>/, each replica's queue/), its growth sampled at each reconcile;
//   HeadroomLow names the one that decides, and TableMetrics exports them with the swaps.
//   Every replica's queue (status.replicaQueues: its size, and its oldest entry and how long that
//   has waited); a replica whose oldest entry waited longer than `queue_stuck_after` makes
//   Replicating=False with reason ReplicaQueueNotProgressing, naming it and the entry.
//
// - With ZooKeeper: the table's tree (<root>/<ns>.<name>, its metadata as rtable-core writes it)
//   is created before the StatefulSet is applied, so the first pods join instead of racing to
//   create it; and the finalizer rtable.io/zookeeper-cleanup, added before anything is created,
//   makes a deletion wait until the StatefulSet's pods are gone and then removes the table's
//   ZooKeeper subtree (every generation), retried until it is done.
// - spec.restoreFrom (with ZooKeeper): nothing is created until the ClusterBackup it names is
//   Completed; then the restore request (backup/restore.h) is written before the tree, and the
//   Restored condition follows the replicas' progress.
// - Events (with `events`): InvalidSpec, ApplyFailed, ZooKeeperTreeCreated, ReplicaRemoved,
//   ZooKeeperUnreachable, WaitingForPods, ZooKeeperTreeRemoved, CleanupFailed, RestoreWaiting,
//   RestoreRequested, Restored, RestoreFailed.
//
// Thread safety: reconcile() may run on several workers at once for different keys (the work
// queue never hands one key to two workers); the client must be thread-safe.
#pragma once

#include <chrono>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "rtable/backup/restore.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/controllers/replicated_table_status.h"
#include "rtable/controllers/table_headroom.h"
#include "rtable/controllers/table_metrics.h"
#include "rtable/operator/controller.h"
#include "rtable/operator/event_recorder.h"
#include "rtable/operator/kube_client.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers {

// group rtable.io, version v1alpha1, replicatedtables.
op::ResourceType replicatedTables();

struct ReplicatedTableReconcilerOptions {
  std::string image = "rtable/rtable:dev";
  std::string field_manager = "rtable-operator";
  // 32 random bytes, hex, or why none could be had (the kernel's random source failed: the
  // table's objects then wait, rather than carry a predictable secret); tests inject their own.
  std::function<std::expected<std::string, std::string>()> generate_secret;
  // Condition timestamps (RFC 3339). Default: the system clock.
  std::function<std::chrono::system_clock::time_point()> wall_clock;
  // A session to the ZooKeeper of a connect string (the caller keeps one per string) holding the
  // table's identity (its digest added, so that the nodes the operator creates carry the table's
  // ACL and it can read the others). Unset: the reconciler does not look at ZooKeeper.
  std::function<core::KeeperResult<std::shared_ptr<core::Keeper>>(
      const std::string& connect, const core::ZooKeeperDigest& identity)>
      keeper_for;
  // Gives every node at the identity's subtree and below the identity's ACL, on the session
  // keeper_for hands out (core::ZooKeeperClient::restrictSubtree); how many nodes changed.
  // Unset: tables made before ACLs keep their open nodes (no ZooKeeperSecured condition).
  std::function<core::KeeperResult<std::size_t>(const std::string& connect,
                                                const core::ZooKeeperDigest& identity)>
      restrict_subtree;
  // Where Events go; null: none. Must outlive the reconciler.
  op::EventRecorder* events = nullptr;
  // A replica whose oldest queue entry has sat in its queue this long is not progressing
  // (Replicating=False, reason ReplicaQueueNotProgressing).
  std::chrono::seconds queue_stuck_after{600};
  // Where the table-level metrics go (TableMetrics); null: none. Must outlive the reconciler.
  prometheus::Registry* registry = nullptr;
  // The counters' growth rate (spec.headroom.exhaustionDays) is taken over this window, once the
  // operator has sampled a counter for `growth_min_span`.
  std::chrono::seconds growth_window{3600};
  std::chrono::seconds growth_min_span{600};
  // After an aborted swap, the next automatic one waits this long (unless the table is stuck).
  std::chrono::seconds swap_retry_after{900};
  // Called right after a table swap's plan was written to ZooKeeper (a step recorded), before
  // anything else: the crash tests' fail point (RTABLE_OPERATOR_FAILPOINT in
  // controllers/tools/operator_main.cpp) kills the operator there. Unset in production.
  std::function<void(const core::SwapPlan&)> swap_step_recorded_for_test;
};

// The ZooKeeper identity of table `name` from its Secret (spec.zookeeper.credentialsSecret, or the
// operator's <name>-zookeeper), owning `<zookeeper.root>/<namespace>.<name>`; or why it cannot be
// read (kubernetes.io/basic-auth keys username, without ':', and password, both non-empty; during
// a rotation also previousPassword). nullopt: the Secret does not exist.
// `version`: where to put the Secret's resourceVersion, if wanted.
std::expected<std::optional<core::ZooKeeperDigest>, std::string> readTableIdentity(
    op::KubeClient& client, const std::string& ns, const std::string& name,
    const ReplicatedTableSpec& spec, std::string* version = nullptr);

// On every ReplicatedTable the reconciler manages ZooKeeper for.
inline constexpr std::string_view kZooKeeperFinalizer = "rtable.io/zookeeper-cleanup";

class ReplicatedTableReconciler {
 public:
  ReplicatedTableReconciler(op::KubeClient& client, ReplicatedTableReconcilerOptions options = {});

  op::ReconcileOutcome reconcile(const op::ObjectKey& key);

 private:
  // Merge-patches `status` (its fields that are set) into the table's, its conditions stamped with
  // the table's generation and, where their status changed, `now` (stampConditions).
  op::ReconcileOutcome patchStatus(const nlohmann::json& table, ReplicatedTableStatus status,
                                   const std::string& now);
  // The deletion path: pods gone, then the ZooKeeper subtree, then the finalizer.
  op::ReconcileOutcome finalize(const op::ObjectKey& key, const nlohmann::json& table);
  // Adds kZooKeeperFinalizer if missing; an error message when the patch failed.
  std::optional<std::string> ensureFinalizer(const op::ObjectKey& key, const nlohmann::json& table);
  // Creates the table's tree if it does not exist; its active generation, or why it could not be
  // read or made.
  std::expected<int64_t, std::string> ensureZooKeeperTree(const op::ObjectKey& key,
                                                          const ReplicatedTableSpec& spec,
                                                          const nlohmann::json& table);
  void event(const nlohmann::json& table, op::EventType type, std::string_view reason,
             const std::string& message);
  // spec.restoreFrom: writes the restore request (backup/restore.h) into the table's ZooKeeper
  // root if it is not there yet, from the ClusterBackup it names. nullopt: the request is there;
  // otherwise why the table waits (condition reason, message): BackupNotFound,
  // BackupNotCompleted, BackupFailed, TableNotInBackup, ZooKeeperUnreachable, ...
  std::optional<std::pair<std::string, std::string>> ensureRestoreRequest(
      const op::ObjectKey& key, const ReplicatedTableSpec& spec, const nlohmann::json& table);
  // Creates the request node (and the table root); nullopt, or why not (as ensureRestoreRequest).
  std::optional<std::pair<std::string, std::string>> writeRestoreRequest(
      const nlohmann::json& table, core::Keeper& keeper, const std::string& root,
      const backup::RestoreRequest& request, const std::string& source);
  // The Restored condition from the request's state (Events Restored and RestoreFailed when it
  // changes); true while the restore has still to end.
  bool reconcileRestoreStatus(const nlohmann::json& table, const op::ObjectKey& key,
                              const ReplicatedTableSpec& spec, ReplicatedTableStatus& status);
  // The reason of the table's Restored condition now ("" when it has none).
  static std::string restoreReason(const nlohmann::json& table);
  // Fills the ZooKeeper part of `status` (fields and conditions) and removes scaled-down replicas,
  // given the table's active generation (ensureZooKeeperTree); an error message when ZooKeeper
  // could not be asked.
  // The table swap (DESIGN.md 2.6): moves a running one on (core::SwapDriver), starts one when
  // headroom is low (and spec.headroom.autoRecover) or the rtable.io/swap annotation has a value
  // no swap was started for yet; status.recovery, the Recovering condition and Events say where
  // it stands. An error message when ZooKeeper could not be asked.
  std::optional<std::string> reconcileSwap(const nlohmann::json& table, const op::ObjectKey& key,
                                           const ReplicatedTableSpec& spec, core::Keeper& keeper,
                                           const std::string& root, const HeadroomVerdict& headroom,
                                           ReplicatedTableStatus& status);
  // The table is gone: its metrics, growth samples and ZooKeeper identity.
  void forgetTable(const op::ObjectKey& key);
  // The table's ZooKeeper identity from its Secret (spec.zookeeper.credentialsSecret, or the
  // operator's <name>-zookeeper, made first when `table` (the object, for its uid) is given and
  // then kept), remembered for keeperFor; or why it cannot be had.
  struct IdentityError {
    std::string reason;  // SecretUnavailable (no randomness), ZooKeeperCredentialsUnavailable
    std::string message;
  };
  // `version`: the Secret's resourceVersion (the pod template's, so that a rotation rolls them).
  std::expected<core::ZooKeeperDigest, IdentityError> zookeeperIdentity(
      const op::ObjectKey& key, const ReplicatedTableSpec& spec, const nlohmann::json* table,
      std::string* version = nullptr);
  // spec.api Token: the tokens Secret exists with a token (made once when the operator owns it,
  // <name>-api-tokens, and `table` is given: the object, for its uid); its resourceVersion (""
  // with authentication None), or why not (reasons SecretUnavailable, ApiTokensUnavailable).
  std::expected<std::string, IdentityError> ensureApiTokens(const op::ObjectKey& key,
                                                            const ReplicatedTableSpec& spec,
                                                            const nlohmann::json* table);
  // spec.tls: its Secret exists, and its tls.crt and tls.key could serve the first replica's
  // address (<name>-0.<name>-headless.<ns>.svc), or why not (reason TlsSecretUnavailable): pods
  // started without them would not start, or would refuse each other's fetches.
  std::optional<IdentityError> checkTlsSecret(const op::ObjectKey& key,
                                              const ReplicatedTableSpec& spec);
  // spec.networkPolicy disabled: the table's NetworkPolicy is deleted if it has one (looked for
  // once per table and process); an error message when the delete failed.
  std::expected<void, std::string> removeNetworkPolicyIfDisabled(const op::ObjectKey& key,
                                                                 const ReplicatedTableSpec& spec);
  // options_.keeper_for with the identity zookeeperIdentity remembered for the table.
  core::KeeperResult<std::shared_ptr<core::Keeper>> keeperFor(const op::ObjectKey& key,
                                                              const ReplicatedTableSpec& spec);
  // The ZooKeeperSecured condition: once every replica runs with the identity (the StatefulSet
  // rolled), every node of the table is given the identity's ACL, once per version of its Secret
  // (`identity_version`): nodes made before ACLs (a table older than them), and after each step
  // of a password rotation (both passwords, then the new one alone).
  void secureZooKeeperTree(const nlohmann::json& table, const op::ObjectKey& key,
                           const ReplicatedTableSpec& spec, const nlohmann::json& stateful_set,
                           const std::string& identity_version, ReplicatedTableStatus& status);
  std::optional<std::string> reconcileZooKeeper(const nlohmann::json& table,
                                                const op::ObjectKey& key,
                                                const ReplicatedTableSpec& spec,
                                                const std::expected<int64_t, std::string>& tree,
                                                ReplicatedTableStatus& status);

  op::KubeClient& client_;
  ReplicatedTableReconcilerOptions options_;
  std::unique_ptr<CounterGrowth> growth_;
  std::unique_ptr<TableMetrics> metrics_;  // null without options_.registry
  std::mutex identities_mu_;
  std::map<std::string, core::ZooKeeperDigest> identities_;  // "<ns>/<name>", under identities_mu_
  std::set<std::string> without_policy_;  // tables known to have no NetworkPolicy, ditto
};

}  // namespace rtable::controllers
