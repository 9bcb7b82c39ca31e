#include "rtable/replication_core/replication_worker.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "posix_file.h"
#include "rtable/replication_core/merge_selector.h"
#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/part_store.h"
#include "rtable/replication_core/quorum.h"
#include "rtable/replication_core/sequential_counter.h"
#include "worker_pool.h"

namespace rtable::core {
namespace fs = std::filesystem;
namespace {

// Parts per batch of the table swap's attach: per ZooKeeper multi in attachParts (4 ops each: log
// entry, dedup id, part node, lock; about 125 KB a request at 250, far under ZooKeeper's 1 MB
// jute.maxbuffer), and per linkAndPlace and multi on the replicas executing the entries.
constexpr std::size_t kAttachBatch = 250;

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

InsertError unavailable(const std::string& message) {
  return InsertError{InsertError::Kind::kUnavailable, message};
}

KeeperError noSession() {
  return KeeperError{KeeperCode::kConnectionLoss, "", "no ZooKeeper session", {}};
}

// host/port of a replica from its `host` node (ReplicatedMergeTreeAddress text).
std::optional<FetchSource> parseReplicaAddress(const std::string& replica,
                                               const std::string& text) {
  FetchSource source;
  source.replica = replica;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("host: ")) source.host = line.substr(6);
    if (line.starts_with("port: "))
      source.port = static_cast<uint16_t>(std::atoi(line.c_str() + 6));
    if (line == "scheme: https") source.tls = true;
  }
  if (source.host.empty() || source.port == 0) return std::nullopt;
  return source;
}

// TableSpec::parseYaml checked that it loads; a spec made in code that names a bad directory
// fetches from no HTTPS replica (fetchPart says why).
std::shared_ptr<common::TlsContext> fetchTls(const TableSpec& spec) {
  if (spec.tls_dir.empty()) return nullptr;
  auto loaded = common::TlsContext::load(common::TlsContext::Side::kClient,
                                         common::TlsFiles::inDirectory(spec.tls_dir));
  if (!loaded) {
    spdlog::error("tls.dir: {}", loaded.error());
    return nullptr;
  }
  return *loaded;
}

}  // namespace

ReplicationWorker::ReplicationWorker(const TableSpec& spec, TablePaths paths,
                                     ReplicationOptions options, KeeperSession& session,
                                     PartStore& store, BlockNumberAllocator& allocator,
                                     metrics::ReplicaMetrics& metrics, const common::Clock& clock)
    : spec_(spec),
      paths_(std::move(paths)),
      options_(options),
      session_(session),
      store_(store),
      allocator_(allocator),
      metrics_(metrics),
      clock_(clock),
      fetch_tls_(fetchTls(spec_)),
      dedup_cleaner_(paths_, spec_.deduplication),
      queue_(QueueLimits{spec_.fetch_threads, spec_.merge_threads}),
      puller_(paths_) {}

ReplicationWorker::~ReplicationWorker() {
  stop();
}

KeeperStatus ReplicationWorker::readLost(Keeper& keeper) {
  // Read after activateReplica, whose multi also sets `host`: the leader marks a replica lost
  // only with a check of the host version it saw while we were inactive, so from here on is_lost
  // stays as read until we clone.
  auto lost = keeper.get(paths_.isLost());
  if (!lost) return std::unexpected(lost.error());
  lost_ = lost->data == "1";
  return {};
}

void ReplicationWorker::load(std::vector<QueueEntry> entries) {
  std::lock_guard lock(queue_mu_);
  for (const auto& name : store_.activeNames()) queue_.addCurrentPart(name);
  for (auto& entry : entries) queue_.insert(std::move(entry));
}

void ReplicationWorker::start() {
  metrics_.poolSize("fetch").Set(static_cast<double>(spec_.fetch_threads));
  metrics_.poolSize("merge").Set(static_cast<double>(spec_.merge_threads));
  fetch_pool_ = std::make_unique<WorkerPool>(spec_.fetch_threads);
  merge_pool_ = std::make_unique<WorkerPool>(spec_.merge_threads);
  store_.onCheckpointWanted([this] { wake(); });
  background_ = std::thread([this] { backgroundLoop(); });
}

