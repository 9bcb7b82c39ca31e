// The two ZooKeeper round trips of an insert (DESIGN.md 2.3, ClickHouse's ReplicatedMergeTreeSink):
//
//   1. allocateBlockNumber: one multi = [check that deduplication_hashes/<id> does not exist,
//      create the ephemeral-sequential block_numbers/<partition>/block-]. The sequence number is
//      the part's block number; a collision on the check means the block is a duplicate.
//   2. commitPart: one multi = [create log/log- (a `get` entry), create deduplication_hashes/<id>
//      = part name, create replicas/<me>/parts/<part>, remove the block lock, and for a quorum
//      insert create quorum/parallel/<part>]. Only after it succeeds is the part made visible and
//      the insert acknowledged (for a quorum insert, once the quorum node is gone). The part is
//      durable on this replica's disk before the commit (PartStore); no row data goes into
//      ZooKeeper.
//
// A crash between them leaves an ephemeral lock that goes with the session and a tmp part that is
// removed on start: the block is neither visible nor remembered, so a client's retry inserts it.
// A connection lost with either answer while the session lives on would leave the lock for the
// session's life; the insert (commit) or the next background round (allocation) removes it.
//
// Reserved block numbers: a commit multi may also create the next lock of its partition, kept by
// the allocator for the next insert into that partition. That insert skips round trip 1: its
// dedup check is the commit's create of deduplication_hashes/<id>, which fails if the id exists
// (the part was then written for nothing, which only a retried insert pays). A reserve unused for
// a second is removed, so that it does not keep merges off the blocks after it.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "rtable/common/clock.h"
#include "rtable/replication_core/block.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/log_entry.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::core {

// `<partition>_<hi>_<lo>` (the hash's halves in decimal, as ClickHouse's block_id): the 128-bit
// hash of the block's values, column by column (name, type, null map, values), in the order the
// part stores them. The same rows give the same id however they were formatted on the wire.
std::string blockDedupId(const std::string& partition, const Block& sorted_block);
// With insert_deduplication_token the token decides, not the data: the n-th block (per partition,
// in the order the insert produced them) of an insert gets the hash of "<token>_<n>".
std::string tokenDedupId(const std::string& partition, const std::string& token, std::size_t n);

struct BlockNumberLock {
  std::string partition;
  int64_t block_number = 0;
  std::string path;  // the ephemeral block_numbers/<partition>/block-NNNNNNNNNN
};

struct Duplicate {
  std::string existing_part;  // the value of deduplication_hashes/<id>: the part that has the rows
  std::size_t index = 0;      // which of the ids asked about (a batch of async inserts: several)
};

using Allocation = std::variant<BlockNumberLock, Duplicate>;

// Allocates block numbers for one table generation. Remembers which partition nodes exist, so a
// steady insert stream costs one request here. Thread-safe.
class BlockNumberAllocator {
 public:
  // `clock` (which must outlive this) times reserves and lost allocations.
  explicit BlockNumberAllocator(TablePaths paths,
                                const common::Clock& clock = common::SteadyClock::instance());

  // A lock's data is the dedup id and a number unique to this allocator, so that an allocation
  // whose answer was lost can find its own lock.
  KeeperResult<Allocation> allocate(Keeper& keeper, const std::string& partition,
                                    const std::string& dedup_id);
  // The same for a part that holds the rows of several inserts (async inserts, async_insert.h):
  // one check per id in the same multi; a duplicate names the first id found in the window.
  KeeperResult<Allocation> allocate(Keeper& keeper, const std::string& partition,
                                    const std::vector<std::string>& dedup_ids);
  // Block numbers for several (partition, dedup id) pairs in one round trip: one multi creating
  // the partition nodes not known yet and allocating every lock with its dedup check (when some
  // partition node exists already: the nodes one by one, then the allocation). All or nothing:
  // any id already in the dedup window (or any other answer but connection loss, which leaves
  // the locks to releaseLostLocks) fails the whole call, and the caller allocates one by one
  // with allocate(), which tells duplicates apart.
  KeeperResult<std::vector<BlockNumberLock>> allocateMany(
      Keeper& keeper, const std::vector<std::pair<std::string, std::string>>& partitions_and_ids);

  // An allocation whose answer was lost with the connection may have created its lock, and the
  // session may have lived on: the lock would then keep merges off its block for the session's
  // life. allocate() remembers such allocations; this removes their locks (if they exist) once
  // ZooKeeper answers again. The replica's background rounds call it.
  void releaseLostLocks(Keeper& keeper);
  std::size_t lostLocksForTest() const;

