// One cluster backup operation as the replicas see it in ZooKeeper (DESIGN.md 2.7, seed 001), and
// where its nodes live:
//
//   <backups root>/alive_tracker                    version bumped whenever an alive node appears
//   <backups root>/backup-<uid>                     the BackupOperation (JSON), written by the
//                                                   initiator (the operator) when it starts
//   <backups root>/backup-<uid>/stage/              started|<host>, finished|<host>, alive|<host>
//                                                   (ephemeral), current|<host>|<stage> (value: the
//                                                   host's result of that stage), error
//   <backups root>/backup-<uid>/parts/<host>/NNNNNN     the parts a host froze (chunked)
//   <backups root>/backup-<uid>/file_infos/<host>/NNNNNN the files a host can write (chunked)
//   <backups root>/backup-<uid>/writing_files/<index>   the writer of data file <index>: its host
//                                                       index, won by `create`
//   <table root>/backup                             the uid of the backup running on the table:
//                                                   a table swap and a backup never overlap
//                                                   (core::backupLockPath)
//
// The initiator's host name is "" (seed 001's kInitiator): "started|", "current||<stage>".
//
// Plain data: copyable, no shared state.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::backup {

// Where a backup's files go, without credentials (those never enter ZooKeeper).
struct DestinationRef {
  enum class Kind { kFilesystem, kS3, kVolume };
  Kind kind = Kind::kFilesystem;
  // kFilesystem: an absolute directory, the same on every replica. kVolume: the directory inside
  // the claim's volume, relative ("" for its root).
  std::string path;
  // kVolume: a PersistentVolumeClaim of the table's namespace that every replica mounts under its
  // volumes directory (openDestination, ReplicatedTable spec.backupVolumes).
  std::string claim_name;
  // kS3:
  std::string endpoint;  // http(s)://host:port
  std::string bucket;
  std::string prefix;  // may be empty
  std::string region = "us-east-1";
  // kS3: the Secret whose keys hold the access key id and the secret key. Only its name travels
  // (ZooKeeper holds no secret): each replica reads the keys from its own mount of the Secret
  // (openDestination, ReplicatedTable spec.backupCredentials).
  std::string credentials_secret;
  std::string access_key_id_key = "accessKeyId";
  std::string secret_access_key_key = "secretAccessKey";

  // "/backups/events", "s3://bucket/prefix" (endpoint left out) or "pvc://claim/path".
  std::string location() const;
  friend bool operator==(const DestinationRef&, const DestinationRef&) = default;
};

// Why `path` cannot be a kVolume destination's directory inside its volume (nullopt: it can). It
// comes from ZooKeeper and must stay inside the volume: relative, no '.', '..' or empty component.
std::optional<std::string> volumePathProblem(std::string_view path);

struct BackupTableRef {
  std::string table;               // the table's name (the manifest's and restore's key)
  std::string table_root;          // its ZooKeeper root, <zookeeper root>/<uid>
  int64_t generation = 0;          // the generation copied (the active one when the backup started)
  std::vector<std::string> hosts;  // its replicas taking part
  friend bool operator==(const BackupTableRef&, const BackupTableRef&) = default;
};

struct BackupOperation {
  std::string uid;   // unique per attempt: names backup-<uid>
  std::string name;  // the backup's name in the destination: backups/<name>/
  int64_t started_ms = 0;
  std::vector<BackupTableRef> tables;
  DestinationRef destination;

  // Every host of every table, sorted: a host's index in it is its number (writing_files values).
  std::vector<std::string> hosts() const;
  // The table `host` replicates, or null.
  const BackupTableRef* tableOf(std::string_view host) const;

  std::string format() const;
  // Refuses missing fields, duplicate hosts, a name with '/' or "..", an empty table list; the
  // error names the field.
  static std::expected<BackupOperation, std::string> parse(std::string_view text);
  friend bool operator==(const BackupOperation&, const BackupOperation&) = default;
};

// Stage names (seed 001's BackupCoordinationStage): hosts pass them in this order.
namespace stage {
inline constexpr std::string_view kGatheringMetadata = "gathering metadata";
inline constexpr std::string_view kExtractingData = "extracting data";
inline constexpr std::string_view kBuildingFileInfos = "building file infos";
inline constexpr std::string_view kWritingBackup = "writing backup";
inline constexpr std::string_view kCompleted = "completed";
// "gathering metadata (0)": the barrier of metadata gathering is per attempt.
std::string gatheringMetadata(int attempt);
// Results of gathering metadata; anything else is an error text.
inline constexpr std::string_view kConsistent = "consistent";
inline constexpr std::string_view kNeedAnotherAttempt = "need_another_attempt";
}  // namespace stage

struct BackupPaths {
  std::string root;  // e.g. /rtable/backups
  std::string uid;

  // <zookeeper root>'s sibling: /rtable/tables -> /rtable/backups.
  static std::string rootFor(std::string_view tables_root);

  std::string aliveTracker() const { return root + "/alive_tracker"; }
  std::string operation() const { return root + "/backup-" + uid; }
  std::string stage() const { return operation() + "/stage"; }
  std::string started(std::string_view host) const;
  std::string finished(std::string_view host) const;
  std::string alive(std::string_view host) const;
  std::string current(std::string_view host, std::string_view stage_name) const;
  std::string error() const { return stage() + "/error"; }
  std::string parts() const { return operation() + "/parts"; }
  std::string parts(std::string_view host) const;
  std::string fileInfos() const { return operation() + "/file_infos"; }
  std::string fileInfos(std::string_view host) const;
  std::string writingFiles() const { return operation() + "/writing_files"; }
  std::string writingFile(std::size_t index) const;
};

inline constexpr std::string_view kOperationPrefix = "backup-";

// Host names inside `stage/` child names ("current|<host>|<stage>"), split back.
struct StageNodeName {
  enum class Kind { kStarted, kFinished, kAlive, kCurrent, kError, kOther };
  Kind kind = Kind::kOther;
  std::string host;
  std::string stage;  // kCurrent only
};
StageNodeName parseStageNodeName(std::string_view name);

}  // namespace rtable::backup