void ReplicationWorker::stop() {
  {
    std::lock_guard lock(background_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  background_wake_.notify_all();
  if (background_.joinable()) background_.join();
  // Running fetches and merges finish; queued ones run after the next start.
  if (fetch_pool_) fetch_pool_->stop();
  if (merge_pool_) merge_pool_->stop();
}

void ReplicationWorker::wake() {
  {
    std::lock_guard lock(background_mu_);
    wake_requested_ = true;
  }
  background_wake_.notify_all();
}

void ReplicationWorker::publish(const PartName& name, PartChecksums checksums, uint64_t rows,
                                std::shared_ptr<const PartImage> image) {
  std::lock_guard queue_lock(queue_mu_);
  store_.makeVisible(name, std::move(checksums), rows, std::move(image));
  queue_.addCurrentPart(name);
}

void ReplicationWorker::rememberLogEntry(const std::string& path, std::string data) {
  puller_.remember(path, std::move(data));
}

void ReplicationWorker::resolveUncertainParts(Keeper& keeper, const PartName* only) {
  // One at a time, and a part leaves the uncertain ones only once it is visible (or removed): a
  // merge selection never sees it nowhere.
  std::lock_guard resolve_lock(resolve_mu_);
  for (auto& [name, part] : store_.uncertainParts()) {
    if (only && name != *only) continue;
    auto committed = commitOutcome(keeper, paths_, name.format(), part.lock_path);
    if (!committed) continue;
    if (*committed) {
      publish(name, part.checksums, part.rows, part.image);
      store_.forgetUncertain(name);
    } else {
      store_.forgetUncertain(name);
      store_.discard(name, part);
    }
  }
}

std::size_t ReplicationWorker::runRoundForTest() {
  store_.checkpointIfDue();
  std::shared_ptr<Keeper> keeper = session_.current();
  if (!keeper) return 0;
  resolveUncertainParts(*keeper);
  allocator_.releaseLostLocks(*keeper);
  allocator_.releaseIdleReserves(*keeper, options_.reserve_idle);
  updateLogMetrics(*keeper);
  if (!cloneIfLost(*keeper)) return 0;
  updateQueue(*keeper);
  if (isLeader(*keeper)) {
    (void)dedup_cleaner_.run(*keeper);
    assignMerges(*keeper, options_.merge_min_parts);
    cleanLog(*keeper);
  }
  return scheduleQueue(/*inline_execution=*/true);
}

bool ReplicationWorker::cloneIfLost(Keeper& keeper) {
  auto lost = keeper.get(paths_.isLost());
  if (!lost) return false;
  if (lost->data != "1") {
    lost_ = false;
    return true;
  }
  lost_ = true;
  auto source = chooseCloneSource(keeper, paths_);
  if (!source || !*source) {
    spdlog::warn(
        "replica {} is lost (or new on a table with history) and no live replica can be "
        "cloned yet",
        spec_.replica);
    return false;
  }
  std::lock_guard pull_lock(pull_mu_);  // no pull in between: the clone replaces the queue
  std::lock_guard lock(queue_mu_);
  // The background loop and /sync (syncQueue) both get here: the one that waited for the locks
  // looks again, or it would clone a second time over the first clone's queue, whose running
  // fetches would then go nowhere.
  auto still_lost = keeper.get(paths_.isLost());
  if (!still_lost) return false;
  if (still_lost->data != "1") {
    lost_ = false;
    return true;
  }
  auto cloned = cloneReplica(keeper, paths_, **source);
  if (!cloned) {
    spdlog::warn("cloning replica {}: {}", **source, cloned.error().toString());
    return false;
  }
  // Local parts the table no longer has anywhere (dropped while we were away) go to detached/.
  std::vector<PartName> strays;
  for (const auto& name : store_.activeNames()) {
    if (!cloned->source_parts.containingPart(name)) strays.push_back(name);
  }
  for (const auto& name : strays) {
    if (auto removed = keeper.remove(paths_.part(name.format()));
        !removed && removed.error().code != KeeperCode::kNoNode) {
      spdlog::warn("cloning: cannot unregister stray part {}: {}", name.format(),
                   removed.error().toString());
      return false;
    }
    store_.retire({name}, "clone_");
    spdlog::info("cloning: part {} is not in {}'s table any more: detached as clone_{}",
                 name.format(), **source, name.format());
  }
  // The old queue was replaced in ZooKeeper; so is the one in memory.
  ReplicationQueue fresh(QueueLimits{spec_.fetch_threads, spec_.merge_threads});
  for (const auto& name : store_.activeNames()) fresh.addCurrentPart(name);
  const std::size_t entries = cloned->entries.size();
  for (auto& entry : cloned->entries) fresh.insert(std::move(entry));
  queue_ = std::move(fresh);
  ++queue_epoch_;  // entries running now belong to the old queue: their outcomes go nowhere
  spdlog::info("replica {} cloned {} ({} queue entries)", spec_.replica, **source, entries);
  lost_ = false;
  return true;
}

bool ReplicationWorker::updateQueue(Keeper& keeper) {
  // One pull at a time, and every pull's entries are in the queue when this returns. queue_mu_ is
  // not held across the pull's ZooKeeper round trips: an insert's publish would wait them out
  // (measured: 120-190 us added to every single-row insert, on average).
  std::lock_guard pull_lock(pull_mu_);
  std::unique_lock lock(queue_mu_);
  last_pull_ = clock_.now();
  if (queue_needs_sync_) {
    // An entry in ZooKeeper's queue but not here would never run, and the leader would merge
    // across its part as if the block did not exist: every replica would lose its rows.
    auto stored = loadQueue(keeper, paths_);
    if (!stored) {
      spdlog::warn("reloading the replication queue after a failed pull: {}",
                   stored.error().toString());
      return false;
    }
    std::size_t recovered = 0;
    for (auto& entry : *stored) {
      if (queue_.contains(entry.node_name)) continue;
      queue_.insert(std::move(entry));
      ++recovered;
    }
    if (recovered > 0) {
      spdlog::warn("recovered {} queue entries that a pull without an answer had created",
                   recovered);
    }
    queue_needs_sync_ = false;
  }
  lock.unlock();
  const auto local = store_.lookup();
  auto pulled = puller_.pull(
      keeper,
      [&](const LogEntry& entry) {
        // Our own inserts (and anything else already here) need no work.
        auto part = PartName::parse(entry.new_part_name);
        if ((entry.type != LogEntry::Type::kGetPart && entry.type != LogEntry::Type::kAttachPart) ||
            !part) {
          return false;
        }
        auto here = local(*part);
        return here && *here == *part;
      },
      [this](const WatchEvent&) { wake(); });
  lock.lock();
  if (!pulled) {
    spdlog::warn("pulling the replication log: {}", pulled.error().toString());
    queue_needs_sync_ = true;
    return false;
  }
  for (auto& entry : *pulled) queue_.insert(std::move(entry));
  return true;
}

std::size_t ReplicationWorker::assignMerges(Keeper& keeper, std::size_t min_parts) {
  if (merges_frozen_) return 0;
  // ClickHouse's MergePredicate. A merge takes only parts that were virtual parts here before the
  // block locks are read (prev_virtual_parts). Every block inside a range of such parts was
  // allocated before them, so the lock read sees it either in flight (the range is refused) or
  // finished: then its log entry exists and is pulled below (or it was committed here), its part
  // is a virtual part between the range's parts, and the range must take it as a source. A part
  // that arrived after the lock read may sit beside a block allocated after it, which no lock in
  // hand shows: it waits for the next round.
  std::set<PartName> known_before_locks;
  std::map<std::string, std::vector<int64_t>> locks;
  {
    // Only partitions with enough parts to merge: between full rounds this runs on every wake,
    // and then mostly ends here without asking ZooKeeper anything.
    std::set<std::string> partitions;
    {
      std::lock_guard lock(queue_mu_);
      std::map<std::string, std::size_t> counts;
      for (const auto& part : queue_.virtualParts().parts()) {
        if (part.isFakeDropRange()) continue;
        known_before_locks.insert(part);
        if (++counts[part.partition_id] == std::max(min_parts, options_.merge_min_parts)) {
          partitions.insert(part.partition_id);
        }
      }
    }
    if (partitions.empty()) return 0;
    for (const auto& partition : partitions) {
      auto locked = lockedBlockNumbers(keeper, partition);
      if (!locked) return 0;
      locks[partition] = std::move(*locked);
    }
  }
  if (!updateQueue(keeper)) return 0;

  std::vector<LogEntry> merges;
  {
    std::lock_guard queue_lock(queue_mu_);
    // Read with queue_mu_ held: no part becomes visible meanwhile (publish takes queue_mu_).
    const PartStore::MergeView view = store_.mergeView();
    // ClickHouse's max_replicated_merges_in_queue: merges waiting anywhere in the queue.
    std::size_t queued_merges = 0;
    for (const auto& queued : queue_.entries()) {
      if (queued.entry.type == LogEntry::Type::kMergeParts) ++queued_merges;
    }
    std::map<std::string, std::vector<PartName>> by_partition;
    for (const auto& part : queue_.virtualParts().parts()) {
      if (!part.isFakeDropRange()) by_partition[part.partition_id].push_back(part);
    }
    for (const auto& [partition, parts] : by_partition) {
      if (parts.size() < options_.merge_min_parts || !locks.contains(partition)) continue;
      const std::vector<int64_t>& locked = locks[partition];
      // Several disjoint merges per round, so merges keep up with a stream of small inserts.
      std::set<PartName> taken;
      // A part can be merged when it is here, was known before the locks were read, and nothing
      // in the queue will change it.
      auto mergeable = [&](const PartName& part) {
        return !taken.contains(part) && known_before_locks.contains(part) &&
               view.active_rows.contains(part) && !queue_.coveredByQueuedEntry(part) &&
               !queue_.futureParts().contains(part);
      };
      // Whether a merge into `range` would cover a block that is allocated but not visible here:
      // an insert in flight anywhere (a lock), or a block this replica is committing or could not
      // confirm. Such a merge would hide that block's rows.
      auto coversArrivingBlock = [&](const PartName& range) {
        for (const auto& name : view.arriving) {
          if (range.contains(name)) return true;
        }
        for (int64_t number : locked) {
          if (number >= range.min_block && number <= range.max_block) return true;
        }
        return false;
      };
      while (queued_merges + merges.size() < options_.max_queued_merges) {
        std::vector<MergeCandidate> candidates;
        candidates.reserve(parts.size());
        for (const auto& part : parts) {
          const bool ok = mergeable(part);
          candidates.push_back({ok ? view.active_rows.at(part) : 0, ok});
        }
        auto best = selectMergeRange(candidates, options_.merge_min_parts, options_.merge_max_parts,
                                     [&](const MergeRange& r) {
                                       const PartName range{partition, parts[r.start].min_block,
                                                            parts[r.start + r.width - 1].max_block,
                                                            PartName::kMaxLevel, 0};
                                       return !coversArrivingBlock(range);
                                     });
        if (!best) break;
        LogEntry entry;
        entry.type = LogEntry::Type::kMergeParts;
        entry.create_time = unixNow();
        entry.source_replica = spec_.replica;
        PartName result{partition, parts[best->start].min_block,
                        parts[best->start + best->width - 1].max_block, 0, 0};
        for (std::size_t i = best->start; i < best->start + best->width; ++i) {
          entry.source_parts.push_back(parts[i].format());
          result.level = std::max(result.level, parts[i].level + 1);
          taken.insert(parts[i]);
        }
        entry.new_part_name = result.format();
        merges.push_back(std::move(entry));
      }
    }
  }
  std::size_t assigned = 0;
  for (const auto& entry : merges) {
    // Every replica, this one included, executes it from its queue.
    if (keeper.create(paths_.logEntryPrefix(), entry.format(), CreateMode::kPersistentSequential)) {
      ++assigned;
    }
  }
  if (assigned > 0) updateQueue(keeper);
  return assigned;
}

ReplicationWorker::Execution::~Execution() {
  if (!worker_) return;
  // No outcome was reported: the entry goes back to the queue as failed (with its backoff), and
  // its slot and its future part are free again.
  std::vector<std::pair<Execution*, EntryOutcome>> abandoned;
  abandoned.emplace_back(this, std::unexpected(EntryError("abandoned without an outcome (the "
                                                          "replica is stopping, or a bug)")));
  worker_->reportOutcomes(std::move(abandoned), nullptr);
}

std::size_t ReplicationWorker::scheduleQueue(bool inline_execution) {
  static constexpr std::size_t kNoOpBatch = 100;
  std::size_t merged = 0;
  std::vector<Execution> no_ops;
  std::vector<Execution> attaches;
  for (;;) {
    std::optional<Execution> selected;
    const bool readonly = session_.current() == nullptr || lost_;
    {
      std::lock_guard lock(queue_mu_);
      const bool pools_full = queue_.executing(QueueAction::kFetch) >= spec_.fetch_threads &&
                              queue_.executing(QueueAction::kMerge) >= spec_.merge_threads;
      if (inline_execution || !pools_full) {
        auto entry = queue_.selectEntryToProcess(store_.lookup(), readonly, clock_.now());
        if (entry) selected.emplace(*this, std::move(*entry), queue_epoch_);
      }
      metrics_.queue_size.Set(static_cast<double>(queue_.size()));
    }
    if (!selected) {
      if (no_ops.empty() && attaches.empty()) return merged;
      // Finishing them may let entries they held back run: look again.
      if (!no_ops.empty()) finishNoOpEntries(no_ops);
      if (!attaches.empty()) executeAttaches(attaches, inline_execution);
      no_ops.clear();
      attaches.clear();
      continue;
    }
    const QueueAction action = selected->selected().action;
    if (action == QueueAction::kNothing || action == QueueAction::kAttach) {
      std::vector<Execution>& batch = action == QueueAction::kNothing ? no_ops : attaches;
      batch.push_back(std::move(*selected));
      if (action == QueueAction::kNothing && batch.size() == kNoOpBatch) {
        finishNoOpEntries(batch);
        batch.clear();
      } else if (action == QueueAction::kAttach && batch.size() == kAttachBatch) {
        executeAttaches(batch, inline_execution);
        batch.clear();
      }
      continue;
    }
    if (inline_execution || action == QueueAction::kDropRange) {
      if (executeEntry(*selected) && action == QueueAction::kMerge) ++merged;
      continue;
    }
    dispatch(std::move(*selected), action, inline_execution);
  }
}

void ReplicationWorker::dispatch(Execution execution, QueueAction action, bool inline_execution) {
  if (inline_execution) {
    executeEntry(execution);
    return;
  }
  WorkerPool& pool = action == QueueAction::kMerge ? *merge_pool_ : *fetch_pool_;
  // A pool that refuses the task (it is stopping) destroys it, and with it the Execution, which
  // gives the entry back.
  (void)pool.submit([this, execution = std::move(execution)]() mutable {
    try {
      executeEntry(execution);
    } catch (const std::exception& e) {
      // Errors are values on this path; an exception is a bug. The Execution gives the entry
      // back, and the replica lives on.
      spdlog::error("queue entry {}: {}", execution.selected().node_name, e.what());
    }
    wake();  // a finished entry frees a slot, and may let others run
  });
}

void ReplicationWorker::executeAttaches(std::vector<Execution>& entries, bool inline_execution) {
  std::shared_ptr<Keeper> keeper = session_.current();
  std::vector<std::pair<Execution*, EntryOutcome>> outcomes;
  std::vector<LinkJob> jobs;
  std::vector<Execution*> linking;
  for (auto& entry : entries) {
    const SelectedEntry& selected = entry.selected();
    auto wanted = PartName::parse(selected.entry.new_part_name);
    if (!keeper || !wanted) {
      outcomes.emplace_back(
          &entry, std::unexpected(EntryError(keeper ? wanted.error() : "no ZooKeeper session")));
      continue;
    }
    if (auto settled = settleEarlierAttempt(*keeper, selected)) {
      outcomes.emplace_back(&entry, std::move(*settled));
      continue;
    }
    DataPartPtr source = attach_source_ && !selected.entry.part_checksum.empty()
                             ? attach_source_(wanted->partition_id, selected.entry.part_checksum)
                             : nullptr;
    if (!source) {
      // Not here in the previous generation (a replica that joined late, a part it lost): fetched
      // from a replica that attached it.
      dispatch(std::move(entry), QueueAction::kAttach, inline_execution);
      continue;
    }
    jobs.push_back(LinkJob{std::move(source), *wanted});
    linking.push_back(&entry);
  }
  linkAndPlace(jobs);
  // The parts' nodes and the entries' queue nodes, all in one multi.
  std::vector<Op> ops;
  std::vector<std::size_t> placed;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].placed) {
      // Another entry brought the same part in meanwhile: then this entry's work is done.
      EntryOutcome done;
      if (auto here = store_.lookup()(jobs[i].name); !here || *here != jobs[i].name) {
        done = std::unexpected(EntryError(fmt::format(
            "placing attached part {}: {}", jobs[i].name.format(), jobs[i].placed.error())));
      }
      outcomes.emplace_back(linking[i], std::move(done));
      continue;
    }
    ops.push_back(partNode(jobs[i].name, jobs[i].source->checksums));
    ops.push_back(op::Remove{paths_.queue() + "/" + linking[i]->selected().node_name, -1});
    placed.push_back(i);
  }
  auto newPart = [&](std::size_t i) {
    NewPart part;
    part.partition = jobs[i].name.partition_id;
    part.dir = *jobs[i].placed;
    part.rows = jobs[i].source->rows;
    part.checksums = jobs[i].source->checksums;
    return part;
  };
  auto registered = placed.empty() ? KeeperResult<std::vector<OpResult>>() : keeper->multi(ops);
  for (std::size_t k = 0; k < placed.size(); ++k) {
    const std::size_t i = placed[k];
    EntryOutcome done;
    if (!registered && registered.error().isConnectionLevel()) {
      // No answer: all of the batch was applied or none. Each part waits, held, for its node to
      // tell (resolveUncertainParts), as registerPart's parts do.
      store_.addUncertain(jobs[i].name, newPart(i));
      done = std::unexpected(EntryError(fmt::format(
          "registering the attached part: {} (the outcome is checked once ZooKeeper answers)",
          registered.error().toString())));
    } else if (!registered) {
      // Not applied (one queue node gone with a clone, one part node there already): each alone,
      // which tells them apart.
      if (auto one = registerPart(*keeper, {ops[2 * k], ops[2 * k + 1]}, jobs[i].name, newPart(i));
          !one) {
        done = std::unexpected(EntryError("registering the attached part: " + one.error()));
      }
    }
    if (done) {
      publish(jobs[i].name, jobs[i].source->checksums, jobs[i].source->rows, nullptr);
      metrics_.attached_parts.Increment();
    }
    outcomes.emplace_back(linking[i], std::move(done));
  }
  reportOutcomes(std::move(outcomes), keeper.get());
}

