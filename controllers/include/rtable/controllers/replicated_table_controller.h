// The ReplicatedTable controller as the operator runs it: informers on ReplicatedTables and on the
// StatefulSets they own (a change to an owned StatefulSet, e.g. its readyReplicas, enqueues its
// table, controller-runtime's Owns()), a Controller whose workers call ReplicatedTableReconciler,
// one ZooKeeper session per connect string shared by all reconciles, and the process's Events.
//
// Thread safety: addReplicatedTableController() before OperatorProcess::start(), from its owner.
#pragma once

#include <chrono>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "rtable/controllers/replicated_table_reconciler.h"
#include "rtable/operator/operator_process.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers {

// One session per connect string, made on first use and again after it expired, holding the
// identity of every table it was asked for (added when first asked: a new session learns them
// again as their tables are reconciled). Thread-safe.
class KeeperSessions {
 public:
  explicit KeeperSessions(std::chrono::milliseconds session_timeout = std::chrono::seconds(30),
                          std::chrono::milliseconds connect_timeout = std::chrono::seconds(5))
      : session_timeout_(session_timeout), connect_timeout_(connect_timeout) {}
  core::KeeperResult<std::shared_ptr<core::Keeper>> sessionFor(
      const std::string& connect, const core::ZooKeeperDigest& identity);
  // core::ZooKeeperClient::restrictSubtree of the identity's subtree, on that session.
  core::KeeperResult<std::size_t> restrictSubtree(const std::string& connect,
                                                  const core::ZooKeeperDigest& identity);

 private:
  core::KeeperResult<std::shared_ptr<core::ZooKeeperClient>> clientFor(
      const std::string& connect, const core::ZooKeeperDigest& identity);

  const std::chrono::milliseconds session_timeout_;
  const std::chrono::milliseconds connect_timeout_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<core::ZooKeeperClient>> sessions_;
};

struct ReplicatedTableControllerOptions {
  // image and field_manager are used as given; keeper_for and events are filled in (a
  // KeeperSessions and the process's recorder) when empty and manage_zookeeper is on.
  ReplicatedTableReconcilerOptions reconciler;
  bool manage_zookeeper = true;
  std::string watch_namespace;  // "": every namespace
  int workers = 2;
};

// Adds the informers and the controller to `process`, which adopts them.
std::expected<void, std::string> addReplicatedTableController(
    op::OperatorProcess& process, ReplicatedTableControllerOptions options);

}  // namespace rtable::controllers
