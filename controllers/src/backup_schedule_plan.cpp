#include "rtable/controllers/backup_schedule_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "rtable/common/rfc3339.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono;
using nlohmann::json;

// A run that starts later than this after its time is reported as late (MissedSchedule): the
// reconciler wakes at the scheduled time, so normal lateness is well under a second.
constexpr seconds kLateAfter{60};

std::optional<sys_seconds> timeField(const json& object, const char* pointer) {
  const json value = object.value(json::json_pointer(pointer), json());
  if (!value.is_string()) return std::nullopt;
  auto parsed = common::parseRfc3339(value.get<std::string>());
  if (!parsed) return std::nullopt;
  return floor<seconds>(*parsed);
}

std::string utcText(sys_seconds t) {
  return common::formatRfc3339(t);
}

// "3d4h", "2h5m", "45s".
std::string durationText(seconds d) {
  if (d < seconds(0)) return "-" + durationText(-d);
  const int64_t total = d.count();
  const int64_t day = total / 86400, hour = total % 86400 / 3600, minute = total % 3600 / 60,
                second = total % 60;
  std::string text;
  if (day) text += fmt::format("{}d", day);
  if (hour) text += fmt::format("{}h", hour);
  if (minute && !day) text += fmt::format("{}m", minute);
  if ((second && !day && !hour) || text.empty()) text += fmt::format("{}s", second);
  return text;
}

void raise(std::optional<sys_seconds>& field, sys_seconds t) {
  if (!field || *field < t) field = t;
}

}  // namespace

std::string describeScheduledTime(sys_seconds t, const TimeZone& zone) {
  if (zone.name() == "UTC") return utcText(t);
  const local_seconds local = zone.toLocal(t);
  const local_days day = floor<days>(local);
  const year_month_day date{day};
  const hh_mm_ss<seconds> time{local - day};
  return fmt::format("{} ({:04}-{:02}-{:02} {:02}:{:02} {})", utcText(t),
                     static_cast<int>(date.year()), static_cast<unsigned>(date.month()),
                     static_cast<unsigned>(date.day()), time.hours().count(),
                     time.minutes().count(), zone.name());
}

ScheduleState ScheduleState::fromObject(const json& schedule) {
  ScheduleState state;
  state.name = schedule.value(json::json_pointer("/metadata/name"), "");
  state.created_at =
      timeField(schedule, "/metadata/creationTimestamp").value_or(sys_seconds(seconds(0)));
  state.last_schedule_time = timeField(schedule, "/status/lastScheduleTime");
  state.last_successful_time = timeField(schedule, "/status/lastSuccessfulTime");
  state.last_skipped_time = timeField(schedule, "/status/lastSkippedTime");
  return state;
}

std::string_view backupPhaseName(BackupPhase phase) {
  switch (phase) {
    case BackupPhase::kPending:
      return "Pending";
    case BackupPhase::kRunning:
      return "Running";
    case BackupPhase::kCompleted:
      return "Completed";
    case BackupPhase::kFailed:
      return "Failed";
  }
  return "Pending";
}

std::string_view skipReasonName(SkipReason reason) {
  switch (reason) {
    case SkipReason::kConcurrencyForbid:
      return "ConcurrencyForbid";
    case SkipReason::kStartingDeadlineExceeded:
      return "StartingDeadlineExceeded";
  }
  return "ConcurrencyForbid";
}

OwnedBackup OwnedBackup::fromObject(const json& object) {
  OwnedBackup backup;
  backup.name = object.value(json::json_pointer("/metadata/name"), "");
  backup.uid = object.value(json::json_pointer("/metadata/uid"), "");
  backup.created_at =
      timeField(object, "/metadata/creationTimestamp").value_or(sys_seconds(seconds(0)));
  backup.scheduled_at = timeField(object, "/metadata/annotations/rtable.io~1scheduled-at");
  backup.started_at = timeField(object, "/status/startedAt");
  backup.completed_at = timeField(object, "/status/completedAt");
  backup.deleting = object.contains(json::json_pointer("/metadata/deletionTimestamp"));
  const std::string phase = object.value(json::json_pointer("/status/phase"), "");
  if (phase == "Running") {
    backup.phase = BackupPhase::kRunning;
  } else if (phase == "Completed") {
    backup.phase = BackupPhase::kCompleted;
  } else if (phase == "Failed") {
    backup.phase = BackupPhase::kFailed;
  }
  return backup;
}