std::optional<ReplicationWorker::EntryOutcome> ReplicationWorker::settleEarlierAttempt(
    Keeper& keeper, const SelectedEntry& selected) {
  auto name = PartName::parse(selected.entry.new_part_name);
  if (!name || !store_.isUncertain(*name)) return std::nullopt;
  resolveUncertainParts(keeper, &*name);
  if (store_.isUncertain(*name)) {
    return std::unexpected(EntryError(fmt::format(
        "part {}: whether an earlier attempt registered it is not known yet", name->format())));
  }
  if (auto here = store_.lookup()(*name); here && *here == *name) return EntryOutcome{};
  return std::nullopt;
}

bool ReplicationWorker::executeEntry(Execution& execution) {
  const SelectedEntry& selected = execution.selected();
  std::shared_ptr<Keeper> keeper = session_.current();
  EntryOutcome done;
  const bool makes_a_part =
      selected.action != QueueAction::kNothing && selected.action != QueueAction::kDropRange;
  std::optional<EntryOutcome> settled;
  if (keeper && makes_a_part) settled = settleEarlierAttempt(*keeper, selected);
  if (!keeper) {
    done = std::unexpected("no ZooKeeper session");
  } else if (settled) {
    done = std::move(*settled);
  } else {
    switch (selected.action) {
      case QueueAction::kNothing:
        if (auto removed = keeper->remove(paths_.queue() + "/" + selected.node_name);
            !removed && removed.error().code != KeeperCode::kNoNode) {
          done = std::unexpected(removed.error().toString());
        }
        break;
      case QueueAction::kFetch:
      case QueueAction::kAttach:  // executeAttaches found no local part to link: fetched
        done = executeFetch(*keeper, selected);
        break;
      case QueueAction::kMerge:
        done = executeMerge(*keeper, selected);
        break;
      case QueueAction::kDropRange:
        done = executeDropRange(*keeper, selected);
        break;
    }
  }
  const bool succeeded = done.has_value();
  std::vector<std::pair<Execution*, EntryOutcome>> outcome;
  outcome.emplace_back(&execution, std::move(done));
  reportOutcomes(std::move(outcome), keeper.get());
  return succeeded;
}

void ReplicationWorker::finishNoOpEntries(std::vector<Execution>& entries) {
  std::shared_ptr<Keeper> keeper = session_.current();
  std::vector<Op> removes;
  for (const auto& entry : entries) {
    removes.push_back(op::Remove{paths_.queue() + "/" + entry.selected().node_name, -1});
  }
  auto batch = keeper ? keeper->multi(removes)
                      : KeeperResult<std::vector<OpResult>>(std::unexpected(noSession()));
  std::vector<std::pair<Execution*, EntryOutcome>> outcomes;
  for (auto& entry : entries) {
    EntryOutcome done;
    if (!keeper) {
      done = std::unexpected("no ZooKeeper session");
    } else if (!batch) {
      // One node was gone already (a clone replaced the queue, say): one by one then.
      if (auto removed = keeper->remove(paths_.queue() + "/" + entry.selected().node_name);
          !removed && removed.error().code != KeeperCode::kNoNode) {
        done = std::unexpected(removed.error().toString());
      }
    }
    outcomes.emplace_back(&entry, std::move(done));
  }
  reportOutcomes(std::move(outcomes), keeper.get());
}