  // The partition's reserved lock, if one is held in `session_id` (taken: it is the caller's now).
  std::optional<BlockNumberLock> takeReserved(int64_t session_id, const std::string& partition);
  // Whether a commit into `partition` should create a reserve: the lock data to create it with,
  // or nothing (one is held or being made, or enough partitions have one). Pair every non-empty
  // answer with one finishReserving().
  std::optional<std::string> startReserving(const std::string& partition);
  // After that commit: `created` is the reserve's path (the commit was applied), or nothing (not
  // applied). With `unknown_outcome` the reserve may exist: it is released like a lost allocation.
  void finishReserving(int64_t session_id, const std::string& partition,
                       const std::string& lock_data, const std::optional<std::string>& created,
                       bool unknown_outcome);
  // Removes reserves unused for `idle` or held in a session other than `keeper`'s.
  void releaseIdleReserves(Keeper& keeper, std::chrono::steady_clock::duration idle);
  std::vector<std::string> reservedForTest() const;  // the reserves' lock paths

 private:
  struct LostAllocation {
    int64_t session_id;
    std::string partition;
    std::string lock_data;
    std::chrono::steady_clock::time_point lost_at;
  };
  // True: released, or certainly never created; false: look again later.
  KeeperResult<bool> releaseLostLock(Keeper& keeper, const LostAllocation& lost);

  struct Reserve {
    int64_t session_id;
    BlockNumberLock lock;
    std::chrono::steady_clock::time_point since;
  };
  std::string nextLockData(const std::string& dedup_id);  // mu_ held
  // The locks a multi allocated, its results from `first` on being allocateMany's pairs of ops.
  static KeeperResult<std::vector<BlockNumberLock>> locksOf(
      const std::vector<std::pair<std::string, std::string>>& partitions_and_ids,
      const std::vector<OpResult>& results, std::size_t first);

  TablePaths paths_;
  const common::Clock& clock_;
  mutable std::mutex mu_;
  std::set<std::string> known_partitions_;
  uint64_t next_lock_tag_;
  std::vector<LostAllocation> lost_;
  std::map<std::string, Reserve> reserved_;  // by partition
  std::set<std::string> reserving_;          // partitions whose commit is creating a reserve
};

struct Committed {
  std::string log_entry_path;               // log/log-NNNNNNNNNN
  std::optional<std::string> reserve_path;  // the lock the commit reserved, if asked to
};

enum class CommitFailure {
  kDuplicate,       // another insert committed the same dedup id after our allocation
  kLockLost,        // our block lock is gone (session expired, or a drop range cleared it)
  kLogExhausted,    // log/ hit the int32 counter limit: "node exists" on log/log- (seed 002)
  kUnknownOutcome,  // connection-level error: the multi may or may not have been applied
  kRejected,        // any other answer of the server (the cause says which); nothing applied
};

struct CommitError {
  CommitFailure failure;
  KeeperError cause;
  std::optional<Duplicate> duplicate;  // for kDuplicate, when it could be read
  std::size_t duplicate_index = 0;  // for kDuplicate: 0 the entry's block_id, i more_dedup_ids[i-1]
};

// The commit multi. `entry` is the get entry (its block_id is the dedup id, new_part_name the
// part). With `reserve_lock_data` it also creates the partition's next block lock with that data.
// `more_dedup_ids`: the ids of the other inserts whose rows the part holds (a batch of async
// inserts), each created beside block_id, so that every insert of the batch is remembered alone.
// `part_checksum` (the part's total, hex; default: the entry's part_checksum, an attach's) is the
// data of this replica's parts node: what a replica fetching the part from here checks it against.
std::expected<Committed, CommitError> commitPart(
    Keeper& keeper, const TablePaths& paths, const LogEntry& entry, const BlockNumberLock& lock,
    const std::optional<std::string>& reserve_lock_data = std::nullopt,
    const std::vector<std::string>& more_dedup_ids = {}, const std::string& part_checksum = "");

// After kUnknownOutcome: the multi was applied iff our parts node exists (it is atomic).
KeeperResult<bool> partIsCommitted(Keeper& keeper, const TablePaths& paths,
                                   const std::string& part);

// After kUnknownOutcome, with the commit's block lock: whether the commit was applied, for good.
// The commit multi removes the lock, so this removes it first, which fences the commit: if that
// remove wins, the commit can never be applied (false); if the lock is gone already (the commit
// removed it, the session ended, or a drop cancelled the insert), the commit was applied or never
// will be, and partIsCommitted says which. Without the fence a commit still on its way could land
// after a "not committed" answer, and the part would be listed here but given up.
KeeperResult<bool> commitOutcome(Keeper& keeper, const TablePaths& paths, const std::string& part,
                                 const std::string& lock_path);

}  // namespace rtable::core