sys_seconds OwnedBackup::runTime() const {
  return scheduled_at.value_or(created_at);
}

ScheduleRunPlan planScheduleRun(const BackupScheduleSpec& spec, const ScheduleState& state,
                                const std::vector<OwnedBackup>& backups, sys_seconds now) {
  const TimeZone& zone = spec.time_zone;
  ScheduleRunPlan plan;
  plan.state = state;
  for (const auto& backup : backups) {
    if (backup.scheduled_at) raise(plan.state.last_schedule_time, *backup.scheduled_at);
    if (backup.phase == BackupPhase::kCompleted) {
      raise(plan.state.last_successful_time,
            backup.completed_at.value_or(backup.started_at.value_or(backup.runTime())));
    }
  }
  sys_seconds handled = state.created_at;
  for (const auto& time : {plan.state.last_schedule_time, plan.state.last_skipped_time}) {
    if (time && *time > handled) handled = *time;
  }
  std::vector<const OwnedBackup*> active;
  for (const auto& backup : backups) {
    if (backup.active()) active.push_back(&backup);
  }

  const std::optional<sys_seconds> due = spec.schedule.previous(now, zone);
  if (due && *due > handled && spec.suspend) {
    plan.state.last_skipped_time = *due;  // resuming later must not start it
  } else if (due && *due > handled) {
    int missed = 0;
    std::optional<sys_seconds> first_missed;
    for (auto t = spec.schedule.next(handled, zone);
         t && *t < *due && missed < kMaxMissedRunsCounted; t = spec.schedule.next(*t, zone)) {
      if (!first_missed) first_missed = *t;
      ++missed;
    }
    const std::string missed_text =
        missed == 0
            ? ""
            : fmt::format("{}{} earlier run{} (from {}) {} missed", missed,
                          missed >= kMaxMissedRunsCounted ? " or more" : "", missed == 1 ? "" : "s",
                          describeScheduledTime(*first_missed, zone), missed == 1 ? "was" : "were");
    const seconds late = now - *due;
    if (spec.starting_deadline && late > *spec.starting_deadline) {
      plan.state.last_skipped_time = *due;
      plan.skipped = SkipReason::kStartingDeadlineExceeded;
      plan.skipped_message = fmt::format(
          "the run of {} was not started: it is {} late, past startingDeadlineSeconds ({}){}",
          describeScheduledTime(*due, zone), durationText(late), spec.starting_deadline->count(),
          missed ? "; " + missed_text : "");
      plan.events.push_back({true, "MissedSchedule", plan.skipped_message});
    } else {
      if (missed > 0) {
        plan.events.push_back(
            {true, "MissedSchedule",
             fmt::format("{} (was the operator not running?); only the most recent, of {}, "
                         "starts now{}",
                         missed_text, describeScheduledTime(*due, zone),
                         late > kLateAfter ? ", " + durationText(late) + " late" : "")});
      } else if (late > kLateAfter) {
        plan.events.push_back(
            {true, "MissedSchedule",
             fmt::format("the run of {} starts {} late (was the operator not running?)",
                         describeScheduledTime(*due, zone), durationText(late))});
      }
      if (!active.empty() && spec.concurrency_policy == ConcurrencyPolicy::kForbid) {
        std::vector<std::string> running;
        for (const auto* backup : active) {
          running.push_back(fmt::format("{} ({})", backup->name, backupPhaseName(backup->phase)));
        }
        plan.state.last_skipped_time = *due;
        plan.skipped = SkipReason::kConcurrencyForbid;
        plan.skipped_message = fmt::format(
            "the run of {} was skipped: {} of this schedule {} not finished (concurrencyPolicy "
            "Forbid)",
            describeScheduledTime(*due, zone), fmt::join(running, ", "),
            running.size() == 1 ? "has" : "have");
        plan.events.push_back({true, "RunSkipped", plan.skipped_message});
      } else {
        if (spec.concurrency_policy == ConcurrencyPolicy::kReplace) {
          for (const auto* backup : active) {
            plan.replace.push_back(
                {backup->name, backup->uid,
                 fmt::format("{}, scheduled {}: replaced by the run of {} (concurrencyPolicy "
                             "Replace)",
                             backupPhaseName(backup->phase),
                             describeScheduledTime(backup->runTime(), zone),
                             describeScheduledTime(*due, zone))});
          }
        }
        plan.create = *due;
        raise(plan.state.last_schedule_time, *due);
      }
    }
  }
  for (const auto* backup : active) {
    const bool replaced =
        std::any_of(plan.replace.begin(), plan.replace.end(),
                    [&](const BackupToDelete& d) { return d.uid == backup->uid; });
    if (!replaced) plan.active.push_back(*backup);
  }

  std::optional<sys_seconds> next_expiry;
  if (spec.retention) {
    std::vector<const OwnedBackup*> finished;
    for (const auto& backup : backups) {
      if (!backup.deleting &&
          (backup.phase == BackupPhase::kCompleted || backup.phase == BackupPhase::kFailed)) {
        finished.push_back(&backup);
      }
    }
    std::sort(finished.begin(), finished.end(), [](const OwnedBackup* a, const OwnedBackup* b) {
      if (a->runTime() != b->runTime()) return a->runTime() > b->runTime();
      return a->name > b->name;
    });
    const std::optional<int32_t> keep_last = spec.retention->keep_last;
    const std::optional<seconds> max_age = spec.retention->maxAge();
    int completed = 0;
    int failed = 0;
    for (const auto* backup : finished) {
      const bool is_completed = backup->phase == BackupPhase::kCompleted;
      const int index = is_completed ? completed++ : failed++;
      if (is_completed && index == 0) continue;  // the newest good backup stays, however old
      const seconds age = now - backup->runTime();
      std::string why;
      if (keep_last && index >= *keep_last) {
        why = fmt::format("beyond keepLast {}{}", *keep_last,
                          is_completed ? "" : " (of the Failed ones)");
      } else if (max_age && age > *max_age) {
        why = fmt::format("older than maxAge {} ({} old)", *spec.retention->max_age,
                          durationText(age));
      }
      if (!why.empty()) {
        plan.prune.push_back({backup->name, backup->uid,
                              fmt::format("{}, scheduled {}: {}", backupPhaseName(backup->phase),
                                          describeScheduledTime(backup->runTime(), zone), why)});
      } else if (max_age) {
        // Retention looks again once this one is past maxAge.
        const sys_seconds expiry = backup->runTime() + *max_age + seconds(1);
        if (!next_expiry || expiry < *next_expiry) next_expiry = expiry;
      }
    }
  }

  if (auto next = spec.schedule.next(now, zone)) {
    if (!spec.suspend) plan.next_schedule_time = *next;
    plan.wake_at = *next;
  }
  if (next_expiry && (!plan.wake_at || *next_expiry < *plan.wake_at)) plan.wake_at = next_expiry;
  return plan;
}

