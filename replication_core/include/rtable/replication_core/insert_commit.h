// The insert path of one replica (DESIGN.md 2.3, docs/formats.md): the request's rows are parsed
// whole first, so bad input writes nothing; each partition's rows become one block (a part), full
// blocks are written to a staging folder of the request at once. Then, block by block: allocate
// a block number with the dedup check (or take the number the last commit reserved), make the
// part durable here (PartStore::makeDurable), commit it in ZooKeeper (insert_protocol.h), make
// it visible. The insert is acknowledged after the last block.
//
// Thread safety: InsertCommit's methods may be called concurrently; a PendingInsert belongs to
// one request.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <expected>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/block.h"
#include "rtable/replication_core/insert_protocol.h"
#include "rtable/replication_core/keeper_session.h"
#include "rtable/replication_core/part_store.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::core {

class ReplicationWorker;
struct SortedBlock;  // insert_commit.cpp

struct InsertOptions {
  std::string deduplication_token;  // insert_deduplication_token: the token decides, not the data
  // insert_quorum: acknowledge once this many replicas have every part (0 or 1: this one).
  std::size_t quorum = 0;
  // insert_quorum=auto: the quorum is a majority of the table's registered replicas.
  bool quorum_auto = false;
  // insert_quorum_timeout (ClickHouse's default: 600 s).
  std::chrono::milliseconds quorum_timeout{600000};
};

struct InsertResult {
  std::size_t rows = 0;    // rows now in the table (deduplicated blocks not counted)
  std::size_t blocks = 0;  // blocks (parts) the insert was split into
  std::size_t deduplicated_blocks = 0;
  std::vector<std::string> parts;  // the parts written, or found, for each block
};

struct InsertError {
  enum class Kind {
    kUnavailable,     // no ZooKeeper session: nothing was written, retry later
    kLogExhausted,    // the table's log counter is at 2147483647 (seed 002): inserts cannot succeed
    kUnknownOutcome,  // some block may or may not be committed: a retry with the same data is safe
    kTooFewReplicas,  // fewer live replicas than the quorum asked: nothing was written
    kQuorumTimeout,   // committed here, not yet on enough replicas: it may still become visible
    kBadRequest,      // the request names something that cannot be done (nothing changed)
    kNotFound,        // the request names something that does not exist (nothing changed)
    kStorageFull,     // this replica's data volume is full: nothing was committed, retry elsewhere
    kOverloaded,      // the async insert buffer is full: nothing was queued, retry after a moment
    kInternal,
  };
  Kind kind;
  std::string message;
};

// One block of an insert on its way to its commit: its rows, until they are encoded (a held part)
// or written to the staging folder (any other).
struct StagedBlock {
  NewPart part;
  std::optional<Block> unwritten;
  // A part holding several async inserts: the other inserts' ids, each checked and created
  // beside part.dedup_id (insert_protocol.h commitPart).
  std::vector<std::string> more_dedup_ids;
};

// One partition's rows of one insert, sorted, with the dedup id a synchronous insert of the same
// rows would have: the unit an async insert (async_insert.h) is deduplicated by.
struct InsertPiece {
  std::string partition;
  Block rows;
  std::string dedup_id;
};

// What became of one piece of a batch (InsertCommit::commitPieces).
struct PieceOutcome {
  std::string part;                  // the part that has its rows: written now, or found
  bool duplicate = false;            // in the window already, or twice in the batch
  std::optional<InsertError> error;  // not committed (or not known): the insert failed
};

// The blocks of one insert request between parsing and commit. Its staged parts are removed with
// it, so an insert that fails (bad input, lost client) leaves nothing behind.
class PendingInsert {
 public:
  // Parts are staged as `<staging_prefix>-<provisional name>` folders.
  PendingInsert(const TableSchema& schema, std::size_t max_part_rows, InsertOptions options,
                std::filesystem::path staging_prefix);
  ~PendingInsert();
  PendingInsert(const PendingInsert&) = delete;
  PendingInsert& operator=(const PendingInsert&) = delete;