void ReplicationWorker::reportOutcomes(std::vector<std::pair<Execution*, EntryOutcome>> outcomes,
                                       Keeper* keeper) {
  std::vector<std::string> pointless;
  {
    std::lock_guard lock(queue_mu_);
    for (auto& [execution, done] : outcomes) {
      if (!execution->release()) continue;  // reported already
      // An entry of a queue a clone replaced: that queue and its slots are gone.
      if (execution->epoch() != queue_epoch_) continue;
      const SelectedEntry& selected = execution->selected();
      if (done) {
        if (selected.action == QueueAction::kFetch || selected.action == QueueAction::kMerge)
          notePartWritten();
        auto removed = queue_.finish(selected.node_name);
        pointless.insert(pointless.end(), removed.begin(), removed.end());
      } else if (done.error().gave_way) {
        queue_.giveWay(selected.node_name, done.error().message, clock_.now());
      } else {
        spdlog::warn("queue entry {} ({} {}): {}", selected.node_name,
                     queueActionName(selected.action), selected.entry.new_part_name,
                     done.error().message);
        queue_.fail(selected.node_name, done.error().message, clock_.now());
        if (isOutOfSpace(done.error().message)) noteOutOfSpace(done.error().message);
      }
    }
    metrics_.queue_size.Set(static_cast<double>(queue_.size()));
  }
  if (keeper) {
    for (const auto& node : pointless) (void)keeper->remove(paths_.queue() + "/" + node);
  }
  // The queue's gauges follow each finished entry, not only the background round.
  updateQueueMetrics();
  queue_changed_.notify_all();
}

void ReplicationWorker::noteOutOfSpace(const std::string& message) {
  std::lock_guard lock(disk_mu_);
  out_of_space_at_ = clock_.now();
  out_of_space_message_ = message;
}

void ReplicationWorker::notePartWritten() {
  std::lock_guard lock(disk_mu_);
  out_of_space_at_.reset();
}

void ReplicationWorker::publishDiskState(Keeper& keeper) {
  std::string message;
  int64_t published;
  {
    std::lock_guard lock(disk_mu_);
    if (out_of_space_at_ && clock_.now() - *out_of_space_at_ >= options_.disk_full_window)
      out_of_space_at_.reset();
    if (out_of_space_at_) message = out_of_space_message_;
    published = disk_full_session_;
  }
  const bool full = !message.empty();
  // Up in this session already, or down: nothing to do. (A new session lost the ephemeral node.)
  if (full == (published == keeper.sessionId())) return;
  if (full) {
    auto created = keeper.create(paths_.diskFull(), message, CreateMode::kEphemeral);
    if (!created && created.error().code == KeeperCode::kNodeExists) {
      (void)keeper.remove(paths_.diskFull());  // the last session's, not yet expired
      created = keeper.create(paths_.diskFull(), message, CreateMode::kEphemeral);
    }
    if (!created) return;  // tried again next round
    spdlog::warn("the data volume is full: {}", message);
  } else {
    auto removed = keeper.remove(paths_.diskFull());
    if (!removed && removed.error().code != KeeperCode::kNoNode) return;
    spdlog::info("the data volume takes parts again");
  }
  std::lock_guard lock(disk_mu_);
  disk_full_session_ = full ? keeper.sessionId() : 0;
}

void ReplicationWorker::noteFetchSource(const std::string& replica, bool failed) {
  std::lock_guard lock(sources_mu_);
  if (failed) {
    failed_sources_[replica] = clock_.now();
  } else {
    failed_sources_.erase(replica);
  }
}

KeeperResult<std::vector<ReplicationWorker::FetchCandidate>> ReplicationWorker::fetchCandidates(
    Keeper& keeper, const PartName& wanted) {
  // Replicas that are live and have the part, or a part covering it (it may have been merged).
  auto replicas = keeper.children(paths_.replicas());
  if (!replicas) return std::unexpected(replicas.error());
  std::vector<FetchCandidate> exact;
  std::vector<FetchCandidate> covering;
  for (const auto& replica : replicas->names) {
    if (replica == spec_.replica) continue;
    TablePaths other = paths_;
    other.replica = replica;
    auto active = keeper.exists(other.isActive());
    if (!active || !*active) continue;
    auto host = keeper.get(other.host());
    if (!host) continue;
    auto source = parseReplicaAddress(replica, host->data);
    if (!source) continue;
    source->generation = paths_.generation;
    // The parts node's data is the checksum the source recorded: what it sends must match it.
    auto has = keeper.get(other.part(wanted.format()));
    if (has) {
      exact.push_back(FetchCandidate{*source, wanted, has->data});
      continue;
    }
    auto parts = keeper.children(other.parts());
    if (!parts) continue;
    for (const auto& name : parts->names) {
      auto part = PartName::parse(name);
      if (part && part->contains(wanted)) {
        auto recorded = keeper.get(other.part(name));
        if (!recorded) break;  // gone meanwhile (merged away): not a source now
        covering.push_back(FetchCandidate{*source, *part, recorded->data});
        break;
      }
    }
  }
  // A source that failed within the last minute (cut off, full, slow) is tried after the others,
  // so that one bad peer does not hold fetch slots while others have the part (ClickHouse picks
  // another replica too).
  constexpr auto kRemembered = std::chrono::minutes(1);
  std::map<std::string, std::chrono::steady_clock::time_point> failed;
  {
    std::lock_guard lock(sources_mu_);
    failed = failed_sources_;
  }
  const auto now = clock_.now();
  auto failedLately = [&](const FetchCandidate& c) {
    auto it = failed.find(c.source.replica);
    return it != failed.end() && now - it->second < kRemembered;
  };
  for (auto* group : {&exact, &covering}) {
    std::stable_partition(group->begin(), group->end(),
                          [&](const FetchCandidate& c) { return !failedLately(c); });
  }
  exact.insert(exact.end(), covering.begin(), covering.end());
  return exact;
}

