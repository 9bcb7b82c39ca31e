// The deduplication window (DESIGN.md 2.3): which dedup ids a table keeps in ZooKeeper.
//
// An id is kept while it is among the newest `max_ids` AND younger than `max_age` measured from
// the newest id's creation time (not the wall clock, so a table that stops receiving inserts keeps
// its last ids) — ClickHouse's clearOldBlocks, which takes the nearer of the two cut-offs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::core {

struct DedupWindow {
  // Defaults of ClickHouse 25.9+: replicated_deduplication_window = 10000 (PR #86820),
  // replicated_deduplication_window_seconds = 3600 (PR #87414).
  std::size_t max_ids = 10000;
  std::chrono::seconds max_age{3600};
  friend bool operator==(const DedupWindow&, const DedupWindow&) = default;
};

struct DedupCleanupResult {
  std::size_t kept = 0;
  std::size_t removed = 0;
};

// Removes the ids outside the window. Run by one replica at a time.
//
// An id node never changes after its creation, so its ctime is read once and cached: a steady
// run costs one listing plus one request per new id and per removed id. Not thread-safe.
class DedupWindowCleaner {
 public:
  DedupWindowCleaner(TablePaths paths, DedupWindow window)
      : paths_(std::move(paths)), window_(window) {}

  // Removes with the version read, so an id re-created meanwhile stays.
  KeeperResult<DedupCleanupResult> run(Keeper& keeper);

 private:
  struct IdStat {
    int64_t ctime;
    int32_t version;
  };
  TablePaths paths_;
  DedupWindow window_;
  std::unordered_map<std::string, IdStat> stats_;
};

}  // namespace rtable::core
