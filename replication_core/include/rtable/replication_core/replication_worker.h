// Replication of one replica (DESIGN.md 2.4): the log is pulled into this replica's queue, whose
// entries run out of order in a fetch pool and a merge pool. Merges are chosen by the leader only,
// written to the log, and executed by every replica, so parts are the same everywhere. A replica
// that lacks a merge's sources fetches the merged part instead; a new replica of a table with
// history (or a lost one) clones a healthy replica first. The leader also trims the log and the
// dedup window.
//
// Thread safety: every public method may be called from any thread. Lock order: pull_mu_, then
// queue_mu_, then the PartStore's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "rtable/common/clock.h"
#include "rtable/common/tls.h"
#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/dedup_window.h"
#include "rtable/replication_core/insert_commit.h"
#include "rtable/replication_core/insert_protocol.h"
#include "rtable/replication_core/keeper_session.h"
#include "rtable/replication_core/part_exchange.h"
#include "rtable/replication_core/part_store.h"
#include "rtable/replication_core/replication_log.h"
#include "rtable/replication_core/replication_queue.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::core {

class WorkerPool;

struct ReplicationOptions {
  // Background merges: a partition with at least `merge_min_parts` active parts merges
  // `merge_min_parts` to `merge_max_parts` neighbouring parts, the run that rewrites the fewest
  // rows per part it removes (selectMergeRange). 100 is ClickHouse's max_parts_to_merge_at_once: a
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
  // A block number reserved by a commit for the next insert into its partition (insert_protocol.h)
  // is given up after this long unused: until then merges cannot cover it.
  std::chrono::milliseconds reserve_idle{1000};
  // How long an out-of-space error keeps the replica's disk_full node (noteOutOfSpace) when no
  // part is written meanwhile.
  std::chrono::milliseconds disk_full_window{60000};
};

// Where an `attach` entry's part may already be on this replica's disk: a part of the generation
// this one replaces (the table swap), found by its partition and checksum, which do not depend on
// the part's name. Null: not here (the part is fetched from a replica that has it).
using AttachSource =
    std::function<DataPartPtr(const std::string& partition, const std::string& checksum_hex)>;

// What attachParts did.
struct AttachSummary {
  std::size_t attached = 0;        // new attach entries written
  std::size_t already = 0;         // attached before (a retry, or another replica did it)
  std::vector<std::string> parts;  // this generation's names of the parts, in the order given
};

// The queue as /replica shows it.
struct QueueState {
  std::vector<QueueEntry> entries;               // in execution order
  std::map<std::string, uint64_t> postponed;     // postponements so far, by reason
  std::map<std::string, std::size_t> executing;  // entries executing now, by action
};

class ReplicationWorker {
 public:
  // `paths`: the generation replicated. The references must outlive this; `clock` times the
  // background rounds, backoff, pulls, cleanup and failed sources.
  ReplicationWorker(const TableSpec& spec, TablePaths paths, ReplicationOptions options,
                    KeeperSession& session, PartStore& store, BlockNumberAllocator& allocator,
                    metrics::ReplicaMetrics& metrics, const common::Clock& clock);
  ~ReplicationWorker();

  // --- Start-up and stop ---
  // is_lost into lost(), right after an activation (see the definition for why that is safe).
  KeeperStatus readLost(Keeper& keeper);
  // The queue as this replica left it, and the parts the store has now.
  void load(std::vector<QueueEntry> entries);
  // Before start(): attach entries take their parts from `source` by hard link when it has them.
  void setAttachSource(AttachSource source) { attach_source_ = std::move(source); }
  // Starts the fetch and merge pools and the background thread.
  void start();
  // Joins the background thread and stops the pools (running tasks finish). Idempotent.
  void stop();

  // --- For inserts ---
  // Makes a committed part visible, to readers and to the queue at once.
  void publish(const PartName& name, PartChecksums checksums, uint64_t rows,
               std::shared_ptr<const PartImage> image);
  // An out-of-space error on the data volume (an insert's staging or commit, a fetch, a merge):
  // the background round says so in ZooKeeper, an ephemeral `<replica>/disk_full` holding the
  // message, which the operator shows in the table's status. It goes once a part is written
  // again, or disk_full_window after the last such error.
  void noteOutOfSpace(const std::string& message);
  void notePartWritten();
  // A log entry this replica wrote: the pull takes it from memory.
  void rememberLogEntry(const std::string& path, std::string data);
  // Asks ZooKeeper about parts whose commit got no answer (all, or the one named): made visible,
  // or removed.
  void resolveUncertainParts(Keeper& keeper, const PartName* only = nullptr);
  // Waiting to clone a healthy replica: takes no insert until then.
  bool lost() const { return lost_; }