ReplicationWorker::EntryOutcome ReplicationWorker::executeFetch(Keeper& keeper,
                                                                const SelectedEntry& selected) {
  auto wanted = PartName::parse(selected.entry.new_part_name);
  if (!wanted) return std::unexpected(wanted.error());
  auto listed = fetchCandidates(keeper, *wanted);
  if (!listed) return std::unexpected(listed.error().toString());
  const std::vector<FetchCandidate>& candidates = *listed;
  if (candidates.empty()) {
    auto missing = searchForMissingPart(keeper, paths_, *wanted);
    if (!missing) return std::unexpected(missing.error().toString());
    if (*missing != MissingPart::kLostForever) {
      return std::unexpected(fmt::format("no live replica has part {} or a part covering it ({})",
                                         wanted->format(), missingPartName(*missing)));
    }
    // No replica, live or not, lists it or a part covering it, and no merge can make it: waiting
    // would retry forever. The rows of that part are gone from the table (ClickHouse logs the
    // same "lost forever" and drops the entry).
    auto removed = keeper.remove(paths_.queue() + "/" + selected.node_name);
    if (!removed && removed.error().code != KeeperCode::kNoNode) {
      return std::unexpected(removed.error().toString());
    }
    spdlog::error(
        "part {} is lost forever: no replica has it or a part covering it; giving up "
        "queue entry {}",
        wanted->format(), selected.node_name);
    metrics_.parts_lost_forever.Increment();
    std::vector<std::string> duplicates;
    {
      std::lock_guard queue_lock(queue_mu_);
      duplicates = queue_.forgetLostPart(selected.node_name, store_.activeNames());
    }
    for (const auto& node : duplicates) (void)keeper.remove(paths_.queue() + "/" + node);
    return {};
  }
  std::string errors;
  const auto started = std::chrono::steady_clock::now();
  for (const auto& candidate : candidates) {
    const std::string name = candidate.part.format();
    if (candidate.part != *wanted) {
      std::lock_guard lock(queue_mu_);
      if (!queue_.setActualPart(selected.node_name, candidate.part)) {
        // Another entry fetches or makes a part overlapping this one: its result will serve us.
        EntryError gave_way(
            fmt::format("Not fetching part {} covering {}: it is being fetched or "
                        "made by another entry",
                        name, wanted->format()));
        gave_way.gave_way = true;
        return std::unexpected(std::move(gave_way));
      }
    }
    const fs::path staging = store_.dataDir() / kStagingDir /
                             fmt::format("fetch-{}-{}", name, next_staging_id_.fetch_add(1));
    if (auto made = makeDirectories(staging.parent_path()); !made)
      return std::unexpected(made.error());
    auto fetched = fetchPart(
        candidate.source, spec_.interserver_secret, name, staging, spec_.schema,
        FetchTimeouts{spec_.fetch_connect_timeout, spec_.fetch_receive_timeout}, fetch_tls_.get());
    // During a rotation the source may not know our new secret yet: the ones we still accept,
    // which it has.
    for (const auto& previous : spec_.interserver_previous_secrets) {
      if (fetched || fetched.error().kind != FetchError::Kind::kUnauthorized ||
          fetched.error().http_status != 401) {
        break;
      }
      fetched = fetchPart(candidate.source, previous, name, staging, spec_.schema,
                          FetchTimeouts{spec_.fetch_connect_timeout, spec_.fetch_receive_timeout},
                          fetch_tls_.get());
    }
    if (!fetched) {
      // A corrupt or cut transfer, a source cut off: the next replica may do better. A failure
      // on our side (our disk) says nothing about the source.
      errors += (errors.empty() ? "" : "; ") + fetched.error().toString();
      metrics_.fetch_errors.Increment();
      if (fetched.error().kind != FetchError::Kind::kLocal)
        noteFetchSource(candidate.source.replica, true);
      continue;
    }
    if (!candidate.recorded_checksum.empty() &&
        fetched->total.hex() != candidate.recorded_checksum) {
      // The files agree with the checksums.txt that came with them, but not with what the
      // source recorded in ZooKeeper when it made or took the part: changed on the way, or not
      // the source's part at all.
      std::error_code ec;
      fs::remove_all(staging, ec);
      errors += fmt::format(
          "{}part {} from replica {} has checksum {}, not the {} recorded in "
          "ZooKeeper: refused",
          errors.empty() ? "" : "; ", name, candidate.source.replica, fetched->total.hex(),
          candidate.recorded_checksum);
      metrics_.fetch_errors.Increment();
      noteFetchSource(candidate.source.replica, true);
      continue;
    }
    noteFetchSource(candidate.source.replica, false);
    uint64_t bytes = 0;
    for (const auto& file : fetched->files) bytes += file.size;
    auto placed = placeStaged(staging, candidate.part);
    if (!placed) {
      // Another entry brought the same part in meanwhile: then this entry's work is done.
      if (auto here = store_.lookup()(*wanted)) {
        spdlog::debug("part {} arrived meanwhile (as {}); dropping the copy fetched for {}", name,
                      here->format(), selected.node_name);
        return {};
      }
      return std::unexpected(fmt::format("placing fetched part {}: {}", name, placed.error()));
    }
    // The part, the parts it replaces here, and the queue entry: one multi.
    std::vector<Op> ops = {partNode(candidate.part, *fetched)};
    for (const auto& covered : store_.partsCoveredBy(candidate.part)) {
      if (covered != candidate.part) ops.push_back(op::Remove{paths_.part(covered.format()), -1});
    }
    ops.push_back(op::Remove{paths_.queue() + "/" + selected.node_name, -1});
    NewPart part;
    part.partition = candidate.part.partition_id;
    part.dir = *placed;
    part.checksums = *fetched;
    if (auto registered = registerPart(keeper, ops, candidate.part, part); !registered) {
      return std::unexpected("registering the fetched part: " + registered.error());
    }
    publish(candidate.part, std::move(*fetched), 0, nullptr);
    metrics_.fetch_duration_seconds.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (selected.entry.quorum >= 2 && candidate.part == *wanted) {
      // Counted once the part is here for good; a failure leaves the insert waiting, not wrong.
      if (auto counted = addToQuorum(keeper, paths_, candidate.part.format()); !counted) {
        spdlog::warn("adding {} to the quorum of {}: {}", spec_.replica, candidate.part.format(),
                     counted.error().toString());
      }
    }
    metrics_.fetches.Increment();
    metrics_.fetched_bytes.Increment(static_cast<double>(bytes));
    return {};
  }
  return std::unexpected(errors);
}

std::expected<fs::path, std::string> ReplicationWorker::placeStaged(const fs::path& staging,
                                                                    const PartName& name) {
  const fs::path final_dir = store_.dataDir() / name.format();
  auto placed = renameNoReplace(staging, final_dir);
  if (placed) {
    placed = fsyncDirectory(store_.dataDir());
    // Renamed, not made durable: the directory goes, or it would stand in the way of every
    // later attempt at this part.
    std::error_code ec;
    if (!placed) fs::remove_all(final_dir, ec);
  }
  if (!placed) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    return std::unexpected(placed.error());
  }
  return final_dir;
}

std::expected<void, std::string> ReplicationWorker::linkPart(const DataPart& source,
                                                             const fs::path& staging) {
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (auto made = makeDirectories(staging.parent_path()); !made) return made;
  if (source.image) {
    // Held in memory: no files to link yet.
    return writePartImage(staging, source.image->files, PartSync::kLater);
  }
  if (auto made = makeDirectory(staging); !made || !*made) {
    return std::unexpected(fmt::format("part {}: cannot create it: {}", staging.string(),
                                       made ? "it exists" : made.error()));
  }
  // The source's files are durable already; the links are directory entries. Parts are
  // immutable, so sharing their inodes is safe.
  for (fs::directory_iterator it(source.dir, ec), end; !ec && it != end; it.increment(ec)) {
    fs::create_hard_link(it->path(), staging / it->path().filename(), ec);
    if (ec) break;
  }
  if (!ec) return {};
  const std::string error = fmt::format("linking part {} into {}: {}", source.dir.string(),
                                        staging.string(), ec.message());
  fs::remove_all(staging, ec);
  return std::unexpected(error);
}

void ReplicationWorker::linkAndPlace(std::vector<LinkJob>& jobs) {
  std::vector<fs::path> staged(jobs.size());
  auto fail = [&](std::size_t i, const std::string& error) {
    std::error_code ec;
    if (!staged[i].empty()) fs::remove_all(staged[i], ec);
    if (jobs[i].placed) fs::remove_all(*jobs[i].placed, ec);
    staged[i].clear();
    jobs[i].placed = std::unexpected(error);
  };
  bool linked_any = false;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    staged[i] = store_.dataDir() / kStagingDir /
                fmt::format("attach-{}-{}", jobs[i].name.format(), next_staging_id_.fetch_add(1));
    if (auto linked = linkPart(*jobs[i].source, staged[i]); !linked) {
      staged[i].clear();
      jobs[i].placed = std::unexpected(linked.error());
      continue;
    }
    linked_any = true;
  }
  if (!linked_any) return;
  // Every link (and every file written) durable before any rename shows it as a part: one
  // syncfs of the data directory's file system. Measured on ext4 here, 1000 parts' links: 0.05-0.1
  // s, where an fsync of each part's directory took 0.5-0.65 s (each flushes the disk's cache).
  // syncfs also writes back the volume's other dirty files; during a swap's attach there are
  // few: inserts are synced when committed, and merges are frozen from the pause.
  if (auto synced = syncFileSystem(store_.dataDir()); !synced) {
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (!staged[i].empty()) fail(i, synced.error());
    return;
  }
  bool placed_any = false;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (staged[i].empty()) continue;
    const fs::path final_dir = store_.dataDir() / jobs[i].name.format();
    if (auto renamed = renameNoReplace(staged[i], final_dir); !renamed) {
      fail(i, renamed.error());
      continue;
    }
    staged[i].clear();
    jobs[i].placed = final_dir;
    placed_any = true;
  }
  if (!placed_any) return;
  // Renamed, not made durable: the directories go, or they would stand in the way of every later
  // attempt at these parts.
  if (auto synced = fsyncDirectory(store_.dataDir()); !synced) {
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (jobs[i].placed) fail(i, synced.error());
  }
}

std::expected<std::vector<ReplicationWorker::PreparedAttach>, std::string>
ReplicationWorker::prepareAttaches(Keeper& keeper, const std::vector<DataPartPtr>& sources,
                                   const std::vector<std::string>& dedup_ids,
                                   const std::vector<BlockNumberLock>& locks) {
  std::vector<LinkJob> jobs;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    PartName name = sources[i]->name;
    name.min_block = name.max_block = locks[i].block_number;
    jobs.push_back(LinkJob{sources[i], name});
  }
  linkAndPlace(jobs);
  const auto failed =
      std::find_if(jobs.begin(), jobs.end(), [](const LinkJob& job) { return !job.placed; });
  if (failed != jobs.end()) {
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      std::error_code ec;
      if (jobs[i].placed) fs::remove_all(*jobs[i].placed, ec);
      (void)keeper.remove(locks[i].path);
    }
    return std::unexpected(fmt::format("attaching {} as {}: {}", failed->source->name.format(),
                                       failed->name.format(), failed->placed.error()));
  }
  std::vector<PreparedAttach> prepared;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    PreparedAttach one{sources[i], dedup_ids[i], locks[i], jobs[i].name, *jobs[i].placed, {}};
    one.entry.type = LogEntry::Type::kAttachPart;
    one.entry.create_time = unixNow();
    one.entry.source_replica = paths_.replica;
    one.entry.block_id = dedup_ids[i];
    one.entry.new_part_name = one.name.format();
    one.entry.part_checksum = sources[i]->checksums.total.hex();
    prepared.push_back(std::move(one));
  }
  return prepared;
}

