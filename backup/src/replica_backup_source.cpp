#include "rtable/backup/replica_backup_source.h"

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

}  // namespace rtable::backup
