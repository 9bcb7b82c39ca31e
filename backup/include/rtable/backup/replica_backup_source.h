// BackupTableSource and RestoreTarget over the replica a TableHost serves (or any TableReplica):
// the generation it serves at each call, its active parts at one moment, its queue as the lag;
// restored parts staged under its data directory and attached to it.
//
// Thread safety: as TableReplica's.
#pragma once

#include <functional>
#include <memory>

#include "rtable/backup/backup_host.h"
#include "rtable/backup/restore.h"
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

class ReplicaRestoreTarget final : public RestoreTarget {
 public:
  explicit ReplicaRestoreTarget(std::function<std::shared_ptr<core::TableReplica>()> serving)
      : serving_(std::move(serving)) {}

  std::string metadataText() const override;
  bool catchUp(std::chrono::milliseconds timeout) override;
  std::size_t activePartCount() const override;
  std::filesystem::path stagingDir() const override;
  std::expected<void, std::string> attach(const std::vector<StagedPart>& parts) override;

 private:
  std::function<std::shared_ptr<core::TableReplica>()> serving_;
};

}  // namespace rtable::backup
