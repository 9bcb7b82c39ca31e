// What a BackupSchedule should do now, as a pure function of its spec, what its status remembers,
// the ClusterBackups it owns and the time (planScheduleRun); BackupScheduleReconciler carries the
// plan out. The contract with the ClusterBackup controller is only the ClusterBackup object: this
// side creates them (renderScheduledBackup), reads status.phase / startedAt / completedAt, and
// deletes them for retention (their controller removes the data).
//
// Runs (spec.schedule in spec.timeZone, CronSchedule's DST rules):
//   - A run is due when its scheduled time has come and is later than every time already handled:
//     the schedule's creation, status.lastScheduleTime, status.lastSkippedTime and the
//     rtable.io/scheduled-at of every owned ClusterBackup (so a run whose status write was lost is
//     not created twice; its name is fixed by its time as well, see scheduledBackupName).
//   - Only the most recent due run is considered: after the operator was down, earlier ones are
//     missed (a MissedSchedule Event counts them), never started in a burst; it starts only if it
//     is at most spec.startingDeadlineSeconds late (unset: however late), as a CronJob's does.
//   - suspend: no run starts; the runs that come meanwhile are skipped (lastSkippedTime), so
//     resuming starts nothing at once. The reconciler still wakes at each scheduled time to note
//     them.
//   - concurrencyPolicy, when an owned ClusterBackup is Pending or Running (and not being
//     deleted): Forbid skips the run for good (lastSkippedTime, RunSkipped condition and Event);
//     Allow creates it anyway; Replace deletes the running ones, then creates it.
// Retention (spec.retention; applies while suspended too), over the finished (Completed or Failed)
// owned ClusterBackups not already being deleted, newest first by scheduled time:
//   - Completed: kept while among the newest keepLast and not older than maxAge; the newest
//     Completed one is always kept, however old: deleting the only good backup because it is old
//     would leave nothing to restore from, which is worse than keeping a stale one.
//   - Failed: kept while among the newest keepLast Failed ones and not older than maxAge (a failed
//     run is kept for its error message, never in place of a good one).
//   - Pending and Running ones are never deleted by retention.
// Age is measured from the run's scheduled time (its creation time when it has no
// rtable.io/scheduled-at annotation).
//
// Plain data and pure functions: thread-safe as values are.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/controllers/backup_specs.h"

namespace rtable::controllers {

// On every ClusterBackup a schedule creates: the schedule's name, and the run's scheduled time.
inline constexpr std::string_view kBackupScheduleLabel = "rtable.io/backup-schedule";
inline constexpr std::string_view kScheduledAtAnnotation = "rtable.io/scheduled-at";

// ClusterBackup status.phase; an absent phase is Pending.
enum class BackupPhase { kPending, kRunning, kCompleted, kFailed };
std::string_view backupPhaseName(BackupPhase phase);

// One ClusterBackup the schedule controls (its controller ownerReference names the schedule's
// uid), as read from the API.
struct OwnedBackup {
  std::string name;
  std::string uid;
  BackupPhase phase = BackupPhase::kPending;
  std::chrono::sys_seconds created_at;                   // metadata.creationTimestamp
  std::optional<std::chrono::sys_seconds> scheduled_at;  // rtable.io/scheduled-at
  std::optional<std::chrono::sys_seconds> started_at;    // status.startedAt
  std::optional<std::chrono::sys_seconds> completed_at;  // status.completedAt
  bool deleting = false;                                 // metadata.deletionTimestamp is set

