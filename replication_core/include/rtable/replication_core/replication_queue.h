// A replica's queue of log entries to execute (ClickHouse's ReplicatedMergeTreeQueue, in memory;
// replicas/<me>/queue/ in ZooKeeper is its durable copy). Entries run out of order: the first
// entry that may run now is taken and moved to the tail; each entry passed over is postponed with
// a counted reason. Failed entries back off exponentially.
//
// Invariant (checked by tests): virtual_parts = current_parts + the new part of every queue entry,
// as an ActiveDataPartSet: what the replica will hold once the queue drains.
//
// Not thread-safe: the owner guards it. Time is passed in, so tests are deterministic.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/active_part_set.h"
#include "rtable/replication_core/log_entry.h"
#include "rtable/replication_core/part_name.h"

namespace rtable::core {

using QueueClock = std::chrono::steady_clock;

// Why an entry that could have been taken was passed over (DESIGN.md 2.4; metric label values).
enum class PostponeReason {
  kCoveredByFuturePart,  // a part it produces or covers is being produced by another entry
  kMergeSourceMissing,   // a merge source is still to come from an earlier entry
  kIntersectsDropRange,  // a drop range in the queue affects its part
  kFetchPoolFull,
  kMergePoolFull,
  kBackoffAfterFailure,
  kReplicaReadonly,  // no ZooKeeper session: nothing may run
};
inline constexpr PostponeReason kAllPostponeReasons[] = {
    PostponeReason::kCoveredByFuturePart, PostponeReason::kMergeSourceMissing,
    PostponeReason::kIntersectsDropRange, PostponeReason::kFetchPoolFull,
    PostponeReason::kMergePoolFull,       PostponeReason::kBackoffAfterFailure,
    PostponeReason::kReplicaReadonly};
std::string_view postponeReasonName(PostponeReason reason);  // "covered_by_future_part", ...

struct QueueEntry {
  std::string node_name;  // queue-NNNNNNNNNN
  LogEntry entry;
  // Execution state, as ClickHouse's system.replication_queue shows it.
  uint32_t num_tries = 0;
  uint32_t num_postponed = 0;
  std::optional<PostponeReason> postpone_reason;
  std::string postpone_message;
  std::string last_exception;
  QueueClock::time_point last_attempt_time{};
  QueueClock::time_point last_exception_time{};
  QueueClock::time_point last_postpone_time{};
  bool currently_executing = false;
};

// How a selected entry is to be carried out.
enum class QueueAction {
  kNothing,    // the part (or one covering it) is already here: the entry is done
  kFetch,      // get the part from a replica that has it (a merge whose sources are gone, too)
  kMerge,      // merge the sources, all here
  kDropRange,  // remove the parts the range covers
  // Attach a part of the previous generation (a table swap): a hard link of a part this replica
  // holds, local work that the worker runs in batches, outside the fetch pool's slots. Without
  // the part here, the worker fetches it as kFetch would.
  kAttach,
};
std::string_view queueActionName(QueueAction action);

struct SelectedEntry {
  std::string node_name;
  LogEntry entry;
  QueueAction action = QueueAction::kNothing;
};

struct QueueLimits {
  std::size_t fetch_pool_size = 4;
  std::size_t merge_pool_size = 2;
  // Exponential backoff of failed entries: base * 2^(tries - 1), at most `max_backoff`
  // (ClickHouse's max_postpone_time_for_failed_replicated_fetches_ms / _merges_ms: 60 s).
  // ClickHouse starts at 2 ms; 100 ms keeps a replica from hammering a peer that is down.
  std::chrono::milliseconds backoff_base{100};
  std::chrono::milliseconds max_backoff{60000};
};

class ReplicationQueue {
 public:
  explicit ReplicationQueue(QueueLimits limits = {}) : limits_(limits) {}

  // A part that became active on this replica (loaded, inserted, fetched or merged).
  void addCurrentPart(const PartName& part);
  // Appends entries pulled from the log (or loaded from replicas/<me>/queue at start), in order.
  void insert(QueueEntry entry);