  // --- Requests ---
  // DROP PARTITION: a drop entry covering every block of `partition` allocated so far goes to the
  // log (inserts still in flight in that range are cancelled: their locks go in the same multi),
  // and the partition's dedup ids are forgotten, so the same rows can be inserted again. Every
  // replica executes it from its queue. Returns the drop range part name.
  std::expected<std::string, InsertError> dropPartition(const std::string& partition);
  // The table swap's attach (DESIGN.md 2.6): each of `parts` (another generation's, read-only to
  // us) becomes a part of this generation under a block number of its own here, hard-linked (no
  // data rewritten) and announced by an `attach` log entry that every other replica executes from
  // its own copy (setAttachSource) or by a fetch. The level and rows stay; the name changes,
  // because this generation's block numbers start afresh. Idempotent: a part's dedup id is its
  // checksum's, so a retry after a crash or a lost answer attaches nothing twice (`already`).
  std::expected<AttachSummary, std::string> attachParts(const std::vector<DataPartPtr>& parts);
  // The same with the dedup id of each part given (`dedup_ids[i]` for `parts[i]`, a token of
  // the caller's): a restore attaches parts that may have equal contents, each of which must be
  // attached.
  std::expected<AttachSummary, std::string> attachParts(const std::vector<DataPartPtr>& parts,
                                                        const std::vector<std::string>& dedup_ids);
  // While frozen, this replica (as leader) assigns no merges: the table swap keeps the old
  // generation's part set from changing but by the inserts it still takes. Entries already in the
  // log still run.
  void freezeMerges(bool frozen) { merges_frozen_ = frozen; }
  // Waits until every log entry that exists now has been executed here (POST /sync). False when
  // `timeout` passed first.
  bool syncQueue(std::chrono::milliseconds timeout);
  // "" when virtual_parts = current parts + queue holds, else what differs.
  std::string checkQueueInvariant() const;
  QueueState queueState() const;
  // One round of background work now, in this thread: pull the log, (as leader) clean the dedup
  // window and assign merges, execute whatever the queue allows. Returns the merges executed.
  std::size_t runRoundForTest();
  // Only the queue's part of a round: what runs between two full rounds, on a wake.
  void executeQueueForTest() { scheduleQueue(/*inline_execution=*/true); }
  // The log counter's gauges (DESIGN.md 2.5), read from ZooKeeper.
  void updateLogMetrics(Keeper& keeper);

 private:
  // Pulls new log entries into the queue; false if ZooKeeper could not be asked.
  bool updateQueue(Keeper& keeper);
  // Leader only: chooses merges among parts every replica will have and writes them to the log.
  // Only partitions with at least `min_parts` parts are looked at.
  std::size_t assignMerges(Keeper& keeper, std::size_t min_parts);
  // Why an executed entry did not finish. `gave_way`: another running entry makes the part it
  // needs, so it waits as postponed rather than failed (ReplicationQueue::giveWay).
  struct EntryError {
    EntryError(std::string text)
        : message(std::move(text)) {}                // NOLINT: every plain error converts
    EntryError(const char* text) : message(text) {}  // NOLINT
    std::string message;
    bool gave_way = false;
  };
  using EntryOutcome = std::expected<void, EntryError>;

  // A selected entry, executing from its selection until its outcome is reported: the one owner
  // of the entry's executing state in the queue (its pool slot, the part it will produce, a
  // covering part it fetches instead). Destroyed without an outcome (an early return, an
  // exception, a pool that stopped before running it) it reports the entry failed, so that no
  // way out can leave a slot taken. An entry of a queue that a clone replaced reports nothing.
  class Execution {
   public:
    Execution(ReplicationWorker& worker, SelectedEntry selected, uint64_t queue_epoch)
        : worker_(&worker), selected_(std::move(selected)), epoch_(queue_epoch) {}
    Execution(Execution&& other) noexcept
        : worker_(std::exchange(other.worker_, nullptr)),
          selected_(std::move(other.selected_)),
          epoch_(other.epoch_) {}
    Execution& operator=(Execution&&) = delete;
    ~Execution();
    const SelectedEntry& selected() const { return selected_; }
    uint64_t epoch() const { return epoch_; }
    // Marks the outcome reported; false if it was already (then the caller reports nothing).
    bool release() { return std::exchange(worker_, nullptr) != nullptr; }

