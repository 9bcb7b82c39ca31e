#include "rtable/controllers/backup_schedule_controller.h"

#include <memory>

#include "rtable/operator/controller.h"
#include "rtable/operator/event_handlers.h"
#include "rtable/operator/informer.h"

namespace rtable::controllers {

std::expected<void, std::string> addBackupScheduleController(
    op::OperatorProcess& process, BackupScheduleControllerOptions options) {
  if (options.workers < 1)
    return std::unexpected("the BackupSchedule controller needs at least one worker");
  if (!options.reconciler.events) options.reconciler.events = &process.eventRecorder();

  auto reconciler =
      std::make_shared<BackupScheduleReconciler>(process.client(), options.reconciler);
  op::ControllerOptions controller_options;
  controller_options.name = "backupschedule";
  controller_options.max_concurrent_reconciles = options.workers;
  controller_options.registry = &process.registry();
  auto controller = std::make_shared<op::Controller>(
      std::move(controller_options),
      [reconciler](const op::ObjectKey& key) { return reconciler->reconcile(key); });

  op::InformerOptions schedules_options;
  schedules_options.type = backupSchedules();
  schedules_options.ns = options.watch_namespace;
  auto schedules = std::make_shared<op::Informer>(process.client(), schedules_options);
  schedules->addHandlers(op::enqueueObject(controller->queue()));

  // Every ClusterBackup, not only those with the rtable.io/backup-schedule label: the controller
  // ownerReference is what ties a backup to its schedule, and a label can be edited away.
  op::InformerOptions backups_options;
  backups_options.type = clusterBackups();
  backups_options.ns = options.watch_namespace;
  auto backups = std::make_shared<op::Informer>(process.client(), backups_options);
  backups->addHandlers(
      op::enqueueOwner(controller->queue(), op::OwnerFilter{"rtable.io", "BackupSchedule"}));

  process.addInformer(*schedules);
  process.addInformer(*backups);
  process.addController(*controller);
  // Destroyed newest first: the controller (its workers use the reconciler) before the reconciler.
  process.adopt(reconciler);
  process.adopt(schedules);
  process.adopt(backups);
  process.adopt(controller);
  return {};
}

}  // namespace rtable::controllers
