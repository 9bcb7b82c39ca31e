// One replica of a replicated table: its parts on local disk, its registration in ZooKeeper, the
// insert path, reads, and replication (DESIGN.md 2.4): the log is pulled into this replica's
// queue, whose entries run out of order in a fetch pool and a merge pool. Merges are chosen by
// the leader only, written to the log, and executed by every replica, so parts are the same
// everywhere. A replica that lacks a merge's sources fetches the merged part instead; a new
// replica of a table with history (or a lost one) clones a healthy replica first.
//
// Insert (DESIGN.md 2.3): the request's rows are parsed whole first, so bad input writes nothing;
// full parts go to a staging folder of the request. Then, part by part: allocate a block number
// with the dedup check, rename the part to its final name (a small part is held in memory
// instead, and journaled: PartJournal), commit it in ZooKeeper, make it visible. The insert is acknowledged after the last part. At start, local parts are reconciled
// with replicas/<me>/parts: a part on disk that ZooKeeper does not list was never acknowledged and
// is moved to detached/unexpected_<name>, so a client's retry of it cannot double its rows.
//
// Thread safety: all public methods may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <expected>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/active_part_set.h"
#include "rtable/replication_core/block.h"
#include "rtable/replication_core/dedup_window.h"
#include "rtable/replication_core/insert_protocol.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/part_journal.h"
#include "rtable/replication_core/replication_log.h"
#include "rtable/replication_core/replication_queue.h"
#include "rtable/replication_core/sequential_counter.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::core {

using KeeperFactory = std::function<KeeperResult<std::unique_ptr<Keeper>>()>;

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
  std::size_t rows = 0;               // rows now in the table (deduplicated blocks not counted)
  std::size_t blocks = 0;             // blocks (parts) the insert was split into
  std::size_t deduplicated_blocks = 0;
  std::vector<std::string> parts;     // the parts written, or found, for each block
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
    kInternal,
  };
  Kind kind;
  std::string message;
};

// One active part as readers see it. The directory is removed when the part is replaced by a
// merge and the last reader lets go of it.
struct DataPart {
  PartName name;
  std::filesystem::path dir;
  // A small inserted part held in memory, with no directory yet: until the part journal's next
  // checkpoint writes it out (and another DataPart replaces this one), or a merge replaces it.
  std::shared_ptr<const PartImage> image;
  uint64_t rows = 0;
  PartChecksums checksums;
  uint64_t bytes = 0;
  std::atomic<bool> remove_when_unused{false};
  ~DataPart();
};
using DataPartPtr = std::shared_ptr<DataPart>;

// The part's rows, from memory or from its directory.
std::expected<Block, std::string> readDataPart(const DataPart& part, const TableSchema& schema);

struct ReplicaState {
  std::string table;
  std::string replica;
  int64_t generation = 1;
  bool readonly = false;
  std::size_t active_parts = 0;
  uint64_t rows = 0;
  std::optional<SequentialCounter> log;  // read from ZooKeeper when the state is asked for
  std::vector<std::string> broken_parts;      // detached on start, with reasons
  std::vector<std::string> unexpected_parts;  // detached on start: on disk, not in ZooKeeper
  std::vector<std::string> lost_parts;        // in ZooKeeper, not on disk
  std::vector<std::string> uncertain_parts;   // commit outcome not known yet
  bool lost = false;                          // waiting to clone a healthy replica
  std::vector<QueueEntry> queue;              // in execution order
  std::map<std::string, uint64_t> postponed;  // postponements so far, by reason
};

