#include "rtable/replication_core/table_registration.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "rtable/replication_core/active_part_set.h"
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
  for (const std::string& node :
       {paths.columns(), paths.log(), paths.blockNumbers(), paths.dedupHashes(), paths.quorum(),
        paths.leaderElection(), paths.temp(), paths.replicas()}) {
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
        KeeperCode::kBadArguments,
        paths.metadata(),
        fmt::format("the table in ZooKeeper has metadata '{}', this replica's spec gives '{}'",
                    existing->data, metadata),
        {}});
  }
  return Registration::kAlreadyThere;
}

KeeperResult<std::optional<int64_t>> readActiveGeneration(Keeper& keeper,
                                                          const std::string& table_root,
                                                          WatchCallback watch) {
  const std::string path = table_root + "/active";
  auto active = keeper.get(path, std::move(watch));
  if (!active) {
    if (active.error().code == KeeperCode::kNoNode) return std::nullopt;
    return std::unexpected(active.error());
  }
  int64_t generation = 0;
  const std::string& text = active->data;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), generation);
  if (error != std::errc() || end != text.data() + text.size() || generation < 1) {
    return std::unexpected(
        KeeperError{KeeperCode::kBadArguments,
                    path,
                    fmt::format("'{}' is not a generation number (a positive integer)", text),
                    {}});
  }
  return generation;
}

KeeperResult<Registration> createReplicaIfNotExists(Keeper& keeper, const TablePaths& paths) {
  KeeperResult<std::vector<OpResult>> created = std::unexpected(KeeperError{});
  // Replicas that register at once (a table's first start, every replica opening the next
  // generation of a swap) bump the replicas node's version under each other: read it again and
  // retry, as ClickHouse's createReplica does on ZBADVERSION.
  for (int attempt = 0;; ++attempt) {
    auto log = keeper.exists(paths.log());
    if (!log) return std::unexpected(log.error());
    if (!*log) {
      return std::unexpected(
          KeeperError{KeeperCode::kNoNode, paths.log(), "table not created", {}});
    }
    const bool log_has_entries = SequentialCounter::fromStat(**log).counter() > 0;
    auto replicas = keeper.exists(paths.replicas());
    if (!replicas) return std::unexpected(replicas.error());
    if (!*replicas) {
      return std::unexpected(
          KeeperError{KeeperCode::kNoNode, paths.replicas(), "table not created", {}});
    }
    // The replicas node's version guards against a concurrent log cleanup deciding without us.
    created = keeper.multi({
        op::Create{paths.replicaRoot(), "", CreateMode::kPersistent},
        op::Create{paths.host(), "", CreateMode::kPersistent},
        op::Create{paths.isLost(), log_has_entries ? "1" : "0", CreateMode::kPersistent},
        op::Create{paths.logPointer(), "", CreateMode::kPersistent},
        op::Create{paths.queue(), "", CreateMode::kPersistent},
        op::Create{paths.parts(), "", CreateMode::kPersistent},
        op::Set{paths.replicas(), "last added replica: " + paths.replica, (*replicas)->version},
    });
    const bool raced = !created && created.error().code == KeeperCode::kBadVersion;
    if (!raced || attempt == 9) break;
  }
  if (created) return Registration::kCreated;
  if (created.error().code != KeeperCode::kNodeExists || created.error().failed_op_index != 0u) {
    return std::unexpected(created.error());
  }
  // The root is there. A dropReplica that was cut short removes queue/ and parts/ (and then the
  // rest) only after setting is_lost; whatever it removed is created again, and a replica missing
  // any of them is lost: its parts in ZooKeeper are gone, so it must clone.
  auto queue = keeper.exists(paths.queue());
  if (!queue) return std::unexpected(queue.error());
  auto parts = keeper.exists(paths.parts());
  if (!parts) return std::unexpected(parts.error());
  auto pointer = keeper.exists(paths.logPointer());
  if (!pointer) return std::unexpected(pointer.error());
  if (*queue && *parts && *pointer) return Registration::kAlreadyThere;
  spdlog::warn("replica {} was partly removed from ZooKeeper; completing it as a lost replica",
               paths.replicaRoot());
  for (const auto& path : {paths.host(), paths.logPointer(), paths.queue(), paths.parts()}) {
    auto made = keeper.create(path, "", CreateMode::kPersistent);
    if (!made && made.error().code != KeeperCode::kNodeExists) return std::unexpected(made.error());
  }
  auto lost = keeper.create(paths.isLost(), "1", CreateMode::kPersistent);
  if (!lost && lost.error().code != KeeperCode::kNodeExists) return std::unexpected(lost.error());
  if (!lost) {
    if (auto set = keeper.set(paths.isLost(), "1"); !set) return std::unexpected(set.error());
  }
  return Registration::kAlreadyThere;
}

