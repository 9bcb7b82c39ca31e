#include "rtable/replication_core/insert_commit.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>

#include "posix_file.h"
#include "rtable/replication_core/keeper_retry.h"
#include "rtable/replication_core/part_store.h"
#include "rtable/replication_core/quorum.h"
#include "rtable/replication_core/replication_worker.h"

namespace rtable::core {
namespace fs = std::filesystem;
namespace {

// A commit this slow is logged with its time split (and counted).
constexpr std::chrono::milliseconds kSlowCommit{1000};

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

InsertError unavailable(const std::string& message) {
  return InsertError{InsertError::Kind::kUnavailable, message};
}

InsertError internal(const std::string& message) {
  return InsertError{InsertError::Kind::kInternal, message};
}

// A part that could not be written or made durable here: a full volume is the operator's to fix
// (and another replica's to take the insert meanwhile), anything else is ours.
InsertError localWriteError(const std::string& message) {
  if (!isOutOfSpace(message)) return internal(message);
  return InsertError{InsertError::Kind::kStorageFull,
                     message +
                         "; this replica's data volume is full, nothing was committed: retry "
                         "on another replica, or here once space is freed"};
}

}  // namespace

// --- PendingInsert -----------------------------------------------------------------------------

// One partition's buffered rows in ORDER BY order, and their dedup id.
struct SortedBlock {
  Block rows;
  std::string dedup_id;
};

PendingInsert::PendingInsert(const TableSchema& schema, std::size_t max_part_rows,
                             InsertOptions options, fs::path staging_prefix)
    : schema_(schema),
      max_part_rows_(max_part_rows),
      options_(std::move(options)),
      staging_prefix_(std::move(staging_prefix)) {}

PendingInsert::~PendingInsert() {
  // Committed parts were moved into the table; the rest go.
  std::error_code ec;
  for (const auto& block : blocks_) fs::remove_all(block.part.dir, ec);
}

namespace {

// With `hash` false, an id from the rows' content is left for later (empty): commit() hashes a
// part's rows while they are being written.
SortedBlock sortAndIdentify(const TableSchema& schema, const std::string& partition, Block rows,
                            const std::string& token, std::size_t n, bool hash = true) {
  const auto order = schema.sortPermutation(rows);
  bool in_order = true;
  for (std::size_t i = 0; i < order.size() && in_order; ++i) in_order = order[i] == i;
  // Rows that came sorted (ids, times) are kept as they are rather than copied.
  SortedBlock sorted{in_order ? std::move(rows) : rows.select(order), {}};
  if (!token.empty()) {
    sorted.dedup_id = tokenDedupId(partition, token, n);
  } else if (hash) {
    sorted.dedup_id = blockDedupId(partition, sorted.rows);
  }
  return sorted;
}

}  // namespace

Block PendingInsert::PartitionRows::take() {
  Block joined = Block::concat(std::move(blocks));
  blocks.clear();
  rows = 0;
  return joined;
}

std::expected<void, std::string> PendingInsert::add(Block block) {
  rows_ += block.rows();
  auto groups = schema_.partitionGroups(block);
  // Each partition's buffer, created in first-seen order.
  std::vector<std::size_t> buffer_of_group;
  for (const auto& partition : groups.ids) {
    auto it = std::find_if(buffers_.begin(), buffers_.end(),
                           [&](const auto& buffer) { return buffer.partition == partition; });
    if (it == buffers_.end()) it = buffers_.insert(buffers_.end(), PartitionRows{partition, {}, 0});
    buffer_of_group.push_back(static_cast<std::size_t>(it - buffers_.begin()));
  }
  auto keep = [&](std::size_t group, Block rows) {
    PartitionRows& buffer = buffers_[buffer_of_group[group]];
    buffer.rows += rows.rows();
    buffer.blocks.push_back(std::move(rows));
  };
  if (groups.ids.size() == 1) {
    keep(0, std::move(block));
  } else if (!groups.ids.empty()) {
    std::vector<Block> split(groups.ids.size(), schema_.emptyBlock());
    std::vector<Block*> targets;
    for (auto& part : split) targets.push_back(&part);
    std::move(block).scatterInto(groups.group_of_row, targets);
    for (std::size_t group = 0; group < split.size(); ++group) keep(group, std::move(split[group]));
  }
  for (std::size_t index : buffer_of_group) {
    if (buffers_[index].rows >= max_part_rows_) {
      if (auto flushed = flush(buffers_[index].partition, /*write_now=*/true); !flushed)
        return flushed;
    }
  }
  return {};
}

std::expected<void, std::string> PendingInsert::flush(const std::string& partition,
                                                      bool write_now) {
  auto it = std::find_if(buffers_.begin(), buffers_.end(),
                         [&](const auto& buffer) { return buffer.partition == partition; });
  if (it == buffers_.end() || it->rows == 0) return {};
  Block rows = it->take();
  const std::size_t n = blocks_per_partition_[partition]++;
  return stage(
      partition,
      sortAndIdentify(schema_, partition, std::move(rows), options_.deduplication_token, n),
      write_now);
}

std::expected<void, std::string> PendingInsert::stage(const std::string& partition,
                                                      SortedBlock sorted, bool write_now) {
  // Staged under a provisional name; the block number comes with the commit.
  const PartName staged{partition, static_cast<int64_t>(blocks_.size()),
                        static_cast<int64_t>(blocks_.size()), 0, 0};
  // A folder per part, not per insert: one mkdir less before an acknowledgement.
  std::error_code ec;
  fs::create_directories(staging_prefix_.parent_path(), ec);
  fs::path dir = staging_prefix_;
  dir += "-" + staged.format();
  StagedBlock block;
  block.part.partition = partition;
  block.part.dedup_id = sorted.dedup_id;
  block.part.dir = std::move(dir);
  block.part.rows = sorted.rows.rows();
  if (write_now) {
    auto written = writeStagedPart(block.part.dir, schema_, sorted.rows);
    if (!written) return std::unexpected(written.error());
    block.part.checksums = std::move(*written);
  } else {
    block.unwritten = std::move(sorted.rows);
  }
  blocks_.push_back(std::move(block));
  return {};
}

std::expected<std::vector<StagedBlock>*, std::string> PendingInsert::finish() {
  // Sorting one partition's rows does not depend on the others: an insert spanning several
  // partitions sorts them in parallel; the parts are staged in first-seen order. Their content
  // hashes come in commit(), beside the writes.
  std::vector<std::future<SortedBlock>> sorting;
  std::vector<std::string> partitions;
  for (auto& buffer : buffers_) {
    if (buffer.rows == 0) continue;
    const std::size_t n = blocks_per_partition_[buffer.partition]++;
    const bool alone = buffers_.size() == 1;
    sorting.push_back(std::async(
        alone ? std::launch::deferred : std::launch::async,
        [this, n, partition = buffer.partition, blocks = std::move(buffer.blocks)]() mutable {
          return sortAndIdentify(schema_, partition, Block::concat(std::move(blocks)),
                                 options_.deduplication_token, n, /*hash=*/false);
        }));
    buffer.blocks.clear();
    buffer.rows = 0;
    partitions.push_back(buffer.partition);
  }
  for (std::size_t i = 0; i < sorting.size(); ++i) {
    if (auto staged = stage(partitions[i], sorting[i].get(), /*write_now=*/false); !staged) {
      return std::unexpected(staged.error());
    }
  }
  return &blocks_;
}

uint64_t PendingInsert::bufferedValueBytes() const {
  uint64_t bytes = 0;
  for (const auto& buffer : buffers_) {
    for (const auto& rows : buffer.blocks) bytes += valueBytes(rows);
  }
  return bytes;
}

std::optional<std::vector<InsertPiece>> PendingInsert::takePieces() {
  if (!blocks_.empty()) return std::nullopt;
  std::vector<InsertPiece> pieces;
  for (auto& buffer : buffers_) {
    if (buffer.rows == 0) continue;
    const std::size_t n = blocks_per_partition_[buffer.partition]++;
    SortedBlock sorted =
        sortAndIdentify(schema_, buffer.partition, buffer.take(), options_.deduplication_token, n);
    pieces.push_back(
        InsertPiece{buffer.partition, std::move(sorted.rows), std::move(sorted.dedup_id)});
  }
  return pieces;
}

// --- InsertCommit ------------------------------------------------------------------------------

InsertCommit::InsertCommit(const TableSpec& spec, TablePaths paths, std::size_t max_part_rows,
                           KeeperSession& session, PartStore& store,
                           BlockNumberAllocator& allocator, ReplicationWorker& worker,
                           metrics::ReplicaMetrics& metrics)
    : spec_(spec),
      paths_(std::move(paths)),
      max_part_rows_(max_part_rows),
      session_(session),
      store_(store),
      allocator_(allocator),
      worker_(worker),
      metrics_(metrics) {}

std::unique_ptr<PendingInsert> InsertCommit::begin(InsertOptions options) {
  const fs::path staging =
      store_.dataDir() / kStagingDir / fmt::format("insert-{}", next_staging_id_.fetch_add(1));
  return std::make_unique<PendingInsert>(spec_.schema, max_part_rows_, std::move(options), staging);
}

std::expected<std::size_t, InsertError> InsertCommit::checkQuorum(const InsertOptions& options) {
  std::size_t quorum = options.quorum >= 2 ? options.quorum : 0;
  if (quorum == 0 && !options.quorum_auto) return 0;
  std::shared_ptr<Keeper> keeper = session_.current();
  if (!keeper) return std::unexpected(unavailable("ZooKeeper is unreachable; nothing was written"));
  auto count = countReplicas(*keeper, paths_);
  auto parent = createAncestorsAndSelf(*keeper, paths_.quorumParallel());
  if (!count || !parent) {
    return std::unexpected(
        unavailable("ZooKeeper: " + (!count ? count.error() : parent.error()).toString()));
  }
  if (options.quorum_auto) {
    quorum = majorityQuorum(count->total);
    if (quorum < 2) quorum = 0;  // a single replica: this one is the majority
  }
  if (count->active() < quorum) {
    return std::unexpected(InsertError{
        InsertError::Kind::kTooFewReplicas,
        fmt::format(
            "Number of alive replicas ({}) is less than requested quorum ({}{}); nothing "
            "was written",
            count->active(), quorum,
            options.quorum_auto ? fmt::format(", a majority of {} replicas", count->total) : "")});
  }
  return quorum;
}

std::expected<InsertResult, InsertError> InsertCommit::commit(PendingInsert& insert) {
  auto failed = [&](InsertError error) {
    metrics_.insert_errors.Increment();
    return std::unexpected(std::move(error));
  };
  auto finished = insert.finish();
  if (!finished) return failed(localWriteError(finished.error()));
  std::vector<StagedBlock>& blocks = **finished;
  const InsertOptions& options = insert.options();
  InsertResult result;
  result.blocks = blocks.size();
  const auto quorum_deadline = std::chrono::steady_clock::now() + options.quorum_timeout;
  auto quorum = checkQuorum(options);
  if (!quorum) return failed(quorum.error());
  // Parts that are not held are written (and synced) while ZooKeeper allocates their block
  // numbers; several at a time, the commits stay in order.
  constexpr std::size_t kParallelWrites = 4;
  std::vector<PartWrite> writes(blocks.size());
  auto startWrite = [&](std::size_t i) {
    if (i >= blocks.size() || !blocks[i].unwritten) return;
    // Small: commitOne encodes it in memory, in microseconds.
    if (store_.willHold(valueBytes(*blocks[i].unwritten))) return;
    writes[i] = std::async(std::launch::async, [this, &block = blocks[i]] {
      return writeStagedPart(block.part.dir, spec_.schema, *block.unwritten, PartSync::kNow);
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
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    startWrite(i + kParallelWrites);
    std::shared_ptr<Keeper> keeper = session_.current();
    if (!keeper) {
      return failed(unavailable(fmt::format(
          "ZooKeeper is unreachable; {} of {} blocks were committed, retrying the same insert is "
          "safe",
          i, blocks.size())));
    }
    if (worker_.lost()) {
      // A part committed now could be detached by the clone (the source does not have it) and
      // be lost with its acknowledged rows.
      return failed(unavailable(fmt::format(
          "this replica is lost (it was away while the log moved on) and is being restored from "
          "a live replica; {} of {} blocks were committed, retrying the same insert is safe",
          i, blocks.size())));
    }
    // The content hash, while the part is being written (it reads the same rows).
    if (blocks[i].part.dedup_id.empty() && blocks[i].unwritten) {
      blocks[i].part.dedup_id = blockDedupId(blocks[i].part.partition, *blocks[i].unwritten);
    }
    // Reserving the next block number pays off for a stream of one-part inserts.
    const std::size_t rows = blocks[i].part.rows;
    auto part = commitOne(*keeper, blocks[i], writes[i], *quorum, /*reserve=*/blocks.size() == 1);
    if (!part) {
      InsertError error = part.error();
      error.message += fmt::format(
          " ({} of {} blocks were committed before; retrying the same "
          "insert is safe)",
          i, blocks.size());
      return failed(std::move(error));
    }
    if (part->duplicate) {
      ++result.deduplicated_blocks;
    } else {
      result.rows += rows;
    }
    result.parts.push_back(part->part);
  }
  if (auto reached = awaitQuorum(result.parts, *quorum, options, quorum_deadline); !reached)
    return failed(reached.error());
  metrics_.inserts.Increment();
  metrics_.inserted_rows.Increment(static_cast<double>(result.rows));
  metrics_.insert_deduplicated_blocks.Increment(static_cast<double>(result.deduplicated_blocks));
  return result;
}

std::vector<PieceOutcome> InsertCommit::commitPieces(std::vector<InsertPiece> pieces,
                                                     const InsertOptions& options) {
  std::vector<PieceOutcome> outcomes(pieces.size());
  auto failAll = [&](const std::vector<std::size_t>& indexes, const InsertError& error) {
    for (std::size_t i : indexes) outcomes[i].error = error;
  };
  std::vector<std::size_t> all(pieces.size());
  for (std::size_t i = 0; i < pieces.size(); ++i) all[i] = i;
  const auto quorum_deadline = std::chrono::steady_clock::now() + options.quorum_timeout;
  auto quorum = checkQuorum(options);
  if (!quorum) {
    failAll(all, quorum.error());
    return outcomes;
  }
  // The pieces of each partition, in arrival order; a piece whose id came earlier in the batch (a
  // client's retry that arrived before the first try was flushed) follows that one's fate.
  std::vector<std::pair<std::string, std::vector<std::size_t>>> partitions;
  std::map<std::string, std::size_t> first_with_id;
  std::vector<std::pair<std::size_t, std::size_t>> repeats;  // (piece, the first with its id)
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (auto [it, fresh] = first_with_id.emplace(pieces[i].dedup_id, i); !fresh) {
      repeats.emplace_back(i, it->second);
      continue;
    }
    auto group = std::find_if(partitions.begin(), partitions.end(),
                              [&](const auto& p) { return p.first == pieces[i].partition; });
    if (group == partitions.end())
      group = partitions.insert(partitions.end(), {pieces[i].partition, {}});
    group->second.push_back(i);
  }
  std::vector<std::string> committed_parts;
  for (auto& [partition, alive] : partitions) {
    // Until a part is committed with every piece still in it: each duplicate found costs one
    // more try without it (rare: a retry whose first try was committed meanwhile).
    while (!alive.empty()) {
      std::shared_ptr<Keeper> keeper = session_.current();
      if (!keeper) {
        failAll(alive, unavailable("ZooKeeper is unreachable; the batch was not committed, "
                                   "retrying the same insert is safe"));
        break;
      }
      if (worker_.lost()) {
        failAll(alive, unavailable("this replica is lost and is being restored from a live "
                                   "replica; retrying the same insert is safe"));
        break;
      }
      Block rows = spec_.schema.emptyBlock();
      for (std::size_t i : alive) rows.append(Block(pieces[i].rows));
      if (alive.size() > 1) {
        const auto order = spec_.schema.sortPermutation(rows);
        rows = rows.select(order);
      }
      StagedBlock block;
      block.part.partition = partition;
      block.part.dedup_id = pieces[alive.front()].dedup_id;
      for (std::size_t k = 1; k < alive.size(); ++k)
        block.more_dedup_ids.push_back(pieces[alive[k]].dedup_id);
      block.part.dir = store_.dataDir() / kStagingDir /
                       fmt::format("async-{}-{}", next_staging_id_.fetch_add(1), partition);
      block.part.rows = rows.rows();
      const bool held = store_.willHold(valueBytes(rows));
      block.unwritten = std::move(rows);
      PartWrite writing;
      if (!held) {
        // Written while ZooKeeper allocates the block number, as commit() does.
        std::error_code ec;
        fs::create_directories(block.part.dir.parent_path(), ec);
        writing = std::async(std::launch::async, [this, &block] {
          return writeStagedPart(block.part.dir, spec_.schema, *block.unwritten, PartSync::kNow);
        });
      }
      // The staged folder goes whatever happens (a committed part was moved out of it).
      struct RemoveStaged {
        const fs::path& dir;
        ~RemoveStaged() {
          std::error_code ec;
          fs::remove_all(dir, ec);
        }
      } remove_staged{block.part.dir};
      auto done = commitOne(*keeper, block, writing, *quorum,
                            /*reserve=*/partitions.size() == 1);
      if (writing.valid()) writing.wait();
      if (!done) {
        failAll(alive, done.error());
        break;
      }
      if (done->duplicate) {
        const std::size_t index = std::min(*done->duplicate, alive.size() - 1);
        outcomes[alive[index]] = PieceOutcome{done->part, true, std::nullopt};
        alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(index));
        continue;
      }
      for (std::size_t i : alive) outcomes[i].part = done->part;
      committed_parts.push_back(done->part);
      break;
    }
  }
  if (auto reached = awaitQuorum(committed_parts, *quorum, options, quorum_deadline); !reached) {
    for (auto& outcome : outcomes) {
      if (!outcome.error && !outcome.duplicate) outcome.error = reached.error();
    }
  }
  for (auto [repeat, first] : repeats) {
    outcomes[repeat] = outcomes[first];
    if (!outcomes[repeat].error) outcomes[repeat].duplicate = true;
  }
  return outcomes;
}

std::expected<void, InsertError> InsertCommit::awaitQuorum(
    const std::vector<std::string>& parts, std::size_t quorum, const InsertOptions& options,
    std::chrono::steady_clock::time_point deadline) {
  if (quorum == 0) return {};
  for (const auto& part : parts) {
    std::shared_ptr<Keeper> keeper = session_.current();
    auto reached = keeper ? waitForQuorum(*keeper, paths_, part, deadline)
                          : KeeperResult<bool>(std::unexpected(
                                KeeperError{KeeperCode::kConnectionLoss, "", "no session", {}}));
    if (!reached || !*reached) {
      return std::unexpected(InsertError{
          InsertError::Kind::kQuorumTimeout,
          fmt::format("the insert is committed on this replica, but part {} did not reach {} "
                      "replicas within {} ms{}; it may still become visible on the others, and "
                      "retrying the same insert is safe (it is deduplicated)",
                      part, quorum, options.quorum_timeout.count(),
                      reached ? "" : " (ZooKeeper: " + reached.error().toString() + ")")});
    }
  }
  return {};
}

std::expected<InsertCommit::BlockCommitted, InsertError> InsertCommit::commitOne(
    Keeper& keeper, StagedBlock& block, PartWrite& writing, std::size_t quorum, bool reserve) {
  NewPart& part = block.part;
  std::error_code ec;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point started = Clock::now();
  if (block.unwritten && !writing.valid()) {
    // Small: encoded in memory, where it stays until a checkpoint writes it out or a merge takes
    // it.
    auto image = encodePart(spec_.schema, *block.unwritten);
    block.unwritten.reset();
    if (!image) return std::unexpected(internal("encoding the part: " + image.error()));
    part.checksums = image->checksums;
    part.image = std::make_shared<const PartImage>(std::move(*image));
  }
  std::optional<BlockNumberLock> reserved;
  if (reserve) reserved = allocator_.takeReserved(keeper.sessionId(), part.partition);
  std::vector<std::string> ids{part.dedup_id};
  ids.insert(ids.end(), block.more_dedup_ids.begin(), block.more_dedup_ids.end());
  auto allocation = reserved ? KeeperResult<Allocation>(Allocation{*reserved})
                             : allocator_.allocate(keeper, part.partition, ids);
  if (writing.valid()) {
    auto written = writing.get();
    block.unwritten.reset();
    if (!written) {
      if (allocation && std::holds_alternative<BlockNumberLock>(*allocation)) {
        (void)keeper.remove(std::get<BlockNumberLock>(*allocation).path);
      }
      return std::unexpected(localWriteError("writing the part: " + written.error()));
    }
    part.checksums = std::move(*written);
  }
  if (!allocation) {
    if (allocation.error().isConnectionLevel()) {
      return std::unexpected(unavailable("ZooKeeper: " + allocation.error().toString()));
    }
    return std::unexpected(internal("allocating a block number: " + allocation.error().toString()));
  }
  if (auto* duplicate = std::get_if<Duplicate>(&*allocation)) {
    fs::remove_all(part.dir, ec);
    // Possibly a duplicate of a part whose commit we could not confirm: it was committed after
    // all, and must become visible before we answer.
    worker_.resolveUncertainParts(keeper);
    return BlockCommitted{duplicate->existing_part, duplicate->index};
  }
  const auto& lock = std::get<BlockNumberLock>(*allocation);
  const PartName name{part.partition, lock.block_number, lock.block_number, 0, 0};
  // Recorded before the commit can remove the lock: a merge selection always sees one or the other.
  store_.beginCommit(name, part.image);
  struct EndCommit {
    PartStore& store;
    const PartName& name;
    ~EndCommit() { store.endCommit(name); }
  } end_commit{store_, name};
  const Clock::time_point placed = Clock::now();
  // Durable here before the commit: once committed, a retry of this insert is deduplicated.
  if (auto durable = store_.makeDurable(name, part); !durable) {
    store_.discard(name, part);
    (void)keeper.remove(lock.path);
    return std::unexpected(localWriteError("making the part durable: " + durable.error()));
  }
  const Clock::time_point durable = Clock::now();
  LogEntry entry;
  entry.type = LogEntry::Type::kGetPart;
  entry.create_time = unixNow();
  entry.source_replica = spec_.replica;
  entry.block_id = part.dedup_id;
  entry.new_part_name = name.format();
  entry.quorum = static_cast<int>(quorum);
  const std::optional<std::string> reserve_data =
      reserve ? allocator_.startReserving(part.partition) : std::nullopt;
  auto committed = commitPart(keeper, paths_, entry, lock, reserve_data, block.more_dedup_ids,
                              part.checksums.total.hex());
  const Clock::time_point answered = Clock::now();
  if (reserve_data) {
    allocator_.finishReserving(
        keeper.sessionId(), part.partition, *reserve_data,
        committed ? committed->reserve_path : std::nullopt,
        !committed && committed.error().failure == CommitFailure::kUnknownOutcome);
  }
  if (committed) {
    worker_.rememberLogEntry(committed->log_entry_path, entry.format());
    worker_.publish(name, part.checksums, part.rows, part.image);
    // Every insert waiting on this commit waited this long: where the time went, when it is
    // long enough to be felt.
    if (const auto took = Clock::now() - started; took >= kSlowCommit) {
      auto ms = [](Clock::duration d) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
      };
      spdlog::warn(
          "slow insert commit of part {} ({} rows, {} inserts): {} ms: encoding, block number "
          "and write {} ms, making it durable {} ms, ZooKeeper's answer to the commit {} ms, "
          "publishing {} ms",
          name.format(), part.rows, 1 + block.more_dedup_ids.size(), ms(took), ms(placed - started),
          ms(durable - placed), ms(answered - durable), ms(Clock::now() - answered));
      metrics_.slow_insert_commits.Increment();
    }
    return BlockCommitted{name.format(), std::nullopt};
  }
  const CommitError& error = committed.error();
  switch (error.failure) {
    case CommitFailure::kDuplicate:
      store_.discard(name, part);
      (void)keeper.remove(lock.path);
      // As for a duplicate found by the allocation (a reserved number skips that check).
      worker_.resolveUncertainParts(keeper);
      return BlockCommitted{
          error.duplicate ? error.duplicate->existing_part : std::string("(deduplicated)"),
          error.duplicate_index};
    case CommitFailure::kLogExhausted:
      store_.discard(name, part);
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
        if (store_.unplace(name, part)) {
          return commitOne(keeper, block, writing, quorum, /*reserve=*/false);
        }
      }
      store_.discard(name, part);
      return std::unexpected(unavailable(
          "the ZooKeeper session ended during the commit; the block was not committed"));
    case CommitFailure::kRejected:
      store_.discard(name, part);
      (void)keeper.remove(lock.path);
      return std::unexpected(internal("commit: " + error.cause.toString()));
    case CommitFailure::kUnknownOutcome:
      break;
  }
  // No answer to the commit: fenced, then the part node tells (commitOutcome).
  part.lock_path = lock.path;
  auto outcome = retryOnConnectionErrors(
      RetryPolicy{std::chrono::milliseconds(100), std::chrono::seconds(2), 8}, [&] {
        std::shared_ptr<Keeper> current = session_.current();
        if (!current)
          return KeeperResult<bool>(
              std::unexpected(KeeperError{KeeperCode::kConnectionLoss, "", "", {}}));
        return commitOutcome(*current, paths_, name.format(), lock.path);
      });
  if (outcome && *outcome) {
    worker_.publish(name, part.checksums, part.rows, part.image);
    return BlockCommitted{name.format(), std::nullopt};
  }
  if (outcome) {
    store_.discard(name, part);
    return std::unexpected(
        unavailable("ZooKeeper connection lost during the commit; the block was not committed"));
  }
  store_.addUncertain(name, part);  // a held part stays held: a checkpoint writes it out
  return std::unexpected(InsertError{
      InsertError::Kind::kUnknownOutcome,
      fmt::format("ZooKeeper did not answer the commit of {}; it may or may not be visible later",
                  name.format())});
}

}  // namespace rtable::core