struct TableReplicaOptions {
  std::size_t max_part_rows = 1048576;  // ClickHouse's max_insert_block_size
  // Background merges: a partition with at least `merge_min_parts` active parts merges
  // `merge_min_parts` to `merge_max_parts` neighbouring parts, the run that rewrites the fewest rows
  // per part it removes (selectMergeRange). 100 is ClickHouse's max_parts_to_merge_at_once: a
  // burst of single-row inserts is merged a hundred parts at a time.
  std::size_t merge_min_parts = 6;
  std::size_t merge_max_parts = 100;
  // At most this many merges wait in the queue (ClickHouse's max_replicated_merges_in_queue).
  std::size_t max_queued_merges = 16;
  // Between background periods the leader looks for merges this often while parts arrive, in
  // partitions with at least `merge_early_min_parts` parts: a burst of inserts is merged before a
  // returning replica would fetch it part by part, in merges wide enough not to multiply merges
  // (and their ZooKeeper writes) for a steady stream.
  std::chrono::milliseconds merge_assignment_interval{200};
  std::size_t merge_early_min_parts = 20;
  std::chrono::milliseconds background_period{1000};
  // A new log entry wakes the replica, but pulls are at least this far apart: pulls then cover
  // several entries (fewer ZooKeeper writes per insert) at the price of this much delay.
  std::chrono::milliseconds min_pull_interval{100};
  // A fetch gives up on a source that sends nothing for this long.
  std::chrono::milliseconds fetch_timeout{30000};
  bool background = true;  // replication, merges and dedup window cleanup in threads
  // Inserted parts up to this size (all files; before compression, rows up to it are tried) are
  // held in memory and made durable by one append to the part journal, instead of files fsynced
  // one by one (PartJournal); the next checkpoint writes them out, unless a merge took them first.
  // 0: every part's files are written and fsynced before the commit.
  uint64_t journal_part_bytes = 1 << 20;
  // How often the background work makes journaled parts durable by themselves and empties the
  // journal (it also bounds how much a start-up after a crash reads back).
  std::chrono::milliseconds journal_checkpoint_interval{5000};
  // The bytes of parts held in memory, about (concurrent inserts may each add one more part).
  // Past it, small parts are written as files (unsynced, journaled) and a checkpoint is started
  // early: memory stays bounded under any insert load.
  uint64_t held_parts_max_bytes = 64 << 20;
  // A held inserted part whose journal record is at most this big travels in its commit multi
  // instead of the journal (replicas/<me>/part_images/<part>, removed by the next checkpoint that
  // writes it out): ZooKeeper's fsync of the commit makes it durable, and the insert waits for
  // one device flush instead of two (0.28-0.32 ms per single-row insert here). 0: the journal.
  uint64_t keeper_part_image_bytes = 16 << 10;
  // The bytes of part images in ZooKeeper at once, about (ZooKeeper holds every node in memory).
  // Past it, small parts go to the journal and a checkpoint is started early.
  uint64_t keeper_part_images_max_bytes = 8 << 20;
  // A block number reserved by a commit for the next insert into its partition (insert_protocol.h)
  // is given up after this long unused: until then merges cannot cover it.
  std::chrono::milliseconds reserve_idle{1000};
};

// One block of an insert, not yet committed: sorted rows (held until the commit writes them, for
// a small insert) or a part already written to the staging folder (a large one).
struct PendingPartFile {
  std::string partition;
  std::string dedup_id;
  std::filesystem::path dir;  // where the part is, or will be, staged
  uint64_t rows = 0;
  std::optional<Block> unwritten;
  std::optional<PartChecksums> checksums;  // once written
  std::shared_ptr<const PartImage> image = nullptr;  // encoded in memory, not in `dir` (a small part)
  bool synced = true;  // false: written without fsync, for the part journal (or a later sync)
};

class PendingInsert;
class WorkerPool;
struct SortedBlock;  // table_replica.cpp

class TableReplica {
 public:
  // Loads and verifies local parts, creates or joins the table in ZooKeeper, reconciles, activates.
  static std::expected<std::unique_ptr<TableReplica>, std::string> open(
      const TableSpec& spec, KeeperFactory keeper_factory, prometheus::Registry& registry,
      TableReplicaOptions options = {});
  ~TableReplica();

