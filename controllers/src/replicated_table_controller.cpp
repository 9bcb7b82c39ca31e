#include "rtable/controllers/replicated_table_controller.h"

#include "rtable/operator/cached_kube_client.h"
#include "rtable/operator/controller.h"
#include "rtable/operator/event_handlers.h"
#include "rtable/operator/informer.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers {

core::KeeperResult<std::shared_ptr<core::ZooKeeperClient>> KeeperSessions::clientFor(
    const std::string& connect, const core::ZooKeeperDigest& identity) {
  std::shared_ptr<core::ZooKeeperClient> client;
  {
    std::lock_guard lock(mu_);
    auto& session = sessions_[connect];
    if (!session || session->expired()) {
      // Connecting under the lock: reconciles of tables on the same ZooKeeper wait for one
      // session instead of each opening their own.
      auto made = core::ZooKeeperClient::connect(
          core::ZooKeeperConfig{connect, session_timeout_, connect_timeout_});
      if (!made) return std::unexpected(made.error());
      session = std::shared_ptr<core::ZooKeeperClient>(std::move(*made));
    }
    client = session;
  }
  // Outside the lock: one table's slow authentication does not hold up the others.
  if (auto added = client->addDigest(identity); !added) return std::unexpected(added.error());
  return client;
}

core::KeeperResult<std::shared_ptr<core::Keeper>> KeeperSessions::sessionFor(
    const std::string& connect, const core::ZooKeeperDigest& identity) {
  auto client = clientFor(connect, identity);
  if (!client) return std::unexpected(client.error());
  return std::shared_ptr<core::Keeper>(std::move(*client));
}

core::KeeperResult<std::size_t> KeeperSessions::restrictSubtree(
    const std::string& connect, const core::ZooKeeperDigest& identity) {
  auto client = clientFor(connect, identity);
  if (!client) return std::unexpected(client.error());
  return (*client)->restrictSubtree(identity.subtree);
}

std::expected<void, std::string> addReplicatedTableController(
    op::OperatorProcess& process, ReplicatedTableControllerOptions options) {
  if (options.workers < 1)
    return std::unexpected("the ReplicatedTable controller needs at least one worker");
  if (options.manage_zookeeper && !options.reconciler.keeper_for) {
    auto sessions = std::make_shared<KeeperSessions>();
    process.adopt(sessions);
    options.reconciler.keeper_for = [sessions](const std::string& connect,
                                               const core::ZooKeeperDigest& identity) {
      return sessions->sessionFor(connect, identity);
    };
    options.reconciler.restrict_subtree = [sessions](const std::string& connect,
                                                     const core::ZooKeeperDigest& identity) {
      return sessions->restrictSubtree(connect, identity);
    };
  }
  if (!options.reconciler.events) options.reconciler.events = &process.eventRecorder();
  if (!options.reconciler.registry) options.reconciler.registry = &process.registry();

  // The reconciler reads through its informers' caches and skips applies that would change
  // nothing (CachedKubeClient): with a thousand tables polled every 15 s, the apiserver is asked
  // only for what changed.
  auto cached = std::make_shared<op::CachedKubeClient>(process.client(), &process.registry());
  auto reconciler = std::make_shared<ReplicatedTableReconciler>(*cached, options.reconciler);
  op::ControllerOptions controller_options;
  controller_options.name = "replicatedtable";
  controller_options.max_concurrent_reconciles = options.workers;
  controller_options.registry = &process.registry();
  auto controller = std::make_shared<op::Controller>(
      std::move(controller_options),
      [reconciler](const op::ObjectKey& key) { return reconciler->reconcile(key); });

  op::InformerOptions tables_options;
  tables_options.type = replicatedTables();
  tables_options.ns = options.watch_namespace;
  tables_options.transform = op::stripManagedFields;
  auto tables = std::make_shared<op::Informer>(process.client(), tables_options);
  tables->addHandlers(op::enqueueObject(controller->queue()));
  process.addInformer(*tables);
  cached->serveFrom(*tables);

  // The objects a table owns, as renderTableObjects makes them (all carry the managed-by label):
  // a change to one enqueues its table (controller-runtime's Owns()), and the reconciler's reads
  // and applies of them are answered from here. Not Secrets: listing them would let the operator
  // read every Secret of the cluster (docs/helm.md), so their reads and the interserver Secret's
  // apply go to the apiserver.
  std::vector<std::shared_ptr<op::Informer>> owned;
  for (const op::ResourceType& type :
       {op::resources::statefulSets(), op::resources::configMaps(), op::resources::services(),
        op::resources::podDisruptionBudgets(), op::resources::networkPolicies()}) {
    op::InformerOptions owned_options;
    owned_options.type = type;
    owned_options.ns = options.watch_namespace;
    owned_options.label_selector = "app.kubernetes.io/managed-by=rtable-operator";
    owned_options.transform = op::stripManagedFields;
    auto informer = std::make_shared<op::Informer>(process.client(), owned_options);
    informer->addHandlers(
        op::enqueueOwner(controller->queue(), op::OwnerFilter{"rtable.io", "ReplicatedTable"}));
    process.addInformer(*informer);
    cached->serveFrom(*informer);
    owned.push_back(std::move(informer));
  }
  process.addController(*controller);
  // Destroyed newest first: the controller (its workers use the reconciler) before the
  // reconciler, the reconciler before the client it reads through, that before its informers.
  process.adopt(tables);
  for (auto& informer : owned) process.adopt(informer);
  process.adopt(cached);
  process.adopt(reconciler);
  process.adopt(controller);
  return {};
}

}  // namespace rtable::controllers
