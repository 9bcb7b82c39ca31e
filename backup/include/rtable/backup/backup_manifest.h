// The one manifest of a backup (DESIGN.md 2.7): backups/<name>/manifest.json in the destination,
// written last, by one host, after every host wrote its data files. A backup without a manifest
// is not a backup: nothing else in the destination says "complete".
//
// Plain data with a JSON round trip (docs/formats.md, "Backup manifest").
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/hash128.h"

namespace rtable::backup {

struct ManifestPart {
  std::string name;  // the part's name in its table
  uint64_t rows = 0;
  core::Hash128 checksum;  // the part's total checksum (checksums.txt's "total:")
  friend bool operator==(const ManifestPart&, const ManifestPart&) = default;
};

struct ManifestTable {
  std::string table;
  int64_t generation = 0;
  std::string metadata;             // the generation's metadata text: the schema restore checks
  std::string source_host;          // the replica whose active parts at one moment these are
  uint64_t rows = 0;                // their rows: what `count` said at that moment
  std::vector<ManifestPart> parts;  // sorted by name
  friend bool operator==(const ManifestTable&, const ManifestTable&) = default;
};

struct ManifestFile {
  std::string name;  // "<table>/<part>/<file>"
  uint64_t size = 0;
  core::Hash128 checksum;
  std::string data_file;  // where its bytes are ("" for an empty file)
  friend bool operator==(const ManifestFile&, const ManifestFile&) = default;
};

struct BackupManifest {
  static constexpr int kVersion = 1;
  int version = kVersion;
  std::string name;
  std::string uid;  // the operation that wrote it
  int64_t started_ms = 0;
  int64_t completed_ms = 0;
  std::vector<ManifestTable> tables;
  std::vector<ManifestFile> files;  // sorted by name
  uint64_t data_files = 0;          // distinct stored files
  uint64_t data_bytes = 0;          // their bytes
  uint64_t bytes_written = 0;       // by this backup (the rest were there already)
  uint64_t bytes_reused = 0;        // found stored by an earlier backup

  const ManifestTable* table(std::string_view name) const;
  // Every data file the backup refers to, sorted, once each.
  std::vector<std::string> dataFiles() const;

  std::string format() const;
  // The error names the field; a newer version is refused.
  static std::expected<BackupManifest, std::string> parse(std::string_view text);
  friend bool operator==(const BackupManifest&, const BackupManifest&) = default;
};

// "backups/<name>/manifest.json"
std::string manifestName(std::string_view backup_name);
inline constexpr std::string_view kManifestsPrefix = "backups/";

}  // namespace rtable::backup
