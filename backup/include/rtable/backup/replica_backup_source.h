// BackupTableSource over the replica a TableHost serves (or any TableReplica): the generation
// it serves at each call, its active parts at one moment, its queue as the lag.
//
// Thread safety: as TableReplica's.
#pragma once

#include <functional>
#include <memory>

#include "rtable/backup/backup_host.h"
#include "rtable/replication_core/table_replica.h"

namespace rtable::backup {

class ReplicaBackupSource final : public BackupTableSource {
 public:
  // `serving` answers the replica serving now (TableHost::serving).
  explicit ReplicaBackupSource(std::function<std::shared_ptr<core::TableReplica>()> serving)
      : serving_(std::move(serving)) {}

  int64_t generation() const override;
  std::string metadataText() const override;
  bool catchUp(std::chrono::milliseconds timeout) override;
  std::expected<Frozen, std::string> freeze() override;

 private:
  std::function<std::shared_ptr<core::TableReplica>()> serving_;
};

}  // namespace rtable::backup
