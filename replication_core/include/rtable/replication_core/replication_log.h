// The replication log in ZooKeeper as one replica sees it (DESIGN.md 2.4; ClickHouse's
// ReplicatedMergeTreeQueue::pullLogsToQueue and StorageReplicatedMergeTree::cloneReplica):
// entries are copied verbatim from log/log-N to replicas/<me>/queue/queue-M, and log_pointer (the
// index of the next entry to pull) moves in the same multi, so an entry is never pulled twice or
// skipped across crashes.
//
// Not thread-safe: one puller per replica.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rtable/replication_core/active_part_set.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/replication_queue.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::core {

// log-0000000042 -> 42, log--2147483648 (ZooKeeper's int32 counter wrapped) -> 2147483648;
// nullopt for anything else.
std::optional<int64_t> logEntryIndex(const std::string& node_name);
// The node name of log entry `index` (logEntryIndex's inverse): 2147483648 is log--2147483648.
std::string logEntryName(int64_t index);

// Reads replicas/<me>/queue at start, in queue order. Nodes whose text does not parse are removed
// (and logged): no replica could execute them.
KeeperResult<std::vector<QueueEntry>> loadQueue(Keeper& keeper, const TablePaths& paths);

class LogPuller {
 public:
  // ClickHouse's MAX_MULTI_OPS: the largest batch of entries copied in one multi.
  static constexpr std::size_t kMaxBatch = 100;

  explicit LogPuller(TablePaths paths) : paths_(std::move(paths)) {}

  // Whether an entry needs no work here: a part this replica committed itself is in its parts
  // already, so its entry only moves the pointer (one queue node written and removed less per
  // insert than ClickHouse).
  using SkipEntry = std::function<bool(const LogEntry&)>;

  // Copies every log entry at or after log_pointer into the queue; returns the new queue entries
  // in order. Batches start at one entry and double up to kMaxBatch (ClickHouse's
  // current_multi_batch_size), so a replica that was away catches up in few round trips.
  // `on_new_entries` is a one-shot watch on the log's children.
  KeeperResult<std::vector<QueueEntry>> pull(Keeper& keeper, const SkipEntry& skip = {},
                                             WatchCallback on_new_entries = {});

  // Multis used by the last pull (for tests and metrics).
  std::size_t lastPullMultis() const { return last_pull_multis_; }
  // Log entries the last pull read from ZooKeeper (the others it had been given by remember()).
  std::size_t lastPullReads() const { return last_pull_reads_; }

  // An entry this replica has just written (`entry_path` = log/log-N, `data` its content): the
  // pull that reaches it takes it from here instead of reading it back, which is one read less
  // per insert. Forgotten once the pointer passes it; at most kMaxRemembered are kept.
  void remember(const std::string& entry_path, std::string data);
  static constexpr std::size_t kMaxRemembered = 10000;

 private:
  TablePaths paths_;
  std::size_t batch_ = 1;
  std::size_t last_pull_multis_ = 0;
  std::size_t last_pull_reads_ = 0;
  std::mutex remembered_mu_;  // remember() runs in insert threads, pull() in the background
  std::map<int64_t, std::string> remembered_;
};

struct CloneResult {
  std::vector<QueueEntry> entries;  // this replica's new queue
  // What the source has or will have (its parts, its queue, the log from the cloned pointer
  // on): a local part none of these contains has no place in the table any more (dropped, say,
  // while this replica was away).
  ActiveDataPartSet source_parts;
};

// Makes this replica a copy of `source` (cloneReplica): a get entry for each of the source's
// parts that no other part of it covers, then the source's own queue, and the source's
// log_pointer; is_lost becomes 0. Used for a new replica of a table with history and for a lost
// replica.
KeeperResult<CloneResult> cloneReplica(Keeper& keeper, const TablePaths& paths,
                                       const std::string& source);

// Where a part that no live replica could give us stands (ClickHouse's
// ReplicatedMergeTreePartCheckThread::searchForMissingPart), judged from every replica's parts/
// in ZooKeeper, live or not.
enum class MissingPart {
  kOnSomeReplica,     // a replica lists it or a part covering it: wait for that replica
  kMayStillBeMerged,  // parts starting at its first block and ending at its last exist: a merge
                      // that produces it may still run somewhere
  kLostForever,       // nothing has it or can make it: the entry for it can never succeed
};
std::string_view missingPartName(MissingPart state);
KeeperResult<MissingPart> searchForMissingPart(Keeper& keeper, const TablePaths& paths,
                                               const PartName& part);

// One replica's queue as ZooKeeper shows it, for the operator's status: how many entries wait and
// how long the oldest has sat in the queue (since the pull that copied it there: an entry that
// waits that long has not been executed, whatever its age in the log).
struct ReplicaQueueSummary {
  bool active = false;  // is_active exists
  bool lost = false;    // is_lost = 1
  std::size_t size = 0;
  std::optional<std::string> oldest_node;  // queue-NNNNNNNNNN
  std::optional<LogEntry> oldest_entry;    // when its text parses
  int64_t oldest_queued_ms = 0;            // its ctime, ms since the epoch (ZooKeeper's clock)
  // The replica's data volume is full: the out-of-space error it last met (its disk_full node).
  std::optional<std::string> disk_full;
};
KeeperResult<ReplicaQueueSummary> summarizeReplicaQueue(Keeper& keeper, const TablePaths& paths,
                                                        const std::string& replica);

// The live replica to clone from: active, not lost, with the highest log_pointer (the healthiest).
KeeperResult<std::optional<std::string>> chooseCloneSource(Keeper& keeper, const TablePaths& paths);

// How much log to keep (ClickHouse's min_replicated_logs_to_keep / max_replicated_logs_to_keep).
struct LogRetention {
  std::size_t min_entries = 10;
  std::size_t max_entries = 1000;
};

struct LogCleanupResult {
  std::size_t removed = 0;               // log entries removed
  std::vector<std::string> marked_lost;  // replicas marked lost by this round
};

// ClickHouse's clearOldLogs, run by the leader: removes entries every live replica has pulled,
// always keeping the newest `min_entries`. An inactive replica whose pointer is older than the
// newest `max_entries` no longer holds the log back: it is marked lost (is_lost = 1, guarded by
// the version of its host node, so a replica that comes back meanwhile is not) and will clone a
// healthy replica when it returns. No replica is marked lost when all would be.
KeeperResult<LogCleanupResult> clearOldLogs(Keeper& keeper, const TablePaths& paths,
                                            LogRetention retention);

}  // namespace rtable::core
