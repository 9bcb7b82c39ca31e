#include "rtable/replication_core/replication_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "rtable/replication_core/active_part_set.h"

namespace rtable::core {
namespace {

constexpr std::string_view kLogPrefix = "log-";
constexpr std::string_view kQueuePrefix = "queue-";

std::optional<int64_t> parseDecimal(std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::string nodeName(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}

QueueEntry queueEntry(std::string node_name, LogEntry entry) {
  QueueEntry queued;
  queued.node_name = std::move(node_name);
  queued.entry = std::move(entry);
  return queued;
}

}  // namespace

std::optional<int64_t> logEntryIndex(const std::string& node_name) {
  if (!node_name.starts_with(kLogPrefix)) return std::nullopt;
  auto value = parseDecimal(std::string_view(node_name).substr(kLogPrefix.size()));
  if (!value || *value < INT32_MIN || *value > INT32_MAX) return std::nullopt;
  // ZooKeeper names a sequential node with its int32 counter as %010d: at the limit, after
  // log-2147483647, one more create succeeds as log--2147483648 (seed 002). That entry comes
  // after log-2147483647: read as the unsigned counter, it is 2147483648.
  return *value < 0 ? *value + (int64_t{1} << 32) : *value;
}

std::string logEntryName(int64_t index) {
  const int64_t counter = index > INT32_MAX ? index - (int64_t{1} << 32) : index;
  return fmt::format("{}{:010d}", kLogPrefix, counter);
}

KeeperResult<std::vector<QueueEntry>> loadQueue(Keeper& keeper, const TablePaths& paths) {
  auto listed = keeper.children(paths.queue());
  if (!listed) return std::unexpected(listed.error());
  std::vector<std::string> names = listed->names;
  std::sort(names.begin(), names.end());  // queue-%010d: the text order is the queue order
  std::erase_if(names, [](const std::string& name) { return !name.starts_with(kQueuePrefix); });
  std::vector<std::string> entry_paths;
  for (const auto& name : names) entry_paths.push_back(paths.queue() + "/" + name);
  auto nodes = keeper.getMany(entry_paths);
  std::vector<QueueEntry> entries;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const std::string& path = entry_paths[i];
    auto& node = nodes[i];
    if (!node) {
      if (node.error().code == KeeperCode::kNoNode) continue;
      return std::unexpected(node.error());
    }
    auto entry = LogEntry::parse(node->data);
    if (!entry) {
      spdlog::error("removing queue entry {} that cannot be executed: {}", path, entry.error());
      (void)keeper.remove(path);
      continue;
    }
    entries.push_back(queueEntry(name, std::move(*entry)));
  }
  return entries;
}

void LogPuller::remember(const std::string& entry_path, std::string data) {
  auto index = logEntryIndex(nodeName(entry_path));
  if (!index) return;
  std::lock_guard lock(remembered_mu_);
  remembered_[*index] = std::move(data);
  // Without pulls for a long while, the oldest are read back instead.
  while (remembered_.size() > kMaxRemembered) remembered_.erase(remembered_.begin());
}

KeeperResult<std::vector<QueueEntry>> LogPuller::pull(Keeper& keeper, const SkipEntry& skip,
                                                      WatchCallback on_new_entries) {
  last_pull_multis_ = 0;
  last_pull_reads_ = 0;
  auto pointer_node = keeper.get(paths_.logPointer());
  if (!pointer_node) return std::unexpected(pointer_node.error());
  auto listed = keeper.children(paths_.log(), std::move(on_new_entries));
  if (!listed) return std::unexpected(listed.error());
  std::vector<int64_t> indexes;
  for (const auto& name : listed->names) {
    if (auto index = logEntryIndex(name)) indexes.push_back(*index);
  }
  std::sort(indexes.begin(), indexes.end());
  // An empty pointer (a replica that never pulled) starts at the oldest entry still in the log.
  int64_t pointer = 0;
  if (auto parsed = parseDecimal(pointer_node->data)) {
    pointer = *parsed;
  } else if (!indexes.empty()) {
    pointer = indexes.front();
  }
  std::erase_if(indexes, [&](int64_t index) { return index < pointer; });
  int32_t pointer_version = pointer_node->stat.version;

  std::vector<QueueEntry> pulled;
  for (std::size_t begin = 0; begin < indexes.size();) {
    const std::size_t end = std::min(indexes.size(), begin + batch_);
    std::vector<Op> ops;
    std::vector<LogEntry> entries;
    std::vector<std::string> entry_paths;
    for (std::size_t i = begin; i < end; ++i) {
      entry_paths.push_back(paths_.log() + "/" + logEntryName(indexes[i]));
    }
    // Entries this replica wrote are known; the others are read in one pipelined request for
    // the batch: a replica catching up on N entries pays about one round trip per batch.
    std::vector<std::optional<std::string>> datas(entry_paths.size());
    {
      std::lock_guard lock(remembered_mu_);
      for (std::size_t i = begin; i < end; ++i) {
        if (auto known = remembered_.find(indexes[i]); known != remembered_.end())
          datas[i - begin] = known->second;
      }
    }
    std::vector<std::string> to_read;
    for (std::size_t i = 0; i < datas.size(); ++i) {
      if (!datas[i]) to_read.push_back(entry_paths[i]);
    }
    std::vector<KeeperResult<GetResult>> nodes;
    if (!to_read.empty()) nodes = keeper.getMany(to_read);
    last_pull_reads_ += to_read.size();
    for (std::size_t i = 0, read = 0; i < datas.size(); ++i) {
      if (datas[i]) continue;
      auto& node = nodes[read++];
      if (!node) return std::unexpected(node.error());  // cleanup never removes what we still need
      datas[i] = std::move(node->data);
    }
    for (std::size_t i = 0; i < datas.size(); ++i) {
      const std::string& data = *datas[i];
      auto entry = LogEntry::parse(data);
      if (!entry) {
        return std::unexpected(KeeperError{KeeperCode::kBadArguments,
                                           entry_paths[i],
                                           "log entry does not parse: " + entry.error(),
                                           {}});
      }
      if (skip && skip(*entry)) continue;
      ops.push_back(op::Create{paths_.queue() + "/" + std::string(kQueuePrefix), data,
                               CreateMode::kPersistentSequential});
      entries.push_back(std::move(*entry));
    }
    // The version check makes two processes serving one replica unable to both pull.
    ops.push_back(
        op::Set{paths_.logPointer(), std::to_string(indexes[end - 1] + 1), pointer_version});
    auto done = keeper.multi(ops);
    if (!done) return std::unexpected(done.error());
    ++last_pull_multis_;
    pointer_version = done->back().stat.version;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      pulled.push_back(queueEntry(nodeName((*done)[i].path_created), std::move(entries[i])));
    }
    begin = end;
    batch_ = std::min(batch_ * 2, kMaxBatch);
    std::lock_guard lock(remembered_mu_);
    remembered_.erase(remembered_.begin(), remembered_.upper_bound(indexes[end - 1]));
  }
  return pulled;
}

