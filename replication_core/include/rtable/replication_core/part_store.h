// A replica's parts: the active set readers see, the parts still on their way in (allocated,
// uncertain, held in memory), the part journal, and the one decision of how a new part becomes
// durable before its commit (DESIGN.md 2.3 as built, docs/formats.md "Part journal"):
//   - a small part (at most `journal_part_bytes` of values, while held parts stay under
//     `held_parts_max_bytes`) is encoded in memory, held, and appended to the part journal, whose
//     group-committed fdatasync makes it durable. A checkpoint writes held parts out and syncs
//     the file system; only once that sync succeeded are they released (and read from their
//     files). A failed sync is never trusted on retry: the parts stay held and the next
//     checkpoint writes them again before the journal records go.
//   - any other part is written as files, each fsynced, and renamed into the table directory,
//     which is fsynced.
// Row data never goes into ZooKeeper.
//
// Thread safety: every public method may be called from any thread. Lock order: the replica's
// queue lock (ReplicationWorker) before this store's.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rtable/common/clock.h"
#include "rtable/metrics/replica_metrics.h"
#include "rtable/replication_core/active_part_set.h"
#include "rtable/replication_core/block.h"
#include "rtable/replication_core/part_format.h"
#include "rtable/replication_core/part_journal.h"
#include "rtable/replication_core/part_name.h"
#include "rtable/replication_core/table_schema.h"

namespace rtable::core {

// Under the data directory: parts being written (inserts, fetches, merges) before they are
// renamed into place; emptied at start.
inline constexpr const char* kStagingDir = "staging";

// One active part as readers see it. The directory is removed when the part is replaced by a
// merge (or dropped) and the last reader lets go of it.
struct DataPart {
  PartName name;
  std::filesystem::path dir;
  // A part held in memory: read from here, not from `dir`, until the checkpoint that wrote it
  // out has synced it (another DataPart with files then replaces this one), or a merge takes it.
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

// The block's values as they sit in memory: about what its part holds before compression.
uint64_t valueBytes(const Block& block);

// The active part on a replica that contains a given part (possibly the part itself).
using LocalPartLookup = std::function<std::optional<PartName>(const PartName&)>;

struct PartStoreOptions {
  // Parts with up to this many bytes of values are held in memory and journaled; 0: none are.
  uint64_t journal_part_bytes = 1 << 20;
  // How often the background writes held parts out and empties the journal (it also bounds what
  // a start-up after a crash reads back).
  std::chrono::milliseconds checkpoint_interval{5000};
  // The bytes of held parts, about. Past it, new parts are written as synced files and a
  // checkpoint starts early: memory stays bounded under any insert load.
  uint64_t held_parts_max_bytes = 64 << 20;
};

// A part made here on its way to its commit: its files in `dir` (synced), or its image.
struct NewPart {
  std::string partition;
  std::string dedup_id;       // "" for fetched and merged parts
  std::filesystem::path dir;  // staged files, or where a held part's files go
  uint64_t rows = 0;          // 0: unknown (read from count.txt when it becomes visible)
  PartChecksums checksums;
  std::shared_ptr<const PartImage> image;  // held in memory instead of files
  // An inserted part's block lock, which its commit removes: removing it first fences a commit
  // whose answer was lost (commitOutcome).
  std::string lock_path;
};

class PartStore {
 public:
  // Creates `data_dir`, removes what inserts left staging, opens the journal. Loads nothing yet.
  // `metrics` and `clock` (which times checkpoints) must outlive the store.
  static std::expected<std::unique_ptr<PartStore>, std::string> open(
      const std::filesystem::path& data_dir, const TableSchema& schema, PartStoreOptions options,
      metrics::ReplicaMetrics& metrics, const common::Clock& clock);
  ~PartStore();

  const std::filesystem::path& dataDir() const { return data_dir_; }
  const TableSchema& schema() const { return schema_; }
  const PartStoreOptions& options() const { return options_; }

  // Start-up, once ZooKeeper was asked which parts this replica has committed (`committed`, read
  // after the previous process's session ended, so that no late commit of it can follow):
  // writes every committed part the journal (or `other_copies`) holds again, fsynced, whatever
  // its directory holds; loads and verifies the table directory (broken parts go to detached/);
  // makes it all durable (syncfs) and empties the journal; a part not committed goes to
  // detached/unexpected_<name> (never acknowledged: a retry of it must not find it), a merge's
  // source whose merged part is committed is removed. Returns the committed parts not here.
  std::expected<std::vector<std::string>, std::string> load(
      const std::set<std::string>& committed, const std::vector<JournaledPart>& other_copies);

  std::vector<DataPartPtr> activeParts() const;
  // One active part by name (null: not active here): a part fetch looks up one of thousands.
  DataPartPtr activePart(const PartName& name) const;
  std::vector<PartName> activeNames() const;
  uint64_t rowCount() const;
  std::vector<PartName> partsCoveredBy(const PartName& part) const;
  // A snapshot of where parts are: blocks being committed here count as here (their entries need
  // no fetch), uncertain parts do not (until ZooKeeper says they were registered).
  LocalPartLookup lookup() const;

