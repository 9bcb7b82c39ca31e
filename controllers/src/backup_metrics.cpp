#include "rtable/controllers/backup_metrics.h"

namespace rtable::controllers {

BackupMetrics::BackupMetrics(prometheus::Registry& registry)
    : last_success_(prometheus::BuildGauge()
                        .Name("rtable_backup_last_success_timestamp_seconds")
                        .Help("When the newest Completed ClusterBackup of the table ended")
                        .Register(registry)),
      duration_(prometheus::BuildGauge()
                    .Name("rtable_backup_duration_seconds")
                    .Help("How long the newest Completed ClusterBackup of the table took")
                    .Register(registry)),
      bytes_written_(prometheus::BuildGauge()
                         .Name("rtable_backup_bytes_written")
                         .Help("Bytes the newest Completed ClusterBackup of the table wrote")
                         .Register(registry)),
      bytes_reused_(prometheus::BuildGauge()
                        .Name("rtable_backup_bytes_reused")
                        .Help("Bytes the newest Completed ClusterBackup of the table found stored "
                              "by an earlier backup and did not write again")
                        .Register(registry)),
      failures_(
          prometheus::BuildCounter()
              .Name("rtable_backup_failures_total")
              .Help("ClusterBackups that failed, by reason (HostGone, NoBucket, NoSpace, ...)")
              .Register(registry)) {}

void BackupMetrics::observeCompleted(const std::string& ns, const std::vector<std::string>& tables,
                                     const std::string& schedule, const Completed& backup) {
  std::lock_guard lock(mu_);
  for (const auto& table : tables) {
    auto [it, inserted] = newest_.try_emplace(Key{ns, table, schedule}, backup.completed_seconds);
    if (!inserted && it->second > backup.completed_seconds) continue;
    it->second = backup.completed_seconds;
    const prometheus::Labels labels{{"namespace", ns}, {"table", table}, {"schedule", schedule}};
    last_success_.Add(labels).Set(backup.completed_seconds);
    duration_.Add(labels).Set(backup.completed_seconds - backup.started_seconds);
    bytes_written_.Add(labels).Set(backup.bytes_written);
    bytes_reused_.Add(labels).Set(backup.bytes_reused);
  }
}

void BackupMetrics::failed(const std::string& ns, const std::vector<std::string>& tables,
                           const std::string& schedule, const std::string& reason) {
  for (const auto& table : tables) {
    failures_.Add({{"namespace", ns}, {"table", table}, {"schedule", schedule}, {"reason", reason}})
        .Increment();
  }
}

}  // namespace rtable::controllers