  // The active part on this replica that contains a given part (possibly the part itself).
  using LocalPartLookup = std::function<std::optional<PartName>(const PartName&)>;

  // The first entry that may run now, marked executing and moved to the tail; nullopt if none.
  std::optional<SelectedEntry> selectEntryToProcess(const LocalPartLookup& local, bool readonly,
                                                    QueueClock::time_point now);
  // The executed entry is done: removed from the queue. For a drop range, the entries whose parts
  // it covers are removed too: their queue nodes are returned, to be removed in ZooKeeper.
  std::vector<std::string> finish(const std::string& node_name);
  // The entry's part can never be had (searchForMissingPart: lost forever): the entry goes, with
  // any other idle entry for the same part, and the part leaves the virtual parts, as
  // ClickHouse's queue.remove(part) does. `current_parts`: the replica's active parts. Returns the
  // other entries' nodes, to be removed in ZooKeeper.
  std::vector<std::string> forgetLostPart(const std::string& node_name,
                                          const std::vector<PartName>& current_parts);
  // A running fetch found only a part covering its own (ClickHouse's setActualPartName): that
  // part becomes a future part too, so entries whose parts it covers wait for it instead of
  // fetching the same covering part in parallel. False (nothing changed) when it is not disjoint
  // from a part another running entry produces: the caller gives up this attempt.
  bool setActualPart(const std::string& node_name, const PartName& actual);
  // The executed entry failed: it stays, and may run again after its backoff.
  void fail(const std::string& node_name, std::string error, QueueClock::time_point now);
  // The executed entry found that another running entry makes the part it needs (setActualPart
  // said no): it goes back as postponed (covered_by_future_part), not failed. No backoff and no
  // try counted: the other entry's part usually makes it a no-op moments later.
  void giveWay(const std::string& node_name, std::string message, QueueClock::time_point now);

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  bool contains(const std::string& node_name) const;
  const std::vector<QueueEntry>& entries() const { return entries_; }
  const ActiveDataPartSet& virtualParts() const { return virtual_parts_; }
  // Parts being produced by entries running now.
  const std::map<PartName, std::string>& futureParts() const { return future_parts_; }
  uint64_t postponedCount(PostponeReason reason) const;
  std::size_t executing(QueueAction action) const;
  // Whether `part` is produced or covered by an entry in the queue (a merge must not take it).
  bool coveredByQueuedEntry(const PartName& part) const;

  // Recomputes current + queue and compares it with the incremental virtual parts: "" when the
  // invariant holds, else what differs.
  std::string checkVirtualPartsInvariant(const std::vector<PartName>& current_parts) const;

 private:
  // The action, or the reason to wait (with a message in ClickHouse's words).
  struct Decision {
    std::optional<QueueAction> action;
    PostponeReason reason{};
    std::string message;
  };
  Decision shouldExecute(const QueueEntry& entry, const LocalPartLookup& local,
                         QueueClock::time_point now) const;
  // Whether an entry other than `self` (queued or running) will produce a part containing `part`.
  bool comesFromAnotherEntry(const PartName& part, const QueueEntry& self) const;
  std::chrono::milliseconds backoffFor(const QueueEntry& entry) const;
  void forgetActualPart(const std::string& node_name);
  // A selected entry is back in the queue (failed or gave way): no longer running, and its part
  // no longer a future part.
  void stopExecuting(QueueEntry& entry);
  void postpone(QueueEntry& entry, PostponeReason reason, std::string message,
                QueueClock::time_point now);

  QueueLimits limits_;
  std::vector<QueueEntry> entries_;  // in execution order: a selected entry moves to the back
  ActiveDataPartSet virtual_parts_;
  std::map<PartName, std::string> future_parts_;  // part being produced -> queue node
  std::map<std::string, PartName> actual_parts_;  // queue node -> covering part it fetches
  std::map<std::string, QueueAction> executing_;  // queue node -> how it is being executed
  std::map<PostponeReason, uint64_t> postponed_;
};

}  // namespace rtable::core