  const TableSpec& spec() const { return spec_; }

  std::unique_ptr<PendingInsert> beginInsert(InsertOptions options);
  std::expected<InsertResult, InsertError> commit(PendingInsert& insert);

  // A consistent set of active parts: reads of them stay valid while a merge replaces them.
  std::vector<DataPartPtr> activeParts() const;
  uint64_t rowCount() const;
  // Whether inserts can be committed now: a live ZooKeeper session (renewed if it expired). No
  // request to ZooKeeper while the session lives, so a readiness probe may ask it often.
  // Inserts can commit: a ZooKeeper session, and not lost (a lost replica takes none until cloned).
  bool writable() { return keeper() != nullptr && !lost_; }
  // Everything /replica shows, including the log counter read from ZooKeeper.
  ReplicaState state();

  // Runs one round of background work now, in this thread: pull the log, (as leader) clean the
  // dedup window and assign merges, execute whatever the queue allows. Returns the number of
  // merges executed.
  std::size_t runBackgroundRoundForTest();

  // DROP PARTITION: a drop entry covering every block of `partition` allocated so far goes to the
  // log (inserts still in flight in that range are cancelled: their locks go in the same multi),
  // and the partition's dedup ids are forgotten, so the same rows can be inserted again. Every
  // replica executes it from its queue. Returns the drop range part name.
  std::expected<std::string, InsertError> dropPartition(const std::string& partition);

  // Removes another replica of this table from ZooKeeper (dropReplica), e.g. after a scale-down,
  // so that the log can be trimmed past its pointer. kBadRequest for this replica itself, for a
  // replica that is still active, or for an unknown one.
  std::expected<void, InsertError> dropReplica(const std::string& replica);

  // Waits until every log entry that exists now has been executed here (POST /sync). False when
  // `timeout` passed first.
  bool syncQueue(std::chrono::milliseconds timeout);
  // "" when virtual_parts = current parts + queue holds, else what differs.
  std::string checkQueueInvariant() const;

  // Before a stop that may be for good (SIGTERM: a scale-down's pod never comes back): stops the
  // background work and waits, up to `timeout`, until every part this replica lists is on some
  // other live replica, which fetches it from here meanwhile (the HTTP server still serves part
  // fetches while it drains). With no other live replica there is no one to wait for. Returns the
  // parts still only here (empty: this replica takes no row with it).
  std::vector<std::string> handOff(std::chrono::milliseconds timeout);

  // Stops background work; in-flight inserts finish. The ZooKeeper session is closed last.
  void shutdown();