   private:
    ReplicationWorker* worker_;  // null once the outcome is reported (or moved from)
    SelectedEntry selected_;
    uint64_t epoch_;
  };

  // Takes every entry the queue lets run now: into the pools, or (`inline_execution`) executes
  // them here. While every pool slot is taken, nothing is selected: a slot that frees up wakes the
  // background, which looks again. Returns the merges executed here.
  std::size_t scheduleQueue(bool inline_execution);
  // The table swap's attach (attachParts), in steps: a part allocated a block number here is
  // linked in and its log entry made ready; then committed, alone or in a batch's multi.
  struct PreparedAttach {
    DataPartPtr source;
    std::string dedup_id;
    BlockNumberLock lock;
    PartName name;  // this generation's
    std::filesystem::path dir;
    LogEntry entry;
  };
  // Links `sources[i]` in under the block number of `locks[i]` and makes its log entry ready, for
  // every i (one linkAndPlace). On an error nothing of the batch is left: no directory, no lock.
  std::expected<std::vector<PreparedAttach>, std::string> prepareAttaches(
      Keeper& keeper, const std::vector<DataPartPtr>& sources,
      const std::vector<std::string>& dedup_ids, const std::vector<BlockNumberLock>& locks);
  std::expected<void, std::string> commitAttach(Keeper& keeper, const PreparedAttach& prepared,
                                                AttachSummary& summary);
  std::expected<void, std::string> attachOneByOne(Keeper& keeper, const DataPartPtr& source,
                                                  const std::string& dedup_id,
                                                  AttachSummary& summary);
  void finishAttach(const PreparedAttach& prepared,
                    const std::optional<std::string>& log_entry_path, AttachSummary& summary);

  // Runs one selected entry and reports its outcome.
  bool executeEntry(Execution& execution);
  // An entry's part left by an earlier attempt whose registration got no answer is settled
  // before the entry runs again: executed beside it, a registration that ZooKeeper refuses
  // (the part node is there) would discard the earlier attempt's files (the same directory, the
  // same held part), and that attempt, found applied, would then be published without them.
  // Nothing: run the entry; done: the earlier attempt was applied; an error: not known yet.
  std::optional<EntryOutcome> settleEarlierAttempt(Keeper& keeper, const SelectedEntry& selected);

  // Entries with nothing to do (their part is here already): their queue nodes go in multis of
  // up to 100, so a replica catching up on a log mostly covered by merged parts pays one round
  // trip per hundred such entries, not one each.
  void finishNoOpEntries(std::vector<Execution>& entries);
  // Attach entries (kAttach), up to kAttachBatch at a time: the parts the attach source holds are
  // linked in by one linkAndPlace and registered, with their queue nodes removed, in one multi;
  // the others are fetched (in the fetch pool, or here with `inline_execution`). One at a time,
  // 1000 attached parts cost each replica 20-25 s (two journal commits and a round trip each).
  void executeAttaches(std::vector<Execution>& entries, bool inline_execution);
  // Hands a selected entry to `pool` (or runs it here with `inline_execution`).
  void dispatch(Execution execution, QueueAction action, bool inline_execution);
  // Reports outcomes to the queue and removes the queue nodes the queue says are pointless now.
  void reportOutcomes(std::vector<std::pair<Execution*, EntryOutcome>> outcomes, Keeper* keeper);
  EntryOutcome executeFetch(Keeper& keeper, const SelectedEntry& selected);
  // `source`'s files as a new part in `staging`: hard links (a part held in memory: its files
  // written), not synced yet: linkAndPlace syncs a batch.
  std::expected<void, std::string> linkPart(const DataPart& source,
                                            const std::filesystem::path& staging);
  // Parts of another generation as parts here (the table swap): each job's source hard-linked
  // into a staging directory, then renamed to its name's place. Durable with one syncfs of the
  // data directory's file system before the renames and one fsync of the data directory after
  // them for the whole batch, where a part alone cost two directory fsyncs. Each job's `placed`
  // tells its directory or its error; a failed job leaves nothing behind.
  struct LinkJob {
    DataPartPtr source;
    PartName name;
    std::expected<std::filesystem::path, std::string> placed =
        std::unexpected(std::string("not linked"));
  };
  void linkAndPlace(std::vector<LinkJob>& jobs);
  // Renames a complete part from `staging` to its place in the data directory, durably.
  std::expected<std::filesystem::path, std::string> placeStaged(
      const std::filesystem::path& staging, const PartName& name);
  // The replicas to fetch `part` from, in the order to try them: those that have it exactly
  // first, then those with a part covering it; within each, sources that failed lately last.
  struct FetchCandidate {
    FetchSource source;
    PartName part;
    // The part's total checksum as the source recorded it in ZooKeeper (its parts node); the
    // fetched part must have it. Empty: recorded before checksums were (not checked).
    std::string recorded_checksum;
  };
  // This replica's parts node for a part: its data is the part's total checksum (hex), which
  // other replicas check what they fetch from here against.
  Op partNode(const PartName& name, const PartChecksums& checksums) const;
  KeeperResult<std::vector<FetchCandidate>> fetchCandidates(Keeper& keeper, const PartName& part);
  void noteFetchSource(const std::string& replica, bool failed);
  std::expected<void, std::string> executeMerge(Keeper& keeper, const SelectedEntry& selected);
  std::expected<void, std::string> executeDropRange(Keeper& keeper, const SelectedEntry& selected);
  // The multi that registers a part made here (fetched or merged). Refused: the part goes. No
  // answer: the part becomes an uncertain part, resolved later.
  std::expected<void, std::string> registerPart(Keeper& keeper, const std::vector<Op>& ops,
                                                const PartName& name, const NewPart& part);
  // A lost replica (or a new one of a table with history) becomes a copy of a healthy one.
  // False while there is none to copy.
  bool cloneIfLost(Keeper& keeper);
  bool isLeader(Keeper& keeper);
  void cleanLog(Keeper& keeper);
  void updateQueueMetrics();
  // Block numbers locked in block_numbers/<partition>: inserts in flight on any replica.
  KeeperResult<std::vector<int64_t>> lockedBlockNumbers(Keeper& keeper,
                                                        const std::string& partition);
  void backgroundLoop();
  void wake();

