#include "rtable/replication_core/dedup_window.h"

#include <algorithm>
#include <vector>

namespace rtable::core {

KeeperResult<DedupCleanupResult> DedupWindowCleaner::run(Keeper& keeper) {
  auto listed = keeper.children(paths_.dedupHashes());
  if (!listed) return std::unexpected(listed.error());
  std::unordered_map<std::string, IdStat> current;
  current.reserve(listed->names.size());
  std::vector<std::string> uncached;
  std::vector<std::string> uncached_paths;
  for (auto& name : listed->names) {
    if (auto cached = stats_.find(name); cached != stats_.end()) {
      current.emplace(std::move(name), cached->second);
    } else {
      uncached_paths.push_back(paths_.dedupHash(name));
      uncached.push_back(std::move(name));
    }
  }
  // One pipelined batch: a stat per id one after another kept the session (which the inserts
  // share) busy for a round trip per id inserted since the last run.
  auto nodes = keeper.getMany(uncached_paths);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]) {
      current.emplace(std::move(uncached[i]), IdStat{nodes[i]->stat.ctime, nodes[i]->stat.version});
    } else if (nodes[i].error().code != KeeperCode::kNoNode) {
      return std::unexpected(nodes[i].error());
    }
  }
  stats_ = std::move(current);

  struct Id {
    const std::string* name;
    IdStat stat;
  };
  std::vector<Id> ids;
  ids.reserve(stats_.size());
  for (const auto& [name, stat] : stats_) ids.push_back(Id{&name, stat});
  // Newest first; the name breaks ties so that any replica would choose the same ids.
  std::sort(ids.begin(), ids.end(), [](const Id& a, const Id& b) {
    return a.stat.ctime != b.stat.ctime ? a.stat.ctime > b.stat.ctime : *a.name > *b.name;
  });
  DedupCleanupResult result;
  if (ids.empty()) return result;
  const int64_t oldest_kept_ctime =
      ids.front().stat.ctime -
      std::chrono::duration_cast<std::chrono::milliseconds>(window_.max_age).count();
  std::vector<std::string> removed_names;
  std::vector<const Id*> doomed;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i < window_.max_ids && ids[i].stat.ctime >= oldest_kept_ctime) {
      ++result.kept;
      continue;
    }
    doomed.push_back(&ids[i]);
  }
  // Async inserts make an id per insert: thousands a second to remove. A multi of removes is one
  // ZooKeeper transaction (one fsync) where a remove each was one per id; an id re-created or
  // removed meanwhile fails its multi, whose ids are then removed one by one.
  constexpr std::size_t kRemovesPerMulti = 100;
  for (std::size_t first = 0; first < doomed.size(); first += kRemovesPerMulti) {
    const std::size_t last = std::min(doomed.size(), first + kRemovesPerMulti);
    std::vector<Op> removes;
    for (std::size_t i = first; i < last; ++i)
      removes.push_back(op::Remove{paths_.dedupHash(*doomed[i]->name), doomed[i]->stat.version});
    auto together = keeper.multi(removes);
    if (together) {
      result.removed += last - first;
      for (std::size_t i = first; i < last; ++i) removed_names.push_back(*doomed[i]->name);
      continue;
    }
    if (together.error().isConnectionLevel()) return std::unexpected(together.error());
    for (std::size_t i = first; i < last; ++i) {
      auto removed = keeper.remove(paths_.dedupHash(*doomed[i]->name), doomed[i]->stat.version);
      if (!removed && removed.error().code != KeeperCode::kNoNode &&
          removed.error().code != KeeperCode::kBadVersion) {
        return std::unexpected(removed.error());
      }
      if (removed) ++result.removed;
      removed_names.push_back(*doomed[i]->name);
    }
  }
  for (const auto& name : removed_names) stats_.erase(name);
  return result;
}

}  // namespace rtable::core