void ReplicationWorker::finishAttach(const PreparedAttach& prepared,
                                     const std::optional<std::string>& log_entry_path,
                                     AttachSummary& summary) {
  if (log_entry_path) rememberLogEntry(*log_entry_path, prepared.entry.format());
  publish(prepared.name, prepared.source->checksums, prepared.source->rows, nullptr);
  metrics_.attached_parts.Increment();
  ++summary.attached;
  summary.parts.push_back(prepared.name.format());
}

std::expected<void, std::string> ReplicationWorker::commitAttach(Keeper& keeper,
                                                                 const PreparedAttach& prepared,
                                                                 AttachSummary& summary) {
  const std::string from = prepared.source->name.format();
  const std::string name = prepared.name.format();
  auto committed = commitPart(keeper, paths_, prepared.entry, prepared.lock);
  bool applied = committed.has_value();
  if (!committed && committed.error().failure == CommitFailure::kUnknownOutcome) {
    // Fenced by the lock, as an insert's commit: applied or never will be.
    auto outcome = commitOutcome(keeper, paths_, name, prepared.lock.path);
    if (!outcome) {
      std::error_code ec;
      fs::remove_all(prepared.dir, ec);
      return std::unexpected(fmt::format(
          "attaching {} as {}: {} (the outcome is not known; attaching again finds out)", from,
          name, outcome.error().toString()));
    }
    applied = *outcome;
  }
  if (!applied) {
    std::error_code ec;
    fs::remove_all(prepared.dir, ec);
    if (committed.error().failure == CommitFailure::kDuplicate) {
      ++summary.already;
      summary.parts.push_back(
          committed.error().duplicate ? committed.error().duplicate->existing_part : std::string());
      return {};
    }
    (void)keeper.remove(prepared.lock.path);
    return std::unexpected(
        fmt::format("attaching {} as {}: {}", from, name, committed.error().cause.toString()));
  }
  finishAttach(prepared, committed ? std::optional(committed->log_entry_path) : std::nullopt,
               summary);
  return {};
}

std::expected<void, std::string> ReplicationWorker::attachOneByOne(Keeper& keeper,
                                                                   const DataPartPtr& source,
                                                                   const std::string& dedup_id,
                                                                   AttachSummary& summary) {
  auto allocation = allocator_.allocate(keeper, source->name.partition_id, dedup_id);
  if (!allocation) {
    return std::unexpected(
        fmt::format("attaching {}: {}", source->name.format(), allocation.error().toString()));
  }
  if (auto* duplicate = std::get_if<Duplicate>(&*allocation)) {
    ++summary.already;
    summary.parts.push_back(duplicate->existing_part);
    return {};
  }
  auto prepared =
      prepareAttaches(keeper, {source}, {dedup_id}, {std::get<BlockNumberLock>(*allocation)});
  if (!prepared) return std::unexpected(prepared.error());
  return commitAttach(keeper, prepared->front(), summary);
}

std::expected<AttachSummary, std::string> ReplicationWorker::attachParts(
    const std::vector<DataPartPtr>& parts) {
  // One id per (partition, contents): the same part attached again is a duplicate.
  std::vector<std::string> ids;
  for (const auto& part : parts) {
    ids.push_back(
        tokenDedupId(part->name.partition_id, "attach-" + part->checksums.total.hex(), 0));
  }
  return attachParts(parts, ids);
}

std::expected<AttachSummary, std::string> ReplicationWorker::attachParts(
    const std::vector<DataPartPtr>& parts, const std::vector<std::string>& dedup_ids) {
  if (dedup_ids.size() != parts.size()) {
    return std::unexpected(
        fmt::format("{} dedup ids for {} parts", dedup_ids.size(), parts.size()));
  }
  AttachSummary summary;
  std::shared_ptr<Keeper> keeper = session_.current();
  if (!keeper) return std::unexpected("no ZooKeeper session");
  // The ids in this generation's dedup window, listed once: before the swap's first attach, only
  // those of attaches tried before. Without the listing (too long for one answer, say), every
  // part's id is read.
  std::optional<std::set<std::string>> present;
  if (auto listed = keeper->children(paths_.dedupHashes())) {
    present.emplace(listed->names.begin(), listed->names.end());
  } else if (listed.error().isConnectionLevel()) {
    return std::unexpected("listing the dedup window: " + listed.error().toString());
  }
  for (std::size_t start = 0; start < parts.size(); start += kAttachBatch) {
    const std::size_t end = std::min(parts.size(), start + kAttachBatch);
    // Parts attached before (a retry after a crash or a lost answer), so that the batch
    // allocation below meets no duplicate in the usual case: those the listing shows (every one
    // without a listing) read in one pipelined round.
    std::vector<std::string> dedup_paths;
    std::vector<std::size_t> read;
    for (std::size_t i = start; i < end; ++i) {
      const std::string id = dedup_ids[i];
      if (present && !present->contains(id)) continue;
      dedup_paths.push_back(paths_.dedupHash(id));
      read.push_back(i);
    }
    auto existing =
        dedup_paths.empty() ? std::vector<KeeperResult<GetResult>>() : keeper->getMany(dedup_paths);
    std::vector<std::pair<std::string, std::string>> wanted;
    std::vector<DataPartPtr> batch;
    for (std::size_t i = start, r = 0; i < end; ++i) {
      if (r < read.size() && read[r] == i) {
        const auto& found = existing[r++];
        if (found) {
          ++summary.already;
          summary.parts.push_back(found->data);
          continue;
        }
        if (found.error().code != KeeperCode::kNoNode) {
          return std::unexpected(
              fmt::format("attaching {}: {}", parts[i]->name.format(), found.error().toString()));
        }
      }
      wanted.emplace_back(parts[i]->name.partition_id, dedup_ids[i]);
      batch.push_back(parts[i]);
    }
    if (batch.empty()) continue;
    auto locks = allocator_.allocateMany(*keeper, wanted);
    if (!locks) {
      if (locks.error().isConnectionLevel()) {
        return std::unexpected(
            fmt::format("attaching {} parts: {}", batch.size(), locks.error().toString()));
      }
      // A duplicate met after all (attached meanwhile), or a partition dropped: one by one.
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (auto one = attachOneByOne(*keeper, batch[i], wanted[i].second, summary); !one)
          return std::unexpected(one.error());
      }
      continue;
    }
    std::vector<std::string> dedup_ids;
    for (const auto& [partition, id] : wanted) dedup_ids.push_back(id);
    auto made = prepareAttaches(*keeper, batch, dedup_ids, *locks);
    if (!made) return std::unexpected(made.error());
    const std::vector<PreparedAttach>& prepared = *made;
    // Every part's log entry, dedup id and part node, and the removal of its lock, in one multi:
    // all of the batch is attached or none of it, each part under its own dedup id as before.
    std::vector<Op> ops;
    for (const auto& one : prepared) {
      ops.push_back(op::Create{paths_.logEntryPrefix(), one.entry.format(),
                               CreateMode::kPersistentSequential});
      ops.push_back(op::Create{paths_.dedupHash(one.dedup_id), one.entry.new_part_name,
                               CreateMode::kPersistent});
      ops.push_back(op::Create{paths_.part(one.entry.new_part_name), one.entry.part_checksum,
                               CreateMode::kPersistent});
      ops.push_back(op::Remove{one.lock.path, -1});
    }
    auto committed = keeper->multi(ops);
    if (committed) {
      for (std::size_t i = 0; i < prepared.size(); ++i)
        finishAttach(prepared[i], (*committed)[4 * i].path_created, summary);
      continue;
    }
    if (committed.error().isConnectionLevel()) {
      // No answer: the whole batch was applied or none of it. Each part's lock tells, fenced as
      // an insert's unknown outcome is (removed now, it can no longer be committed).
      std::string error;
      for (const auto& one : prepared) {
        auto outcome = error.empty()
                           ? commitOutcome(*keeper, paths_, one.entry.new_part_name, one.lock.path)
                           : KeeperResult<bool>(false);
        if (outcome && *outcome) {
          finishAttach(one, std::nullopt, summary);
          continue;
        }
        std::error_code ec;
        fs::remove_all(one.dir, ec);
        if (!outcome || !error.empty()) (void)keeper->remove(one.lock.path);
        if (!outcome) {
          error = outcome.error().toString();
        } else if (error.empty()) {
          error = committed.error().toString() + " (not applied)";
        }
      }
      if (!error.empty()) {
        return std::unexpected(fmt::format("attaching {} parts: {}; attaching again finds out",
                                           prepared.size(), error));
      }
      continue;
    }
    // Not applied (a log that ran out, a lock lost, a duplicate): each part alone, whose commit
    // tells these apart.
    for (const auto& one : prepared) {
      if (auto done = commitAttach(*keeper, one, summary); !done) {
        for (const auto& rest : prepared) {
          if (&rest <= &one) continue;
          std::error_code ec;
          fs::remove_all(rest.dir, ec);
          (void)keeper->remove(rest.lock.path);
        }
        return std::unexpected(done.error());
      }
    }
  }
  wake();
  return summary;
}