  const TableSpec& spec_;
  const TablePaths paths_;
  const ReplicationOptions options_;
  KeeperSession& session_;
  PartStore& store_;
  BlockNumberAllocator& allocator_;
  metrics::ReplicaMetrics& metrics_;
  const common::Clock& clock_;
  metrics::CounterRateEstimator counter_rate_;
  // Fetches from replicas that serve HTTPS trust the table's ca.crt (spec tls.dir); null without.
  std::shared_ptr<common::TlsContext> fetch_tls_;
  DedupWindowCleaner dedup_cleaner_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> merges_frozen_{false};
  std::mutex resolve_mu_;  // one resolution of uncertain parts at a time

  // The queue and its puller; queue_changed_ tells waiters (syncQueue) that entries finished.
  // pull_mu_ is held by a pull of the log (puller_, queue_needs_sync_) and by a clone.
  std::mutex pull_mu_;
  mutable std::mutex queue_mu_;
  ReplicationQueue queue_;
  uint64_t queue_epoch_ = 0;  // guarded by queue_mu_; bumped when a clone replaces queue_
  LogPuller puller_;
  std::condition_variable queue_changed_;
  std::chrono::steady_clock::time_point last_pull_{};  // guarded by queue_mu_
  // A pull failed: its multis may have been applied (ZooKeeper did not answer) or applied in part
  // (one batch of several), so replicas/<me>/queue may hold entries memory lacks. Guarded by
  // queue_mu_; the next updateQueue loads them before pulling.
  bool queue_needs_sync_ = false;
  std::unique_ptr<WorkerPool> fetch_pool_;
  std::unique_ptr<WorkerPool> merge_pool_;

  AttachSource attach_source_;  // set before start()
  std::atomic<uint64_t> next_staging_id_{0};
  // Fetch sources that failed lately (replica -> when), tried after the others.
  std::mutex sources_mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> failed_sources_;
  // noteOutOfSpace / notePartWritten, and the disk_full node (publishDiskState).
  void publishDiskState(Keeper& keeper);
  std::mutex disk_mu_;
  std::optional<std::chrono::steady_clock::time_point> out_of_space_at_;  // since the last write
  std::string out_of_space_message_;
  int64_t disk_full_session_ = 0;  // the session whose disk_full node is up; 0: none (background)
  std::mutex background_mu_;
  std::condition_variable background_wake_;
  bool wake_requested_ = false;  // a new log entry, or an entry finished
  bool stopping_ = false;
  std::thread background_;
};

}  // namespace rtable::core
