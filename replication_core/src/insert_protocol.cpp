#include "rtable/replication_core/insert_protocol.h"

#include <fmt/format.h>

#include <charconv>
#include <iterator>
#include <random>
#include <set>

#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/quorum.h"

namespace rtable::core {
namespace {

std::string formatDedupId(const std::string& partition, const Hash128& hash) {
  return fmt::format("{}_{}_{}", partition, hash.high, hash.low);
}

std::optional<int64_t> sequenceNumber(const std::string& created_path) {
  const std::size_t dash = created_path.rfind('-');
  if (dash == std::string::npos) return std::nullopt;
  int64_t value = 0;
  const char* begin = created_path.data() + dash + 1;
  const char* end = created_path.data() + created_path.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace

std::string blockDedupId(const std::string& partition, const Block& block) {
  Hasher128 hasher;
  hasher.updateU64(block.rows());
  for (const auto& column : block.columns) {
    hasher.updateString(column.name);
    hasher.updateString(column.type.name());
    hasher.update(column.null_map.data(), column.null_map.size());
    std::visit(
        [&](const auto& values) {
          using T = std::decay_t<decltype(values[0])>;
          if constexpr (std::is_same_v<T, std::string>) {
            for (const auto& value : values) hasher.updateString(value);
          } else {
            hasher.update(values.data(), values.size() * sizeof(T));
          }
        },
        column.values);
  }
  return formatDedupId(partition, hasher.digest());
}

std::string tokenDedupId(const std::string& partition, const std::string& token, std::size_t n) {
  return formatDedupId(partition, hash128(fmt::format("{}_{}", token, n)));
}

BlockNumberAllocator::BlockNumberAllocator(TablePaths paths, const common::Clock& clock)
    : paths_(std::move(paths)), clock_(clock) {
  std::random_device random;
  next_lock_tag_ = (static_cast<uint64_t>(random()) << 32) | random();
}

KeeperResult<Allocation> BlockNumberAllocator::allocate(Keeper& keeper,
                                                        const std::string& partition,
                                                        const std::string& dedup_id) {
  return allocate(keeper, partition, std::vector<std::string>{dedup_id});
}

KeeperResult<Allocation> BlockNumberAllocator::allocate(Keeper& keeper,
                                                        const std::string& partition,
                                                        const std::vector<std::string>& dedup_ids) {
  std::string lock_data;
  {
    std::lock_guard lock(mu_);
    lock_data = nextLockData(dedup_ids.empty() ? std::string() : dedup_ids.front());
  }
  const std::size_t lock_op = dedup_ids.size();
  // Two tries: the partition node may be removed under us (a dropped partition), then made again.
  for (int attempt = 0;; ++attempt) {
    bool known;
    {
      std::lock_guard lock(mu_);
      known = known_partitions_.contains(partition);
    }
    if (!known) {
      auto created = keeper.create(paths_.blockNumbers(partition), "", CreateMode::kPersistent);
      if (!created && created.error().code != KeeperCode::kNodeExists) {
        return std::unexpected(created.error());
      }
      std::lock_guard lock(mu_);
      known_partitions_.insert(partition);
    }
    std::vector<Op> ops;
    for (const auto& id : dedup_ids) ops.push_back(op::CheckNotExists{paths_.dedupHash(id)});
    ops.push_back(
        op::Create{paths_.blockLockPrefix(partition), lock_data, CreateMode::kEphemeralSequential});
    auto allocated = keeper.multi(ops);
    if (allocated) {
      const std::string& path = (*allocated)[lock_op].path_created;
      auto number = sequenceNumber(path);
      if (!number) {
        return std::unexpected(
            KeeperError{KeeperCode::kOther, path, "unparsable block lock name", {}});
      }
      return BlockNumberLock{partition, *number, path};
    }
    const KeeperError& error = allocated.error();
    if (error.isConnectionLevel()) {
      std::lock_guard lock(mu_);
      lost_.push_back(LostAllocation{keeper.sessionId(), partition, lock_data, clock_.now()});
      return std::unexpected(error);
    }
    const std::size_t failed = error.failed_op_index.value_or(SIZE_MAX);
    if (error.code == KeeperCode::kNodeExists && failed < lock_op) {
      auto existing = keeper.get(paths_.dedupHash(dedup_ids[failed]));
      if (existing) return Duplicate{existing->data, failed};
      // Cleaned from the window in between: no longer a duplicate.
      if (existing.error().code == KeeperCode::kNoNode && attempt == 0) continue;
      return std::unexpected(existing.error());
    }
    if (error.code == KeeperCode::kNoNode && failed == lock_op && attempt == 0) {
      std::lock_guard lock(mu_);
      known_partitions_.erase(partition);
      continue;
    }
    return std::unexpected(error);
  }
}

KeeperResult<std::vector<BlockNumberLock>> BlockNumberAllocator::allocateMany(
    Keeper& keeper, const std::vector<std::pair<std::string, std::string>>& partitions_and_ids) {
  std::vector<std::string> lock_data;
  std::set<std::string> unknown;
  {
    std::lock_guard lock(mu_);
    for (const auto& [partition, dedup_id] : partitions_and_ids) {
      lock_data.push_back(nextLockData(dedup_id));
      if (!known_partitions_.contains(partition)) unknown.insert(partition);
    }
  }
  // No answer: the locks may exist; releaseLostLocks removes them.
  auto rememberLost = [&] {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < partitions_and_ids.size(); ++i) {
      lost_.push_back(LostAllocation{keeper.sessionId(), partitions_and_ids[i].first, lock_data[i],
                                     clock_.now()});
    }
  };
  std::vector<Op> ops;
  for (std::size_t i = 0; i < partitions_and_ids.size(); ++i) {
    const auto& [partition, dedup_id] = partitions_and_ids[i];
    ops.push_back(op::CheckNotExists{paths_.dedupHash(dedup_id)});
    ops.push_back(op::Create{paths_.blockLockPrefix(partition), lock_data[i],
                             CreateMode::kEphemeralSequential});
  }
  if (!unknown.empty()) {
    // The partitions' nodes first, in the same multi: a new generation's attach makes them all,
    // and one round trip fewer per batch is a shorter write pause. One that exists (another
    // allocator made it) fails the multi: then they are made one by one, and the multi again.
    std::vector<Op> creates;
    for (const auto& partition : unknown)
      creates.push_back(op::Create{paths_.blockNumbers(partition), "", CreateMode::kPersistent});
    std::vector<Op> together = creates;
    together.insert(together.end(), ops.begin(), ops.end());
    auto allocated = keeper.multi(together);
    if (allocated) {
      {
        std::lock_guard lock(mu_);
        known_partitions_.insert(unknown.begin(), unknown.end());
      }
      return locksOf(partitions_and_ids, *allocated, creates.size());
    }
    if (allocated.error().isConnectionLevel()) {
      rememberLost();
      return std::unexpected(allocated.error());
    }
    if (allocated.error().code != KeeperCode::kNodeExists)
      return std::unexpected(allocated.error());
    for (const auto& create : creates) {
      auto one = keeper.create(std::get<op::Create>(create).path, "", CreateMode::kPersistent);
      if (!one && one.error().code != KeeperCode::kNodeExists) return std::unexpected(one.error());
    }
    std::lock_guard lock(mu_);
    known_partitions_.insert(unknown.begin(), unknown.end());
  }
  auto allocated = keeper.multi(ops);
  if (!allocated) {
    if (allocated.error().isConnectionLevel()) {
      rememberLost();
    } else if (allocated.error().code == KeeperCode::kNoNode) {
      // A partition node removed under us (a dropped partition): allocate() makes it again.
      std::lock_guard lock(mu_);
      for (const auto& [partition, dedup_id] : partitions_and_ids)
        known_partitions_.erase(partition);
    }
    return std::unexpected(allocated.error());
  }
  return locksOf(partitions_and_ids, *allocated, 0);
}

KeeperResult<std::vector<BlockNumberLock>> BlockNumberAllocator::locksOf(
    const std::vector<std::pair<std::string, std::string>>& partitions_and_ids,
    const std::vector<OpResult>& results, std::size_t first) {
  std::vector<BlockNumberLock> locks;
  for (std::size_t i = 0; i < partitions_and_ids.size(); ++i) {
    const std::string& path = results[first + 2 * i + 1].path_created;
    auto number = sequenceNumber(path);
    if (!number) {
      return std::unexpected(
          KeeperError{KeeperCode::kOther, path, "unparsable block lock name", {}});
    }
    locks.push_back(BlockNumberLock{partitions_and_ids[i].first, *number, path});
  }
  return locks;
}

std::string BlockNumberAllocator::nextLockData(const std::string& dedup_id) {
  return fmt::format("{} {:016x}", dedup_id, next_lock_tag_++);
}

std::optional<BlockNumberLock> BlockNumberAllocator::takeReserved(int64_t session_id,
                                                                  const std::string& partition) {
  std::lock_guard lock(mu_);
  auto it = reserved_.find(partition);
  // A reserve of an earlier session went with it (releaseIdleReserves forgets it).
  if (it == reserved_.end() || it->second.session_id != session_id) return std::nullopt;
  BlockNumberLock taken = std::move(it->second.lock);
  reserved_.erase(it);
  return taken;
}

std::optional<std::string> BlockNumberAllocator::startReserving(const std::string& partition) {
  // A few partitions take a steady insert stream; the others would only hold locks to release.
  constexpr std::size_t kMaxReserves = 4;
  std::lock_guard lock(mu_);
  if (reserved_.contains(partition) || reserving_.contains(partition)) return std::nullopt;
  if (reserved_.size() + reserving_.size() >= kMaxReserves) return std::nullopt;
  reserving_.insert(partition);
  return nextLockData("reserve");
}

void BlockNumberAllocator::finishReserving(int64_t session_id, const std::string& partition,
                                           const std::string& lock_data,
                                           const std::optional<std::string>& created,
                                           bool unknown_outcome) {
  std::lock_guard lock(mu_);
  reserving_.erase(partition);
  if (unknown_outcome) {
    lost_.push_back(LostAllocation{session_id, partition, lock_data, clock_.now()});
    return;
  }
  if (!created) return;
  auto number = sequenceNumber(*created);
  if (!number) {
    // Cannot happen with ZooKeeper's names; leave it to the session rather than guess.
    lost_.push_back(LostAllocation{session_id, partition, lock_data, clock_.now()});
    return;
  }
  reserved_[partition] =
      Reserve{session_id, BlockNumberLock{partition, *number, *created}, clock_.now()};
}

void BlockNumberAllocator::releaseIdleReserves(Keeper& keeper,
                                               std::chrono::steady_clock::duration idle) {
  std::vector<std::string> release;
  {
    std::lock_guard lock(mu_);
    const auto now = clock_.now();
    for (auto it = reserved_.begin(); it != reserved_.end();) {
      if (it->second.session_id != keeper.sessionId()) {
        it = reserved_.erase(it);  // ephemeral: gone with its session
      } else if (now - it->second.since >= idle) {
        release.push_back(it->second.lock.path);
        it = reserved_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // A failed remove leaves the lock to its session, as a crash would.
  for (const auto& path : release) (void)keeper.remove(path);
}

std::vector<std::string> BlockNumberAllocator::reservedForTest() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> paths;
  for (const auto& [partition, reserve] : reserved_) paths.push_back(reserve.lock.path);
  return paths;
}

void BlockNumberAllocator::releaseLostLocks(Keeper& keeper) {
  std::vector<LostAllocation> lost;
  {
    std::lock_guard lock(mu_);
    lost.swap(lost_);
  }
  std::vector<LostAllocation> again;
  for (auto& allocation : lost) {
    // Ephemeral nodes go with their session: a later session has nothing of it to release.
    if (allocation.session_id != keeper.sessionId()) continue;
    auto released = releaseLostLock(keeper, allocation);
    if (!released || !*released) again.push_back(std::move(allocation));
  }
  if (again.empty()) return;
  std::lock_guard lock(mu_);
  lost_.insert(lost_.end(), std::make_move_iterator(again.begin()),
               std::make_move_iterator(again.end()));
}

std::size_t BlockNumberAllocator::lostLocksForTest() const {
  std::lock_guard lock(mu_);
  return lost_.size();
}

KeeperResult<bool> BlockNumberAllocator::releaseLostLock(Keeper& keeper,
                                                         const LostAllocation& lost) {
  // A request sent before the connection dropped can still reach the leader a little later.
  constexpr auto kLostRequestGrace = std::chrono::seconds(30);
  auto locks = keeper.children(paths_.blockNumbers(lost.partition));
  if (!locks) {
    if (locks.error().code == KeeperCode::kNoNode) return true;
    return std::unexpected(locks.error());
  }
  std::vector<std::string> lock_paths;
  for (const auto& name : locks->names)
    lock_paths.push_back(paths_.blockNumbers(lost.partition) + "/" + name);
  auto got = keeper.getMany(lock_paths);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!got[i]) {
      if (got[i].error().code == KeeperCode::kNoNode) continue;  // committed or released meanwhile
      return std::unexpected(got[i].error());
    }
    if (got[i]->data != lost.lock_data || got[i]->stat.ephemeral_owner != lost.session_id) continue;
    auto removed = keeper.remove(lock_paths[i]);
    if (!removed && removed.error().code != KeeperCode::kNoNode)
      return std::unexpected(removed.error());
    return true;
  }
  return clock_.now() - lost.lost_at > kLostRequestGrace;
}

std::expected<Committed, CommitError> commitPart(
    Keeper& keeper, const TablePaths& paths, const LogEntry& entry, const BlockNumberLock& lock,
    const std::optional<std::string>& reserve_lock_data,
    const std::vector<std::string>& more_dedup_ids, const std::string& part_checksum) {
  enum { kLogOp, kDedupOp, kPartOp, kUnlockOp, kMoreDedupOps };
  std::vector<Op> ops = {
      op::Create{paths.logEntryPrefix(), entry.format(), CreateMode::kPersistentSequential},
      op::Create{paths.dedupHash(entry.block_id), entry.new_part_name, CreateMode::kPersistent},
      op::Create{paths.part(entry.new_part_name),
                 part_checksum.empty() ? entry.part_checksum : part_checksum,
                 CreateMode::kPersistent},
      op::Remove{lock.path, -1},
  };
  for (const auto& id : more_dedup_ids)
    ops.push_back(op::Create{paths.dedupHash(id), entry.new_part_name, CreateMode::kPersistent});
  if (entry.quorum >= 2) {
    // This replica has the part: it is the first of the quorum.
    QuorumEntry quorum{
        entry.new_part_name, static_cast<std::size_t>(entry.quorum), {paths.replica}};
    ops.push_back(op::Create{paths.quorumParallel(entry.new_part_name), quorum.format(),
                             CreateMode::kPersistent});
  }
  if (reserve_lock_data) {
    ops.push_back(op::Create{paths.blockLockPrefix(lock.partition), *reserve_lock_data,
                             CreateMode::kEphemeralSequential});
  }
  auto committed = keeper.multi(ops);
  if (committed) {
    Committed done{(*committed)[kLogOp].path_created, std::nullopt};
    if (reserve_lock_data) done.reserve_path = committed->back().path_created;
    return done;
  }
  const KeeperError& error = committed.error();
  if (error.isConnectionLevel())
    return std::unexpected(CommitError{CommitFailure::kUnknownOutcome, error, {}});
  const auto op = error.failed_op_index.value_or(SIZE_MAX);
  if (error.code == KeeperCode::kNodeExists && op == kLogOp) {
    return std::unexpected(CommitError{CommitFailure::kLogExhausted, error, {}});
  }
  const bool more_dedup_op = op >= kMoreDedupOps && op < kMoreDedupOps + more_dedup_ids.size();
  if (error.code == KeeperCode::kNodeExists && (op == kDedupOp || more_dedup_op)) {
    const std::size_t index = op == kDedupOp ? 0 : op - kMoreDedupOps + 1;
    const std::string& id = index == 0 ? entry.block_id : more_dedup_ids[index - 1];
    std::optional<Duplicate> duplicate;
    if (auto existing = keeper.get(paths.dedupHash(id)))
      duplicate = Duplicate{existing->data, index};
    return std::unexpected(CommitError{CommitFailure::kDuplicate, error, duplicate, index});
  }
  if (error.code == KeeperCode::kNoNode && op == kUnlockOp) {
    return std::unexpected(CommitError{CommitFailure::kLockLost, error, {}});
  }
  return std::unexpected(CommitError{CommitFailure::kRejected, error, {}});
}

KeeperResult<bool> partIsCommitted(Keeper& keeper, const TablePaths& paths,
                                   const std::string& part) {
  auto stat = keeper.exists(paths.part(part));
  if (!stat) return std::unexpected(stat.error());
  return stat->has_value();
}

KeeperResult<bool> commitOutcome(Keeper& keeper, const TablePaths& paths, const std::string& part,
                                 const std::string& lock_path) {
  if (!lock_path.empty()) {
    auto fenced = keeper.remove(lock_path);
    if (fenced) return false;
    if (fenced.error().code != KeeperCode::kNoNode) return std::unexpected(fenced.error());
  }
  return partIsCommitted(keeper, paths, part);
}

}  // namespace rtable::core
