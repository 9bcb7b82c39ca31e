#include "rtable/replication_core/replication_queue.h"

#include <fmt/format.h>

#include <algorithm>

namespace rtable::core {
namespace {

// Entries are checked when pulled, so a name that does not parse here is a bug upstream; such an
// entry is treated as producing nothing.
std::optional<PartName> partOf(const std::string& name) {
  auto part = PartName::parse(name);
  if (!part) return std::nullopt;
  return *part;
}

}  // namespace

std::string_view postponeReasonName(PostponeReason reason) {
  switch (reason) {
    case PostponeReason::kCoveredByFuturePart:
      return "covered_by_future_part";
    case PostponeReason::kMergeSourceMissing:
      return "merge_source_missing";
    case PostponeReason::kIntersectsDropRange:
      return "intersects_drop_range";
    case PostponeReason::kFetchPoolFull:
      return "fetch_pool_full";
    case PostponeReason::kMergePoolFull:
      return "merge_pool_full";
    case PostponeReason::kBackoffAfterFailure:
      return "backoff_after_failure";
    case PostponeReason::kReplicaReadonly:
      return "replica_readonly";
  }
  return "unknown";
}

std::string_view queueActionName(QueueAction action) {
  switch (action) {
    case QueueAction::kNothing:
      return "nothing";
    case QueueAction::kFetch:
      return "fetch";
    case QueueAction::kMerge:
      return "merge";
    case QueueAction::kDropRange:
      return "drop_range";
    case QueueAction::kAttach:
      return "attach";
  }
  return "unknown";
}

void ReplicationQueue::addCurrentPart(const PartName& part) {
  (void)virtual_parts_.add(part);
}

void ReplicationQueue::insert(QueueEntry entry) {
  if (auto part = partOf(entry.entry.new_part_name)) (void)virtual_parts_.add(*part);
  entry.currently_executing = false;
  entries_.push_back(std::move(entry));
}

bool ReplicationQueue::contains(const std::string& node_name) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const QueueEntry& e) { return e.node_name == node_name; });
}

std::chrono::milliseconds ReplicationQueue::backoffFor(const QueueEntry& entry) const {
  if (entry.last_exception.empty() || entry.num_tries == 0) return std::chrono::milliseconds(0);
  const uint32_t doublings = std::min<uint32_t>(entry.num_tries - 1, 30);
  const auto backoff = limits_.backoff_base * (int64_t{1} << doublings);
  return std::min(backoff, limits_.max_backoff);
}

bool ReplicationQueue::comesFromAnotherEntry(const PartName& part, const QueueEntry& self) const {
  for (const auto& other : entries_) {
    if (&other == &self || other.entry.type == LogEntry::Type::kDropRange) continue;
    auto produced = partOf(other.entry.new_part_name);
    if (produced && produced->contains(part)) return true;
  }
  return false;
}

