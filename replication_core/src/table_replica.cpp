#include "rtable/replication_core/table_replica.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <set>

#include "rtable/replication_core/keeper_retry.h"
#include "rtable/replication_core/measured_keeper.h"
#include "rtable/replication_core/table_registration.h"

namespace rtable::core {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStagingDir = "staging";
constexpr const char* kDetachedDir = "detached";

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A rename is durable once the directory holding the new name is synced.
bool syncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

std::string replicaAddress(const TableSpec& spec) {
  // ClickHouse's ReplicatedMergeTreeAddress text, so tools that read `host` find their way.
  return fmt::format("host: {}\nport: {}\ntcp_port: 0\ndatabase: default\ntable: {}\nscheme: http\n",
                     spec.replica_host, spec.http_port, spec.table);
}

InsertError unavailable(const std::string& message) {
  return InsertError{InsertError::Kind::kUnavailable, message};
}

}  // namespace

DataPart::~DataPart() {
  if (remove_when_unused) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

TableReplica::TableReplica(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
                           TableReplicaOptions options)
    : spec_(std::move(spec)),
      keeper_factory_(std::move(factory)),
      options_(options),
      paths_{spec_.tableRoot(), 1, spec_.replica},
      metrics_(registry, metrics::ReplicaLabels{spec_.table, spec_.replica, 1}),
      allocator_(paths_),
      dedup_cleaner_(paths_, spec_.deduplication) {}

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
  auto loaded = loadParts(spec_.data_dir, spec_.schema);
  if (!loaded) return std::unexpected(loaded.error());
  for (const auto& [name, reason] : loaded->broken) {
    broken_parts_.push_back(fmt::format("{}: {}", name, reason));
    metrics_.broken_parts.Increment();
  }

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
    if (!local.contains(name)) lost_parts_.push_back(name);
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
  {
    std::lock_guard lock(keeper_mu_);
    keeper_ = keeper;
  }
  metrics_.replica_readonly.Set(0);
  updateLogMetrics(*keeper);
  if (options_.background) background_ = std::thread([this] { backgroundLoop(); });
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
  keeper_ = renewed;
  metrics_.replica_readonly.Set(0);
  return keeper_;
}

DataPartPtr TableReplica::makeDataPart(const PartName& name, PartChecksums checksums) {
  auto part = std::make_shared<DataPart>();
  part->name = name;
  part->dir = spec_.data_dir / name.format();
  for (const auto& file : checksums.files) part->bytes += file.size;
  part->checksums = std::move(checksums);
  std::error_code ec;
  if (auto count = fs::file_size(part->dir / "count.txt", ec); !ec && count < 32) {
    std::FILE* f = std::fopen((part->dir / "count.txt").c_str(), "r");
    if (f) {
      unsigned long long rows = 0;
      if (std::fscanf(f, "%llu", &rows) == 1) part->rows = rows;
      std::fclose(f);
    }
  }
  return part;
}

void TableReplica::makeVisible(const PartName& name, PartChecksums checksums, uint64_t rows) {
  std::lock_guard lock(parts_mu_);
  makeVisibleLocked(name, std::move(checksums), rows);
}