 private:
  TableReplica(TableSpec spec, KeeperFactory factory, prometheus::Registry& registry,
               TableReplicaOptions options);
  std::expected<void, std::string> start();
  // Joins the background thread and stops the fetch and merge pools (running tasks finish).
  void stopBackgroundWork();
  // The current session, renewed (and the replica re-activated) after expiry; nullptr if ZooKeeper
  // cannot be reached now.
  std::shared_ptr<Keeper> keeper();
  using PartWrite = std::future<std::expected<PartChecksums, std::string>>;
  // `writing`: the part's write, if it was not written yet; waited for before the rename.
  // `reserve`: use the partition's reserved block number if there is one, and reserve the next.
  std::expected<std::string, InsertError> commitOne(Keeper& keeper, PendingPartFile& pending,
                                                    PartWrite& writing, InsertResult& result,
                                                    std::size_t quorum, bool reserve);
  // Pulls new log entries into the queue; false if ZooKeeper could not be asked.
  bool updateQueue(Keeper& keeper);
  // Leader only: chooses merges among parts every replica will have and writes them to the log.
  // Only partitions with at least `min_parts` parts are looked at.
  std::size_t assignMerges(Keeper& keeper, std::size_t min_parts);
  // Takes every entry the queue lets run now: into the pools, or (`inline_execution`) executes
  // them here. Returns the merges executed here.
  std::size_t scheduleQueue(bool inline_execution);
  // Runs one selected entry and reports the outcome to the queue.
  bool executeEntry(const SelectedEntry& selected);
  // Entries with nothing to do (their part is here already): their queue nodes go in multis of
  // up to 100, so a replica catching up on a log mostly covered by merged parts pays one round
  // trip per hundred such entries, not one each.
  void finishNoOpEntries(const std::vector<SelectedEntry>& entries);
  // Why an executed entry did not finish. `gave_way`: another running entry makes the part it
  // needs, so it waits as postponed rather than failed (ReplicationQueue::giveWay).
  struct EntryError {
    EntryError(std::string text) : message(std::move(text)) {}  // NOLINT: every plain error converts
    EntryError(const char* text) : message(text) {}             // NOLINT
    std::string message;
    bool gave_way = false;
  };
  using EntryOutcome = std::expected<void, EntryError>;
  // Reports outcomes to the queue and removes the queue nodes the queue says are pointless now.
  void reportOutcomes(const std::vector<std::pair<const SelectedEntry*, EntryOutcome>>& outcomes,
                      Keeper* keeper);
  EntryOutcome executeFetch(Keeper& keeper, const SelectedEntry& selected);
  std::expected<void, std::string> executeMerge(Keeper& keeper, const SelectedEntry& selected);
  std::expected<void, std::string> executeDropRange(Keeper& keeper, const SelectedEntry& selected);
  // The multi that registers a part made here (fetched or merged: its files at `dir`, or a held
  // `image`; `rows` 0 if unknown). Refused: the files are removed, a held part forgotten. No
  // answer: the part becomes an uncertain part, resolved later.
  std::expected<void, std::string> registerPart(Keeper& keeper, const std::vector<Op>& ops,
                                                const PartName& part, const std::filesystem::path& dir,
                                                const PartChecksums& checksums,
                                                std::shared_ptr<const PartImage> image = nullptr,
                                                uint64_t rows = 0);
  // A small merge result held in memory and made durable as a small insert is: by its image in
  // the merge's multi (`keeper_record`, for the caller to add) or by the journal. Nothing if it is
  // too big, the held parts are full, or the journal refuses it: the caller writes it as files.
  struct HeldMerge {
    std::shared_ptr<const PartImage> image;
    std::optional<std::string> keeper_record;
  };
  HeldMerge holdMergedPart(const PartName& name, const Block& rows);
  // A lost replica (or a new one of a table with history) becomes a copy of a healthy one.
  // False while there is none to copy.
  bool cloneIfLost(Keeper& keeper);
  // is_lost into lost_, right after an activation (see the definition for why that is safe).
  KeeperStatus readLost(Keeper& keeper);
  ReplicationQueue::LocalPartLookup localPartLookup() const;
  void resolveUncertainParts(Keeper& keeper);
  // Makes a committed part's rename durable: by the part journal (small parts written without
  // fsync) or by syncing its files and the table directory.
  std::expected<void, std::string> makeDurable(const PartName& name, PendingPartFile& pending);
  // Checkpoints the journal if one is due, and sets the journal's metrics either way.
  void checkpointJournalIfDue();
  // A journal checkpoint: rotate, write every held part out (no fsync), syncfs, drop the old files.
  std::expected<void, std::string> checkpointJournal();
  std::expected<void, std::string> writeHeldParts();
  // The record to put in ZooKeeper with the commit of held part `name`, if it may go there
  // (keeper_part_image_bytes, keeper_part_images_max_bytes); otherwise the journal takes it.
  std::optional<std::string> keeperImageFor(const PartName& name, const PartImage& image);
  // Records that a multi created (or may have created) the image of `name`, `bytes` long.
  void noteKeeperImage(const PartName& name, uint64_t bytes);
  // Removes these parts' images from ZooKeeper (they are durable on disk now) and forgets them;
  // those it could not remove stay for the next checkpoint.
  void removeKeeperImages(Keeper& keeper, const std::vector<PartName>& names);
  // Restores committed parts whose only copy was their image in ZooKeeper; returns every image
  // listed (all to be removed once the table directory is synced).
  std::expected<std::vector<PartName>, std::string> restoreFromKeeperImages(
      Keeper& keeper, const std::set<std::string>& in_keeper);
  // Wakes the background for an early checkpoint (once until it runs).
  void requestCheckpoint();
  // A part held in memory leaves held_parts_ (its commit failed, or it left the table);
  // a directory a checkpoint wrote for it is removed.
  void forgetHeldPart(const PartName& name);
  // Takes an active part out of the table (merged or dropped); its files go with its last reader.
  std::map<PartName, DataPartPtr>::iterator retirePartLocked(std::map<PartName, DataPartPtr>::iterator it);
  bool isLeader(Keeper& keeper);
  // Lock order: pull_mu_, queue_mu_, parts_mu_.
  // `image`: an inserted part held in memory (it becomes a DataPart with files instead if a
  // checkpoint wrote it out while its commit ran).
  void makeVisible(const PartName& name, PartChecksums checksums, uint64_t rows,
                   std::shared_ptr<const PartImage> image = nullptr);
  void makeVisibleLocked(const PartName& name, PartChecksums checksums, uint64_t rows,
                         std::shared_ptr<const PartImage> image = nullptr);
  // Block numbers locked in block_numbers/<partition>: inserts in flight on any replica.
  KeeperResult<std::vector<int64_t>> lockedBlockNumbers(Keeper& keeper, const std::string& partition);
  // Whether a merge into `result` would cover a block that is allocated but not visible here: one
  // of `locked`, or a block this replica committed and has not made visible yet. Such a merge
  // would hide that block's rows. Requires parts_mu_.
  bool rangeHasUnpublishedBlocksLocked(const PartName& result, const std::vector<int64_t>& locked) const;
  void backgroundLoop();
  void updateQueueMetrics();
  void cleanLog(Keeper& keeper);
  void updateLogMetrics(Keeper& keeper);
  // `rows` 0: read from count.txt. `image`: a part held in memory (no directory yet).
  DataPartPtr makeDataPart(const PartName& name, PartChecksums checksums, uint64_t rows,
                           std::shared_ptr<const PartImage> image = nullptr);

