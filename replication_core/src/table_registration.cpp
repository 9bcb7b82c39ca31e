#include "rtable/replication_core/table_registration.h"

#include <fmt/format.h>

#include "rtable/replication_core/sequential_counter.h"

namespace rtable::core {

KeeperResult<Registration> createTableIfNotExists(Keeper& keeper, const TablePaths& paths,
                                                  const std::string& metadata) {
  if (auto root = createAncestorsAndSelf(keeper, paths.table_root); !root) {
    return std::unexpected(root.error());
  }
  // The first generation also names itself active; later ones are switched to by the table swap.
  auto active = keeper.create(paths.activeGeneration(), std::to_string(paths.generation),
                              CreateMode::kPersistent);
  if (!active && active.error().code != KeeperCode::kNodeExists) {
    return std::unexpected(active.error());
  }
  std::vector<Op> ops = {op::Create{paths.generationRoot(), "", CreateMode::kPersistent},
                         op::Create{paths.metadata(), metadata, CreateMode::kPersistent}};
  for (const std::string& node : {paths.columns(), paths.log(), paths.blockNumbers(),
                                  paths.dedupHashes(), paths.quorum(), paths.leaderElection(),
                                  paths.temp(), paths.replicas()}) {
    ops.push_back(op::Create{node, "", CreateMode::kPersistent});
  }
  auto created = keeper.multi(ops);
  if (created) return Registration::kCreated;
  if (created.error().code != KeeperCode::kNodeExists || created.error().failed_op_index != 0u) {
    return std::unexpected(created.error());
  }
  auto existing = keeper.get(paths.metadata());
  if (!existing) return std::unexpected(existing.error());
  if (existing->data != metadata) {
    return std::unexpected(KeeperError{
        KeeperCode::kBadArguments, paths.metadata(),
        fmt::format("the table in ZooKeeper has metadata '{}', this replica's spec gives '{}'",
                    existing->data, metadata),
        {}});
  }
  return Registration::kAlreadyThere;
}

KeeperResult<Registration> createReplicaIfNotExists(Keeper& keeper, const TablePaths& paths) {
  auto log = keeper.exists(paths.log());
  if (!log) return std::unexpected(log.error());
  if (!*log) return std::unexpected(KeeperError{KeeperCode::kNoNode, paths.log(), "table not created", {}});
  const bool log_has_entries = SequentialCounter::fromStat(**log).counter() > 0;
  auto replicas = keeper.exists(paths.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  // The replicas node's version guards against a concurrent log cleanup deciding without us.
  auto created = keeper.multi({
      op::Create{paths.replicaRoot(), "", CreateMode::kPersistent},
      op::Create{paths.host(), "", CreateMode::kPersistent},
      op::Create{paths.isLost(), log_has_entries ? "1" : "0", CreateMode::kPersistent},
      op::Create{paths.logPointer(), "", CreateMode::kPersistent},
      op::Create{paths.queue(), "", CreateMode::kPersistent},
      op::Create{paths.parts(), "", CreateMode::kPersistent},
      op::Set{paths.replicas(), "last added replica: " + paths.replica, (*replicas)->version},
  });
  if (created) return Registration::kCreated;
  if (created.error().code == KeeperCode::kNodeExists && created.error().failed_op_index == 0u) {
    return Registration::kAlreadyThere;
  }
  return std::unexpected(created.error());
}

KeeperStatus activateReplica(Keeper& keeper, const TablePaths& paths, const std::string& address) {
  const std::string session = fmt::format("{:x}", keeper.sessionId());
  auto activated = keeper.multi({
      op::Create{paths.isActive(), session, CreateMode::kEphemeral},
      op::Set{paths.host(), address, -1},
  });
  if (activated) return {};
  if (activated.error().code != KeeperCode::kNodeExists) return std::unexpected(activated.error());
  // Our own node from this same session (a retried activation) is fine; another session's is not
  // ours to remove: it goes when that session times out.
  auto owner = keeper.get(paths.isActive());
  if (owner && owner->data == session) return {};
  return std::unexpected(KeeperError{KeeperCode::kNodeExists, paths.isActive(),
                                     "another live session holds this replica's is_active; "
                                     "is a second process serving the same replica?",
                                     {}});
}

}  // namespace rtable::core