ReplicationQueue::Decision ReplicationQueue::shouldExecute(const QueueEntry& queued,
                                                           const LocalPartLookup& local,
                                                           QueueClock::time_point now) const {
  const LogEntry& entry = queued.entry;
  auto wait = [](PostponeReason reason, std::string message) {
    return Decision{std::nullopt, reason, std::move(message)};
  };
  auto act = [](QueueAction action) { return Decision{action, {}, {}}; };
  const auto part = partOf(entry.new_part_name);
  if (!part) return act(QueueAction::kNothing);

  // A part that is here already (or covered by one that is) needs nothing, whatever happened to
  // earlier tries: a fetch that gave way to a covering fetch ends here once that part lands.
  if (entry.type != LogEntry::Type::kDropRange && local(*part)) return act(QueueAction::kNothing);
  if (auto backoff = backoffFor(queued); now < queued.last_exception_time + backoff) {
    return wait(PostponeReason::kBackoffAfterFailure,
                fmt::format("Not executing log entry {} of type {} because recently it has failed. "
                            "According to exponential backoff policy, put aside this log entry for "
                            "{} ms.",
                            queued.node_name, logEntryTypeName(entry.type), backoff.count()));
  }
  for (const auto& [future, node] : future_parts_) {
    if (!future.isDisjoint(*part)) {
      return wait(PostponeReason::kCoveredByFuturePart,
                  fmt::format("Not executing log entry {} for part {} because it is not disjoint "
                              "with part {} that is currently executing ({}).",
                              queued.node_name, entry.new_part_name, future.format(), node));
    }
  }
  if (entry.type != LogEntry::Type::kDropRange) {
    for (const auto& other : entries_) {
      if (other.entry.type != LogEntry::Type::kDropRange) continue;
      auto range = partOf(other.entry.new_part_name);
      if (range && !range->isDisjoint(*part)) {
        return wait(PostponeReason::kIntersectsDropRange,
                    fmt::format("Has DROP RANGE {} affecting entry {} producing part {}. Will "
                                "postpone its execution.",
                                other.entry.new_part_name, queued.node_name, entry.new_part_name));
      }
    }
  }

  auto fetchUnlessPoolFull = [&]() {
    if (executing(QueueAction::kFetch) >= limits_.fetch_pool_size) {
      return wait(PostponeReason::kFetchPoolFull,
                  fmt::format("Not executing fetch of part {} because {} fetches already "
                              "executing, max {}.",
                              entry.new_part_name, executing(QueueAction::kFetch),
                              limits_.fetch_pool_size));
    }
    return act(QueueAction::kFetch);
  };
  switch (entry.type) {
    case LogEntry::Type::kDropRange:
      return act(QueueAction::kDropRange);
    case LogEntry::Type::kGetPart:
      return fetchUnlessPoolFull();  // not here: checked above
    case LogEntry::Type::kAttachPart:
      return act(QueueAction::kAttach);
    case LogEntry::Type::kMergeParts: {
      bool all_here = true;
      for (const auto& source_name : entry.source_parts) {
        auto source = partOf(source_name);
        if (!source) continue;
        auto here = local(*source);
        if (here && *here == *source) continue;
        all_here = false;
        if (comesFromAnotherEntry(*source, queued)) {
          return wait(PostponeReason::kMergeSourceMissing,
                      fmt::format("Not executing log entry {} of type {} for part {} because part "
                                  "{} is not ready yet (log entry for that part is being "
                                  "processed).",
                                  queued.node_name, logEntryTypeName(entry.type),
                                  entry.new_part_name, source_name));
        }
      }
      // A source that no entry will bring is gone here for good: fetch the merged part instead.
      if (!all_here) return fetchUnlessPoolFull();
      if (executing(QueueAction::kMerge) >= limits_.merge_pool_size) {
        return wait(PostponeReason::kMergePoolFull,
                    fmt::format("Not executing log entry {} of type {} for part {} because {} "
                                "merges already executing, max {}.",
                                queued.node_name, logEntryTypeName(entry.type), entry.new_part_name,
                                executing(QueueAction::kMerge), limits_.merge_pool_size));
      }
      return act(QueueAction::kMerge);
    }
  }
  return act(QueueAction::kNothing);
}

void ReplicationQueue::postpone(QueueEntry& entry, PostponeReason reason, std::string message,
                                QueueClock::time_point now) {
  ++entry.num_postponed;
  entry.postpone_reason = reason;
  entry.postpone_message = std::move(message);
  entry.last_postpone_time = now;
  ++postponed_[reason];
}

std::optional<SelectedEntry> ReplicationQueue::selectEntryToProcess(const LocalPartLookup& local,
                                                                    bool readonly,
                                                                    QueueClock::time_point now) {
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    QueueEntry& queued = entries_[i];
    if (queued.currently_executing) continue;
    if (readonly) {
      postpone(queued, PostponeReason::kReplicaReadonly,
               "Not executing log entry: the replica is read-only (no ZooKeeper session)", now);
      continue;
    }
    Decision decision = shouldExecute(queued, local, now);
    if (!decision.action) {
      postpone(queued, decision.reason, std::move(decision.message), now);
      continue;
    }
    QueueEntry taken = std::move(queued);
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    taken.currently_executing = true;
    ++taken.num_tries;
    taken.last_attempt_time = now;
    if (auto part = partOf(taken.entry.new_part_name)) future_parts_[*part] = taken.node_name;
    executing_[taken.node_name] = *decision.action;
    SelectedEntry selected{taken.node_name, taken.entry, *decision.action};
    entries_.push_back(std::move(taken));
    return selected;
  }
  return std::nullopt;
}

std::vector<std::string> ReplicationQueue::finish(const std::string& node_name) {
  std::vector<std::string> removed;
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const QueueEntry& e) { return e.node_name == node_name; });
  if (it == entries_.end()) return removed;
  const LogEntry entry = it->entry;
  entries_.erase(it);
  executing_.erase(node_name);
  forgetActualPart(node_name);
  auto part = partOf(entry.new_part_name);
  if (part) future_parts_.erase(*part);
  if (entry.type == LogEntry::Type::kDropRange && part) {
    // Parts the range dropped will not come: their entries are pointless now.
    std::erase_if(entries_, [&](const QueueEntry& other) {
      if (other.currently_executing || other.entry.type == LogEntry::Type::kDropRange) return false;
      auto produced = partOf(other.entry.new_part_name);
      if (!produced || !part->contains(*produced)) return false;
      removed.push_back(other.node_name);
      return true;
    });
    virtual_parts_.remove(*part);
  }
  return removed;
}