KeeperResult<ReplicaRemoval> dropReplica(Keeper& keeper, const TablePaths& table,
                                         const std::string& replica) {
  TablePaths paths = table;
  paths.replica = replica;
  auto root = keeper.exists(paths.replicaRoot());
  if (!root) return std::unexpected(root.error());
  if (!*root) return ReplicaRemoval::kNotThere;
  // Lost first, and only while no process serves the replica (the multi fails on is_active).
  auto marked = keeper.multi({op::CheckNotExists{paths.isActive()},
                              op::Create{paths.isLost(), "1", CreateMode::kPersistent}});
  if (!marked && marked.error().code == KeeperCode::kNodeExists &&
      marked.error().failed_op_index == 1u) {
    marked = keeper.multi({op::CheckNotExists{paths.isActive()}, op::Set{paths.isLost(), "1", -1}});
  }
  if (!marked) {
    if (marked.error().code == KeeperCode::kNodeExists && marked.error().failed_op_index == 0u) {
      return std::unexpected(KeeperError{
          KeeperCode::kBadArguments,
          paths.isActive(),
          fmt::format("replica '{}' is active: stop its process before removing it", replica),
          {}});
    }
    if (marked.error().code != KeeperCode::kNoNode) return std::unexpected(marked.error());
    // The root went meanwhile (another remover finished).
    return ReplicaRemoval::kNotThere;
  }
  spdlog::info("removing replica {} from ZooKeeper", paths.replicaRoot());
  // The parts first: no one chooses a replica without them as a fetch source.
  for (const auto& subtree : {paths.parts(), paths.queue()}) {
    if (auto removed = removeRecursive(keeper, subtree); !removed) {
      return std::unexpected(removed.error());
    }
  }
  auto children = keeper.children(paths.replicaRoot());
  if (!children) return std::unexpected(children.error());
  const std::vector<std::string> names = std::move(children->names);
  for (const auto& name : names) {
    if (name == "is_lost" || name == "is_active") continue;
    if (auto removed = removeRecursive(keeper, joinPath(paths.replicaRoot(), name)); !removed) {
      return std::unexpected(removed.error());
    }
  }
  // is_lost goes with the root in one multi, still only while no process serves the replica; the
  // replicas node's version is bumped as createReplicaIfNotExists does, for log cleanup's guard.
  auto replicas = keeper.exists(paths.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  std::vector<Op> last = {op::CheckNotExists{paths.isActive()}, op::Remove{paths.isLost(), -1},
                          op::Remove{paths.replicaRoot(), -1}};
  if (*replicas)
    last.push_back(
        op::Set{paths.replicas(), "last removed replica: " + replica, (*replicas)->version});
  auto removed = keeper.multi(last);
  if (!removed) {
    if (removed.error().code == KeeperCode::kNodeExists && removed.error().failed_op_index == 0u) {
      return std::unexpected(KeeperError{
          KeeperCode::kBadArguments,
          paths.isActive(),
          fmt::format("replica '{}' became active while being removed; it was marked lost and "
                      "will clone; stop its process and remove it again",
                      replica),
          {}});
    }
    return std::unexpected(removed.error());
  }
  return ReplicaRemoval::kRemoved;
}

KeeperResult<std::vector<std::string>> partsOnlyOn(Keeper& keeper, const TablePaths& table,
                                                   const std::string& replica,
                                                   const std::vector<std::string>& staying) {
  ActiveDataPartSet elsewhere;
  for (const auto& name : staying) {
    TablePaths other = table;
    other.replica = name;
    // A lost replica's parts are about to be replaced by its clone: no copy to count on.
    auto lost = keeper.get(other.isLost());
    if (!lost) {
      if (lost.error().code == KeeperCode::kNoNode) continue;  // not (or no longer) a replica
      return std::unexpected(lost.error());
    }
    if (lost->data == "1") continue;
    auto parts = keeper.children(other.parts());
    if (!parts) {
      if (parts.error().code == KeeperCode::kNoNode) continue;
      return std::unexpected(parts.error());
    }
    for (const auto& part : parts->names) {
      if (auto name = PartName::parse(part)) (void)elsewhere.add(*name);
    }
  }
  TablePaths leaving = table;
  leaving.replica = replica;
  auto parts = keeper.children(leaving.parts());
  if (!parts) {
    if (parts.error().code == KeeperCode::kNoNode) return std::vector<std::string>{};
    return std::unexpected(parts.error());
  }
  std::vector<std::string> only;
  for (const auto& part : parts->names) {
    auto name = PartName::parse(part);
    if (name && !elsewhere.containingPart(*name)) only.push_back(part);
  }
  std::sort(only.begin(), only.end());
  return only;
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
  return std::unexpected(KeeperError{KeeperCode::kNodeExists,
                                     paths.isActive(),
                                     "another live session holds this replica's is_active; "
                                     "is a second process serving the same replica?",
                                     {}});
}

}  // namespace rtable::core
