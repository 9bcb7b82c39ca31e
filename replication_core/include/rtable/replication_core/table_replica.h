// One replica of one generation of a replicated table: what the HTTP API and the process serve.
// A thin facade over the classes that own the replica's state:
//   KeeperSession      the ZooKeeper session, renewed (and the replica re-activated) after expiry
//   PartStore          the parts on disk and in memory, the part journal, durability
//   InsertCommit       the insert path (allocation with dedup, commit, reserved block numbers)
//   ReplicationWorker  the queue, the log puller, fetches, merges, drops, clones, leader work
// The generation is a value every one of them takes (TablePaths), so a second generation of the
// same table can be opened beside the first (the table swap).
//
// Start-up (open): the previous process's session is waited out first (its is_active must go)
// so that no late commit of it can land after ZooKeeper was asked which parts this replica
// has; then local parts are reconciled with that list (PartStore::load) and the replica starts.
//
// Thread safety: all public methods may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/async_insert.h"
#include "rtable/replication_core/insert_commit.h"
#include "rtable/replication_core/insert_protocol.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/keeper_session.h"
#include "rtable/replication_core/part_store.h"
#include "rtable/replication_core/replication_worker.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::core {

struct ReplicaState {
  std::string table;
  std::string replica;
  int64_t generation = 1;
  bool readonly = false;
  std::size_t active_parts = 0;
  uint64_t rows = 0;
  std::optional<SequentialCounter> log;          // read from ZooKeeper when the state is asked for
  std::vector<std::string> broken_parts;         // detached on start, with reasons
  std::vector<std::string> unexpected_parts;     // detached on start: on disk, not in ZooKeeper
  std::vector<std::string> lost_parts;           // in ZooKeeper, not on disk
  std::vector<std::string> uncertain_parts;      // commit outcome not known yet
  bool lost = false;                             // waiting to clone a healthy replica
  std::vector<QueueEntry> queue;                 // in execution order
  std::map<std::string, uint64_t> postponed;     // postponements so far, by reason
  std::map<std::string, std::size_t> executing;  // entries executing now, by action
};

struct TableReplicaOptions {
  std::size_t max_part_rows = 1048576;  // ClickHouse's max_insert_block_size
  PartStoreOptions parts;
  ReplicationOptions replication;
  bool background = true;  // replication, merges, checkpoints and cleanup in threads
  // The generation served (<root>/<generation> in ZooKeeper, DESIGN.md 2.2); 0: the one
  // <root>/active names when the replica opens (1 for a table that does not exist yet).
  int64_t generation = 0;
  // The generation this one replaces (the table swap), open beside it: attach entries take their
  // parts from its disk by hard link. Must outlive this replica; null: fetched instead.
  const class TableReplica* attach_from = nullptr;
  // Opened with merge assignment frozen (freezeMerges): TableHost opens a generation so until it
  // knows whether a swap runs, since a merge assigned in that moment would change the parts the
  // swap attaches and verifies.
  bool merges_frozen = false;
  // Times checkpoints, background rounds, backoff, reserves and cleanup (a test's FakeClock);
  // must outlive the replica. Null: the steady clock.
  const common::Clock* clock = nullptr;
};

class TableReplica {
 public:
  // Creates or joins the table in ZooKeeper, waits out this replica's previous session, loads
  // and reconciles local parts, activates.
  static std::expected<std::unique_ptr<TableReplica>, std::string> open(
      const TableSpec& spec, KeeperFactory keeper_factory, prometheus::Registry& registry,
      TableReplicaOptions options = {});
  ~TableReplica();

  const TableSpec& spec() const { return spec_; }
  const TablePaths& paths() const { return paths_; }

  std::unique_ptr<PendingInsert> beginInsert(InsertOptions options) {
    return inserts_->begin(std::move(options));
  }
  std::expected<InsertResult, InsertError> commit(PendingInsert& insert) {
    auto committed = inserts_->commit(insert);
    if (!committed && committed.error().kind == InsertError::Kind::kStorageFull)
      worker_->noteOutOfSpace(committed.error().message);
    return committed;
  }
  // An insert's staging found the data volume full (ReplicationWorker::noteOutOfSpace).
  void noteOutOfSpace(const std::string& message) { worker_->noteOutOfSpace(message); }
  // An async insert (async_insert.h): the pieces join the buffer; `hold` is kept until they are
  // committed. The ticket tells the outcome.
  std::expected<std::shared_ptr<AsyncInsertTicket>, InsertError> enqueueAsync(
      std::vector<InsertPiece> pieces, const InsertOptions& options, std::shared_ptr<void> hold) {
    return async_inserts_->enqueue(std::move(pieces), options, std::move(hold));
  }
  // Flushes the async insert buffer now (a table swap's pause waits for what it holds).
  void flushAsyncInserts() { async_inserts_->flushNow(); }

