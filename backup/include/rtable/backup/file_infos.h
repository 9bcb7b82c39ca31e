// The backup's files as the hosts publish them (seed 001's BackupFileInfo), the chunked ZooKeeper
// values that carry them, and the global plan every host computes from all of them alike: sorted
// by name, a file's position is its data file index, and files of the same (size, checksum) share
// one data file (the first one's index), stored once.
//
// Data files are named by their content in the destination ("data/3f/3f0a...-4096"), so a file a
// previous backup stored already is referenced, not written again: incremental by content.
//
// Plain data and pure functions, except the two that talk to a Keeper.
#pragma once

#include <cstdint>
#include <expected>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/keeper.h"

namespace rtable::backup {

struct BackupFileInfo {
  std::string name;  // "<table>/<part>/<file>": the same name on every replica holding it
  uint64_t size = 0;
  core::Hash128 checksum;  // hash128 of the bytes
  friend bool operator==(const BackupFileInfo&, const BackupFileInfo&) = default;
};

// One line per file: "<size> <checksum hex> <name>\n". Names may not hold a newline.
std::string formatFileInfos(const std::vector<BackupFileInfo>& infos);
// The error names the line.
std::expected<std::vector<BackupFileInfo>, std::string> parseFileInfos(std::string_view text);

// "data/3f/3f0a...-4096": where a file of this content lives in the destination.
std::string dataFileName(uint64_t size, const core::Hash128& checksum);

struct PlannedFile {
  BackupFileInfo info;
  std::size_t data_file_index = 0;  // the position of the first file of the same content
  std::string data_file;            // "" for an empty file: nothing to store
};

struct BackupFilePlan {
  std::vector<PlannedFile> files;  // sorted by name, names unique
  std::size_t data_files = 0;      // distinct non-empty contents
  uint64_t data_bytes = 0;         // their bytes, each counted once
  uint64_t logical_bytes = 0;      // every file's bytes
  const PlannedFile* find(std::string_view name) const;
};

// From every host's infos (key: host): the same on every host for the same input. A name
// published by several hosts must have the same size and checksum everywhere (they are replicas
// of one part); otherwise the error names the file and the hosts.
std::expected<BackupFilePlan, std::string> planFiles(
    const std::map<std::string, std::vector<BackupFileInfo>>& infos_by_host);

// ZooKeeper values are bounded (jute.maxbuffer, 1 MiB by default, counts the whole request):
// `value` is written as children <path>/000000, 000001, ... of at most `max_chunk` bytes each, one
// create per chunk. Idempotent: a chunk that exists (an earlier attempt whose answer was lost) is
// overwritten. Readers read only after a stage barrier, so they never see half of it.
inline constexpr std::size_t kMaxChunkBytes = 512 * 1024;
core::KeeperStatus writeChunked(core::Keeper& keeper, const std::string& path,
                                std::string_view value, std::size_t max_chunk = kMaxChunkBytes);
core::KeeperResult<std::string> readChunked(core::Keeper& keeper, const std::string& path);

}  // namespace rtable::backup
