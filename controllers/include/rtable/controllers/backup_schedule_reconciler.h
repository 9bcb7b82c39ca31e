// The BackupSchedule reconciler (DESIGN.md 3, issue 21): reads a schedule and the ClusterBackups
// it controls, asks planScheduleRun (backup_schedule_plan.h) what to do at the wall-clock time,
// does it, writes the status and asks to be called again at the plan's wake-up time.
//
// - Order: delete the runs concurrencyPolicy Replace replaces, create the due run, delete what
//   retention prunes, merge-patch the status. Deletes carry the backup's uid as a precondition
//   (a newer object of the same name is never deleted) and propagate in the background.
// - A create answered 409 AlreadyExists by a ClusterBackup this schedule controls is that run
//   (an earlier attempt whose answer or status write was lost): nothing is created twice. One
//   that belongs to someone else is a retryable error and a CreateFailed Event.
// - Status: observedGeneration, lastScheduleTime, lastSuccessfulTime, nextScheduleTime,
//   lastSkippedTime, active[] (name, uid), conditions Ready (Scheduled, Suspended, NoNextRun,
//   InvalidSpec) and RunSkipped (True: ConcurrencyForbid or StartingDeadlineExceeded; False:
//   RunCreated once a later run was created). A status that would not change is not written.
// - Events: Created, Replaced, Deleted, MissedSchedule, RunSkipped, InvalidSpec, CreateFailed,
//   DeleteFailed.
// - An invalid spec (or a name that cannot be a label value) creates and deletes nothing; Ready
//   says why and the key is not retried until the schedule changes (a terminal error).
//
// Thread safety: reconcile() may run on several workers at once for different keys; the client
// and the recorder must be thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "rtable/operator/controller.h"
#include "rtable/operator/event_recorder.h"
#include "rtable/operator/kube_client.h"

namespace rtable::controllers {

// group rtable.io, version v1alpha1, backupschedules.
op::ResourceType backupSchedules();
// clusterbackups: defined with the ClusterBackup controller (cluster_backup_reconciler.h), declared
// here too so that this header does not pull in the backup protocol's.
op::ResourceType clusterBackups();

struct BackupScheduleReconcilerOptions {
  // What "now" is for the schedule and retention (and condition timestamps). Default: the system
  // clock. Tests inject their own.
  std::function<std::chrono::system_clock::time_point()> wall_clock;
  // Where Events go; null: none. Must outlive the reconciler.
  op::EventRecorder* events = nullptr;
  std::string field_manager = "rtable-operator";
};

class BackupScheduleReconciler {
 public:
  BackupScheduleReconciler(op::KubeClient& client, BackupScheduleReconcilerOptions options = {});

  op::ReconcileOutcome reconcile(const op::ObjectKey& key);

 private:
  // Merge-patches `status` (null fields removed) into the schedule's unless nothing changes.
  op::ReconcileOutcome patchStatus(const nlohmann::json& schedule, const nlohmann::json& status);
  void event(const nlohmann::json& schedule, op::EventType type, std::string_view reason,
             const std::string& message);

  op::KubeClient& client_;
  BackupScheduleReconcilerOptions options_;
};

}  // namespace rtable::controllers
