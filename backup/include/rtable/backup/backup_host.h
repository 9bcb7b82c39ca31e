// A replica's side of one cluster backup (DESIGN.md 2.7, seed 001): the stages, in order,
// each ended by a barrier of every host and the initiator.
//
//   gathering metadata (N)  the table's active generation and its metadata are what the operation
//                           names, read twice alike ("consistent"); otherwise another attempt
//   extracting data         the replica executes every log entry that exists now (SYNC REPLICA:
//                           so every insert acknowledged before the backup began is in its
//                           parts), then holds its active parts at one moment (their files stay
//                           while merges and drops go on) and publishes their names, rows,
//                           checksums and whether it caught up, under parts/<host>
//   building file infos     every host of the table picks the same source replica (the least
//                           behind; then the most rows; then the name): the backup holds that
//                           replica's parts, a set that existed together at one moment. Each host
//                           publishes the files of those parts it holds alike under
//                           file_infos/<host>
//   writing backup          every host computes the same plan from all file infos (planFiles) and
//                           writes the data files whose writer election (`create` of
//                           writing_files/<index>) it wins, unless the destination holds that
//                           content already (a previous backup's file: reused, not copied)
//   completed               the first host (by name) writes the manifest, last
//
// A host's error is set in ZooKeeper and stops everyone; a host whose alive node is gone fails
// the operation at the next barrier.
//
// Thread safety: run() in one thread; stop() from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/backup/backup_operation.h"
#include "rtable/backup/backup_storage.h"
#include "rtable/backup/file_infos.h"
#include "rtable/backup/stage_sync.h"
#include "rtable/replication_core/part_store.h"

namespace rtable::backup {

// What the host side needs of the replica it runs on.
class BackupTableSource {
 public:
  virtual ~BackupTableSource() = default;

  // The generation this replica serves now, and its metadata text.
  virtual int64_t generation() const = 0;
  virtual std::string metadataText() const = 0;

  // Waits until every log entry that exists now has been executed here (SYNC REPLICA); false
  // when `timeout` passed first. Called before freeze(): every insert acknowledged before the
  // backup began then lies in the parts this replica freezes.
  virtual bool catchUp(std::chrono::milliseconds timeout) = 0;

