// The cluster backups as Prometheus metrics (issue 21), from the ClusterBackup controller:
//
//   rtable_backup_last_success_timestamp_seconds{namespace,table,schedule}  the newest Completed
//   rtable_backup_duration_seconds{namespace,table,schedule}       that backup's start to end
//   rtable_backup_bytes_written{namespace,table,schedule}          what it wrote
//   rtable_backup_bytes_reused{namespace,table,schedule}           what it found stored already
//   rtable_backup_failures_total{namespace,table,schedule,reason}  backups that failed
//
// `schedule` is the BackupSchedule that made the backup ("" for one made by hand). The gauges are
// taken from every Completed ClusterBackup the controller sees (the newest wins), so they are
// right again after an operator restart once its informer listed the backups. Thread-safe.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace rtable::controllers {

class BackupMetrics {
 public:
  explicit BackupMetrics(prometheus::Registry& registry);

  struct Completed {
    double started_seconds = 0;    // since the epoch
    double completed_seconds = 0;  // since the epoch
    double bytes_written = 0;
    double bytes_reused = 0;
  };
  // A Completed backup of `tables`: kept when it is the newest seen for a series.
  void observeCompleted(const std::string& ns, const std::vector<std::string>& tables,
                        const std::string& schedule, const Completed& backup);
  // A backup that just failed, once per backup.
  void failed(const std::string& ns, const std::vector<std::string>& tables,
              const std::string& schedule, const std::string& reason);

 private:
  using Key = std::tuple<std::string, std::string, std::string>;  // namespace, table, schedule
  prometheus::Family<prometheus::Gauge>& last_success_;
  prometheus::Family<prometheus::Gauge>& duration_;
  prometheus::Family<prometheus::Gauge>& bytes_written_;
  prometheus::Family<prometheus::Gauge>& bytes_reused_;
  prometheus::Family<prometheus::Counter>& failures_;
  std::mutex mu_;
  std::map<Key, double> newest_;  // completed_seconds of the backup each series shows
};

}  // namespace rtable::controllers
