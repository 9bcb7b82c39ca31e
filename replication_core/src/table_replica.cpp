#include "rtable/replication_core/table_replica.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <deque>
#include <set>
#include <sstream>
#include <thread>

#include "rtable/replication_core/keeper_retry.h"
#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/quorum.h"
#include "rtable/replication_core/measured_keeper.h"
#include "rtable/replication_core/merge_selector.h"
#include "rtable/replication_core/table_registration.h"
#include "posix_file.h"
#include "worker_pool.h"

namespace rtable::core {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStagingDir = "staging";
constexpr const char* kDetachedDir = "detached";
constexpr const char* kJournalDir = "journal";

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A rename is durable once the directory holding the new name is synced.
bool syncDirectory(const fs::path& dir) { return fsyncDirectory(dir).has_value(); }

std::string replicaAddress(const TableSpec& spec) {
  // ClickHouse's ReplicatedMergeTreeAddress text, so tools that read `host` find their way.
  return fmt::format("host: {}\nport: {}\ntcp_port: 0\ndatabase: default\ntable: {}\nscheme: http\n",
                     spec.replica_host, spec.http_port, spec.table);
}

InsertError unavailable(const std::string& message) {
  return InsertError{InsertError::Kind::kUnavailable, message};
}

// The block's values as they sit in memory: about what its part holds before compression.
uint64_t valueBytes(const Block& block) {
  uint64_t total = 0;
  for (const auto& column : block.columns) {
    total += column.null_map.size();
    std::visit([&](const auto& values) {
      using T = typename std::decay_t<decltype(values)>::value_type;
      if constexpr (std::is_same_v<T, std::string>) {
        for (const auto& value : values) total += value.size() + 1;
      } else {
        total += values.size() * sizeof(T);
      }
    }, column.values);
  }
  return total;
}

}  // namespace