  struct Frozen {
    // Active at one moment; held, so their files stay until these pointers go.
    std::vector<core::DataPartPtr> parts;
    uint64_t lag = 0;  // queue entries waiting
  };
  virtual std::expected<Frozen, std::string> freeze() = 0;
};

// What a host reports at the end (its result of "writing backup", JSON).
struct HostStats {
  uint64_t files_written = 0;
  uint64_t bytes_written = 0;
  uint64_t files_reused = 0;  // the destination held them already (an earlier backup)
  uint64_t bytes_reused = 0;
  std::string format() const;
  static HostStats parse(std::string_view text);  // a malformed value reads as zeros
  friend bool operator==(const HostStats&, const HostStats&) = default;
};

// What the initiator reports of a completed backup: the manifest writer's result of "completed".
struct BackupSummary {
  struct Table {
    std::string table;
    int64_t generation = 0;
    uint64_t parts = 0;
    uint64_t rows = 0;
    friend bool operator==(const Table&, const Table&) = default;
  };
  std::vector<Table> tables;
  uint64_t data_files = 0;     // distinct files stored for it (written now or earlier)
  uint64_t data_bytes = 0;     // their bytes
  uint64_t logical_bytes = 0;  // every file of every part: what a copy without dedup would hold
  std::string manifest;        // its name in the destination
  std::string format() const;
  static std::optional<BackupSummary> parse(std::string_view text);
  friend bool operator==(const BackupSummary&, const BackupSummary&) = default;
};

// The parts a host froze (parts/<host>): "lag <n>\n" then "<name> <rows> <checksum>\n" lines.
struct FrozenPartList {
  uint64_t lag = 0;  // 0: caught up with the log as it was; else 1 + the entries waiting
  struct Part {
    std::string name;
    uint64_t rows = 0;
    core::Hash128 checksum;
    friend bool operator==(const Part&, const Part&) = default;
  };
  std::vector<Part> parts;
  uint64_t rows() const;
  std::string format() const;
  static std::expected<FrozenPartList, std::string> parse(std::string_view text);
  friend bool operator==(const FrozenPartList&, const FrozenPartList&) = default;
};

// The replica whose parts the backup takes, from every host's list; the same on every host.
std::string chooseSourceHost(const std::map<std::string, FrozenPartList>& lists);

struct BackupHostOptions {
  StageSyncOptions sync;
  // Metadata gathering: attempts until every host says "consistent", sleeping between rounds
  // from 100 ms doubling to 5 s, for at most 10 min (seed 001's defaults).
  std::chrono::milliseconds collect_metadata_timeout{600000};
  // How long a replica waits to execute the log entries that existed when it reached
  // "extracting data" (ClickHouse's SYNC REPLICA waits up to receive_timeout, 300 s). One that
  // could not is behind: another replica, caught up, is the source.
  std::chrono::milliseconds catch_up_timeout{120000};
  // Data files one host writes at once. Each write ends with an fsync, so one at a time leaves
  // the disk idle between files: 4 made a one-host backup of 1 GiB about twice as fast here
  // (docs/benchmarks.md); an S3 destination gets 4 uploads in flight.
  int writers = 4;
  // Tests only: called in the host's thread at named points of run(), "after <stage>" once this
  // host recorded reaching a stage and "writing files" before it writes its data files, so that
  // a test can kill or pause a replica exactly there (rtable-core's RTABLE_CORE_FAILPOINT).
  std::function<void(std::string_view point)> test_point;
};

class BackupHost {
 public:
  // `source` and `storage` must outlive run(); `paths` is where the operation's node is.
  BackupHost(BackupPaths paths, BackupOperation operation, std::string host,
             BackupTableSource& source, BackupStorage& storage, core::KeeperFactory keeper_factory,
             BackupHostOptions options = {});

  // The whole protocol for this host; its stats, or why the operation failed (also in ZooKeeper).
  BackupResult<HostStats> run();
  void stop() { sync_.stop(); }

 private:
  BackupResult<void> gatherMetadata();
  BackupResult<std::map<std::string, FrozenPartList>> readPartLists(const BackupTableRef& table);
  BackupResult<HostStats> writeFiles(const BackupFilePlan& plan);
  // The writer election of data files `indexes`: for each, whether this host (`my_index`, its
  // position in the operation's hosts) writes it.
  BackupResult<std::vector<bool>> electWriters(const std::vector<std::size_t>& indexes,
                                               const std::string& my_index);
  struct LocalFile;
  enum class Written { kWritten, kReused };
  // One won data file: reused when the destination has it with its size, else written.
  BackupResult<Written> writeDataFile(const PlannedFile& planned, const LocalFile& local);
  void reached(std::string_view point);  // options_.test_point
  // The manifest written; its summary (BackupSummary) is this host's result of "completed".
  BackupResult<std::string> writeManifest(const BackupFilePlan& plan,
                                          const std::map<std::string, std::string>& write_results);

  const BackupPaths paths_;
  const BackupOperation operation_;
  const std::string host_;
  const BackupTableRef table_;
  BackupTableSource& source_;
  BackupStorage& storage_;
  const BackupHostOptions options_;
  BackupStageSync sync_;
  std::vector<core::DataPartPtr> frozen_;  // held from extracting data to the end
  // This host's files of the chosen parts: the file's name -> where its bytes are.
  struct LocalFile {
    core::DataPartPtr part;
    std::string file;  // inside the part
    BackupFileInfo info;
  };
  std::map<std::string, LocalFile> local_files_;
};

}  // namespace rtable::backup
