// Restore (DESIGN.md 2.7): a new table filled from one table of a backup, by its replicas.
//
// The request is one node, <table root>/restore (JSON, RestoreRequest), written by the operator
// before the table's tree exists, so every replica sees it from its start and refuses inserts
// until the restore is done (restoreRefusal): rows inserted meanwhile would mix with the backup's.
// One replica restores, elected by `create` of the ephemeral <table root>/restore/restorer: it
// reads the manifest, checks the backup's schema against the table's, refuses a table that
// already has parts, then for each batch of the backup's parts: copies each from the
// destination into its staging directory (every file's size and checksum checked against the
// manifest), and attaches them (ReplicationWorker::attachParts: a block number of this table, an
// `attach` log entry, the other replicas fetch it), then records the count done in the request.
// Its death frees the election; the next replica goes on from the count recorded, and the batch
// cut short is not doubled: each part is attached under a dedup id of its own (the backup's uid
// and the part's name), which the batch just attached still holds in the dedup window.
//
// Departure from ClickHouse (RESTORE ON CLUSTER, where every host restores its own share and
// the replicated table's replicas then exchange parts): one replica restores here, because a
// backup holds one replica's parts (backup_host.h), and the others fetch from it as from any
// insert.
//
// Thread safety: RestoreRequest is a value; restoreIfAsked may run in several threads and
// processes at once (the election keeps one restorer).
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/backup/backup_operation.h"
#include "rtable/backup/backup_storage.h"
#include "rtable/replication_core/keeper.h"
#include "rtable/replication_core/part_name.h"

namespace rtable::backup {

struct RestoreRequest {
  enum class State { kPending, kRunning, kDone, kFailed };
  std::string backup;  // the backup's name in the destination: backups/<backup>/manifest.json
  std::string table;   // the table of the backup restored
  DestinationRef destination;
  State state = State::kPending;
  std::string message;   // kFailed: why
  std::string restorer;  // the replica restoring (set from kRunning on)
  uint64_t parts_total = 0;
  uint64_t parts_done = 0;  // the first parts_done of the manifest's parts (sorted by name)
  uint64_t rows_done = 0;
  int64_t requested_ms = 0;
  int64_t finished_ms = 0;

  std::string format() const;
  // The error names the field.
  static std::expected<RestoreRequest, std::string> parse(std::string_view text);
  friend bool operator==(const RestoreRequest&, const RestoreRequest&) = default;
};

std::string_view restoreStateName(RestoreRequest::State state);  // pending, running, done, failed

// <table root>/restore
std::string restoreRequestPath(std::string_view table_root);

// The table's request (nullopt: none), with its node's version.
struct StoredRestoreRequest {
  RestoreRequest request;
  int32_t version = 0;
};
std::expected<std::optional<StoredRestoreRequest>, std::string> readRestoreRequest(
    core::Keeper& keeper, std::string_view table_root);

// Why a replica refuses inserts while its table's restore is not done, or nullopt (no request,
// or done).
std::optional<std::string> restoreRefusal(const std::optional<RestoreRequest>& request);

// A part copied out of the backup into the target's staging directory.
struct StagedPart {
  core::PartName name;  // its name in the backup (the attach gives it a block number here)
  std::filesystem::path dir;
  uint64_t rows = 0;
  std::string dedup_id;  // unique per part of the backup
};

// The replica a restore fills.
class RestoreTarget {
 public:
  virtual ~RestoreTarget() = default;
  virtual std::string metadataText() const = 0;  // the table's schema (TableSpec::metadataText)
  // Waits until every log entry that exists now has been executed here; false on timeout.
  virtual bool catchUp(std::chrono::milliseconds timeout) = 0;
  virtual std::size_t activePartCount() const = 0;
  // A directory on the data directory's file system (links, not copies, into the table), emptied
  // when the replica opens.
  virtual std::filesystem::path stagingDir() const = 0;
  // Verifies each staged part in full and attaches it: after success each is a part of the
  // table (attached now, or before under its dedup id). Atomic per batch or not at all is not
  // promised: a retry with the same ids completes it.
  virtual std::expected<void, std::string> attach(const std::vector<StagedPart>& parts) = 0;
};

// Opens a destination (credentials come from the replica's side).
using DestinationOpener =
    std::function<StorageResult<std::unique_ptr<BackupStorage>>(const DestinationRef&)>;

struct RestoreOptions {
  // Parts attached per step (and per progress record). Well below the dedup window (100 blocks),
  // so that a batch cut short still finds its parts' ids when it is taken up again.
  std::size_t batch = 16;
  std::chrono::milliseconds catch_up_timeout{60000};
};

// One look at the table's restore request by replica `host`: nothing to do (no request, done,
// failed, or another replica restoring), or the restore run to its end in this thread. Returns
// the request as it stands afterwards (nullopt: none). An error is a passing one (ZooKeeper, a
// replica that did not catch up, an attach that failed): the request stays as it was, and the
// next look (here or on another replica) goes on. A lasting one (no manifest, another schema, a
// damaged file, a table with parts) fails the request, with the reason as its message.
std::expected<std::optional<RestoreRequest>, std::string> restoreIfAsked(
    core::Keeper& keeper, const std::string& table_root, const std::string& host,
    RestoreTarget& target, const DestinationOpener& open, const RestoreOptions& options = {});

}  // namespace rtable::backup