std::string scheduledBackupName(std::string_view schedule, sys_seconds scheduled_at) {
  const sys_days day = floor<days>(scheduled_at);
  const year_month_day date{day};
  const hh_mm_ss<seconds> time{scheduled_at - day};
  return fmt::format("{}-{:04}{:02}{:02}{:02}{:02}", schedule, static_cast<int>(date.year()),
                     static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                     time.hours().count(), time.minutes().count());
}

json renderScheduledBackup(const BackupScheduleSpec& spec, std::string_view schedule,
                           std::string_view ns, std::string_view schedule_uid,
                           sys_seconds scheduled_at) {
  json labels = json::object();
  for (const auto& [key, value] : spec.template_labels) labels[key] = value;
  labels[std::string(kBackupScheduleLabel)] = schedule;
  json annotations = json::object();
  for (const auto& [key, value] : spec.template_annotations) annotations[key] = value;
  annotations[std::string(kScheduledAtAnnotation)] = utcText(scheduled_at);
  return {{"apiVersion", "rtable.io/v1alpha1"},
          {"kind", "ClusterBackup"},
          {"metadata",
           {{"name", scheduledBackupName(schedule, scheduled_at)},
            {"namespace", ns},
            {"labels", std::move(labels)},
            {"annotations", std::move(annotations)},
            {"ownerReferences", json::array({{{"apiVersion", "rtable.io/v1alpha1"},
                                              {"kind", "BackupSchedule"},
                                              {"name", schedule},
                                              {"uid", schedule_uid},
                                              {"controller", true},
                                              {"blockOwnerDeletion", true}}})}}},
          {"spec", spec.template_spec.toJson()}};
}

}  // namespace rtable::controllers