Op ReplicationWorker::partNode(const PartName& name, const PartChecksums& checksums) const {
  return op::Create{paths_.part(name.format()), checksums.total.hex(), CreateMode::kPersistent};
}

std::expected<void, std::string> ReplicationWorker::registerPart(Keeper& keeper,
                                                                 const std::vector<Op>& ops,
                                                                 const PartName& name,
                                                                 const NewPart& part) {
  auto committed = keeper.multi(ops);
  if (committed) return {};
  if (!committed.error().isConnectionLevel()) {
    store_.discard(name, part);
    return std::unexpected(committed.error().toString());
  }
  // No answer: the multi is atomic, so our parts node will tell whether it was applied. Until
  // then the part stays (held, or on disk); resolveUncertainParts makes it visible or removes
  // it, and the entry, retried, then finds the part here (or fetches or merges again).
  store_.addUncertain(name, part);
  return std::unexpected(fmt::format("{} (the outcome is checked once ZooKeeper answers)",
                                     committed.error().toString()));
}

std::expected<void, std::string> ReplicationWorker::executeMerge(Keeper& keeper,
                                                                 const SelectedEntry& selected) {
  auto result = PartName::parse(selected.entry.new_part_name);
  if (!result) return std::unexpected(result.error());
  // A test may hold (or fail) the merge here, its entry executing (fail_points.h).
  if (int error = faultFor(FailPoint::kMerge, selected.entry.new_part_name)) {
    return std::unexpected(fmt::format("merging: {}", errnoText(error)));
  }
  auto sources = store_.mergeSources(*result, selected.entry.source_parts);
  if (!sources) return std::unexpected(sources.error());
  // Sources are in block order and each is sorted: a stable sort of their concatenation is the
  // k-way merge, ties in source order, so every replica gets the same bytes.
  const auto started = std::chrono::steady_clock::now();
  Block rows = spec_.schema.emptyBlock();
  for (const auto& part : *sources) {
    auto block = readDataPart(*part, spec_.schema);
    if (!block) return std::unexpected("reading merge source: " + block.error());
    rows.append(*block);
  }
  const Block sorted = rows.select(spec_.schema.sortPermutation(rows));
  NewPart part;
  part.partition = result->partition_id;
  part.dir = store_.dataDir() / result->format();
  part.rows = sorted.rows();
  part.image = store_.holdMergeResult(*result, sorted);
  if (part.image) {
    part.checksums = part.image->checksums;
  } else {
    auto written = writePart(store_.dataDir(), *result, spec_.schema, sorted);
    if (!written) return std::unexpected("writing merged part: " + written.error());
    part.checksums = std::move(*written);
  }
  std::vector<Op> ops = {partNode(*result, part.checksums)};
  for (const auto& source : *sources)
    ops.push_back(op::Remove{paths_.part(source->name.format()), -1});
  ops.push_back(op::Remove{paths_.queue() + "/" + selected.node_name, -1});
  if (auto registered = registerPart(keeper, ops, *result, part); !registered) {
    return std::unexpected("registering the merged part: " + registered.error());
  }
  uint64_t bytes = 0;
  for (const auto& file : part.checksums.files) bytes += file.size;
  publish(*result, part.checksums, part.rows, part.image);
  metrics_.merges.Increment();
  metrics_.merged_rows.Increment(static_cast<double>(part.rows));
  metrics_.merged_bytes.Increment(static_cast<double>(bytes));
  metrics_.merge_duration_seconds.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return {};
}

std::expected<void, std::string> ReplicationWorker::executeDropRange(
    Keeper& keeper, const SelectedEntry& selected) {
  auto range = PartName::parse(selected.entry.new_part_name);
  if (!range) return std::unexpected(range.error());
  const std::vector<PartName> dropped = store_.partsCoveredBy(*range);
  std::vector<Op> ops;
  for (const auto& part : dropped) ops.push_back(op::Remove{paths_.part(part.format()), -1});
  ops.push_back(op::Remove{paths_.queue() + "/" + selected.node_name, -1});
  if (auto committed = keeper.multi(ops); !committed) {
    return std::unexpected("removing dropped parts: " + committed.error().toString());
  }
  store_.retire(dropped);
  return {};
}

void ReplicationWorker::updateQueueMetrics() {
  std::lock_guard lock(queue_mu_);
  std::map<std::string, double> by_type = {
      {"get", 0}, {"merge", 0}, {"drop_range", 0}, {"attach", 0}};
  int64_t oldest = 0;
  int64_t oldest_insert = 0;
  for (const auto& queued : queue_.entries()) {
    if (queued.entry.type == LogEntry::Type::kGetPart && queued.entry.create_time > 0 &&
        (oldest_insert == 0 || queued.entry.create_time < oldest_insert)) {
      oldest_insert = queued.entry.create_time;
    }
    switch (queued.entry.type) {
      case LogEntry::Type::kGetPart:
        by_type["get"] += 1;
        break;
      case LogEntry::Type::kMergeParts:
        by_type["merge"] += 1;
        break;
      case LogEntry::Type::kDropRange:
        by_type["drop_range"] += 1;
        break;
      case LogEntry::Type::kAttachPart:
        by_type["attach"] += 1;
        break;
    }
    if (queued.entry.create_time > 0 && (oldest == 0 || queued.entry.create_time < oldest)) {
      oldest = queued.entry.create_time;
    }
  }
  for (const auto& [type, count] : by_type) metrics_.queueEntries(type).Set(count);
  for (auto action : {QueueAction::kFetch, QueueAction::kMerge, QueueAction::kDropRange}) {
    metrics_.queueExecuting(std::string(queueActionName(action)))
        .Set(static_cast<double>(queue_.executing(action)));
  }
  metrics_.queue_size.Set(static_cast<double>(queue_.size()));
  metrics_.queue_oldest_entry_age_seconds.Set(
      oldest == 0 ? 0.0 : static_cast<double>(std::max<int64_t>(0, unixNow() - oldest)));
  metrics_.replica_lost.Set(lost_ ? 1 : 0);
  metrics_.absolute_delay_seconds.Set(
      oldest_insert == 0 ? 0.0
                         : static_cast<double>(std::max<int64_t>(0, unixNow() - oldest_insert)));
  // The queue counts postponements itself; the counters follow it.
  for (auto reason : kAllPostponeReasons) {
    auto& counter = metrics_.queuePostponed(std::string(postponeReasonName(reason)));
    const double total = static_cast<double>(queue_.postponedCount(reason));
    if (total > counter.Value()) counter.Increment(total - counter.Value());
  }
}

void ReplicationWorker::updateLogMetrics(Keeper& keeper) {
  auto counter = SequentialCounter::read(keeper, paths_.log(), "log-");
  if (!counter) return;
  metrics_.log_max_index.Set(static_cast<double>(counter->maxIndex()));
  metrics_.log_counter.Set(static_cast<double>(counter->counter()));
  metrics_.log_counter_headroom_ratio.Set(counter->headroomRatio());
  counter_rate_.addSample(steadySeconds(), counter->counter());
  metrics_.log_counter_exhaustion_seconds.Set(
      counter_rate_.secondsToExhaustion(counter->createsLeft()));
}

bool ReplicationWorker::isLeader(Keeper& keeper) {
  // One replica at a time selects merges and cleans the dedup window: the holder of this
  // ephemeral node (DESIGN.md 2.4). It goes with its holder's session.
  // A read first: a refused create would still cost ZooKeeper a write transaction every round.
  const std::string node = paths_.leaderElection() + "/leader";
  auto holder = keeper.exists(node);
  if (!holder) return false;
  if (*holder) return (*holder)->ephemeral_owner == keeper.sessionId();
  return keeper.create(node, spec_.replica, CreateMode::kEphemeral).has_value();
}