  // The active part with this partition and checksum (the table swap attaches it), or null.
  DataPartPtr activePartWithChecksum(const std::string& partition,
                                     const std::string& checksum_hex) const;
  // Attaches `previous`'s active parts into this generation (ReplicationWorker::attachParts).
  std::expected<AttachSummary, std::string> attachPartsOf(const TableReplica& previous) {
    return worker_->attachParts(previous.activeParts());
  }

  // Attaches parts from outside the table (a restore from a backup), `parts[i]` under
  // `dedup_ids[i]` (ReplicationWorker::attachParts).
  std::expected<AttachSummary, std::string> attachParts(const std::vector<DataPartPtr>& parts,
                                                        const std::vector<std::string>& dedup_ids) {
    return worker_->attachParts(parts, dedup_ids);
  }
  // Where files meant to become parts are written first (the directory PartStore::open empties:
  // never a part after a crash), on the parts' file system.
  std::filesystem::path stagingDir() const { return store_->dataDir() / kStagingDir; }

  // A consistent set of active parts: reads of them stay valid while a merge replaces them.
  std::vector<DataPartPtr> activeParts() const { return store_->activeParts(); }
  DataPartPtr activePart(const PartName& name) const { return store_->activePart(name); }
  uint64_t rowCount() const { return store_->rowCount(); }
  // Inserts can commit: a live ZooKeeper session (renewed if it expired), and not lost (a lost
  // replica takes none until cloned). No request to ZooKeeper while the session lives, so a
  // readiness probe may ask it often.
  bool writable() { return session_.current() != nullptr && !worker_->lost(); }
  // Everything /replica shows, including the log counter read from ZooKeeper.
  ReplicaState state();

  std::size_t runBackgroundRoundForTest() { return worker_->runRoundForTest(); }
  void executeQueueForTest() { worker_->executeQueueForTest(); }
  std::expected<std::string, InsertError> dropPartition(const std::string& partition) {
    return worker_->dropPartition(partition);
  }
  // Removes another replica of this table from ZooKeeper (dropReplica), e.g. after a scale-down,
  // so that the log can be trimmed past its pointer. kBadRequest for this replica itself, for a
  // replica that is still active, or for an unknown one.
  std::expected<void, InsertError> dropReplica(const std::string& replica);
  bool syncQueue(std::chrono::milliseconds timeout) { return worker_->syncQueue(timeout); }
  void freezeMerges(bool frozen) { worker_->freezeMerges(frozen); }
  // Stops background work, writes held parts out and closes the session, then removes this
  // generation's files (the swap's cleanup; its ZooKeeper subtree is the driver's to remove).
  // Generation 1's directory keeps the later generations' directories inside it.
  std::expected<void, std::string> closeAndRemoveFiles();
  std::string checkQueueInvariant() const { return worker_->checkQueueInvariant(); }

  // Before a stop that may be for good (SIGTERM: a scale-down's pod never comes back): stops the
  // background work and waits, up to `timeout`, until every part this replica lists is on some
  // other live replica, which fetches it from here meanwhile (the HTTP server still serves part
  // fetches while it drains). With no other live replica there is no one to wait for. Returns the
  // parts still only here (empty: this replica takes no row with it).
  std::vector<std::string> handOff(std::chrono::milliseconds timeout);

  // Stops background work and writes held parts out; in-flight inserts finish. The ZooKeeper
  // session is closed last.
  void shutdown();

 private:
  TableReplica(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
               TableReplicaOptions options);
  std::expected<void, std::string> start();
  // Marks this replica live in `keeper`'s session and reads is_lost.
  KeeperStatus activate(Keeper& keeper);

  const TableSpec spec_;
  const TableReplicaOptions options_;
  const TablePaths paths_;
  metrics::ReplicaMetrics metrics_;
  const common::Clock& clock_;
  KeeperSession session_;
  BlockNumberAllocator allocator_;
  std::unique_ptr<PartStore> store_;           // set by start()
  std::unique_ptr<ReplicationWorker> worker_;  // set by start()
  std::unique_ptr<InsertCommit> inserts_;      // set by start()
  // Set by start(); declared last, so that it is destroyed (its flusher stopped) first.
  std::unique_ptr<AsyncInsertQueue> async_inserts_;
  std::atomic<bool> stopped_{false};
};

}  // namespace rtable::core