  // From a ClusterBackup object; unreadable times count as absent, an unknown phase as Pending.
  static OwnedBackup fromObject(const nlohmann::json& object);
  // What retention and ordering go by: scheduled_at, else created_at.
  std::chrono::sys_seconds runTime() const;
  bool active() const {
    return !deleting && (phase == BackupPhase::kPending || phase == BackupPhase::kRunning);
  }
  friend bool operator==(const OwnedBackup&, const OwnedBackup&) = default;
};

// The schedule as read, beside its parsed spec: what planScheduleRun needs from its metadata and
// status.
struct ScheduleState {
  std::string name;
  std::chrono::sys_seconds created_at;  // metadata.creationTimestamp
  std::optional<std::chrono::sys_seconds> last_schedule_time;
  std::optional<std::chrono::sys_seconds> last_successful_time;
  std::optional<std::chrono::sys_seconds> last_skipped_time;

  // From a BackupSchedule object (metadata.name, creationTimestamp and the status's times).
  static ScheduleState fromObject(const nlohmann::json& schedule);
  friend bool operator==(const ScheduleState&, const ScheduleState&) = default;
};

struct BackupToDelete {
  std::string name;
  std::string uid;  // a precondition of the delete: never a newer object of the same name
  std::string why;  // for the Event: "Completed, scheduled ...: beyond keepLast 7"
  friend bool operator==(const BackupToDelete&, const BackupToDelete&) = default;
};

struct PlannedEvent {
  bool warning = false;
  std::string reason;
  std::string message;
  friend bool operator==(const PlannedEvent&, const PlannedEvent&) = default;
};

enum class SkipReason { kConcurrencyForbid, kStartingDeadlineExceeded };
std::string_view skipReasonName(SkipReason reason);  // the RunSkipped condition's reason

struct ScheduleRunPlan {
  // In this order: delete `replace` (concurrencyPolicy Replace), create `create`, delete `prune`.
  std::vector<BackupToDelete> replace;
  std::optional<std::chrono::sys_seconds> create;  // the scheduled time of the run to create
  std::vector<BackupToDelete> prune;
  // MissedSchedule and RunSkipped; the reconciler adds Created, Replaced and Deleted as it acts.
  std::vector<PlannedEvent> events;
  // A run was skipped (not while suspended: the Ready condition says that).
  std::optional<SkipReason> skipped;
  std::string skipped_message;

  // The status to write.
  ScheduleState state;
  std::optional<std::chrono::sys_seconds> next_schedule_time;  // unset while suspended
  std::vector<OwnedBackup> active;  // Pending/Running, not replaced; without the one created
  // When to look again: the next run (also while suspended), or the next retention expiry.
  std::optional<std::chrono::sys_seconds> wake_at;
  friend bool operator==(const ScheduleRunPlan&, const ScheduleRunPlan&) = default;
};

// At most this many missed runs are counted for the MissedSchedule Event ("100 or more").
inline constexpr int kMaxMissedRunsCounted = 100;

ScheduleRunPlan planScheduleRun(const BackupScheduleSpec& spec, const ScheduleState& state,
                                const std::vector<OwnedBackup>& backups,
                                std::chrono::sys_seconds now);

// "2026-03-29T01:00:00Z", and when the zone is not UTC its wall-clock time beside it:
// "2026-03-29T01:00:00Z (2026-03-29 03:00 Europe/Berlin)". For messages.
std::string describeScheduledTime(std::chrono::sys_seconds t, const TimeZone& zone);

// "<schedule>-<yyyymmddhhmm>" of the scheduled time in UTC: one name per run, so a create that
// is repeated (a lost answer, a restarted operator) meets 409 AlreadyExists instead of making a
// second backup.
std::string scheduledBackupName(std::string_view schedule, std::chrono::sys_seconds scheduled_at);

// The ClusterBackup of one run: spec.template's metadata and spec, the label
// rtable.io/backup-schedule=<schedule>, the annotation rtable.io/scheduled-at=<RFC 3339>, and a
// controller ownerReference (blockOwnerDeletion) to the schedule.
nlohmann::json renderScheduledBackup(const BackupScheduleSpec& spec, std::string_view schedule,
                                     std::string_view ns, std::string_view schedule_uid,
                                     std::chrono::sys_seconds scheduled_at);

}  // namespace rtable::controllers