  friend class PendingInsert;

  const TableSpec spec_;
  const KeeperFactory keeper_factory_;
  const TableReplicaOptions options_;
  const TablePaths paths_;
  metrics::ReplicaMetrics metrics_;
  metrics::CounterRateEstimator counter_rate_;
  BlockNumberAllocator allocator_;
  std::unique_ptr<PartJournal> journal_;  // set by start()
  std::chrono::steady_clock::time_point last_checkpoint_;  // background thread only
  DedupWindowCleaner dedup_cleaner_;

  std::mutex keeper_mu_;
  std::shared_ptr<Keeper> keeper_;

  mutable std::mutex parts_mu_;
  ActiveDataPartSet active_set_;
  std::map<PartName, DataPartPtr> active_parts_;
  std::vector<std::string> broken_parts_;
  std::vector<std::string> unexpected_parts_;
  std::vector<std::string> lost_parts_;
  // Parts whose commit multi got no answer: on disk under their final name, made visible or
  // removed once ZooKeeper says whether the multi was applied.
  std::map<PartName, PendingPartFile> uncertain_parts_;
  // Small inserted parts and merge results held in memory, from before their journal append (or
  // their commit, for a part whose image goes to ZooKeeper) until a checkpoint writes
  // them out (`written`: their directory exists, not yet synced) or they leave: every part whose
  // record a checkpoint's rotation covers is here, even while its commit still runs.
  struct HeldPart {
    std::shared_ptr<const PartImage> image;
    bool written = false;
    uint64_t bytes = 0;  // of the image's files
  };
  std::map<PartName, HeldPart> held_parts_;
  uint64_t held_bytes_ = 0;  // the sum of held_parts_' bytes
  // held_parts_ changes only through these (parts_mu_ held), which keep held_bytes_.
  void holdPartLocked(const PartName& name, std::shared_ptr<const PartImage> image);
  void releaseHeldLocked(std::map<PartName, HeldPart>::iterator it);
  void releaseHeldLocked(const PartName& name);
  // Whether a new small part may be held (held_parts_max_bytes); if not, asks for a checkpoint.
  bool mayHoldMore();
  std::atomic<bool> checkpoint_requested_{false};
  // Parts whose image this replica put in ZooKeeper (or may have: an unanswered commit), with the
  // image's bytes. A checkpoint removes those it found here when it started: each was held
  // before its commit, so that checkpoint writes it out (or it left the table).
  std::map<PartName, uint64_t> keeper_images_;
  uint64_t keeper_image_bytes_ = 0;
  // Blocks this replica allocated and has not made visible (or abandoned) yet. An insert records
  // its block here, under parts_mu_, before its commit removes the block's lock in ZooKeeper.
  std::set<PartName> unpublished_;