  // --- New parts (inserted, fetched, merged) ---
  // Whether a part with `value_bytes` of values will be held in memory (journal_part_bytes, and
  // room under held_parts_max_bytes; when full, asks for an early checkpoint).
  bool willHold(uint64_t value_bytes);
  // Block `name` is being committed here: a merge must not cover it until it is visible or given
  // up (endCommit). A held part is held from here on.
  void beginCommit(const PartName& name, const std::shared_ptr<const PartImage>& image);
  void endCommit(const PartName& name);
  // Before the commit: a held part is appended to the journal (or, should the journal refuse,
  // written as synced files: `part.image` is then reset); staged files are renamed to their final
  // name and the table directory fsynced.
  std::expected<void, std::string> makeDurable(const PartName& name, NewPart& part);
  // The commit did not happen: the files (or the held image) go.
  void discard(const PartName& name, const NewPart& part);
  // The commit did not happen and another block number is to be tried: staged files go back to
  // `part.dir`, a held part is released.
  std::expected<void, std::string> unplace(const PartName& name, const NewPart& part);
  // The commit's answer was lost: the part stays (held, or on disk) until resolveUncertain.
  void addUncertain(const PartName& name, NewPart part);
  std::map<PartName, NewPart> uncertainParts() const;
  bool isUncertain(const PartName& name) const;
  // Once ZooKeeper answered: made visible (before this), or to be discarded.
  void forgetUncertain(const PartName& name);
  std::vector<std::string> uncertainNames() const;

  // The part becomes active (replacing what it covers). The caller (ReplicationWorker) holds its
  // queue lock, so readers of both see the part in both or in neither.
  void makeVisible(const PartName& name, PartChecksums checksums, uint64_t rows,
                   std::shared_ptr<const PartImage> image);

  // --- Merges and drops ---
  // The sources of a merge into `result`, all active here, and no other active part inside it.
  std::expected<std::vector<DataPartPtr>, std::string> mergeSources(
      const PartName& result, const std::vector<std::string>& sources) const;
  // A merge result small enough is held and journaled like a small insert; nullptr: write it.
  std::shared_ptr<const PartImage> holdMergeResult(const PartName& name, const Block& rows);
  // Takes active parts out (dropped, or detached by a clone); their files go with their last
  // reader, or, with `detach_prefix`, to detached/<prefix><name> at once.
  void retire(const std::vector<PartName>& parts, const std::string& detach_prefix = "");

  // What the merge selection needs, read at one moment: the rows of every active part, and the
  // blocks on their way in (being committed, or uncertain) that no merge may cover.
  struct MergeView {
    std::map<PartName, uint64_t> active_rows;
    std::vector<PartName> arriving;
  };
  MergeView mergeView() const;

  // --- Checkpoints ---
  // Runs a checkpoint if one is due (interval, or asked for by willHold) and updates the metrics.
  void checkpointIfDue();
  // Writes held parts out, syncs, releases them, removes the journal files that are covered.
  std::expected<void, std::string> checkpoint();
  // Called when a checkpoint is wanted early (the background wakes up for it).
  void onCheckpointWanted(std::function<void()> wake) { wake_ = std::move(wake); }

  // For /replica: what start-up found.
  struct Report {
    std::vector<std::string> broken;      // detached on start, with reasons
    std::vector<std::string> unexpected;  // detached on start: on disk, not in ZooKeeper
    std::vector<std::string> lost;        // in ZooKeeper, not on disk
  };
  Report report() const;
  std::size_t heldPartsForTest() const;

 private:
  PartStore(std::filesystem::path data_dir, const TableSchema& schema, PartStoreOptions options,
            metrics::ReplicaMetrics& metrics, const common::Clock& clock,
            std::unique_ptr<PartJournal> journal);

  struct Held {
    std::shared_ptr<const PartImage> image;
    uint64_t bytes = 0;    // of the image's files
    bool written = false;  // a checkpoint wrote its directory, not yet known durable
  };
  DataPartPtr makeDataPart(const PartName& name, PartChecksums checksums, uint64_t rows,
                           std::shared_ptr<const PartImage> image) const;
  void holdLocked(const PartName& name, std::shared_ptr<const PartImage> image);
  void releaseHeldLocked(const PartName& name);
  void forgetHeld(const PartName& name);
  std::map<PartName, DataPartPtr>::iterator retireLocked(
      std::map<PartName, DataPartPtr>::iterator it);
  // Writes every held part not yet written into its directory (no fsync).
  std::expected<void, std::string> writeHeldParts();
  // After a checkpoint's sync: the written parts are durable (`synced`: released, read from their
  // files from now on), or must be written again by the next checkpoint.
  void settleHeldParts(bool synced);
  // Writes a held part's files into its directory, every file fsynced, then the table directory.
  std::expected<void, std::string> writeSyncedPart(const PartName& name, const PartImage& image);
  void requestCheckpoint();

  const std::filesystem::path data_dir_;
  const TableSchema schema_;
  const PartStoreOptions options_;
  metrics::ReplicaMetrics& metrics_;
  const common::Clock& clock_;
  const std::unique_ptr<PartJournal> journal_;
  std::function<void()> wake_;

  mutable std::mutex mu_;
  ActiveDataPartSet active_set_;
  std::map<PartName, DataPartPtr> active_;
  std::map<PartName, Held> held_;
  uint64_t held_bytes_ = 0;  // the sum of held_' bytes
  // Blocks allocated here whose commit runs now: recorded before the commit can remove the
  // block's lock in ZooKeeper, so a merge selection always sees one or the other.
  std::set<PartName> committing_;
  // Parts whose commit (or registration) got no answer.
  std::map<PartName, NewPart> uncertain_;
  Report report_;

  std::mutex checkpoint_mu_;                               // one checkpoint at a time
  std::chrono::steady_clock::time_point last_checkpoint_;  // guarded by checkpoint_mu_
  std::atomic<bool> checkpoint_wanted_{false};
};

}  // namespace rtable::core