std::vector<std::string> ReplicationQueue::forgetLostPart(
    const std::string& node_name, const std::vector<PartName>& current_parts) {
  std::vector<std::string> also_removed;
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const QueueEntry& e) { return e.node_name == node_name; });
  if (it == entries_.end()) return also_removed;
  const std::string lost = it->entry.new_part_name;
  if (auto part = partOf(lost)) future_parts_.erase(*part);
  entries_.erase(it);
  executing_.erase(node_name);
  forgetActualPart(node_name);
  // Other entries for the same part (a part requeued at start and its log entry pulled later)
  // cannot succeed either.
  std::erase_if(entries_, [&](const QueueEntry& other) {
    if (other.currently_executing || other.entry.type == LogEntry::Type::kDropRange ||
        other.entry.new_part_name != lost) {
      return false;
    }
    also_removed.push_back(other.node_name);
    return true;
  });
  // The lost part may have covered parts that stay (a merge's sources held here, another entry's
  // part): the virtual parts are rebuilt as the invariant defines them.
  virtual_parts_ = ActiveDataPartSet();
  for (const auto& part : current_parts) (void)virtual_parts_.add(part);
  for (const auto& queued : entries_) {
    if (auto part = partOf(queued.entry.new_part_name)) (void)virtual_parts_.add(*part);
  }
  return also_removed;
}

bool ReplicationQueue::setActualPart(const std::string& node_name, const PartName& actual) {
  for (const auto& [future, node] : future_parts_) {
    if (node == node_name || future.isDisjoint(actual)) continue;
    // Another entry's own small part inside it does not stop us (that entry will find the same
    // covering part and give way); another covering fetch, or a bigger part, does.
    auto other_actual = actual_parts_.find(node);
    const bool is_other_actual =
        other_actual != actual_parts_.end() && other_actual->second == future;
    if (is_other_actual || !actual.contains(future)) return false;
  }
  forgetActualPart(node_name);
  future_parts_[actual] = node_name;
  actual_parts_[node_name] = actual;
  return true;
}

void ReplicationQueue::forgetActualPart(const std::string& node_name) {
  auto it = actual_parts_.find(node_name);
  if (it == actual_parts_.end()) return;
  auto future = future_parts_.find(it->second);
  if (future != future_parts_.end() && future->second == node_name) future_parts_.erase(future);
  actual_parts_.erase(it);
}

void ReplicationQueue::stopExecuting(QueueEntry& entry) {
  entry.currently_executing = false;
  executing_.erase(entry.node_name);
  forgetActualPart(entry.node_name);
  if (auto part = partOf(entry.entry.new_part_name)) future_parts_.erase(*part);
}

void ReplicationQueue::fail(const std::string& node_name, std::string error,
                            QueueClock::time_point now) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const QueueEntry& e) { return e.node_name == node_name; });
  if (it == entries_.end()) return;
  stopExecuting(*it);
  it->last_exception = std::move(error);
  it->last_exception_time = now;
}

void ReplicationQueue::giveWay(const std::string& node_name, std::string message,
                               QueueClock::time_point now) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const QueueEntry& e) { return e.node_name == node_name; });
  if (it == entries_.end()) return;
  stopExecuting(*it);
  if (it->num_tries > 0) --it->num_tries;
  postpone(*it, PostponeReason::kCoveredByFuturePart, std::move(message), now);
}

uint64_t ReplicationQueue::postponedCount(PostponeReason reason) const {
  auto it = postponed_.find(reason);
  return it == postponed_.end() ? 0 : it->second;
}

std::size_t ReplicationQueue::executing(QueueAction action) const {
  return static_cast<std::size_t>(std::count_if(executing_.begin(), executing_.end(),
                                                [&](const auto& e) { return e.second == action; }));
}

bool ReplicationQueue::coveredByQueuedEntry(const PartName& part) const {
  for (const auto& queued : entries_) {
    auto produced = partOf(queued.entry.new_part_name);
    if (produced && !produced->isDisjoint(part) && *produced != part) return true;
  }
  return false;
}

std::string ReplicationQueue::checkVirtualPartsInvariant(
    const std::vector<PartName>& current_parts) const {
  ActiveDataPartSet expected;
  for (const auto& part : current_parts) (void)expected.add(part);
  for (const auto& queued : entries_) {
    if (auto part = partOf(queued.entry.new_part_name)) (void)expected.add(*part);
  }
  const auto want = expected.parts();
  const auto have = virtual_parts_.parts();
  if (want == have) return "";
  auto names = [](const std::vector<PartName>& parts) {
    std::string text;
    for (const auto& p : parts) text += (text.empty() ? "" : " ") + p.format();
    return text;
  };
  return fmt::format("virtual parts [{}] != current parts + queue [{}]", names(have), names(want));
}

}  // namespace rtable::core
