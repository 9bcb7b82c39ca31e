// Finds replicated tables in a ZooKeeper tree and reads their log counters.
//
// A replicated table is any node with both a `log` and a `replicas` child: rtable's generations
// and ClickHouse's ReplicatedMergeTree tables alike. The walk never lists a table's children below
// that level (log/ may hold millions), and reads each counter from a Stat. A subtree whose ACL
// refuses this session (a table with its own ZooKeeper credential) is reported as such, not
// walked: the report lists it without a counter.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/sequential_counter.h"

namespace rtable::core {

struct TableCounterReport {
  std::string path;
  std::vector<std::string> replicas;  // sorted
  // nullopt: the node's ACL refused this session (a table, or a subtree that may hold some).
  std::optional<SequentialCounter> log;
};

// Depth-first from `root` (itself included), at most `max_depth` levels below it; sorted by path.
KeeperResult<std::vector<TableCounterReport>> findReplicatedTables(Keeper& keeper,
                                                                   const std::string& root,
                                                                   int max_depth);

struct HeadroomThreshold {
  double min_percent = 5.0;  // DESIGN.md 2.6: the table swap's default trigger
  // A stuck counter is below any threshold, even 0%.
  bool isBelow(const SequentialCounter& counter) const {
    return counter.exhausted() || counter.headroomRatio() * 100.0 < min_percent;
  }
  bool isBelow(const TableCounterReport& report) const {
    return report.log && isBelow(*report.log);
  }
};

// A human table: one row per table with log_max_index, counter, headroom in % and entries left.
std::string formatReportsAsTable(const std::vector<TableCounterReport>& reports,
                                 const HeadroomThreshold& threshold);
// One JSON document: {"root":..., "min_headroom_percent":..., "tables":[...]}.
std::string formatReportsAsJson(const std::string& root,
                                const std::vector<TableCounterReport>& reports,
                                const HeadroomThreshold& threshold);

}  // namespace rtable::core