std::string_view missingPartName(MissingPart state) {
  switch (state) {
    case MissingPart::kOnSomeReplica:
      return "on_some_replica";
    case MissingPart::kMayStillBeMerged:
      return "may_still_be_merged";
    case MissingPart::kLostForever:
      return "lost_forever";
  }
  return "unknown";
}

KeeperResult<MissingPart> searchForMissingPart(Keeper& keeper, const TablePaths& paths,
                                               const PartName& part) {
  auto replicas = keeper.children(paths.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  const std::vector<std::string> names = std::move(replicas->names);
  bool found_min = false;
  bool found_max = false;
  for (const auto& name : names) {
    TablePaths other = paths;
    other.replica = name;
    auto listed = keeper.children(other.parts());
    if (!listed) {
      if (listed.error().code == KeeperCode::kNoNode) continue;  // being created or removed
      return std::unexpected(listed.error());
    }
    for (const auto& part_name : listed->names) {
      auto have = PartName::parse(part_name);
      if (!have) continue;
      if (have->contains(part)) return MissingPart::kOnSomeReplica;
      if (!part.contains(*have)) continue;
      found_min = found_min || have->min_block == part.min_block;
      found_max = found_max || have->max_block == part.max_block;
    }
  }
  return found_min && found_max ? MissingPart::kMayStillBeMerged : MissingPart::kLostForever;
}

KeeperResult<ReplicaQueueSummary> summarizeReplicaQueue(Keeper& keeper, const TablePaths& paths,
                                                        const std::string& replica) {
  TablePaths of = paths;
  of.replica = replica;
  ReplicaQueueSummary summary;
  // The three small nodes in one round trip (the operator asks this of every replica of every
  // table each poll).
  auto nodes = keeper.getMany({of.isActive(), of.isLost(), of.diskFull()});
  for (const auto& node : nodes) {
    if (!node && node.error().code != KeeperCode::kNoNode) return std::unexpected(node.error());
  }
  summary.active = nodes[0].has_value();
  summary.lost = nodes[1] && nodes[1]->data == "1";
  if (nodes[2]) summary.disk_full = nodes[2]->data;
  auto queue = keeper.children(of.queue());
  if (!queue) {
    if (queue.error().code == KeeperCode::kNoNode) return summary;
    return std::unexpected(queue.error());
  }
  summary.size = queue->names.size();
  if (queue->names.empty()) return summary;
  // Sequential names sort in the order they were pulled.
  const std::string oldest = *std::min_element(queue->names.begin(), queue->names.end());
  auto entry = keeper.get(of.queue() + "/" + oldest);
  if (!entry) {
    if (entry.error().code == KeeperCode::kNoNode) return summary;  // executed meanwhile
    return std::unexpected(entry.error());
  }
  summary.oldest_node = oldest;
  summary.oldest_queued_ms = entry->stat.ctime;
  if (auto parsed = LogEntry::parse(entry->data)) summary.oldest_entry = std::move(*parsed);
  return summary;
}

KeeperResult<std::optional<std::string>> chooseCloneSource(Keeper& keeper,
                                                           const TablePaths& paths) {
  auto replicas = keeper.children(paths.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  std::optional<std::string> best;
  int64_t best_pointer = -1;
  for (const auto& name : replicas->names) {
    if (name == paths.replica) continue;
    TablePaths other = paths;
    other.replica = name;
    auto active = keeper.exists(other.isActive());
    auto lost = keeper.get(other.isLost());
    auto pointer = keeper.get(other.logPointer());
    if (!active || !lost || !pointer) continue;  // a replica being removed: not a source
    if (!*active || lost->data == "1") continue;
    const int64_t value = parseDecimal(pointer->data).value_or(0);
    if (value > best_pointer) {
      best_pointer = value;
      best = name;
    }
  }
  return best;
}

KeeperResult<CloneResult> cloneReplica(Keeper& keeper, const TablePaths& paths,
                                       const std::string& source) {
  TablePaths from = paths;
  from.replica = source;
  // Our old queue is replaced by the source's state.
  auto own = keeper.children(paths.queue());
  if (!own) return std::unexpected(own.error());
  for (const auto& name : own->names) {
    if (auto removed = keeper.remove(paths.queue() + "/" + name);
        !removed && removed.error().code != KeeperCode::kNoNode) {
      return std::unexpected(removed.error());
    }
  }

  // A consistent point: our log_pointer takes the source's while neither its pointer nor its
  // is_lost changes. Everything before that point is in the source's queue or in its parts;
  // reading the queue before the parts misses nothing (an entry leaves the queue only after its
  // part is in the parts list).
  constexpr int kAttempts = 10;
  std::vector<std::string> queue_texts;
  int64_t cloned_pointer = 0;
  for (int attempt = 0;; ++attempt) {
    auto pointer = keeper.get(from.logPointer());
    if (!pointer) return std::unexpected(pointer.error());
    cloned_pointer = parseDecimal(pointer->data).value_or(0);
    auto lost = keeper.get(from.isLost());
    if (!lost) return std::unexpected(lost.error());
    if (lost->data == "1") {
      return std::unexpected(KeeperError{
          KeeperCode::kBadVersion, from.isLost(), "the clone source is lost itself", {}});
    }
    auto queue = keeper.children(from.queue());
    if (!queue) return std::unexpected(queue.error());
    std::vector<std::string> names = queue->names;
    std::sort(names.begin(), names.end());
    queue_texts.clear();
    std::vector<std::string> entry_paths;
    for (const auto& name : names) entry_paths.push_back(from.queue() + "/" + name);
    for (auto& node : keeper.getMany(entry_paths)) {
      // An entry gone meanwhile was executed there: the pointer check below decides whether the
      // copy is still consistent. Any other failure would silently drop an entry from the copy.
      if (node) {
        queue_texts.push_back(std::move(node->data));
      } else if (node.error().code != KeeperCode::kNoNode) {
        return std::unexpected(node.error());
      }
    }
    auto snapshot = keeper.multi({op::Set{paths.logPointer(), pointer->data, -1},
                                  op::Check{from.isLost(), lost->stat.version},
                                  op::Check{from.logPointer(), pointer->stat.version}});
    if (snapshot) break;
    if (snapshot.error().code != KeeperCode::kBadVersion || attempt + 1 == kAttempts) {
      return std::unexpected(snapshot.error());
    }
  }
  auto parts = keeper.children(from.parts());
  if (!parts) return std::unexpected(parts.error());

  ActiveDataPartSet wanted;
  for (const auto& name : parts->names) {
    if (auto part = PartName::parse(name)) (void)wanted.add(*part);
  }
  std::vector<std::string> texts;
  for (const auto& part : wanted.parts()) {
    LogEntry get;
    get.type = LogEntry::Type::kGetPart;
    get.new_part_name = part.format();
    texts.push_back(get.format());
  }
  for (auto& text : queue_texts) texts.push_back(std::move(text));

  CloneResult result;
  result.source_parts = wanted;
  // The log from the cloned pointer on is pulled after the clone: the parts it names are the
  // table's too. One of them may be ours alone (committed here just before we went away, not yet
  // pulled by the source): unregistering it as a stray would lose acknowledged rows.
  auto log = keeper.children(paths.log());
  if (!log) return std::unexpected(log.error());
  std::vector<std::string> pending_paths;
  for (const auto& name : log->names) {
    if (auto index = logEntryIndex(name); index && *index >= cloned_pointer) {
      pending_paths.push_back(paths.log() + "/" + name);
    }
  }
  for (auto& node : keeper.getMany(pending_paths)) {
    if (!node) {
      if (node.error().code == KeeperCode::kNoNode) continue;  // trimmed: below every pointer
      return std::unexpected(node.error());
    }
    auto entry = LogEntry::parse(node->data);
    if (!entry || entry->type == LogEntry::Type::kDropRange) continue;
    if (auto part = PartName::parse(entry->new_part_name)) (void)result.source_parts.add(*part);
  }
  std::vector<QueueEntry>& created = result.entries;
  for (std::size_t begin = 0; begin < texts.size(); begin += LogPuller::kMaxBatch) {
    const std::size_t end = std::min(texts.size(), begin + LogPuller::kMaxBatch);
    std::vector<Op> ops;
    for (std::size_t i = begin; i < end; ++i) {
      ops.push_back(op::Create{paths.queue() + "/" + std::string(kQueuePrefix), texts[i],
                               CreateMode::kPersistentSequential});
    }
    auto done = keeper.multi(ops);
    if (!done) return std::unexpected(done.error());
    for (std::size_t i = begin; i < end; ++i) {
      auto entry = LogEntry::parse(texts[i]);
      if (!entry) continue;  // copied verbatim; loadQueue drops it on the next start
      if (auto part = PartName::parse(entry->new_part_name);
          part && entry->type != LogEntry::Type::kDropRange) {
        (void)result.source_parts.add(*part);
      }
      created.push_back(queueEntry(nodeName((*done)[i - begin].path_created), std::move(*entry)));
    }
  }
  if (auto found = keeper.set(paths.isLost(), "0"); !found) return std::unexpected(found.error());
  return result;
}

KeeperResult<LogCleanupResult> clearOldLogs(Keeper& keeper, const TablePaths& paths,
                                            LogRetention retention) {
  LogCleanupResult result;
  auto replicas_stat = keeper.exists(paths.replicas());
  if (!replicas_stat) return std::unexpected(replicas_stat.error());
  if (!*replicas_stat) return result;
  auto listed = keeper.children(paths.log());
  if (!listed) return std::unexpected(listed.error());
  std::vector<int64_t> indexes;
  for (const auto& name : listed->names) {
    if (auto index = logEntryIndex(name)) indexes.push_back(*index);
  }
  std::sort(indexes.begin(), indexes.end());
  if (indexes.size() <= retention.min_entries) return result;
  // Entries older than the newest max_entries no longer hold the log for an inactive replica.
  const int64_t min_saved_record =
      indexes[indexes.size() > retention.max_entries ? indexes.size() - retention.max_entries : 0];

  auto replicas = keeper.children(paths.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  int64_t min_pointer = INT64_MAX;
  struct Candidate {
    std::string name;
    int32_t host_version;
    int64_t pointer;
  };
  std::vector<Candidate> to_mark_lost;
  std::size_t not_lost = 0;
  for (const auto& name : replicas->names) {
    TablePaths other = paths;
    other.replica = name;
    auto host = keeper.exists(other.host());
    auto pointer = keeper.get(other.logPointer());
    auto lost = keeper.get(other.isLost());
    auto active = keeper.exists(other.isActive());
    // A lost replica that no process serves holds nothing back, even one half removed by
    // dropReplica (which marks it lost first).
    if (lost && lost->data == "1" && active && !*active) continue;
    if (!host || !pointer || !lost || !active) {
      // A replica being created or removed: decide next round.
      return result;
    }
    if (!*host) return result;
    // A pointer never set means the replica has pulled nothing yet: it needs everything.
    const int64_t value = parseDecimal(pointer->data).value_or(0);
    const bool is_lost = lost->data == "1";
    const bool is_active = active->has_value();
    if (is_active) {
      min_pointer = std::min(min_pointer, value);  // also a recovering (lost, active) one
      if (!is_lost) ++not_lost;
    } else if (!is_lost) {
      if (value >= min_saved_record) {
        min_pointer = std::min(min_pointer, value);
        ++not_lost;
      } else {
        to_mark_lost.push_back({name, (**host).version, value});
      }
    }
  }
  if (!to_mark_lost.empty() && not_lost == 0) {
    spdlog::warn("all replicas of {} are stale: none is marked lost", paths.table_root);
    for (const auto& c : to_mark_lost) min_pointer = std::min(min_pointer, c.pointer);
    to_mark_lost.clear();
  }
  for (const auto& candidate : to_mark_lost) {
    TablePaths other = paths;
    other.replica = candidate.name;
    auto marked = keeper.multi(
        {op::Check{other.host(), candidate.host_version}, op::Set{other.isLost(), "1", -1}});
    if (!marked) {
      // It came back (its host changed) or went away: keep its entries this round.
      min_pointer = std::min(min_pointer, candidate.pointer);
      continue;
    }
    spdlog::info("replica {} of {} is lost: its log pointer {} is behind the kept log",
                 candidate.name, paths.table_root, candidate.pointer);
    result.marked_lost.push_back(candidate.name);
  }

  // Never the newest min_entries, nothing at or after the lowest pointer still needed.
  const int64_t keep_from = std::min(min_pointer, indexes[indexes.size() - retention.min_entries]);
  std::vector<int64_t> old;
  for (int64_t index : indexes) {
    if (index < keep_from) old.push_back(index);
  }
  // Batches guarded by the replicas node's version: a replica added meanwhile needs the log.
  constexpr std::size_t kRemoveBatch = 4 * LogPuller::kMaxBatch;
  for (std::size_t begin = 0; begin < old.size(); begin += kRemoveBatch) {
    const std::size_t end = std::min(old.size(), begin + kRemoveBatch);
    std::vector<Op> ops;
    for (std::size_t i = begin; i < end; ++i) {
      ops.push_back(op::Remove{paths.log() + "/" + logEntryName(old[i]), -1});
    }
    ops.push_back(op::Check{paths.replicas(), (**replicas_stat).version});
    auto removed = keeper.multi(ops);
    if (!removed) {
      if (removed.error().code == KeeperCode::kNoNode) break;  // another cleaner got there first
      return std::unexpected(removed.error());
    }
    result.removed += end - begin;
  }
  if (result.removed > 0) {
    spdlog::info("removed {} old log entries of {}: log-{:010d} - log-{:010d}", result.removed,
                 paths.table_root, old.front(), old[result.removed - 1]);
  }
  return result;
}

}  // namespace rtable::core