  // Adds parsed rows (the schema's columns). Full parts are written to staging at once.
  std::expected<void, std::string> add(Block block);
  std::size_t rows() const { return rows_; }
  // The values not yet staged (valueBytes): what an async insert would add to its batch.
  uint64_t bufferedValueBytes() const;
  const InsertOptions& options() const { return options_; }

  // Sorts and identifies what is still buffered: every block of the insert, in order.
  std::expected<std::vector<StagedBlock>*, std::string> finish();
  // Instead of finish(), for an async insert: each partition's rows sorted and identified, as
  // finish() would; nothing if a part was written already (the insert is too big to batch).
  std::optional<std::vector<InsertPiece>> takePieces();

 private:
  // `write_now`: write the staged part at once (a full buffer); otherwise the commit encodes or
  // writes it while ZooKeeper allocates its block number.
  std::expected<void, std::string> flush(const std::string& partition, bool write_now);
  std::expected<void, std::string> stage(const std::string& partition, SortedBlock sorted,
                                         bool write_now);

  const TableSchema& schema_;
  const std::size_t max_part_rows_;
  InsertOptions options_;
  std::filesystem::path staging_prefix_;
  // One partition's rows: the parsed blocks as they came, joined once (Block::concat) when the
  // part is made.
  struct PartitionRows {
    std::string partition;
    std::vector<Block> blocks;
    std::size_t rows = 0;

    Block take();
  };
  std::vector<PartitionRows> buffers_;  // in first-seen order
  std::vector<StagedBlock> blocks_;
  std::map<std::string, std::size_t> blocks_per_partition_;
  std::size_t rows_ = 0;
};

class InsertCommit {
 public:
  // `paths`: the generation inserts go to. The references must outlive this.
  InsertCommit(const TableSpec& spec, TablePaths paths, std::size_t max_part_rows,
               KeeperSession& session, PartStore& store, BlockNumberAllocator& allocator,
               ReplicationWorker& worker, metrics::ReplicaMetrics& metrics);

  std::unique_ptr<PendingInsert> begin(InsertOptions options);
  std::expected<InsertResult, InsertError> commit(PendingInsert& insert);

  // Commits the pieces of many inserts together (a flush of the async insert buffer): per
  // partition one part and one log entry with every piece's rows, and every piece's dedup id in
  // the same multi. A piece whose id is in the window already (or earlier in the batch) is left
  // out and answered as a duplicate; the part is then made again without it. `options` (the
  // quorum) are the batch's: the buffer keeps inserts of other quorum settings apart.
  std::vector<PieceOutcome> commitPieces(std::vector<InsertPiece> pieces,
                                         const InsertOptions& options);

 private:
  using PartWrite = std::future<std::expected<PartChecksums, std::string>>;
  struct BlockCommitted {
    std::string part;  // the part written, or the one found to have the rows
    // The block was a duplicate of the id with this index (0: part.dedup_id, i:
    // more_dedup_ids[i-1]), which exists already: nothing was written.
    std::optional<std::size_t> duplicate;
  };
  // Commits one block. `writing`: its staged write, if one was started. `reserve`: use the
  // partition's reserved block number if there is one, and reserve the next.
  std::expected<BlockCommitted, InsertError> commitOne(Keeper& keeper, StagedBlock& block,
                                                       PartWrite& writing, std::size_t quorum,
                                                       bool reserve);
  // Waits until each part is on `quorum` replicas (0: returns at once).
  std::expected<void, InsertError> awaitQuorum(const std::vector<std::string>& parts,
                                               std::size_t quorum, const InsertOptions& options,
                                               std::chrono::steady_clock::time_point deadline);
  // The quorum an insert asks for, checked against the live replicas before anything is written
  // (ClickHouse's checkQuorumPrecondition): 0 for none.
  std::expected<std::size_t, InsertError> checkQuorum(const InsertOptions& options);

  const TableSpec& spec_;
  const TablePaths paths_;
  const std::size_t max_part_rows_;
  KeeperSession& session_;
  PartStore& store_;
  BlockNumberAllocator& allocator_;
  ReplicationWorker& worker_;
  metrics::ReplicaMetrics& metrics_;
  std::atomic<uint64_t> next_staging_id_{0};
};

}  // namespace rtable::core