void TableReplica::makeVisibleLocked(const PartName& name, PartChecksums checksums, uint64_t rows) {
  DataPartPtr part = makeDataPart(name, std::move(checksums));
  if (rows != 0) part->rows = rows;
  unpublished_.erase(name);
  auto added = active_set_.add(name);
  if (!added || *added != ActiveDataPartSet::AddResult::kAdded) {
    // Merges never cover unpublished blocks, so a committed part is never covered already.
    spdlog::error("part {} could not become visible: {}", name.format(),
                  added ? "covered by an active part" : added.error());
    return;
  }
  for (auto it = active_parts_.begin(); it != active_parts_.end();) {
    if (name.contains(it->first) && it->first != name) {
      it->second->remove_when_unused = true;
      it = active_parts_.erase(it);
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
  // Parts are written while ZooKeeper allocates their block numbers (they do not depend on each
  // other), several at a time; the commits stay in order.
  constexpr std::size_t kParallelWrites = 4;
  std::vector<PartWrite> writes(parts.size());
  auto startWrite = [&](std::size_t i) {
    if (i >= parts.size() || !parts[i].unwritten) return;
    writes[i] = std::async(std::launch::async, [this, &part = parts[i]] {
      return writeStagedPart(part.dir, spec_.schema, *part.unwritten);
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
    auto part = commitOne(*keeper, parts[i], writes[i], result);
    if (!part) {
      metrics_.insert_errors.Increment();
      InsertError error = part.error();
      error.message += fmt::format(" ({} of {} blocks were committed before; retrying the same "
                                   "insert is safe)", i, parts.size());
      return std::unexpected(error);
    }
    result.parts.push_back(*part);
  }
  metrics_.inserts.Increment();
  metrics_.inserted_rows.Increment(static_cast<double>(result.rows));
  metrics_.insert_deduplicated_blocks.Increment(static_cast<double>(result.deduplicated_blocks));
  return result;
}

std::expected<std::string, InsertError> TableReplica::commitOne(Keeper& keeper,
                                                                PendingPartFile& pending,
                                                                PartWrite& writing,
                                                                InsertResult& result) {
  std::error_code ec;
  auto allocation = allocator_.allocate(keeper, pending.partition, pending.dedup_id);
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
  fs::rename(pending.dir, final_dir, ec);
  if (ec || !syncDirectory(spec_.data_dir)) {
    (void)keeper.remove(lock.path);
    return std::unexpected(InsertError{InsertError::Kind::kInternal,
                                       fmt::format("cannot move part to {}: {}", final_dir.string(), ec.message())});
  }
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.create_time = unixNow();
  entry.source_replica = spec_.replica;
  entry.block_id = pending.dedup_id;
  entry.new_part_name = name.format();
  auto committed = commitPart(keeper, paths_, entry, lock);
  if (committed) {
    makeVisible(name, *pending.checksums, pending.rows);
    result.rows += pending.rows;
    return name.format();
  }
  const CommitError& error = committed.error();
  switch (error.failure) {
    case CommitFailure::kDuplicate:
      fs::remove_all(final_dir, ec);
      (void)keeper.remove(lock.path);
      ++result.deduplicated_blocks;
      return error.duplicate ? error.duplicate->existing_part : std::string("(deduplicated)");
    case CommitFailure::kLogExhausted:
      fs::remove_all(final_dir, ec);
      (void)keeper.remove(lock.path);
      return std::unexpected(InsertError{
          InsertError::Kind::kLogExhausted,
          fmt::format("the table's replication log counter is exhausted ({} exists: ZooKeeper's "
                      "int32 sequential counter reached 2147483647); inserts cannot succeed until "
                      "the table moves to a new generation",
                      paths_.log() + "/log-2147483647")});
    case CommitFailure::kLockLost:
      fs::remove_all(final_dir, ec);
      return std::unexpected(unavailable("the ZooKeeper session ended during the commit; the block was not committed"));
    case CommitFailure::kRejected:
      fs::remove_all(final_dir, ec);
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
    makeVisible(name, *pending.checksums, pending.rows);
    result.rows += pending.rows;
    return name.format();
  }
  if (asked) {
    fs::remove_all(final_dir, ec);
    return std::unexpected(unavailable("ZooKeeper connection lost during the commit; the block was not committed"));
  }
  {
    std::lock_guard lock_parts(parts_mu_);
    PendingPartFile uncertain{pending.partition, pending.dedup_id, final_dir, pending.rows, std::nullopt, pending.checksums};
    uncertain_parts_[name] = std::move(uncertain);
  }
  return std::unexpected(InsertError{
      InsertError::Kind::kUnknownOutcome,
      fmt::format("ZooKeeper did not answer the commit of {}; it may or may not be visible later",
                  name.format())});
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
      makeVisible(name, *pending.checksums, pending.rows);
    } else {
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
  std::shared_ptr<Keeper> keeper = this->keeper();
  if (!keeper) return 0;
  resolveUncertainParts(*keeper);
  updateLogMetrics(*keeper);
  if (!isLeader(*keeper)) return 0;
  (void)dedup_cleaner_.run(*keeper);
  return mergeRound(*keeper);
}

std::size_t TableReplica::mergeRound(Keeper& keeper) {
  // Pick, per partition, the run of neighbouring parts with the fewest rows.
  std::vector<std::vector<DataPartPtr>> selections;
  {
    std::lock_guard lock(parts_mu_);
    std::map<std::string, std::vector<DataPartPtr>> by_partition;
    for (const auto& [name, part] : active_parts_) by_partition[name.partition_id].push_back(part);
    for (auto& [partition, parts] : by_partition) {
      if (parts.size() < options_.merge_min_parts) continue;
      auto locked = lockedBlockNumbers(keeper, partition);
      if (!locked) continue;
      const std::size_t width = std::min(options_.merge_max_parts, parts.size());
      std::optional<std::size_t> best;
      uint64_t best_rows = UINT64_MAX;
      for (std::size_t start = 0; start + width <= parts.size(); ++start) {
        const PartName range{partition, parts[start]->name.min_block,
                             parts[start + width - 1]->name.max_block, PartName::kMaxLevel, 0};
        if (rangeHasUnpublishedBlocksLocked(range, *locked)) continue;
        uint64_t rows = 0;
        for (std::size_t i = start; i < start + width; ++i) rows += parts[i]->rows;
        if (rows < best_rows) {
          best_rows = rows;
          best = start;
        }
      }
      if (best) selections.emplace_back(parts.begin() + *best, parts.begin() + *best + width);
    }
  }
  std::size_t merged = 0;
  for (const auto& sources : selections) {
    PartName result{sources.front()->name.partition_id, sources.front()->name.min_block,
                    sources.back()->name.max_block, 0, 0};
    for (const auto& part : sources) result.level = std::max(result.level, part->name.level + 1);
    LogEntry entry;
    entry.type = LogEntry::Type::kMergeParts;
    entry.create_time = unixNow();
    entry.source_replica = spec_.replica;
    entry.new_part_name = result.format();
    for (const auto& part : sources) entry.source_parts.push_back(part->name.format());
    // The entry goes to the log so that every replica executes the same merge.
    auto logged = keeper.create(paths_.logEntryPrefix(), entry.format(), CreateMode::kPersistentSequential);
    if (!logged) break;

    // Sources are in block order and each is sorted: a stable sort of their concatenation is the
    // k-way merge, ties in source order, so every replica gets the same bytes.
    Block rows;
    bool readable = true;
    for (const auto& part : sources) {
      auto block = readPart(part->dir, spec_.schema);
      if (!block) {
        readable = false;
        break;
      }
      rows.append(*block);
    }
    if (!readable) continue;
    const Block sorted = rows.select(spec_.schema.sortPermutation(rows));
    auto written = writePart(spec_.data_dir, result, spec_.schema, sorted);
    if (!written) continue;
    // The final check and the swap happen under parts_mu_, which an insert needs to record its
    // block before committing: nothing can slip into the range between them.
    std::unique_lock parts_lock(parts_mu_);
    std::vector<PartName> still_active;
    for (const auto& part : active_set_.partsCoveredBy(result)) still_active.push_back(part);
    std::vector<PartName> source_names;
    for (const auto& part : sources) source_names.push_back(part->name);
    auto locked = lockedBlockNumbers(keeper, result.partition_id);
    if (still_active != source_names || !locked || rangeHasUnpublishedBlocksLocked(result, *locked)) {
      parts_lock.unlock();
      std::error_code ec;
      fs::remove_all(spec_.data_dir / result.format(), ec);
      continue;
    }
    std::vector<Op> swap = {op::Create{paths_.part(result.format()), "", CreateMode::kPersistent}};
    for (const auto& part : sources) swap.push_back(op::Remove{paths_.part(part->name.format()), -1});
    if (auto committed = keeper.multi(swap); !committed) {
      parts_lock.unlock();
      std::error_code ec;
      fs::remove_all(spec_.data_dir / result.format(), ec);
      continue;
    }
    makeVisibleLocked(result, std::move(*written), sorted.rows());
    parts_lock.unlock();
    metrics_.merges.Increment();
    metrics_.merged_rows.Increment(static_cast<double>(sorted.rows()));
    ++merged;
  }
  return merged;
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

void TableReplica::backgroundLoop() {
  std::unique_lock lock(background_mu_);
  while (!stopping_) {
    lock.unlock();
    runBackgroundRoundForTest();
    lock.lock();
    background_wake_.wait_for(lock, options_.background_period, [this] { return stopping_; });
  }
}

void TableReplica::shutdown() {
  {
    std::lock_guard lock(background_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  background_wake_.notify_all();
  if (background_.joinable()) background_.join();
  std::lock_guard lock(keeper_mu_);
  keeper_.reset();
}

PendingInsert::PendingInsert(TableReplica& table, InsertOptions options, fs::path staging_dir)
    : table_(table), options_(std::move(options)), staging_dir_(std::move(staging_dir)) {}

PendingInsert::~PendingInsert() {
  std::error_code ec;
  fs::remove_all(staging_dir_, ec);
}

std::expected<void, std::string> PendingInsert::add(Block block) {
  rows_ += block.rows();
  for (auto& [partition, rows] : table_.spec_.schema.splitByPartition(block)) {
    auto it = std::find_if(buffers_.begin(), buffers_.end(),
                           [&](const auto& buffer) { return buffer.first == partition; });
    if (it == buffers_.end()) {
      buffers_.emplace_back(partition, std::move(rows));
      it = std::prev(buffers_.end());
    } else {
      it->second.append(rows);
    }
    if (it->second.rows() >= table_.options_.max_part_rows) {
      if (auto flushed = flush(partition, /*write_now=*/true); !flushed) return flushed;
    }
  }
  return {};
}

std::expected<void, std::string> PendingInsert::flush(const std::string& partition, bool write_now) {
  auto it = std::find_if(buffers_.begin(), buffers_.end(),
                         [&](const auto& buffer) { return buffer.first == partition; });
  if (it == buffers_.end() || it->second.rows() == 0) return {};
  const TableSchema& schema = table_.spec_.schema;
  Block sorted = it->second.select(schema.sortPermutation(it->second));
  it->second = schema.emptyBlock();
  const std::size_t n = blocks_per_partition_[partition]++;
  const std::string dedup_id = options_.deduplication_token.empty()
                                   ? blockDedupId(partition, sorted)
                                   : tokenDedupId(partition, options_.deduplication_token, n);
  // Staged under a provisional name; the block number comes with the commit.
  const PartName staged{partition, static_cast<int64_t>(parts_.size()), static_cast<int64_t>(parts_.size()), 0, 0};
  std::error_code ec;
  fs::create_directories(staging_dir_, ec);
  PendingPartFile part{partition, dedup_id, staging_dir_ / staged.format(), sorted.rows(), std::nullopt, std::nullopt};
  if (write_now) {
    auto written = writeStagedPart(part.dir, schema, sorted);
    if (!written) return std::unexpected(written.error());
    part.checksums = std::move(*written);
  } else {
    part.unwritten = std::move(sorted);
  }
  parts_.push_back(std::move(part));
  return {};
}

std::expected<void, std::string> PendingInsert::flushAll() {
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (auto flushed = flush(buffers_[i].first, /*write_now=*/false); !flushed) return flushed;
  }
  return {};
}

}  // namespace rtable::core
