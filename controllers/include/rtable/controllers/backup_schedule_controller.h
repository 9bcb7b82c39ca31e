// The BackupSchedule controller as the operator runs it: an informer on BackupSchedules (each
// change enqueues its schedule), one on ClusterBackups whose changes enqueue the schedule that
// controls them (controller-runtime's Owns(): a backup that completes updates lastSuccessfulTime
// and lets a Forbid schedule run again, at once), and a Controller whose workers call
// BackupScheduleReconciler, which asks to be called again at the next scheduled time.
//
// Thread safety: addBackupScheduleController() before OperatorProcess::start(), from its owner.
#pragma once

#include <expected>
#include <string>

#include "rtable/controllers/backup_schedule_reconciler.h"
#include "rtable/operator/operator_process.h"

namespace rtable::controllers {

struct BackupScheduleControllerOptions {
  // `events` is filled in with the process's recorder when empty.
  BackupScheduleReconcilerOptions reconciler;
  std::string watch_namespace;  // "": every namespace
  int workers = 1;
};

// Adds the informers and the controller to `process`, which adopts them.
std::expected<void, std::string> addBackupScheduleController(
    op::OperatorProcess& process, BackupScheduleControllerOptions options);

}  // namespace rtable::controllers