  // The queue and its puller; queue_changed_ tells waiters (syncQueue) that entries finished.
  // Held by a pull of the log (puller_, queue_needs_sync_) and by a clone; before queue_mu_.
  std::mutex pull_mu_;
  mutable std::mutex queue_mu_;
  ReplicationQueue queue_;
  LogPuller puller_;
  std::condition_variable queue_changed_;
  std::atomic<bool> lost_{false};
  std::chrono::steady_clock::time_point last_pull_{};  // guarded by queue_mu_
  // A pull failed: its multis may have been applied (ZooKeeper did not answer) or applied in part
  // (one batch of several), so replicas/<me>/queue may hold entries memory lacks. Guarded by
  // queue_mu_; the next updateQueue loads them before pulling.
  bool queue_needs_sync_ = false;
  std::unique_ptr<WorkerPool> fetch_pool_;
  std::unique_ptr<WorkerPool> merge_pool_;

  std::atomic<uint64_t> next_staging_id_{0};
  std::mutex background_mu_;
  std::condition_variable background_wake_;
  bool wake_requested_ = false;  // a new log entry, or an entry finished
  bool stopping_ = false;
  std::thread background_;
};

// The blocks of one insert request between parsing and commit. Its staged parts are removed with
// it, so an insert that fails (bad input, lost client) leaves nothing behind.
class PendingInsert {
 public:
  // Parts are staged as `<staging_prefix>-<provisional name>` folders.
  PendingInsert(TableReplica& table, InsertOptions options, std::filesystem::path staging_prefix);
  ~PendingInsert();

  // Adds parsed rows (the schema's columns). Full parts are written to staging at once.
  std::expected<void, std::string> add(Block block);
  std::size_t rows() const { return rows_; }

 private:
  friend class TableReplica;
  // `write_now`: write the staged part at once (a full buffer); otherwise the commit writes it
  // while ZooKeeper allocates its block number.
  std::expected<void, std::string> flush(const std::string& partition, bool write_now);
  std::expected<void, std::string> flushAll();
  // Adds one partition's sorted rows as a part (written now, or left for the commit to write).
  std::expected<void, std::string> stage(const std::string& partition, SortedBlock sorted,
                                         bool write_now);

  TableReplica& table_;
  InsertOptions options_;
  std::filesystem::path staging_prefix_;
  std::vector<std::pair<std::string, Block>> buffers_;  // per partition, in first-seen order
  std::vector<PendingPartFile> parts_;
  std::map<std::string, std::size_t> blocks_per_partition_;
  std::size_t rows_ = 0;
};

}  // namespace rtable::core
