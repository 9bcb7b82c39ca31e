// Creating a table generation's tree and a replica's nodes in ZooKeeper, idempotently and each in
// one multi, as ClickHouse's createTableIfNotExists / createReplica do: a crash half-way leaves
// either nothing or the whole tree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::core {

enum class Registration { kCreated, kAlreadyThere };

// Creates <root>/<generation> with all its children (and <root>, <root>/active = generation when
// missing). `metadata` describes the schema; an existing generation whose metadata differs is an
// error (kBadArguments, naming both), since its replicas would disagree about the data.
KeeperResult<Registration> createTableIfNotExists(Keeper& keeper, const TablePaths& paths,
                                                  const std::string& metadata);

// The generation <root>/active names, or nothing while the table does not exist. A value that is
// not a positive number is an error (kBadArguments), never taken as generation 1.
KeeperResult<std::optional<int64_t>> readActiveGeneration(Keeper& keeper,
                                                          const std::string& table_root,
                                                          WatchCallback watch = {});

// Creates replicas/<name> with host, is_lost, log_pointer, queue, parts. A replica that joins a
// table whose log already has entries starts lost (is_lost = 1) so that it clones the part set of
// a healthy replica instead of replaying a log that may be trimmed. A replica left incomplete by a
// dropReplica cut short is completed and marked lost (it clones again).
KeeperResult<Registration> createReplicaIfNotExists(Keeper& keeper, const TablePaths& paths);

// Removes a replica that is gone for good (scale-down, a decommissioned host) from the table, as
// ClickHouse's SYSTEM DROP REPLICA does, so that log cleanup stops waiting for its pointer and no
// one fetches from it. Refused (kBadArguments) while the replica is live (is_active exists): the
// caller stops its process first. Marks it lost before anything else, so that a removal cut short
// leaves a replica that is never chosen as a clone source and whose pointer no longer holds back
// log trimming; a second call finishes the job. A replica that is not there: kNotThere.
enum class ReplicaRemoval { kRemoved, kNotThere };
KeeperResult<ReplicaRemoval> dropReplica(Keeper& keeper, const TablePaths& paths,
                                         const std::string& replica);

// The parts `replica` lists in ZooKeeper that no part of a replica in `staying` (not lost)
// contains: what removing `replica` would lose while its disk is not read again (a scale-down
// right after an insert on the leaving replica, before the others fetched it). Empty: nothing.
KeeperResult<std::vector<std::string>> partsOnlyOn(Keeper& keeper, const TablePaths& paths,
                                                   const std::string& replica,
                                                   const std::vector<std::string>& staying);

// Marks this replica live: the ephemeral is_active node (in this session) and its address in
// host. An is_active left by this replica's previous session is replaced once that session ends.
KeeperStatus activateReplica(Keeper& keeper, const TablePaths& paths, const std::string& address);

}  // namespace rtable::core
