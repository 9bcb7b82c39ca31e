// Quorum inserts (insert_quorum=N, DESIGN.md 2.3 step 6; ClickHouse's
// ReplicatedMergeTreeQuorumEntry with insert_quorum_parallel=1): the commit multi also creates
// quorum/parallel/<part> listing the inserting replica; every replica that fetches the part adds
// itself; the replica that makes the list reach N removes the node. The insert is acknowledged when
// the node is gone.
//
//   version: 1
//   part_name: 202612_5_5_0
//   required_number_of_replicas: 2
//   actual_number_of_replicas: 1
//   replicas:
//   r1
#pragma once

#include <chrono>
#include <cstddef>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::core {

struct QuorumEntry {
  std::string part_name;
  std::size_t required_replicas = 0;
  std::vector<std::string> replicas;  // those that have the part

  std::string format() const;
  static std::expected<QuorumEntry, std::string> parse(std::string_view text);
  friend bool operator==(const QuorumEntry&, const QuorumEntry&) = default;
};

struct ReplicaCount {
  std::size_t total = 0;          // registered under replicas/
  std::vector<std::string> live;  // with an is_active node now
  // The most a quorum insert can reach.
  std::size_t active() const { return live.size(); }
};
KeeperResult<ReplicaCount> countReplicas(Keeper& keeper, const TablePaths& paths);

// insert_quorum=auto (ClickHouse 22.x): a majority of the table's registered replicas, so that
// any two acknowledged quorum inserts share a replica.
inline std::size_t majorityQuorum(std::size_t total_replicas) {
  return total_replicas / 2 + 1;
}

// After this replica fetched `part`: counts it in the part's quorum, if one is waiting. Retries on
// a concurrent update (bad version).
KeeperStatus addToQuorum(Keeper& keeper, const TablePaths& paths, const std::string& part);

// Waits until the part's quorum node is gone (the quorum was reached). False on timeout.
KeeperResult<bool> waitForQuorum(Keeper& keeper, const TablePaths& paths, const std::string& part,
                                 std::chrono::steady_clock::time_point deadline);

}  // namespace rtable::core