DataPart::~DataPart() {
  // A part held in memory has no directory (a checkpoint that writes one replaces this DataPart).
  if (remove_when_unused && !image) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

std::expected<Block, std::string> readDataPart(const DataPart& part, const TableSchema& schema) {
  return part.image ? readPart(*part.image, schema, part.dir) : readPart(part.dir, schema);
}

TableReplica::TableReplica(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
                           TableReplicaOptions options)
    : spec_(std::move(spec)),
      keeper_factory_(std::move(factory)),
      options_(options),
      paths_{spec_.tableRoot(), 1, spec_.replica},
      metrics_(registry, metrics::ReplicaLabels{spec_.table, spec_.replica, 1}),
      allocator_(paths_),
      dedup_cleaner_(paths_, spec_.deduplication),
      queue_(QueueLimits{spec_.fetch_threads, spec_.merge_threads}),
      puller_(paths_) {}

std::expected<std::unique_ptr<TableReplica>, std::string> TableReplica::open(
    const TableSpec& spec, KeeperFactory keeper_factory, prometheus::Registry& registry,
    TableReplicaOptions options) {
  std::unique_ptr<TableReplica> table(
      new TableReplica(spec, std::move(keeper_factory), registry, options));
  if (auto started = table->start(); !started) return std::unexpected(started.error());
  return table;
}

TableReplica::~TableReplica() { shutdown(); }

std::expected<void, std::string> TableReplica::start() {
  std::error_code ec;
  fs::create_directories(spec_.data_dir, ec);
  if (ec) return std::unexpected(fmt::format("cannot create {}: {}", spec_.data_dir.string(), ec.message()));
  // Inserts that were still staging when the process stopped were never acknowledged.
  fs::remove_all(spec_.data_dir / kStagingDir, ec);
  auto journal = PartJournal::open(spec_.data_dir / kJournalDir);
  if (!journal) return std::unexpected(journal.error());
  journal_ = std::move(*journal);

  auto keeper_or = keeper_factory_();
  if (!keeper_or) return std::unexpected("ZooKeeper: " + keeper_or.error().toString());
  std::shared_ptr<Keeper> keeper = measureKeeper(std::move(*keeper_or), metrics_);
  if (auto table = createTableIfNotExists(*keeper, paths_, spec_.metadataText()); !table) {
    return std::unexpected("creating the table in ZooKeeper: " + table.error().toString());
  }
  if (auto replica = createReplicaIfNotExists(*keeper, paths_); !replica) {
    return std::unexpected("creating the replica in ZooKeeper: " + replica.error().toString());
  }
  auto listed = keeper->children(paths_.parts());
  if (!listed) return std::unexpected("listing this replica's parts: " + listed.error().toString());
  const std::set<std::string> in_keeper(listed->names.begin(), listed->names.end());

  // A committed part written without fsync may not have survived the crash: the journal has it.
  auto restored = journal_->restore(spec_.data_dir, spec_.schema,
                                    [&](const std::string& name) { return in_keeper.contains(name); });
  if (!restored) return std::unexpected(restored.error());
  for (const auto& name : *restored) {
    spdlog::warn("part {} did not survive the crash intact: written again from the part journal", name);
  }
  auto images = restoreFromKeeperImages(*keeper, in_keeper);
  if (!images) return std::unexpected(images.error());
  auto loaded = loadParts(spec_.data_dir, spec_.schema);
  if (!loaded) return std::unexpected(loaded.error());
  for (const auto& [name, reason] : loaded->broken) {
    broken_parts_.push_back(fmt::format("{}: {}", name, reason));
    metrics_.broken_parts.Increment();
  }
  // The parts are durable by themselves from here on; the journal starts empty, and so do the
  // part images in ZooKeeper.
  if (auto checkpointed = journal_->checkpoint(spec_.data_dir); !checkpointed) {
    return std::unexpected(checkpointed.error());
  }
  if (!images->empty()) {
    if (auto synced = syncFileSystem(spec_.data_dir); !synced) return std::unexpected(synced.error());
    {
      std::lock_guard lock(parts_mu_);
      for (const auto& name : *images) keeper_images_.emplace(name, 0);
    }
    removeKeeperImages(*keeper, *images);
  }
  last_checkpoint_ = std::chrono::steady_clock::now();

  // ZooKeeper is the truth about which parts were committed.
  ActiveDataPartSet committed;
  for (const auto& name : in_keeper) {
    if (auto part = PartName::parse(name)) (void)committed.add(*part);
  }
  std::set<std::string> local;
  for (auto& [name, checksums] : loaded->valid) {
    const std::string text = name.format();
    local.insert(text);
    const fs::path dir = spec_.data_dir / text;
    if (in_keeper.contains(text)) {
      makeVisible(name, std::move(checksums), 0);
      continue;
    }
    auto container = committed.containingPart(name);
    if (container && *container != name) {
      // A merge's source whose removal was cut short: its rows are in the merged part.
      fs::remove_all(dir, ec);
      continue;
    }
    // Written, never committed, so never acknowledged: out of the way of a retry.
    fs::create_directories(spec_.data_dir / kDetachedDir, ec);
    fs::rename(dir, spec_.data_dir / kDetachedDir / ("unexpected_" + text), ec);
    unexpected_parts_.push_back(text);
  }
  for (const auto& name : in_keeper) {
    if (local.contains(name)) continue;
    lost_parts_.push_back(name);
    // Lost here (broken and detached, or its files gone): unlist it and fetch it again from a
    // replica that has it, in one multi (ClickHouse's removePartAndEnqueueFetch).
    LogEntry get;
    get.type = LogEntry::Type::kGetPart;
    get.create_time = unixNow();
    get.new_part_name = name;
    auto requeued = keeper->multi({op::Remove{paths_.part(name), -1},
                                   op::Create{paths_.queue() + "/queue-", get.format(),
                                              CreateMode::kPersistentSequential}});
    if (requeued) {
      spdlog::warn("part {} is listed for this replica but not on disk: fetching it again", name);
    } else {
      spdlog::error("part {} is lost here and could not be queued for a fetch: {}", name,
                    requeued.error().toString());
    }
  }

  // After a kill -9 the previous process's is_active lives until its session times out.
  const auto deadline =
      std::chrono::steady_clock::now() + spec_.zookeeper_session_timeout + std::chrono::seconds(10);
  for (;;) {
    auto activated = activateReplica(*keeper, paths_, replicaAddress(spec_));
    if (activated) break;
    if (activated.error().code != KeeperCode::kNodeExists || std::chrono::steady_clock::now() > deadline) {
      return std::unexpected("activating the replica: " + activated.error().toString());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (auto lost = readLost(*keeper); !lost) {
    return std::unexpected("reading is_lost: " + lost.error().toString());
  }
  // The queue as this replica left it; the log after it is pulled by the background work.
  auto queued = loadQueue(*keeper, paths_);
  if (!queued) return std::unexpected("loading the replication queue: " + queued.error().toString());
  {
    std::lock_guard queue_lock(queue_mu_);
    for (auto& entry : *queued) queue_.insert(std::move(entry));
  }
  {
    std::lock_guard lock(keeper_mu_);
    keeper_ = keeper;
  }
  metrics_.replica_readonly.Set(0);
  updateLogMetrics(*keeper);
  if (options_.background) {
    fetch_pool_ = std::make_unique<WorkerPool>(spec_.fetch_threads);
    merge_pool_ = std::make_unique<WorkerPool>(spec_.merge_threads);
    background_ = std::thread([this] { backgroundLoop(); });
  }
  return {};
}

std::shared_ptr<Keeper> TableReplica::keeper() {
  std::lock_guard lock(keeper_mu_);
  if (keeper_ && !keeper_->expired()) return keeper_;
  auto fresh = keeper_ ? keeper_->startNewSession() : keeper_factory_();
  if (!fresh) {
    metrics_.replica_readonly.Set(1);
    return nullptr;
  }
  std::shared_ptr<Keeper> renewed = keeper_ ? std::move(*fresh) : measureKeeper(std::move(*fresh), metrics_);
  // The expired session's is_active went with it; a new one marks us live again.
  if (auto activated = activateReplica(*renewed, paths_, replicaAddress(spec_)); !activated) {
    metrics_.replica_readonly.Set(1);
    return nullptr;
  }
  // Without a session we were inactive: the leader may have marked us lost meanwhile.
  if (!readLost(*renewed)) {
    metrics_.replica_readonly.Set(1);
    return nullptr;
  }
  keeper_ = renewed;
  metrics_.replica_readonly.Set(0);
  return keeper_;
}

KeeperStatus TableReplica::readLost(Keeper& keeper) {
  // Read after activateReplica, whose multi also sets `host`: the leader marks a replica lost
  // only with a check of the host version it saw while we were inactive, so from here on is_lost
  // stays as read until we clone.
  auto lost = keeper.get(paths_.isLost());
  if (!lost) return std::unexpected(lost.error());
  lost_ = lost->data == "1";
  return {};
}

DataPartPtr TableReplica::makeDataPart(const PartName& name, PartChecksums checksums, uint64_t rows,
                                       std::shared_ptr<const PartImage> image) {
  auto part = std::make_shared<DataPart>();
  part->name = name;
  part->dir = spec_.data_dir / name.format();
  for (const auto& file : checksums.files) part->bytes += file.size;
  part->checksums = std::move(checksums);
  part->image = std::move(image);
  part->rows = rows;
  if (rows != 0 || part->image) return part;
  std::error_code ec;
  if (auto count = fs::file_size(part->dir / "count.txt", ec); !ec && count < 32) {
    std::FILE* f = std::fopen((part->dir / "count.txt").c_str(), "r");
    if (f) {
      unsigned long long counted = 0;
      if (std::fscanf(f, "%llu", &counted) == 1) part->rows = counted;
      std::fclose(f);
    }
  }
  return part;
}

void TableReplica::makeVisible(const PartName& name, PartChecksums checksums, uint64_t rows,
                               std::shared_ptr<const PartImage> image) {
  std::lock_guard queue_lock(queue_mu_);
  std::lock_guard lock(parts_mu_);
  makeVisibleLocked(name, std::move(checksums), rows, std::move(image));
  queue_.addCurrentPart(name);
}

void TableReplica::makeVisibleLocked(const PartName& name, PartChecksums checksums, uint64_t rows,
                                     std::shared_ptr<const PartImage> image) {
  if (image) {
    // A checkpoint wrote it out while the commit ran: from now on it is a part with files.
    if (auto held = held_parts_.find(name); held != held_parts_.end() && held->second.written) {
      releaseHeldLocked(held);
      image.reset();
    }
  }
  DataPartPtr part = makeDataPart(name, std::move(checksums), rows, std::move(image));
  unpublished_.erase(name);
  auto added = active_set_.add(name);
  if (!added || *added != ActiveDataPartSet::AddResult::kAdded) {
    // Merges never cover unpublished blocks, so a committed part is never covered already.
    spdlog::error("part {} could not become visible: {}", name.format(),
                  added ? "covered by an active part" : added.error());
    return;
  }
  // The parts it covers start at its partition and min block (the map's order): a single-row
  // insert looks at one or two parts, not at every active part of the table.
  const PartName first{name.partition_id, name.min_block, name.min_block, 0, 0};
  for (auto it = active_parts_.lower_bound(first);
       it != active_parts_.end() && it->first.partition_id == name.partition_id &&
       it->first.min_block <= name.max_block;) {
    if (name.contains(it->first) && it->first != name) {
      it = retirePartLocked(it);
    } else {
      ++it;
    }
  }
  active_parts_[name] = std::move(part);
  metrics_.parts.Set(static_cast<double>(active_parts_.size()));
}

std::unique_ptr<PendingInsert> TableReplica::beginInsert(InsertOptions options) {
  const fs::path staging =
      spec_.data_dir / kStagingDir / fmt::format("insert-{}", next_staging_id_.fetch_add(1));
  return std::make_unique<PendingInsert>(*this, std::move(options), staging);
}

std::expected<InsertResult, InsertError> TableReplica::commit(PendingInsert& insert) {
  if (auto flushed = insert.flushAll(); !flushed) {
    metrics_.insert_errors.Increment();
    return std::unexpected(InsertError{InsertError::Kind::kInternal, flushed.error()});
  }
  InsertResult result;
  auto& parts = insert.parts_;
  result.blocks = parts.size();
  std::size_t quorum = insert.options_.quorum >= 2 ? insert.options_.quorum : 0;
  const auto quorum_deadline = std::chrono::steady_clock::now() + insert.options_.quorum_timeout;
  if (quorum > 0 || insert.options_.quorum_auto) {
    // ClickHouse's checkQuorumPrecondition: a quorum that cannot be reached now is refused before
    // anything is written.
    std::shared_ptr<Keeper> keeper = this->keeper();
    if (!keeper) {
      metrics_.insert_errors.Increment();
      return std::unexpected(unavailable("ZooKeeper is unreachable; nothing was written"));
    }
    auto count = countReplicas(*keeper, paths_);
    auto parent = createAncestorsAndSelf(*keeper, paths_.quorumParallel());
    if (!count || !parent) {
      metrics_.insert_errors.Increment();
      return std::unexpected(unavailable("ZooKeeper: " + (!count ? count.error() : parent.error()).toString()));
    }
    if (insert.options_.quorum_auto) {
      quorum = majorityQuorum(count->total);
      if (quorum < 2) quorum = 0;  // a single replica: this one is the majority
    }
    if (count->active() < quorum) {
      metrics_.insert_errors.Increment();
      return std::unexpected(InsertError{
          InsertError::Kind::kTooFewReplicas,
          fmt::format("Number of alive replicas ({}) is less than requested quorum ({}{}); nothing "
                      "was written", count->active(), quorum,
                      insert.options_.quorum_auto ? fmt::format(", a majority of {} replicas", count->total) : "")});
    }
  }
  // Parts are written while ZooKeeper allocates their block numbers (they do not depend on each
  // other), several at a time; the commits stay in order.
  constexpr std::size_t kParallelWrites = 4;
  std::vector<PartWrite> writes(parts.size());
  auto startWrite = [&](std::size_t i) {
    if (i >= parts.size() || !parts[i].unwritten) return;
    // Small: commitOne encodes it in memory, in microseconds.
    if (valueBytes(*parts[i].unwritten) <= options_.journal_part_bytes && mayHoldMore()) return;
    writes[i] = std::async(std::launch::async, [this, &part = parts[i]]() -> std::expected<PartChecksums, std::string> {
      auto written = writeStagedPart(part.dir, spec_.schema, *part.unwritten, PartSync::kLater);
      if (!written) return written;
      uint64_t bytes = 0;
      for (const auto& file : written->files) bytes += file.size;
      if (bytes <= options_.journal_part_bytes) {
        part.synced = false;  // the journal makes it durable once it has its name
        return written;
      }
      // Too big for the journal: synced here, while ZooKeeper allocates the block number.
      if (auto synced = syncPartFiles(part.dir, *written); !synced) return std::unexpected(synced.error());
      return written;
    });
  };
  for (std::size_t i = 0; i < kParallelWrites; ++i) startWrite(i);
  // Whatever happens, no write may outlive this call (it writes into the insert's staging).
  struct JoinWrites {
    std::vector<PartWrite>& writes;
    ~JoinWrites() {
      for (auto& w : writes) {
        if (w.valid()) w.wait();
      }
    }
  } join{writes};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    startWrite(i + kParallelWrites);
    std::shared_ptr<Keeper> keeper = this->keeper();
    if (!keeper) {
      metrics_.insert_errors.Increment();
      return std::unexpected(unavailable(fmt::format(
          "ZooKeeper is unreachable; {} of {} blocks were committed, retrying the same insert is "
          "safe", i, parts.size())));
    }
    if (lost_) {
      // A part committed now could be detached by the clone (the source does not have it) and
      // be lost with its acknowledged rows.
      metrics_.insert_errors.Increment();
      return std::unexpected(unavailable(fmt::format(
          "this replica is lost (it was away while the log moved on) and is being restored from "
          "a live replica; {} of {} blocks were committed, retrying the same insert is safe",
          i, parts.size())));
    }
    // Reserving the next block number pays off for a stream of one-part inserts.
    auto part = commitOne(*keeper, parts[i], writes[i], result, quorum, /*reserve=*/parts.size() == 1);
    if (!part) {
      metrics_.insert_errors.Increment();
      InsertError error = part.error();
      error.message += fmt::format(" ({} of {} blocks were committed before; retrying the same "
                                   "insert is safe)", i, parts.size());
      return std::unexpected(error);
    }
    result.parts.push_back(*part);
  }
  if (quorum > 0) {
    for (const auto& part : result.parts) {
      std::shared_ptr<Keeper> keeper = this->keeper();
      auto reached = keeper ? waitForQuorum(*keeper, paths_, part, quorum_deadline)
                            : KeeperResult<bool>(std::unexpected(KeeperError{KeeperCode::kConnectionLoss, "", "no session", {}}));
      if (!reached || !*reached) {
        metrics_.insert_errors.Increment();
        return std::unexpected(InsertError{
            InsertError::Kind::kQuorumTimeout,
            fmt::format("the insert is committed on this replica, but part {} did not reach {} "
                        "replicas within {} ms{}; it may still become visible on the others, and "
                        "retrying the same insert is safe (it is deduplicated)",
                        part, quorum, insert.options_.quorum_timeout.count(),
                        reached ? "" : " (ZooKeeper: " + reached.error().toString() + ")")});
      }
    }
  }
  metrics_.inserts.Increment();
  metrics_.inserted_rows.Increment(static_cast<double>(result.rows));
  metrics_.insert_deduplicated_blocks.Increment(static_cast<double>(result.deduplicated_blocks));
  return result;
}

std::expected<std::string, InsertError> TableReplica::commitOne(Keeper& keeper,
                                                                PendingPartFile& pending,
                                                                PartWrite& writing,
                                                                InsertResult& result,
                                                                std::size_t quorum, bool reserve) {
  std::error_code ec;
  if (pending.unwritten && !writing.valid()) {
    // Small: encoded in memory, where it stays until a checkpoint or a merge (makeDurable).
    auto image = encodePart(spec_.schema, *pending.unwritten);
    pending.unwritten.reset();
    if (!image) return std::unexpected(InsertError{InsertError::Kind::kInternal, "encoding the part: " + image.error()});
    pending.checksums = image->checksums;
    pending.synced = false;
    pending.image = std::make_shared<const PartImage>(std::move(*image));
  }
  std::optional<BlockNumberLock> reserved;
  if (reserve) reserved = allocator_.takeReserved(keeper.sessionId(), pending.partition);
  auto allocation = reserved ? KeeperResult<Allocation>(Allocation{*reserved})
                             : allocator_.allocate(keeper, pending.partition, pending.dedup_id);
  if (writing.valid()) {
    auto written = writing.get();
    pending.unwritten.reset();
    if (!written) {
      if (allocation && std::holds_alternative<BlockNumberLock>(*allocation)) {
        (void)keeper.remove(std::get<BlockNumberLock>(*allocation).path);
      }
      return std::unexpected(InsertError{InsertError::Kind::kInternal, "writing the part: " + written.error()});
    }
    pending.checksums = std::move(*written);
  }
  if (!allocation) {
    if (allocation.error().isConnectionLevel()) {
      return std::unexpected(unavailable("ZooKeeper: " + allocation.error().toString()));
    }
    return std::unexpected(InsertError{InsertError::Kind::kInternal,
                                       "allocating a block number: " + allocation.error().toString()});
  }
  if (auto* duplicate = std::get_if<Duplicate>(&*allocation)) {
    ++result.deduplicated_blocks;
    fs::remove_all(pending.dir, ec);
    // Possibly a duplicate of a part whose commit we could not confirm: it was committed after
    // all, and must become visible before we answer.
    resolveUncertainParts(keeper);
    return duplicate->existing_part;
  }
  const auto& lock = std::get<BlockNumberLock>(*allocation);
  const PartName name{pending.partition, lock.block_number, lock.block_number, 0, 0};
  {
    // Recorded before the commit can remove the lock: a merge always sees one or the other.
    std::lock_guard parts_lock(parts_mu_);
    unpublished_.insert(name);
    // Held before its journal record exists: a checkpoint that covers the record writes it out.
    if (pending.image) holdPartLocked(name, pending.image);
  }
  // Every way out below either makes the part visible or gives the block up.
  struct Unpublish {
    TableReplica& table;
    const PartName& name;
    ~Unpublish() {
      std::lock_guard parts_lock(table.parts_mu_);
      table.unpublished_.erase(name);
    }
  } unpublish{*this, name};
  const fs::path final_dir = spec_.data_dir / name.format();
  // Every way out below that gives the block up removes what a checkpoint may have written of a
  // held part, and forgets it.
  auto discard = [&] {
    if (pending.image) forgetHeldPart(name);
    fs::remove_all(final_dir, ec);
  };
  if (!pending.image) fs::rename(pending.dir, final_dir, ec);
  if (ec) {
    (void)keeper.remove(lock.path);
    return std::unexpected(InsertError{InsertError::Kind::kInternal,
                                       fmt::format("cannot move part to {}: {}", final_dir.string(), ec.message())});
  }
  // Durable before the commit, or by it: once committed, a retry of this insert is deduplicated.
  const std::optional<std::string> image_record = pending.image ? keeperImageFor(name, *pending.image) : std::nullopt;
  if (!image_record) {
    if (auto durable = makeDurable(name, pending); !durable) {
      discard();
      (void)keeper.remove(lock.path);
      return std::unexpected(InsertError{InsertError::Kind::kInternal, "making the part durable: " + durable.error()});
    }
  }
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.create_time = unixNow();
  entry.source_replica = spec_.replica;
  entry.block_id = pending.dedup_id;
  entry.new_part_name = name.format();
  entry.quorum = static_cast<int>(quorum);
  const std::optional<std::string> reserve_data =
      reserve ? allocator_.startReserving(pending.partition) : std::nullopt;
  auto committed = commitPart(keeper, paths_, entry, lock, reserve_data, image_record);
  if (image_record && (committed || committed.error().failure == CommitFailure::kUnknownOutcome)) {
    noteKeeperImage(name, image_record->size());
  }
  if (reserve_data) {
    allocator_.finishReserving(keeper.sessionId(), pending.partition, *reserve_data,
                               committed ? committed->reserve_path : std::nullopt,
                               !committed && committed.error().failure == CommitFailure::kUnknownOutcome);
  }
  if (committed) {
    puller_.remember(committed->log_entry_path, entry.format());
    makeVisible(name, *pending.checksums, pending.rows, pending.image);
    result.rows += pending.rows;
    return name.format();
  }
  const CommitError& error = committed.error();
  switch (error.failure) {
    case CommitFailure::kDuplicate:
      discard();
      (void)keeper.remove(lock.path);
      ++result.deduplicated_blocks;
      // As for a duplicate found by the allocation (a reserved number skips that check).
      resolveUncertainParts(keeper);
      return error.duplicate ? error.duplicate->existing_part : std::string("(deduplicated)");
    case CommitFailure::kLogExhausted:
      discard();
      (void)keeper.remove(lock.path);
      return std::unexpected(InsertError{
          InsertError::Kind::kLogExhausted,
          fmt::format("the table's replication log counter is exhausted ({} exists: ZooKeeper's "
                      "int32 sequential counter reached 2147483647); inserts cannot succeed until "
                      "the table moves to a new generation",
                      paths_.log() + "/log-2147483647")});
    case CommitFailure::kLockLost:
      if (reserved) {
        // A drop of the partition removed the reserved lock with the in-flight ones: the block
        // comes after the drop, so it takes a number of its own.
        if (pending.image) {
          forgetHeldPart(name);
        } else {
          fs::rename(final_dir, pending.dir, ec);
        }
        if (!ec) return commitOne(keeper, pending, writing, result, quorum, /*reserve=*/false);
      }
      discard();
      return std::unexpected(unavailable("the ZooKeeper session ended during the commit; the block was not committed"));
    case CommitFailure::kRejected:
      discard();
      (void)keeper.remove(lock.path);
      return std::unexpected(InsertError{InsertError::Kind::kInternal, "commit: " + error.cause.toString()});
    case CommitFailure::kUnknownOutcome:
      break;
  }
  // No answer to the commit: ZooKeeper's multi is atomic, so the part node tells.
  auto asked = retryOnConnectionErrors(RetryPolicy{std::chrono::milliseconds(100), std::chrono::seconds(2), 8}, [&] {
    std::shared_ptr<Keeper> current = this->keeper();
    if (!current) return KeeperResult<bool>(std::unexpected(KeeperError{KeeperCode::kConnectionLoss, "", "", {}}));
    return partIsCommitted(*current, paths_, name.format());
  });
  if (asked && *asked) {
    makeVisible(name, *pending.checksums, pending.rows, pending.image);
    result.rows += pending.rows;
    return name.format();
  }
  if (asked) {
    discard();
    // The session may have lived through the lost connection, and its lock with it: that would
    // keep merges off this block until the session ends. Removing it also fences the commit, in
    // case the server still has it.
    if (std::shared_ptr<Keeper> current = this->keeper()) (void)current->remove(lock.path);
    return std::unexpected(unavailable("ZooKeeper connection lost during the commit; the block was not committed"));
  }
  {
    std::lock_guard lock_parts(parts_mu_);
    PendingPartFile uncertain{pending.partition, pending.dedup_id, final_dir, pending.rows, std::nullopt, pending.checksums};
    uncertain.image = pending.image;  // still held: a checkpoint writes it to final_dir
    uncertain_parts_[name] = std::move(uncertain);
  }
  return std::unexpected(InsertError{
      InsertError::Kind::kUnknownOutcome,
      fmt::format("ZooKeeper did not answer the commit of {}; it may or may not be visible later",
                  name.format())});
}

std::expected<void, std::string> TableReplica::makeDurable(const PartName& name, PendingPartFile& pending) {
  const fs::path dir = spec_.data_dir / name.format();
  if (pending.synced) return fsyncDirectory(spec_.data_dir);
  // A part on disk was renamed first: the checkpoint that drops its record syncs the rename too.
  auto journaled = pending.image ? journal_->append(name.format(), *pending.image)
                                 : journal_->append(name.format(), dir, *pending.checksums);
  if (journaled) return {};
  spdlog::warn("part journal: {}; syncing part {} itself", journaled.error(), name.format());
  if (pending.image) {
    // Out of held_parts_ first, so that no checkpoint writes it any more; one may have already.
    bool written = false;
    {
      std::lock_guard lock(parts_mu_);
      if (auto held = held_parts_.find(name); held != held_parts_.end()) {
        written = held->second.written;
        releaseHeldLocked(held);
      }
    }
    auto synced = written ? syncPartFiles(dir, *pending.checksums) : writePartImage(dir, pending.image->files, PartSync::kNow);
    if (!synced) return synced;
    pending.image.reset();  // a part with files from here on
  } else if (auto synced = syncPartFiles(dir, *pending.checksums); !synced) {
    return synced;
  }
  return fsyncDirectory(spec_.data_dir);
}

void TableReplica::checkpointJournalIfDue() {
  const auto now = std::chrono::steady_clock::now();
  const bool requested = checkpoint_requested_.exchange(false);
  bool images;
  {
    std::lock_guard lock(parts_mu_);
    images = !keeper_images_.empty();
  }
  if ((journal_->pendingBytes() > 0 || images) &&
      (requested || now - last_checkpoint_ >= options_.journal_checkpoint_interval)) {
    last_checkpoint_ = now;
    if (auto done = checkpointJournal(); !done) {
      spdlog::warn("{}", done.error());
      metrics_.part_journal_checkpoint_failures.Increment();
    }
  }
  metrics_.part_journal_bytes.Set(static_cast<double>(journal_->pendingBytes()));
  std::lock_guard lock(parts_mu_);
  metrics_.parts_in_memory.Set(static_cast<double>(held_parts_.size()));
  metrics_.parts_in_memory_bytes.Set(static_cast<double>(held_bytes_));
  metrics_.part_images_in_keeper.Set(static_cast<double>(keeper_images_.size()));
  metrics_.part_images_in_keeper_bytes.Set(static_cast<double>(keeper_image_bytes_));
}

std::expected<void, std::string> TableReplica::checkpointJournal() {
  // Every record the rotation covers belongs to a part in held_parts_ by then (held before its
  // append), or to one on disk, or to one that left the table: written out, all are durable after
  // the syncfs without those records.
  PartJournal::Rotation rotation = journal_->rotate();
  // The same holds for the parts whose images are in ZooKeeper by now.
  std::vector<PartName> images;
  {
    std::lock_guard lock(parts_mu_);
    for (const auto& [name, bytes] : keeper_images_) images.push_back(name);
  }
  if (rotation.covered.empty() && images.empty()) return {};
  if (auto written = writeHeldParts(); !written) {
    journal_->cancelCheckpoint(std::move(rotation));
    return std::unexpected("part journal checkpoint: " + written.error());
  }
  if (!rotation.covered.empty()) {
    if (auto finished = journal_->finishCheckpoint(std::move(rotation), spec_.data_dir); !finished) return finished;
  } else if (auto synced = syncFileSystem(spec_.data_dir); !synced) {
    return std::unexpected("part journal checkpoint: " + synced.error());
  }
  if (images.empty()) return {};
  std::shared_ptr<Keeper> keeper = this->keeper();
  if (keeper) removeKeeperImages(*keeper, images);  // without a session, the next checkpoint does
  return {};
}

std::expected<void, std::string> TableReplica::writeHeldParts() {
  std::vector<std::pair<PartName, std::shared_ptr<const PartImage>>> todo;
  {
    std::lock_guard lock(parts_mu_);
    for (const auto& [name, held] : held_parts_) {
      if (!held.written) todo.emplace_back(name, held.image);
    }
  }
  std::error_code ec;
  fs::create_directories(spec_.data_dir / kStagingDir, ec);
  for (const auto& [name, image] : todo) {
    // Written aside, then renamed under parts_mu_ only if still held: a part that left meanwhile
    // (merged, dropped, its commit refused) must not come back as a directory.
    const fs::path tmp = spec_.data_dir / kStagingDir / ("held-" + name.format());
    const fs::path final_dir = spec_.data_dir / name.format();
    fs::remove_all(tmp, ec);
    if (auto written = writePartImage(tmp, image->files, PartSync::kLater); !written) return written;
    bool keep = false;
    {
      std::lock_guard lock(parts_mu_);
      auto held = held_parts_.find(name);
      if (held != held_parts_.end() && !held->second.written) {
        fs::rename(tmp, final_dir, ec);
        if (ec) return std::unexpected(fmt::format("cannot move {} to {}: {}", tmp.string(), final_dir.string(), ec.message()));
        keep = true;
        held->second.written = true;
        if (auto active = active_parts_.find(name); active != active_parts_.end() && active->second->image) {
          // Visible already: a DataPart with files replaces the one in memory (readers of that
          // one keep its image), and the part is no longer held.
          active->second = makeDataPart(name, active->second->checksums, active->second->rows);
          releaseHeldLocked(held);
        }
      }
    }
    if (!keep) fs::remove_all(tmp, ec);
  }
  return {};
}

void TableReplica::forgetHeldPart(const PartName& name) {
  std::lock_guard lock(parts_mu_);
  auto held = held_parts_.find(name);
  if (held == held_parts_.end()) return;
  if (held->second.written) {
    std::error_code ec;
    fs::remove_all(spec_.data_dir / name.format(), ec);
  }
  releaseHeldLocked(held);
}

void TableReplica::holdPartLocked(const PartName& name, std::shared_ptr<const PartImage> image) {
  uint64_t bytes = 0;
  for (const auto& file : image->files) bytes += file.bytes.size();
  auto [it, added] = held_parts_.try_emplace(name);
  if (!added) held_bytes_ -= it->second.bytes;
  it->second = HeldPart{std::move(image), false, bytes};
  held_bytes_ += bytes;
}

void TableReplica::releaseHeldLocked(std::map<PartName, HeldPart>::iterator it) {
  held_bytes_ -= it->second.bytes;
  held_parts_.erase(it);
}

void TableReplica::releaseHeldLocked(const PartName& name) {
  if (auto it = held_parts_.find(name); it != held_parts_.end()) releaseHeldLocked(it);
}

bool TableReplica::mayHoldMore() {
  {
    std::lock_guard lock(parts_mu_);
    if (held_bytes_ < options_.held_parts_max_bytes) return true;
  }
  requestCheckpoint();
  return false;
}

void TableReplica::requestCheckpoint() {
  if (checkpoint_requested_.exchange(true)) return;
  {
    std::lock_guard lock(background_mu_);
    wake_requested_ = true;
  }
  background_wake_.notify_all();
}

std::optional<std::string> TableReplica::keeperImageFor(const PartName& name, const PartImage& image) {
  if (options_.keeper_part_image_bytes == 0) return std::nullopt;
  // The files first: a part of up to journal_part_bytes is not encoded only to be refused.
  uint64_t bytes = 0;
  for (const auto& file : image.files) bytes += file.bytes.size();
  if (bytes > options_.keeper_part_image_bytes) return std::nullopt;
  {
    std::lock_guard lock(parts_mu_);
    if (keeper_image_bytes_ + bytes > options_.keeper_part_images_max_bytes) {
      requestCheckpoint();
      return std::nullopt;
    }
  }
  std::string record = encodeJournalRecord(name.format(), image.files);
  if (record.size() > options_.keeper_part_image_bytes) return std::nullopt;
  return record;
}

void TableReplica::noteKeeperImage(const PartName& name, uint64_t bytes) {
  // After the part's hold: the checkpoint that removes the image writes the part out first.
  std::lock_guard lock(parts_mu_);
  if (keeper_images_.emplace(name, bytes).second) keeper_image_bytes_ += bytes;
}

void TableReplica::removeKeeperImages(Keeper& keeper, const std::vector<PartName>& names) {
  // A multi per batch; one of them gone already (an unanswered commit that was not applied, a
  // removal whose answer was lost) fails the batch, which is then removed node by node.
  constexpr std::size_t kBatch = 100;
  for (std::size_t first = 0; first < names.size(); first += kBatch) {
    const std::size_t last = std::min(names.size(), first + kBatch);
    std::vector<Op> ops;
    for (std::size_t i = first; i < last; ++i) ops.push_back(op::Remove{paths_.partImage(names[i].format()), -1});
    std::vector<PartName> removed;
    auto batch = keeper.multi(ops);
    if (batch) {
      removed.assign(names.begin() + static_cast<std::ptrdiff_t>(first), names.begin() + static_cast<std::ptrdiff_t>(last));
    } else if (batch.error().isConnectionLevel()) {
      spdlog::warn("removing part images from ZooKeeper: {}; the next checkpoint tries again", batch.error().toString());
      return;
    } else {
      for (std::size_t i = first; i < last; ++i) {
        auto one = keeper.remove(paths_.partImage(names[i].format()));
        if (one || one.error().code == KeeperCode::kNoNode) {
          removed.push_back(names[i]);
        } else {
          spdlog::warn("removing the image of part {} from ZooKeeper: {}", names[i].format(), one.error().toString());
        }
      }
    }
    std::lock_guard lock(parts_mu_);
    for (const auto& name : removed) {
      if (auto it = keeper_images_.find(name); it != keeper_images_.end()) {
        keeper_image_bytes_ -= it->second;
        keeper_images_.erase(it);
      }
    }
  }
}

std::expected<std::vector<PartName>, std::string> TableReplica::restoreFromKeeperImages(
    Keeper& keeper, const std::set<std::string>& in_keeper) {
  auto listed = keeper.children(paths_.partImages());
  if (!listed && listed.error().code == KeeperCode::kNoNode) {
    // A replica registered before part images existed.
    auto made = keeper.create(paths_.partImages(), "", CreateMode::kPersistent);
    if (!made && made.error().code != KeeperCode::kNodeExists) {
      return std::unexpected("creating " + paths_.partImages() + ": " + made.error().toString());
    }
    return std::vector<PartName>{};
  }
  if (!listed) return std::unexpected("listing this replica's part images: " + listed.error().toString());
  std::vector<PartName> images;
  std::vector<std::string> wanted_paths;
  for (const auto& name : listed->names) {
    auto part = PartName::parse(name);
    if (!part) {
      spdlog::warn("{} in {} is not a part name; left alone", name, paths_.partImages());
      continue;
    }
    images.push_back(*part);
    // Only committed parts: an image of a part ZooKeeper does not list went with a merge or a drop.
    if (in_keeper.contains(name)) wanted_paths.push_back(paths_.partImage(name));
  }
  std::vector<JournaledPart> parts;
  auto read = keeper.getMany(wanted_paths);
  for (std::size_t i = 0; i < read.size(); ++i) {
    if (!read[i]) return std::unexpected("reading " + wanted_paths[i] + ": " + read[i].error().toString());
    DecodedJournal decoded = decodeJournal(read[i]->data);
    const std::string name = wanted_paths[i].substr(paths_.partImages().size() + 1);
    if (decoded.parts.size() != 1 || decoded.parts[0].name != name || !decoded.damage.empty()) {
      // Its part is then lost here, and fetched again like any other lost part.
      spdlog::error("the image of part {} in ZooKeeper is damaged ({}); not restored from it", name,
                    decoded.damage.empty() ? "not one record of that part" : decoded.damage);
      continue;
    }
    parts.push_back(std::move(decoded.parts[0]));
  }
  auto restored = restoreParts(spec_.data_dir, spec_.schema, parts,
                               [&](const std::string& name) { return in_keeper.contains(name); },
                               "its image in ZooKeeper");
  if (!restored) return std::unexpected(restored.error());
  for (const auto& name : *restored) {
    spdlog::warn("part {} was committed but not yet written out: written from its image in ZooKeeper", name);
  }
  return images;
}

std::map<PartName, DataPartPtr>::iterator TableReplica::retirePartLocked(
    std::map<PartName, DataPartPtr>::iterator it) {
  it->second->remove_when_unused = true;
  releaseHeldLocked(it->first);  // a merged or dropped part needs no writing out
  return active_parts_.erase(it);
}

void TableReplica::resolveUncertainParts(Keeper& keeper) {
  std::map<PartName, PendingPartFile> uncertain;
  {
    std::lock_guard lock(parts_mu_);
    uncertain.swap(uncertain_parts_);
  }
  for (auto& [name, pending] : uncertain) {
    auto committed = partIsCommitted(keeper, paths_, name.format());
    if (!committed) {
      std::lock_guard lock(parts_mu_);
      uncertain_parts_.emplace(name, pending);
      continue;
    }
    if (*committed) {
      makeVisible(name, *pending.checksums, pending.rows, pending.image);
    } else {
      if (pending.image) forgetHeldPart(name);
      std::error_code ec;
      fs::remove_all(pending.dir, ec);
    }
  }
}

std::vector<DataPartPtr> TableReplica::activeParts() const {
  std::lock_guard lock(parts_mu_);
  std::vector<DataPartPtr> parts;
  parts.reserve(active_parts_.size());
  for (const auto& [name, part] : active_parts_) parts.push_back(part);
  return parts;
}

uint64_t TableReplica::rowCount() const {
  std::lock_guard lock(parts_mu_);
  uint64_t rows = 0;
  for (const auto& [name, part] : active_parts_) rows += part->rows;
  return rows;
}

ReplicaState TableReplica::state() {
  ReplicaState state;
  state.table = spec_.table;
  state.replica = spec_.replica;
  state.generation = paths_.generation;
  {
    std::lock_guard lock(parts_mu_);
    state.active_parts = active_parts_.size();
    for (const auto& [name, part] : active_parts_) state.rows += part->rows;
    state.broken_parts = broken_parts_;
    state.unexpected_parts = unexpected_parts_;
    state.lost_parts = lost_parts_;
    for (const auto& [name, pending] : uncertain_parts_) state.uncertain_parts.push_back(name.format());
  }
  {
    std::lock_guard lock(queue_mu_);
    state.queue = queue_.entries();
    for (auto reason : kAllPostponeReasons) {
      state.postponed[std::string(postponeReasonName(reason))] = queue_.postponedCount(reason);
    }
  }
  state.lost = lost_;
  std::shared_ptr<Keeper> keeper = this->keeper();
  state.readonly = keeper == nullptr;
  if (keeper) {
    if (auto counter = SequentialCounter::read(*keeper, paths_.log(), "log-")) state.log = *counter;
  }
  return state;
}

void TableReplica::updateLogMetrics(Keeper& keeper) {
  auto counter = SequentialCounter::read(keeper, paths_.log(), "log-");
  if (!counter) return;
  metrics_.log_max_index.Set(static_cast<double>(counter->maxIndex()));
  metrics_.log_counter.Set(static_cast<double>(counter->counter()));
  metrics_.log_counter_headroom_ratio.Set(counter->headroomRatio());
  counter_rate_.addSample(steadySeconds(), counter->counter());
  metrics_.log_counter_exhaustion_seconds.Set(counter_rate_.secondsToExhaustion(counter->createsLeft()));
}

bool TableReplica::isLeader(Keeper& keeper) {
  // One replica at a time selects merges and cleans the dedup window: the holder of this
  // ephemeral node (DESIGN.md 2.4). It goes with its holder's session.
  // A read first: a refused create would still cost ZooKeeper a write transaction every round.
  const std::string node = paths_.leaderElection() + "/leader";
  auto holder = keeper.exists(node);
  if (!holder) return false;
  if (*holder) return (*holder)->ephemeral_owner == keeper.sessionId();
  return keeper.create(node, spec_.replica, CreateMode::kEphemeral).has_value();
}

std::size_t TableReplica::runBackgroundRoundForTest() {
  checkpointJournalIfDue();
  std::shared_ptr<Keeper> keeper = this->keeper();
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

bool TableReplica::cloneIfLost(Keeper& keeper) {
  auto lost = keeper.get(paths_.isLost());
  if (!lost) return false;
  if (lost->data != "1") {
    lost_ = false;
    return true;
  }
  lost_ = true;
  auto source = chooseCloneSource(keeper, paths_);
  if (!source || !*source) {
    spdlog::warn("replica {} is lost (or new on a table with history) and no live replica can be "
                 "cloned yet", spec_.replica);
    return false;
  }
  std::lock_guard pull_lock(pull_mu_);  // no pull in between: the clone replaces the queue
  std::lock_guard lock(queue_mu_);
  auto cloned = cloneReplica(keeper, paths_, **source);
  if (!cloned) {
    spdlog::warn("cloning replica {}: {}", **source, cloned.error().toString());
    return false;
  }
  // Local parts the table no longer has anywhere (dropped while we were away) go to detached/.
  std::vector<PartName> strays;
  {
    std::lock_guard parts_lock(parts_mu_);
    for (const auto& [name, part] : active_parts_) {
      if (!cloned->source_parts.containingPart(name)) strays.push_back(name);
    }
  }
  for (const auto& name : strays) {
    if (auto removed = keeper.remove(paths_.part(name.format()));
        !removed && removed.error().code != KeeperCode::kNoNode) {
      spdlog::warn("cloning: cannot unregister stray part {}: {}", name.format(),
                   removed.error().toString());
      return false;
    }
    std::lock_guard parts_lock(parts_mu_);
    active_set_.remove(name);
    std::shared_ptr<const PartImage> image;
    if (auto it = active_parts_.find(name); it != active_parts_.end()) {
      image = it->second->image;
      active_parts_.erase(it);
    }
    releaseHeldLocked(name);
    std::error_code ec;
    fs::create_directories(spec_.data_dir / kDetachedDir, ec);
    const fs::path detached = spec_.data_dir / kDetachedDir / ("clone_" + name.format());
    if (image) {
      // Held in memory: its rows are kept on disk like any other detached part's.
      if (auto written = writePartImage(detached, image->files, PartSync::kNow); !written) spdlog::warn("cloning: {}", written.error());
    } else {
      fs::rename(spec_.data_dir / name.format(), detached, ec);
    }
    spdlog::info("cloning: part {} is not in {}'s table any more: detached as clone_{}",
                 name.format(), **source, name.format());
  }
  // The old queue was replaced in ZooKeeper; so is the one in memory.
  ReplicationQueue fresh(QueueLimits{spec_.fetch_threads, spec_.merge_threads});
  {
    std::lock_guard parts_lock(parts_mu_);
    for (const auto& [name, part] : active_parts_) fresh.addCurrentPart(name);
    metrics_.parts.Set(static_cast<double>(active_parts_.size()));
  }
  const std::size_t entries = cloned->entries.size();
  for (auto& entry : cloned->entries) fresh.insert(std::move(entry));
  queue_ = std::move(fresh);
  spdlog::info("replica {} cloned {} ({} queue entries)", spec_.replica, **source, entries);
  lost_ = false;
  return true;
}

bool TableReplica::updateQueue(Keeper& keeper) {
  // One pull at a time, and every pull's entries are in the queue when this returns. queue_mu_ is
  // not held across the pull's ZooKeeper round trips: an insert's makeVisible would wait them out
  // (measured: 120-190 us added to every single-row insert, on average).
  std::lock_guard pull_lock(pull_mu_);
  std::unique_lock lock(queue_mu_);
  last_pull_ = std::chrono::steady_clock::now();
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
  const auto local = localPartLookup();
  auto pulled = puller_.pull(
      keeper,
      [&](const LogEntry& entry) {
        // Our own inserts (and anything else already here) need no work.
        auto part = PartName::parse(entry.new_part_name);
        if (entry.type != LogEntry::Type::kGetPart || !part) return false;
        auto here = local(*part);
        return here && *here == *part;
      },
      [this](const WatchEvent&) {
        {
          std::lock_guard wake_lock(background_mu_);
          wake_requested_ = true;
        }
        background_wake_.notify_all();
      });
  lock.lock();
  if (!pulled) {
    spdlog::warn("pulling the replication log: {}", pulled.error().toString());
    queue_needs_sync_ = true;
    return false;
  }
  for (auto& entry : *pulled) queue_.insert(std::move(entry));
  return true;
}

ReplicationQueue::LocalPartLookup TableReplica::localPartLookup() const {
  // A snapshot: blocks this replica is committing count as here (their entries need no fetch
  // from anyone else). Uncertain parts do not: until ZooKeeper says they were registered, their
  // entries must stay in the queue.
  auto set = std::make_shared<ActiveDataPartSet>();
  {
    std::lock_guard lock(parts_mu_);
    *set = active_set_;
    for (const auto& name : unpublished_) (void)set->add(name);
  }
  return [set](const PartName& part) { return set->containingPart(part); };
}

std::size_t TableReplica::assignMerges(Keeper& keeper, std::size_t min_parts) {
  // Block locks first, then the log: a block number inside a chosen range is then either locked
  // (an insert in flight: the range is skipped) or its entry has been pulled (its part is a
  // virtual part here), because a commit removes the lock and creates the entry in one multi and
  // later allocations get higher numbers.
  std::map<std::string, std::vector<int64_t>> locks;
  {
    // Only partitions with enough parts to merge: between full rounds this runs on every wake,
    // and then mostly ends here without asking ZooKeeper anything.
    std::set<std::string> partitions;
    {
      std::lock_guard lock(queue_mu_);
      std::map<std::string, std::size_t> counts;
      for (const auto& part : queue_.virtualParts().parts()) {
        if (!part.isFakeDropRange() &&
            ++counts[part.partition_id] == std::max(min_parts, options_.merge_min_parts)) {
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
    std::lock_guard parts_lock(parts_mu_);
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
      // Several disjoint merges per round, so merges keep up with a stream of small inserts.
      std::set<PartName> taken;
      // A part can be merged when it is here and nothing in the queue will change it.
      auto mergeable = [&](const PartName& part) {
        return !taken.contains(part) && active_parts_.contains(part) &&
               !queue_.coveredByQueuedEntry(part) && !queue_.futureParts().contains(part);
      };
      while (queued_merges + merges.size() < options_.max_queued_merges) {
        std::vector<MergeCandidate> candidates;
        candidates.reserve(parts.size());
        for (const auto& part : parts) {
          const bool ok = mergeable(part);
          candidates.push_back({ok ? active_parts_.at(part)->rows : 0, ok});
        }
        auto best = selectMergeRange(
            candidates, options_.merge_min_parts, options_.merge_max_parts, [&](const MergeRange& r) {
              const PartName range{partition, parts[r.start].min_block,
                                   parts[r.start + r.width - 1].max_block, PartName::kMaxLevel, 0};
              return !rangeHasUnpublishedBlocksLocked(range, locks[partition]);
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

std::size_t TableReplica::scheduleQueue(bool inline_execution) {
  static constexpr std::size_t kNoOpBatch = 100;
  std::size_t merged = 0;
  std::vector<SelectedEntry> no_ops;
  for (;;) {
    std::optional<SelectedEntry> selected;
    const bool readonly = this->keeper() == nullptr || lost_;
    {
      std::lock_guard lock(queue_mu_);
      selected = queue_.selectEntryToProcess(localPartLookup(), readonly,
                                             std::chrono::steady_clock::now());
      metrics_.queue_size.Set(static_cast<double>(queue_.size()));
    }
    if (!selected) {
      if (no_ops.empty()) return merged;
      // Finishing them may let entries they held back run: look again.
      finishNoOpEntries(no_ops);
      no_ops.clear();
      continue;
    }
    if (selected->action == QueueAction::kNothing) {
      no_ops.push_back(std::move(*selected));
      if (no_ops.size() == kNoOpBatch) {
        finishNoOpEntries(no_ops);
        no_ops.clear();
      }
      continue;
    }
    const bool is_merge = selected->action == QueueAction::kMerge;
    if (inline_execution || selected->action == QueueAction::kDropRange) {
      if (executeEntry(*selected) && is_merge) ++merged;
      continue;
    }
    WorkerPool& pool = is_merge ? *merge_pool_ : *fetch_pool_;
    pool.submit([this, entry = std::move(*selected)] {
      executeEntry(entry);
      {
        std::lock_guard lock(background_mu_);
        wake_requested_ = true;  // a finished entry may let others run
      }
      background_wake_.notify_all();
    });
  }
}

bool TableReplica::executeEntry(const SelectedEntry& selected) {
  std::shared_ptr<Keeper> keeper = this->keeper();
  EntryOutcome done;
  if (!keeper) {
    done = std::unexpected("no ZooKeeper session");
  } else {
    switch (selected.action) {
      case QueueAction::kNothing:
        if (auto removed = keeper->remove(paths_.queue() + "/" + selected.node_name);
            !removed && removed.error().code != KeeperCode::kNoNode) {
          done = std::unexpected(removed.error().toString());
        }
        break;
      case QueueAction::kFetch: done = executeFetch(*keeper, selected); break;
      case QueueAction::kMerge: done = executeMerge(*keeper, selected); break;
      case QueueAction::kDropRange: done = executeDropRange(*keeper, selected); break;
    }
  }
  const bool succeeded = done.has_value();
  reportOutcomes({{&selected, std::move(done)}}, keeper.get());
  return succeeded;
}

void TableReplica::finishNoOpEntries(const std::vector<SelectedEntry>& entries) {
  std::shared_ptr<Keeper> keeper = this->keeper();
  std::vector<std::pair<const SelectedEntry*, EntryOutcome>> outcomes;
  std::vector<Op> removes;
  for (const auto& entry : entries) removes.push_back(op::Remove{paths_.queue() + "/" + entry.node_name, -1});
  auto batch = keeper ? keeper->multi(removes)
                      : KeeperResult<std::vector<OpResult>>(std::unexpected(KeeperError{KeeperCode::kConnectionLoss, "", "no ZooKeeper session", {}}));
  for (const auto& entry : entries) {
    EntryOutcome done;
    if (!keeper) {
      done = std::unexpected("no ZooKeeper session");
    } else if (!batch) {
      // One node was gone already (a clone replaced the queue, say): one by one then.
      if (auto removed = keeper->remove(paths_.queue() + "/" + entry.node_name);
          !removed && removed.error().code != KeeperCode::kNoNode) {
        done = std::unexpected(removed.error().toString());
      }
    }
    outcomes.emplace_back(&entry, std::move(done));
  }
  reportOutcomes(outcomes, keeper.get());
}

void TableReplica::reportOutcomes(
    const std::vector<std::pair<const SelectedEntry*, EntryOutcome>>& outcomes,
    Keeper* keeper) {
  std::vector<std::string> pointless;
  {
    std::lock_guard lock(queue_mu_);
    for (const auto& [selected, done] : outcomes) {
      if (done) {
        auto removed = queue_.finish(selected->node_name);
        pointless.insert(pointless.end(), removed.begin(), removed.end());
      } else if (done.error().gave_way) {
        queue_.giveWay(selected->node_name, done.error().message, std::chrono::steady_clock::now());
      } else {
        spdlog::warn("queue entry {} ({} {}): {}", selected->node_name,
                     queueActionName(selected->action), selected->entry.new_part_name,
                     done.error().message);
        queue_.fail(selected->node_name, done.error().message, std::chrono::steady_clock::now());
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

namespace {

// host/port of a replica from its `host` node (ReplicatedMergeTreeAddress text).
std::optional<FetchSource> parseReplicaAddress(const std::string& replica, const std::string& text) {
  FetchSource source;
  source.replica = replica;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("host: ")) source.host = line.substr(6);
    if (line.starts_with("port: ")) source.port = static_cast<uint16_t>(std::atoi(line.c_str() + 6));
  }
  if (source.host.empty() || source.port == 0) return std::nullopt;
  return source;
}

}  // namespace

TableReplica::EntryOutcome TableReplica::executeFetch(Keeper& keeper,
                                                      const SelectedEntry& selected) {
  auto wanted = PartName::parse(selected.entry.new_part_name);
  if (!wanted) return std::unexpected(wanted.error());
  // Replicas that are live and have the part, or a part covering it (it may have been merged).
  auto replicas = keeper.children(paths_.replicas());
  if (!replicas) return std::unexpected(replicas.error().toString());
  struct Candidate {
    FetchSource source;
    PartName part;
  };
  std::vector<Candidate> candidates;
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
    auto exact = keeper.exists(other.part(wanted->format()));
    if (exact && *exact) {
      candidates.insert(candidates.begin(), Candidate{*source, *wanted});
      continue;
    }
    auto parts = keeper.children(other.parts());
    if (!parts) continue;
    for (const auto& name : parts->names) {
      auto part = PartName::parse(name);
      if (part && part->contains(*wanted)) {
        candidates.push_back(Candidate{*source, *part});
        break;
      }
    }
  }
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
    spdlog::error("part {} is lost forever: no replica has it or a part covering it; giving up "
                  "queue entry {}", wanted->format(), selected.node_name);
    metrics_.parts_lost_forever.Increment();
    std::vector<std::string> duplicates;
    {
      std::lock_guard queue_lock(queue_mu_);
      std::vector<PartName> current;
      {
        std::lock_guard parts_lock(parts_mu_);
        for (const auto& [name, part] : active_parts_) current.push_back(name);
      }
      duplicates = queue_.forgetLostPart(selected.node_name, current);
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
        EntryError gave_way(fmt::format("Not fetching part {} covering {}: it is being fetched or "
                                        "made by another entry", name, wanted->format()));
        gave_way.gave_way = true;
        return std::unexpected(std::move(gave_way));
      }
    }
    const fs::path staging = spec_.data_dir / kStagingDir /
                             fmt::format("fetch-{}-{}", name, next_staging_id_.fetch_add(1));
    std::error_code ec;
    fs::create_directories(staging.parent_path(), ec);
    auto fetched = fetchPart(candidate.source, spec_.interserver_secret, name, staging,
                             spec_.schema, options_.fetch_timeout);
    if (!fetched) {
      // A corrupt or cut transfer: the next replica may do better.
      errors += (errors.empty() ? "" : "; ") + fetched.error().toString();
      metrics_.fetch_errors.Increment();
      continue;
    }
    uint64_t bytes = 0;
    for (const auto& file : fetched->files) bytes += file.size;
    const fs::path final_dir = spec_.data_dir / name;
    fs::rename(staging, final_dir, ec);
    if (ec || !syncDirectory(spec_.data_dir)) {
      fs::remove_all(staging, ec);
      // Another entry brought the same part in meanwhile: then this entry's work is done.
      if (auto here = localPartLookup()(*wanted)) {
        spdlog::debug("part {} arrived meanwhile (as {}); dropping the copy fetched for {}",
                      name, here->format(), selected.node_name);
        return {};
      }
      return std::unexpected(fmt::format("cannot move fetched part to {}: {}", final_dir.string(),
                                         ec ? ec.message() : "directory fsync failed"));
    }
    // The part, the parts it replaces here, and the queue entry: one multi.
    std::vector<Op> ops = {op::Create{paths_.part(name), "", CreateMode::kPersistent}};
    {
      std::lock_guard lock(parts_mu_);
      for (const auto& covered : active_set_.partsCoveredBy(candidate.part)) {
        if (covered != candidate.part) ops.push_back(op::Remove{paths_.part(covered.format()), -1});
      }
    }
    ops.push_back(op::Remove{paths_.queue() + "/" + selected.node_name, -1});
    if (auto registered = registerPart(keeper, ops, candidate.part, final_dir, *fetched); !registered) {
      return std::unexpected("registering the fetched part: " + registered.error());
    }
    makeVisible(candidate.part, std::move(*fetched), 0);
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

std::expected<void, std::string> TableReplica::registerPart(Keeper& keeper, const std::vector<Op>& ops,
                                                            const PartName& part,
                                                            const fs::path& dir,
                                                            const PartChecksums& checksums,
                                                            std::shared_ptr<const PartImage> image,
                                                            uint64_t rows) {
  auto committed = keeper.multi(ops);
  if (committed) return {};
  std::error_code ec;
  if (!committed.error().isConnectionLevel()) {
    if (image) {
      forgetHeldPart(part);
    } else {
      fs::remove_all(dir, ec);
    }
    return std::unexpected(committed.error().toString());
  }
  // No answer: the multi is atomic, so our parts node will tell whether it was applied. Until
  // then the files stay (a held part stays held); resolveUncertainParts makes the part visible or
  // removes it, and the entry, retried, then finds the part here (or fetches or merges again).
  std::lock_guard lock(parts_mu_);
  PendingPartFile uncertain{part.partition_id, "", dir, rows, std::nullopt, checksums};
  uncertain.image = std::move(image);
  uncertain_parts_[part] = std::move(uncertain);
  return std::unexpected(fmt::format("{} (the outcome is checked once ZooKeeper answers)",
                                     committed.error().toString()));
}

std::expected<void, std::string> TableReplica::executeMerge(Keeper& keeper,
                                                            const SelectedEntry& selected) {
  auto result = PartName::parse(selected.entry.new_part_name);
  if (!result) return std::unexpected(result.error());
  std::vector<DataPartPtr> sources;
  {
    std::lock_guard lock(parts_mu_);
    for (const auto& name : selected.entry.source_parts) {
      auto part = PartName::parse(name);
      auto it = part ? active_parts_.find(*part) : active_parts_.end();
      if (it == active_parts_.end()) return std::unexpected("merge source " + name + " is not here");
      sources.push_back(it->second);
    }
    // A part inside the result that is not a source would be covered without its rows being
    // merged in: refuse (the leader chose wrongly) rather than lose them.
    for (const auto& [name, part] : active_parts_) {
      if (!result->contains(name)) continue;
      const bool is_source = std::any_of(sources.begin(), sources.end(),
                                         [&](const DataPartPtr& s) { return s->name == name; });
      if (!is_source) {
        return std::unexpected(fmt::format("merge {} would cover part {}, which is not one of its "
                                           "sources; not merging", result->format(), name.format()));
      }
    }
  }
  // Sources are in block order and each is sorted: a stable sort of their concatenation is the
  // k-way merge, ties in source order, so every replica gets the same bytes.
  const auto started = std::chrono::steady_clock::now();
  Block rows = spec_.schema.emptyBlock();
  for (const auto& part : sources) {
    auto block = readDataPart(*part, spec_.schema);
    if (!block) return std::unexpected("reading merge source: " + block.error());
    rows.append(*block);
  }
  const Block sorted = rows.select(spec_.schema.sortPermutation(rows));
  auto [image, keeper_record] = holdMergedPart(*result, sorted);
  PartChecksums checksums;
  if (image) {
    checksums = image->checksums;
  } else {
    auto written = writePart(spec_.data_dir, *result, spec_.schema, sorted);
    if (!written) return std::unexpected("writing merged part: " + written.error());
    checksums = std::move(*written);
  }
  std::vector<Op> ops = {op::Create{paths_.part(result->format()), "", CreateMode::kPersistent}};
  for (const auto& part : sources) ops.push_back(op::Remove{paths_.part(part->name.format()), -1});
  ops.push_back(op::Remove{paths_.queue() + "/" + selected.node_name, -1});
  if (keeper_record) ops.push_back(op::Create{paths_.partImage(result->format()), *keeper_record, CreateMode::kPersistent});
  auto registered = registerPart(keeper, ops, *result, spec_.data_dir / result->format(), checksums, image, sorted.rows());
  if (keeper_record) {
    // Applied, or perhaps (no answer: the part is uncertain): the next checkpoint removes it.
    bool maybe_applied = registered.has_value();
    if (!maybe_applied) {
      std::lock_guard lock(parts_mu_);
      maybe_applied = uncertain_parts_.contains(*result);
    }
    if (maybe_applied) noteKeeperImage(*result, keeper_record->size());
  }
  if (!registered) return std::unexpected("registering the merged part: " + registered.error());
  uint64_t bytes = 0;
  for (const auto& file : checksums.files) bytes += file.size;
  makeVisible(*result, std::move(checksums), sorted.rows(), std::move(image));
  metrics_.merges.Increment();
  metrics_.merged_rows.Increment(static_cast<double>(sorted.rows()));
  metrics_.merged_bytes.Increment(static_cast<double>(bytes));
  metrics_.merge_duration_seconds.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return {};
}

TableReplica::HeldMerge TableReplica::holdMergedPart(const PartName& name, const Block& rows) {
  // A stream of small inserts keeps merging small parts: a synced file per column for each
  // result contended with the inserts' commits for the same disk. Held, a merge result is as
  // durable as a small insert, by its image in its multi or by the journal; the next checkpoint
  // writes it out (unless a later merge took it), and after a crash the start-up writes it again
  // once ZooKeeper lists it.
  if (valueBytes(rows) > options_.journal_part_bytes || !mayHoldMore()) return {};
  auto encoded = encodePart(spec_.schema, rows);
  if (!encoded) {
    spdlog::warn("merge {}: {}; writing it as files", name.format(), encoded.error());
    return {};
  }
  auto image = std::make_shared<const PartImage>(std::move(*encoded));
  {
    // Held before its record exists: a checkpoint that covers the record writes it out.
    std::lock_guard lock(parts_mu_);
    holdPartLocked(name, image);
  }
  if (auto record = keeperImageFor(name, *image)) return {image, std::move(record)};
  if (auto journaled = journal_->append(name.format(), *image); !journaled) {
    spdlog::warn("part journal: {}; writing merged part {} as files", journaled.error(), name.format());
    forgetHeldPart(name);
    return {};
  }
  return {image, std::nullopt};
}

std::expected<void, std::string> TableReplica::executeDropRange(Keeper& keeper,
                                                                const SelectedEntry& selected) {
  auto range = PartName::parse(selected.entry.new_part_name);
  if (!range) return std::unexpected(range.error());
  std::vector<PartName> dropped;
  {
    std::lock_guard lock(parts_mu_);
    dropped = active_set_.partsCoveredBy(*range);
  }
  std::vector<Op> ops;
  for (const auto& part : dropped) ops.push_back(op::Remove{paths_.part(part.format()), -1});
  ops.push_back(op::Remove{paths_.queue() + "/" + selected.node_name, -1});
  if (auto committed = keeper.multi(ops); !committed) {
    return std::unexpected("removing dropped parts: " + committed.error().toString());
  }
  std::lock_guard lock(parts_mu_);
  for (const auto& part : dropped) {
    active_set_.remove(part);
    if (auto it = active_parts_.find(part); it != active_parts_.end()) retirePartLocked(it);
  }
  metrics_.parts.Set(static_cast<double>(active_parts_.size()));
  return {};
}

void TableReplica::updateQueueMetrics() {
  std::lock_guard lock(queue_mu_);
  std::map<std::string, double> by_type = {{"get", 0}, {"merge", 0}, {"drop_range", 0}, {"attach", 0}};
  int64_t oldest = 0;
  int64_t oldest_insert = 0;
  for (const auto& queued : queue_.entries()) {
    if (queued.entry.type == LogEntry::Type::kGetPart && queued.entry.create_time > 0 &&
        (oldest_insert == 0 || queued.entry.create_time < oldest_insert)) {
      oldest_insert = queued.entry.create_time;
    }
    switch (queued.entry.type) {
      case LogEntry::Type::kGetPart: by_type["get"] += 1; break;
      case LogEntry::Type::kMergeParts: by_type["merge"] += 1; break;
      case LogEntry::Type::kDropRange: by_type["drop_range"] += 1; break;
      case LogEntry::Type::kAttachPart: by_type["attach"] += 1; break;
    }
    if (queued.entry.create_time > 0 && (oldest == 0 || queued.entry.create_time < oldest)) {
      oldest = queued.entry.create_time;
    }
  }
  for (const auto& [type, count] : by_type) metrics_.queueEntries(type).Set(count);
  metrics_.queue_size.Set(static_cast<double>(queue_.size()));
  metrics_.queue_oldest_entry_age_seconds.Set(
      oldest == 0 ? 0.0 : static_cast<double>(std::max<int64_t>(0, unixNow() - oldest)));
  metrics_.replica_lost.Set(lost_ ? 1 : 0);
  metrics_.absolute_delay_seconds.Set(
      oldest_insert == 0 ? 0.0 : static_cast<double>(std::max<int64_t>(0, unixNow() - oldest_insert)));
  // The queue counts postponements itself; the counters follow it.
  for (auto reason : kAllPostponeReasons) {
    auto& counter = metrics_.queuePostponed(std::string(postponeReasonName(reason)));
    const double total = static_cast<double>(queue_.postponedCount(reason));
    if (total > counter.Value()) counter.Increment(total - counter.Value());
  }
}

std::expected<void, InsertError> TableReplica::dropReplica(const std::string& replica) {
  if (replica == spec_.replica) {
    return std::unexpected(InsertError{InsertError::Kind::kBadRequest,
                                       fmt::format("replica '{}' is this one: ask another replica, or "
                                                   "stop this one first", replica)});
  }
  if (replica.empty() || replica.find('/') != std::string::npos) {
    return std::unexpected(InsertError{InsertError::Kind::kBadRequest,
                                       fmt::format("replica '{}' is not a replica name", replica)});
  }
  std::shared_ptr<Keeper> keeper = this->keeper();
  if (!keeper) return std::unexpected(unavailable("ZooKeeper is unreachable; nothing was removed"));
  auto removed = core::dropReplica(*keeper, paths_, replica);
  if (!removed) {
    if (removed.error().code == KeeperCode::kBadArguments) {
      return std::unexpected(InsertError{InsertError::Kind::kBadRequest, removed.error().detail});
    }
    return std::unexpected(unavailable("ZooKeeper: " + removed.error().toString()));
  }
  if (*removed == ReplicaRemoval::kNotThere) {
    return std::unexpected(InsertError{InsertError::Kind::kNotFound,
                                       fmt::format("replica '{}' is not a replica of this table", replica)});
  }
  return {};
}

std::expected<std::string, InsertError> TableReplica::dropPartition(const std::string& partition) {
  if (!isValidPartitionId(partition)) {
    return std::unexpected(InsertError{InsertError::Kind::kBadRequest,
                                       fmt::format("partition '{}' is not a partition id", partition)});
  }
  std::shared_ptr<Keeper> keeper = this->keeper();
  if (!keeper) return std::unexpected(unavailable("ZooKeeper is unreachable; nothing was dropped"));
  if (auto made = createAncestorsAndSelf(*keeper, paths_.blockNumbers(partition)); !made) {
    return std::unexpected(unavailable("ZooKeeper: " + made.error().toString()));
  }
  // Our own block number bounds the range: every block below it was allocated before the drop.
  constexpr int kAttempts = 10;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    auto lock = keeper->create(paths_.blockLockPrefix(partition), "", CreateMode::kEphemeralSequential);
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
      if (number < bound) ops.push_back(op::Remove{fmt::format("{}{:010d}", paths_.blockLockPrefix(partition), number), -1});
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
    {
      std::lock_guard lock_guard(background_mu_);
      wake_requested_ = true;
    }
    background_wake_.notify_all();
    return range.format();
  }
  return std::unexpected(unavailable("inserts kept committing into the partition; try again"));
}

bool TableReplica::syncQueue(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::shared_ptr<Keeper> keeper = this->keeper();
  if (!keeper) return false;
  // Everything in the log now, pulled; then wait for those entries to leave the queue.
  if (!cloneIfLost(*keeper) || !updateQueue(*keeper)) return false;
  std::set<std::string> waiting;
  {
    std::lock_guard lock(queue_mu_);
    for (const auto& entry : queue_.entries()) waiting.insert(entry.node_name);
  }
  {
    std::lock_guard lock(background_mu_);
    wake_requested_ = true;
  }
  background_wake_.notify_all();
  std::unique_lock lock(queue_mu_);
  return queue_changed_.wait_until(lock, deadline, [&] {
    for (const auto& entry : queue_.entries()) {
      if (waiting.contains(entry.node_name)) return false;
    }
    return true;
  });
}

std::string TableReplica::checkQueueInvariant() const {
  std::lock_guard queue_lock(queue_mu_);
  std::vector<PartName> current;
  {
    std::lock_guard parts_lock(parts_mu_);
    for (const auto& [name, part] : active_parts_) current.push_back(name);
  }
  return queue_.checkVirtualPartsInvariant(current);
}

KeeperResult<std::vector<int64_t>> TableReplica::lockedBlockNumbers(Keeper& keeper,
                                                                    const std::string& partition) {
  std::vector<int64_t> numbers;
  auto locks = keeper.children(paths_.blockNumbers(partition));
  if (!locks) {
    if (locks.error().code == KeeperCode::kNoNode) return numbers;
    return std::unexpected(locks.error());
  }
  for (const auto& lock : locks->names) {
    const auto dash = lock.rfind('-');
    if (dash != std::string::npos) numbers.push_back(std::strtoll(lock.c_str() + dash + 1, nullptr, 10));
  }
  return numbers;
}

bool TableReplica::rangeHasUnpublishedBlocksLocked(const PartName& result,
                                                   const std::vector<int64_t>& locked) const {
  for (const auto& name : unpublished_) {
    if (result.contains(name)) return true;
  }
  for (const auto& [name, pending] : uncertain_parts_) {
    if (result.contains(name)) return true;
  }
  for (int64_t number : locked) {
    if (number >= result.min_block && number <= result.max_block) return true;
  }
  return false;
}

void TableReplica::cleanLog(Keeper& keeper) {
  auto cleaned = clearOldLogs(keeper, paths_, LogRetention{spec_.min_logs_to_keep, spec_.max_logs_to_keep});
  if (!cleaned) spdlog::warn("trimming the replication log: {}", cleaned.error().toString());
}

void TableReplica::backgroundLoop() {
  auto last_full_round = std::chrono::steady_clock::time_point{};
  auto last_merge_assignment = std::chrono::steady_clock::time_point{};
  // The session in which this replica last found itself the leader: the leader node is
  // ephemeral, so it stays the leader as long as that session lives. 0: not the leader (ZooKeeper
  // never gives out session id 0).
  int64_t leader_session = 0;
  auto last_cleanup = std::chrono::steady_clock::now();
  std::unique_lock lock(background_mu_);
  while (!stopping_) {
    wake_requested_ = false;
    lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    // Every round: an insert that finds the held parts full wakes us for an early checkpoint.
    checkpointJournalIfDue();
    if (now - last_full_round >= options_.background_period) {
      // Leader work, metrics, uncertain parts: once a period.
      last_full_round = now;
      std::shared_ptr<Keeper> keeper = this->keeper();
      if (keeper) {
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
    } else if (std::shared_ptr<Keeper> keeper = this->keeper(); keeper && !lost_) {
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
    background_wake_.wait_for(lock, options_.background_period,
                              [this] { return stopping_ || wake_requested_; });
    if (!stopping_ && wake_requested_) {
      background_wake_.wait_for(lock, options_.min_pull_interval, [this] { return stopping_; });
    }
  }
}

void TableReplica::stopBackgroundWork() {
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

std::vector<std::string> TableReplica::handOff(std::chrono::milliseconds timeout) {
  // No new merge (this replica may lead) makes a part that only it has.
  stopBackgroundWork();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> only_here;
  bool announced = false;
  for (;;) {
    std::shared_ptr<Keeper> keeper = this->keeper();
    if (!keeper) return only_here;  // no session: nothing can be learned or handed on
    auto count = countReplicas(*keeper, paths_);
    if (!count) return only_here;
    std::vector<std::string> live = std::move(count->live);
    std::erase(live, spec_.replica);
    if (live.empty()) return {};  // no one to hand parts to; they stay on this volume
    auto only = partsOnlyOn(*keeper, paths_, spec_.replica, live);
    if (only) {
      only_here = std::move(*only);
      if (only_here.empty()) {
        if (announced) spdlog::info("hand-off done: every part of this replica is on another live replica");
        return {};
      }
      if (!announced) {
        spdlog::info("handing off {} part(s) only this replica has before stopping (up to {} ms): {}",
                     only_here.size(), timeout.count(), fmt::join(only_here, ", "));
        announced = true;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  spdlog::warn("stopping with {} part(s) no other live replica has yet: {}", only_here.size(),
               fmt::join(only_here, ", "));
  return only_here;
}

void TableReplica::shutdown() {
  stopBackgroundWork();
  // A clean stop leaves nothing for the next start to read back. Inserts have finished (the API
  // stops before the table), and a journal append still running would only wait for this.
  if (journal_) {
    if (auto done = checkpointJournal(); !done) spdlog::warn("{}", done.error());
  }
  std::lock_guard lock(keeper_mu_);
  keeper_.reset();
}

PendingInsert::PendingInsert(TableReplica& table, InsertOptions options, fs::path staging_prefix)
    : table_(table), options_(std::move(options)), staging_prefix_(std::move(staging_prefix)) {}

PendingInsert::~PendingInsert() {
  // Committed parts were moved into the table; the rest go.
  std::error_code ec;
  for (const auto& part : parts_) fs::remove_all(part.dir, ec);
}

// One partition's buffered rows in ORDER BY order, and their dedup id.
struct SortedBlock {
  Block rows;
  std::string dedup_id;
};

namespace {

SortedBlock sortAndIdentify(const TableSchema& schema, const std::string& partition, Block rows,
                            const std::string& token, std::size_t n) {
  const auto order = schema.sortPermutation(rows);
  bool in_order = true;
  for (std::size_t i = 0; i < order.size() && in_order; ++i) in_order = order[i] == i;
  // Rows that came sorted (ids, times) are kept as they are rather than copied.
  SortedBlock sorted{in_order ? std::move(rows) : rows.select(order), {}};
  sorted.dedup_id = token.empty() ? blockDedupId(partition, sorted.rows) : tokenDedupId(partition, token, n);
  return sorted;
}

}  // namespace

std::expected<void, std::string> PendingInsert::add(Block block) {
  rows_ += block.rows();
  const TableSchema& schema = table_.spec_.schema;
  auto groups = schema.partitionGroups(block);
  // Each partition's buffer, created in first-seen order.
  std::vector<std::size_t> buffer_of_group;
  for (const auto& partition : groups.ids) {
    auto it = std::find_if(buffers_.begin(), buffers_.end(),
                           [&](const auto& buffer) { return buffer.first == partition; });
    if (it == buffers_.end()) it = buffers_.insert(buffers_.end(), {partition, schema.emptyBlock()});
    buffer_of_group.push_back(static_cast<std::size_t>(it - buffers_.begin()));
  }
  if (groups.ids.size() == 1) {
    buffers_[buffer_of_group[0]].second.append(std::move(block));
  } else if (!groups.ids.empty()) {
    std::vector<Block*> targets;
    for (std::size_t index : buffer_of_group) targets.push_back(&buffers_[index].second);
    std::move(block).scatterInto(groups.group_of_row, targets);
  }
  for (std::size_t index : buffer_of_group) {
    if (buffers_[index].second.rows() >= table_.options_.max_part_rows) {
      if (auto flushed = flush(buffers_[index].first, /*write_now=*/true); !flushed) return flushed;
    }
  }
  return {};
}

std::expected<void, std::string> PendingInsert::flush(const std::string& partition, bool write_now) {
  auto it = std::find_if(buffers_.begin(), buffers_.end(),
                         [&](const auto& buffer) { return buffer.first == partition; });
  if (it == buffers_.end() || it->second.rows() == 0) return {};
  const TableSchema& schema = table_.spec_.schema;
  Block rows = std::exchange(it->second, schema.emptyBlock());
  const std::size_t n = blocks_per_partition_[partition]++;
  return stage(partition,
               sortAndIdentify(schema, partition, std::move(rows), options_.deduplication_token, n),
               write_now);
}

std::expected<void, std::string> PendingInsert::stage(const std::string& partition,
                                                      SortedBlock sorted, bool write_now) {
  // Staged under a provisional name; the block number comes with the commit.
  const PartName staged{partition, static_cast<int64_t>(parts_.size()), static_cast<int64_t>(parts_.size()), 0, 0};
  // A folder per part, not per insert: one mkdir less before an acknowledgement.
  std::error_code ec;
  fs::create_directories(staging_prefix_.parent_path(), ec);
  fs::path dir = staging_prefix_;
  dir += "-" + staged.format();
  PendingPartFile part{partition, sorted.dedup_id, std::move(dir), sorted.rows.rows(), std::nullopt, std::nullopt};
  if (write_now) {
    auto written = writeStagedPart(part.dir, table_.spec_.schema, sorted.rows);
    if (!written) return std::unexpected(written.error());
    part.checksums = std::move(*written);
  } else {
    part.unwritten = std::move(sorted.rows);
  }
  parts_.push_back(std::move(part));
  return {};
}

std::expected<void, std::string> PendingInsert::flushAll() {
  // Sorting and hashing one partition's rows does not depend on the others: an insert spanning
  // several partitions does them in parallel; the parts are staged in first-seen order.
  const TableSchema& schema = table_.spec_.schema;
  std::vector<std::future<SortedBlock>> sorting;
  std::vector<std::string> partitions;
  for (auto& [partition, rows] : buffers_) {
    if (rows.rows() == 0) continue;
    const std::size_t n = blocks_per_partition_[partition]++;
    Block taken = std::exchange(rows, schema.emptyBlock());
    const bool alone = buffers_.size() == 1;
    sorting.push_back(std::async(alone ? std::launch::deferred : std::launch::async,
                                 sortAndIdentify, std::cref(schema), partition, std::move(taken),
                                 options_.deduplication_token, n));
    partitions.push_back(partition);
  }
  for (std::size_t i = 0; i < sorting.size(); ++i) {
    if (auto staged = stage(partitions[i], sorting[i].get(), /*write_now=*/false); !staged) return staged;
  }
  return {};
}

}  // namespace rtable::core