void ReplicationWorker::cleanLog(Keeper& keeper) {
  auto cleaned =
      clearOldLogs(keeper, paths_, LogRetention{spec_.min_logs_to_keep, spec_.max_logs_to_keep});
  if (!cleaned) spdlog::warn("trimming the replication log: {}", cleaned.error().toString());
}

KeeperResult<std::vector<int64_t>> ReplicationWorker::lockedBlockNumbers(
    Keeper& keeper, const std::string& partition) {
  std::vector<int64_t> numbers;
  auto locks = keeper.children(paths_.blockNumbers(partition));
  if (!locks) {
    if (locks.error().code == KeeperCode::kNoNode) return numbers;
    return std::unexpected(locks.error());
  }
  for (const auto& lock : locks->names) {
    const auto dash = lock.rfind('-');
    if (dash != std::string::npos)
      numbers.push_back(std::strtoll(lock.c_str() + dash + 1, nullptr, 10));
  }
  return numbers;
}

std::expected<std::string, InsertError> ReplicationWorker::dropPartition(
    const std::string& partition) {
  if (!isValidPartitionId(partition)) {
    return std::unexpected(
        InsertError{InsertError::Kind::kBadRequest,
                    fmt::format("partition '{}' is not a partition id", partition)});
  }
  std::shared_ptr<Keeper> keeper = session_.current();
  if (!keeper) return std::unexpected(unavailable("ZooKeeper is unreachable; nothing was dropped"));
  if (auto made = createAncestorsAndSelf(*keeper, paths_.blockNumbers(partition)); !made) {
    return std::unexpected(unavailable("ZooKeeper: " + made.error().toString()));
  }
  // Our own block number bounds the range: every block below it was allocated before the drop.
  constexpr int kAttempts = 10;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    auto lock =
        keeper->create(paths_.blockLockPrefix(partition), "", CreateMode::kEphemeralSequential);
    if (!lock) return std::unexpected(unavailable("ZooKeeper: " + lock.error().toString()));
    const int64_t bound = std::strtoll(lock->c_str() + lock->rfind('-') + 1, nullptr, 10);
    auto locks = lockedBlockNumbers(*keeper, partition);
    if (!locks) {
      (void)keeper->remove(*lock);
      return std::unexpected(unavailable("ZooKeeper: " + locks.error().toString()));
    }
    if (bound == 0) {
      (void)keeper->remove(*lock);
      return std::unexpected(InsertError{InsertError::Kind::kBadRequest,
                                         fmt::format("partition '{}' has no data", partition)});
    }
    const PartName range{partition, 0, bound - 1, PartName::kMaxLevel, 0};
    LogEntry entry;
    entry.type = LogEntry::Type::kDropRange;
    entry.create_time = unixNow();
    entry.source_replica = spec_.replica;
    entry.new_part_name = range.format();
    std::vector<Op> ops = {
        op::Create{paths_.logEntryPrefix(), entry.format(), CreateMode::kPersistentSequential},
        op::Remove{*lock, -1}};
    // Inserts holding a block in the range are cancelled: their commit finds its lock gone.
    for (int64_t number : *locks) {
      if (number < bound)
        ops.push_back(
            op::Remove{fmt::format("{}{:010d}", paths_.blockLockPrefix(partition), number), -1});
    }
    auto done = keeper->multi(ops);
    if (!done) {
      (void)keeper->remove(*lock);
      // An insert committed (its lock went) between our read and the multi: look again.
      if (done.error().code == KeeperCode::kNoNode) continue;
      return std::unexpected(unavailable("ZooKeeper: " + done.error().toString()));
    }
    // The rows may come again: forget their dedup ids (ClickHouse's clearBlocksInPartition).
    auto ids = keeper->children(paths_.dedupHashes());
    if (ids) {
      for (const auto& id : ids->names) {
        if (id.starts_with(partition + "_")) (void)keeper->remove(paths_.dedupHash(id));
      }
    }
    wake();
    return range.format();
  }
  return std::unexpected(unavailable("inserts kept committing into the partition; try again"));
}

bool ReplicationWorker::syncQueue(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::shared_ptr<Keeper> keeper = session_.current();
  if (!keeper) return false;
  // Everything in the log now, pulled; then wait for those entries to leave the queue.
  if (!cloneIfLost(*keeper) || !updateQueue(*keeper)) return false;
  std::set<std::string> waiting;
  {
    std::lock_guard lock(queue_mu_);
    for (const auto& entry : queue_.entries()) waiting.insert(entry.node_name);
  }
  wake();
  std::unique_lock lock(queue_mu_);
  return queue_changed_.wait_until(lock, deadline, [&] {
    for (const auto& entry : queue_.entries()) {
      if (waiting.contains(entry.node_name)) return false;
    }
    return true;
  });
}

std::string ReplicationWorker::checkQueueInvariant() const {
  std::lock_guard queue_lock(queue_mu_);
  return queue_.checkVirtualPartsInvariant(store_.activeNames());
}

QueueState ReplicationWorker::queueState() const {
  QueueState state;
  std::lock_guard lock(queue_mu_);
  state.entries = queue_.entries();
  for (auto reason : kAllPostponeReasons) {
    state.postponed[std::string(postponeReasonName(reason))] = queue_.postponedCount(reason);
  }
  for (auto action : {QueueAction::kFetch, QueueAction::kMerge, QueueAction::kDropRange}) {
    state.executing[std::string(queueActionName(action))] = queue_.executing(action);
  }
  return state;
}

void ReplicationWorker::backgroundLoop() {
  auto last_full_round = std::chrono::steady_clock::time_point{};
  auto last_merge_assignment = std::chrono::steady_clock::time_point{};
  // The session in which this replica last found itself the leader: the leader node is
  // ephemeral, so it stays the leader as long as that session lives. 0: not the leader (ZooKeeper
  // never gives out session id 0).
  int64_t leader_session = 0;
  auto last_cleanup = clock_.now();
  std::unique_lock lock(background_mu_);
  while (!stopping_) {
    wake_requested_ = false;
    lock.unlock();
    const auto now = clock_.now();
    // Every round: an insert that finds the held parts full wakes us for an early checkpoint.
    store_.checkpointIfDue();
    if (now - last_full_round >= options_.background_period) {
      // Leader work, metrics, uncertain parts: once a period.
      last_full_round = now;
      std::shared_ptr<Keeper> keeper = session_.current();
      if (keeper) {
        publishDiskState(*keeper);
        resolveUncertainParts(*keeper);
        allocator_.releaseLostLocks(*keeper);
        allocator_.releaseIdleReserves(*keeper, options_.reserve_idle);
        updateLogMetrics(*keeper);
        if (cloneIfLost(*keeper)) {
          updateQueue(*keeper);
          leader_session = 0;
          if (isLeader(*keeper)) {
            leader_session = keeper->sessionId();
            last_merge_assignment = now;
            assignMerges(*keeper, options_.merge_min_parts);
            // ClickHouse's cleanup thread period: listing every dedup id once a second cost the
            // session (which the inserts share) more than a window a few seconds too wide.
            if (now - last_cleanup >= spec_.cleanup_period) {
              last_cleanup = now;
              (void)dedup_cleaner_.run(*keeper);
              cleanLog(*keeper);
            }
          }
        }
      }
    } else if (std::shared_ptr<Keeper> keeper = session_.current(); keeper && !lost_) {
      bool due;
      {
        std::lock_guard queue_lock(queue_mu_);
        due = now - last_pull_ >= options_.min_pull_interval;
      }
      if (due) updateQueue(*keeper);
      // Merges are assigned as parts arrive, not once a second: a stream of small inserts
      // otherwise leaves hundreds of parts for a returning replica to fetch one by one.
      if (leader_session != 0 && leader_session == keeper->sessionId() &&
          now - last_merge_assignment >= options_.merge_assignment_interval) {
        last_merge_assignment = now;
        assignMerges(*keeper, options_.merge_early_min_parts);
      }
    }
    scheduleQueue(/*inline_execution=*/false);
    updateQueueMetrics();
    lock.lock();
    // A new log entry or a finished one wakes us, but pulls stay min_pull_interval apart.
    const auto round_ends = clock_.now() + options_.background_period;
    while (!stopping_ && !wake_requested_ && clock_.now() < round_ends) {
      clock_.waitUntil(background_wake_, lock, round_ends);
    }
    if (!stopping_ && wake_requested_) {
      const auto pull_allowed = clock_.now() + options_.min_pull_interval;
      while (!stopping_ && clock_.now() < pull_allowed)
        clock_.waitUntil(background_wake_, lock, pull_allowed);
    }
  }
}

}  // namespace rtable::core
