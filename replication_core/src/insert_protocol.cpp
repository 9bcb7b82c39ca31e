#include "rtable/replication_core/insert_protocol.h"

#include "rtable/replication_core/quorum.h"

#include <fmt/format.h>

#include <charconv>

#include "rtable/replication_core/hash128.h"

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

KeeperResult<Allocation> BlockNumberAllocator::allocate(Keeper& keeper, const std::string& partition,
                                                        const std::string& dedup_id) {
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
    auto allocated = keeper.multi({
        op::CheckNotExists{paths_.dedupHash(dedup_id)},
        op::Create{paths_.blockLockPrefix(partition), dedup_id, CreateMode::kEphemeralSequential},
    });
    if (allocated) {
      const std::string& path = (*allocated)[1].path_created;
      auto number = sequenceNumber(path);
      if (!number) {
        return std::unexpected(KeeperError{KeeperCode::kOther, path, "unparsable block lock name", {}});
      }
      return BlockNumberLock{partition, *number, path};
    }
    const KeeperError& error = allocated.error();
    if (error.code == KeeperCode::kNodeExists && error.failed_op_index == 0u) {
      auto existing = keeper.get(paths_.dedupHash(dedup_id));
      if (existing) return Duplicate{existing->data};
      // Cleaned from the window in between: no longer a duplicate.
      if (existing.error().code == KeeperCode::kNoNode && attempt == 0) continue;
      return std::unexpected(existing.error());
    }
    if (error.code == KeeperCode::kNoNode && error.failed_op_index == 1u && attempt == 0) {
      std::lock_guard lock(mu_);
      known_partitions_.erase(partition);
      continue;
    }
    return std::unexpected(error);
  }
}

std::expected<Committed, CommitError> commitPart(Keeper& keeper, const TablePaths& paths,
                                                 const LogEntry& entry, const BlockNumberLock& lock) {
  enum { kLogOp, kDedupOp, kPartOp, kUnlockOp, kQuorumOp };
  std::vector<Op> ops = {
      op::Create{paths.logEntryPrefix(), entry.format(), CreateMode::kPersistentSequential},
      op::Create{paths.dedupHash(entry.block_id), entry.new_part_name, CreateMode::kPersistent},
      op::Create{paths.part(entry.new_part_name), "", CreateMode::kPersistent},
      op::Remove{lock.path, -1},
  };
  if (entry.quorum >= 2) {
    // This replica has the part: it is the first of the quorum.
    QuorumEntry quorum{entry.new_part_name, static_cast<std::size_t>(entry.quorum), {paths.replica}};
    ops.push_back(op::Create{paths.quorumParallel(entry.new_part_name), quorum.format(), CreateMode::kPersistent});
  }
  auto committed = keeper.multi(ops);
  if (committed) return Committed{(*committed)[kLogOp].path_created};
  const KeeperError& error = committed.error();
  if (error.isConnectionLevel()) return std::unexpected(CommitError{CommitFailure::kUnknownOutcome, error, {}});
  const auto op = error.failed_op_index.value_or(SIZE_MAX);
  if (error.code == KeeperCode::kNodeExists && op == kLogOp) {
    return std::unexpected(CommitError{CommitFailure::kLogExhausted, error, {}});
  }
  if (error.code == KeeperCode::kNodeExists && op == kDedupOp) {
    std::optional<Duplicate> duplicate;
    if (auto existing = keeper.get(paths.dedupHash(entry.block_id))) duplicate = Duplicate{existing->data};
    return std::unexpected(CommitError{CommitFailure::kDuplicate, error, duplicate});
  }
  if (error.code == KeeperCode::kNoNode && op == kUnlockOp) {
    return std::unexpected(CommitError{CommitFailure::kLockLost, error, {}});
  }
  return std::unexpected(CommitError{CommitFailure::kRejected, error, {}});
}

KeeperResult<bool> partIsCommitted(Keeper& keeper, const TablePaths& paths, const std::string& part) {
  auto stat = keeper.exists(paths.part(part));
  if (!stat) return std::unexpected(stat.error());
  return stat->has_value();
}

}  // namespace rtable::core
