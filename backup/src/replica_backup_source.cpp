#include "rtable/backup/replica_backup_source.h"

#include <fmt/format.h>

#include "rtable/replication_core/part_format.h"

namespace rtable::backup {

int64_t ReplicaBackupSource::generation() const {
  auto table = serving_();
  return table ? table->paths().generation : 0;
}

std::string ReplicaBackupSource::metadataText() const {
  auto table = serving_();
  return table ? table->spec().metadataText() : "";
}

bool ReplicaBackupSource::catchUp(std::chrono::milliseconds timeout) {
  auto table = serving_();
  return table && table->syncQueue(timeout);
}

std::expected<BackupTableSource::Frozen, std::string> ReplicaBackupSource::freeze() {
  auto table = serving_();
  if (!table) return std::unexpected("the replica serves no table (shutting down?)");
  Frozen frozen;
  // One snapshot of the active set, under the store's lock: parts that existed together.
  frozen.parts = table->activeParts();
  frozen.lag = table->state().queue.size();
  return frozen;
}

std::string ReplicaRestoreTarget::metadataText() const {
  auto table = serving_();
  return table ? table->spec().metadataText() : "";
}

bool ReplicaRestoreTarget::catchUp(std::chrono::milliseconds timeout) {
  auto table = serving_();
  return table && table->syncQueue(timeout);
}

std::size_t ReplicaRestoreTarget::activePartCount() const {
  auto table = serving_();
  return table ? table->activeParts().size() : 0;
}

std::filesystem::path ReplicaRestoreTarget::stagingDir() const {
  auto table = serving_();
  return table ? table->stagingDir() / "restore" : std::filesystem::path();
}

std::expected<void, std::string> ReplicaRestoreTarget::attach(
    const std::vector<StagedPart>& parts) {
  auto table = serving_();
  if (!table) return std::unexpected("the replica serves no table (shutting down?)");
  std::vector<core::DataPartPtr> loaded;
  std::vector<std::string> ids;
  for (const StagedPart& staged : parts) {
    // The whole part read back against its checksums.txt and this table's schema: what the
    // manifest vouched for file by file is now a part this table can read.
    auto checksums = core::verifyPart(staged.dir, table->spec().schema);
    if (!checksums) return std::unexpected(checksums.error());
    auto part = std::make_shared<core::DataPart>();
    part->name = staged.name;
    part->dir = staged.dir;
    part->rows = staged.rows;
    for (const auto& file : checksums->files) part->bytes += file.size;
    part->checksums = std::move(*checksums);
    loaded.push_back(std::move(part));
    ids.push_back(staged.dedup_id);
  }
  auto attached = table->attachParts(loaded, ids);
  if (!attached) return std::unexpected(attached.error());
  return {};
}

}  // namespace rtable::backup
