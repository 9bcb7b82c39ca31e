#include "rtable/controllers/replicated_table_controller.h"

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

  auto reconciler =
      std::make_shared<ReplicatedTableReconciler>(process.client(), options.reconciler);
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
  auto tables = std::make_shared<op::Informer>(process.client(), tables_options);
  tables->addHandlers(op::enqueueObject(controller->queue()));

  op::InformerOptions sets_options;
  sets_options.type = op::resources::statefulSets();
  sets_options.ns = options.watch_namespace;
  sets_options.label_selector = "app.kubernetes.io/managed-by=rtable-operator";
  auto sets = std::make_shared<op::Informer>(process.client(), sets_options);
  sets->addHandlers(
      op::enqueueOwner(controller->queue(), op::OwnerFilter{"rtable.io", "ReplicatedTable"}));

  process.addInformer(*tables);
  process.addInformer(*sets);
  process.addController(*controller);
  // Destroyed newest first: the controller (its workers use the reconciler) before the reconciler.
  process.adopt(reconciler);
  process.adopt(tables);
  process.adopt(sets);
  process.adopt(controller);
  return {};
}

}  // namespace rtable::controllers
