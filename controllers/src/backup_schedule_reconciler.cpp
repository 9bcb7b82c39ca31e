#include "rtable/controllers/backup_schedule_reconciler.h"

#include <fmt/format.h>

#include <algorithm>

#include "rtable/common/rfc3339.h"
#include "rtable/controllers/backup_schedule_plan.h"
#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/replicated_table_status.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono;
using nlohmann::json;

Condition condition(std::string type, bool status, std::string_view reason, std::string message) {
  Condition c;
  c.type = std::move(type);
  c.status = conditionStatusOf(status);
  c.reason = std::string(reason);
  c.message = std::move(message);
  return c;
}

std::vector<Condition> currentConditions(const json& object) {
  std::vector<Condition> conditions;
  const json list = object.value(json::json_pointer("/status/conditions"), json::array());
  if (!list.is_array()) return conditions;
  for (const auto& item : list) {
    if (auto parsed = Condition::parse(item)) conditions.push_back(std::move(*parsed));
  }
  return conditions;
}

json conditionsJson(std::vector<Condition> conditions, const json& object, const std::string& now) {
  const int64_t generation = object.value(json::json_pointer("/metadata/generation"), int64_t{0});
  stampConditions(conditions, currentConditions(object), generation, now);
  json list = json::array();
  for (const auto& c : conditions) list.push_back(c.toJson());
  return list;
}

json timeOrNull(const std::optional<sys_seconds>& t) {
  return t ? json(common::formatRfc3339(*t)) : json();
}

// The controller ownerReference of `object` names `uid`.
bool controlledBy(const json& object, const std::string& uid) {
  const json refs = object.value(json::json_pointer("/metadata/ownerReferences"), json::array());
  if (!refs.is_array()) return false;
  return std::any_of(refs.begin(), refs.end(), [&](const json& ref) {
    return ref.is_object() && ref.value("controller", false) && ref.value("uid", "") == uid;
  });
}

}  // namespace

op::ResourceType backupSchedules() {
  return {"rtable.io", "v1alpha1", "backupschedules", "BackupSchedule", true, true};
}

BackupScheduleReconciler::BackupScheduleReconciler(op::KubeClient& client,
                                                   BackupScheduleReconcilerOptions options)
    : client_(client), options_(std::move(options)) {
  if (!options_.wall_clock) options_.wall_clock = [] { return system_clock::now(); };
}

void BackupScheduleReconciler::event(const json& schedule, op::EventType type,
                                     std::string_view reason, const std::string& message) {
  if (options_.events)
    options_.events->record(op::ObjectReference::of(schedule), type, reason, message);
}

op::ReconcileOutcome BackupScheduleReconciler::reconcile(const op::ObjectKey& key) {
  auto schedule = client_.get(backupSchedules(), key);
  if (!schedule) {
    if (schedule.error().kind == op::KubeErrorKind::kNotFound) return op::ReconcileResult::done();
    return std::unexpected(
        op::ReconcileError::retryable("reading the schedule: " + schedule.error().toString()));
  }
  // Its ClusterBackups go with it (garbage collection of their ownerReferences).
  if (schedule->contains(json::json_pointer("/metadata/deletionTimestamp")))
    return op::ReconcileResult::done();
  const system_clock::time_point wall = options_.wall_clock();
  const sys_seconds now = floor<seconds>(wall);
  const std::string now_text = common::formatRfc3339(now);
  const int64_t generation =
      schedule->value(json::json_pointer("/metadata/generation"), int64_t{0});

  std::optional<SpecError> invalid = checkBackupScheduleName(key.name);
  auto spec = BackupScheduleSpec::parse(schedule->value("spec", json::object()));
  if (!invalid && !spec) invalid = spec.error();
  if (invalid) {
    std::vector<Condition> conditions = currentConditions(*schedule);
    setCondition(conditions, condition("Ready", false, "InvalidSpec", invalid->toString()));
    const json status = {
        {"observedGeneration", generation},
        {"nextScheduleTime", nullptr},
        {"conditions", conditionsJson(std::move(conditions), *schedule, now_text)}};
    if (auto patched = patchStatus(*schedule, status); !patched) return patched;
    event(*schedule, op::EventType::kWarning, "InvalidSpec", invalid->toString());
    return std::unexpected(
        op::ReconcileError::terminalError("invalid spec: " + invalid->toString()));
  }

  const std::string uid = schedule->value(json::json_pointer("/metadata/uid"), "");
  auto listed = client_.listAll(clusterBackups(), key.ns);
  if (!listed) {
    return std::unexpected(
        op::ReconcileError::retryable("listing ClusterBackups: " + listed.error().toString()));
  }
  std::vector<OwnedBackup> owned;
  for (const auto& item : listed->items) {
    if (controlledBy(item, uid)) owned.push_back(OwnedBackup::fromObject(item));
  }

  ScheduleRunPlan plan = planScheduleRun(*spec, ScheduleState::fromObject(*schedule), owned, now);
  for (const auto& planned : plan.events) {
    event(*schedule, planned.warning ? op::EventType::kWarning : op::EventType::kNormal,
          planned.reason, planned.message);
  }

  op::DeleteOptions delete_options;
  delete_options.propagation_policy = op::PropagationPolicy::kBackground;
  // The delete of one backup; an error message when it failed (gone already is done).
  auto remove = [&](const BackupToDelete& backup,
                    std::string_view reason) -> std::optional<std::string> {
    op::DeleteOptions options = delete_options;
    options.precondition_uid = backup.uid;
    auto removed = client_.remove(clusterBackups(), {key.ns, backup.name}, options);
    if (!removed) {
      // NotFound: gone already. Conflict: the uid precondition failed, so the name is a newer
      // object's now and this backup is gone too.
      if (removed.error().kind == op::KubeErrorKind::kNotFound ||
          removed.error().kind == op::KubeErrorKind::kConflict) {
        return std::nullopt;
      }
      const std::string message = fmt::format("deleting ClusterBackup {} ({}): {}", backup.name,
                                              backup.why, removed.error().toString());
      event(*schedule, op::EventType::kWarning, "DeleteFailed", message);
      return message;
    }
    event(*schedule, op::EventType::kNormal, reason,
          fmt::format("deleted ClusterBackup {} ({})", backup.name, backup.why));
    return std::nullopt;
  };

  for (const auto& backup : plan.replace) {
    if (auto failed = remove(backup, "Replaced"))
      return std::unexpected(op::ReconcileError::retryable(*failed));
  }

  json active = json::array();
  for (const auto& backup : plan.active) {
    active.push_back({{"name", backup.name}, {"uid", backup.uid}});
  }
  std::string created_name;
  if (plan.create) {
    const json object = renderScheduledBackup(*spec, key.name, key.ns, uid, *plan.create);
    created_name = object["metadata"]["name"];
    op::WriteOptions write;
    write.field_manager = options_.field_manager;
    auto made = client_.create(clusterBackups(), object, write);
    if (!made && made.error().kind == op::KubeErrorKind::kAlreadyExists) {
      // This run's name: an earlier attempt made it, unless someone else holds the name.
      made = client_.get(clusterBackups(), {key.ns, created_name});
      if (made && !controlledBy(*made, uid)) {
        const std::string message = fmt::format(
            "cannot create ClusterBackup {} for the run of {}: a ClusterBackup of that name "
            "exists that this schedule does not control",
            created_name, describeScheduledTime(*plan.create, spec->time_zone));
        event(*schedule, op::EventType::kWarning, "CreateFailed", message);
        return std::unexpected(op::ReconcileError::retryable(message));
      }
    } else if (made) {
      event(*schedule, op::EventType::kNormal, "Created",
            fmt::format("created ClusterBackup {} for the run of {}", created_name,
                        describeScheduledTime(*plan.create, spec->time_zone)));
    }
    if (!made) {
      const std::string message =
          fmt::format("creating ClusterBackup {}: {}", created_name, made.error().toString());
      event(*schedule, op::EventType::kWarning, "CreateFailed", message);
      return std::unexpected(op::ReconcileError::retryable(message));
    }
    const OwnedBackup created = OwnedBackup::fromObject(*made);
    if (created.active()) active.push_back({{"name", created.name}, {"uid", created.uid}});
  }

  std::optional<std::string> prune_failed;
  for (const auto& backup : plan.prune) {
    if (auto failed = remove(backup, "Deleted"); failed && !prune_failed) prune_failed = failed;
  }

  std::vector<Condition> conditions = currentConditions(*schedule);
  if (spec->suspend) {
    setCondition(conditions, condition("Ready", false, "Suspended",
                                       "spec.suspend is true: no new runs (retention still "
                                       "applies, running backups go on)"));
  } else if (!plan.next_schedule_time) {
    setCondition(conditions,
                 condition("Ready", false, "NoNextRun",
                           fmt::format("the schedule '{}' has no run in the next five years",
                                       spec->schedule.text())));
  } else {
    setCondition(conditions,
                 condition("Ready", true, "Scheduled",
                           "next run at " +
                               describeScheduledTime(*plan.next_schedule_time, spec->time_zone)));
  }
  if (plan.skipped) {
    setCondition(conditions, condition("RunSkipped", true, skipReasonName(*plan.skipped),
                                       plan.skipped_message));
  } else if (plan.create) {
    setCondition(
        conditions,
        condition("RunSkipped", false, "RunCreated",
                  fmt::format("the run of {} was created: ClusterBackup {}",
                              describeScheduledTime(*plan.create, spec->time_zone), created_name)));
  }
  const json status = {{"observedGeneration", generation},
                       {"lastScheduleTime", timeOrNull(plan.state.last_schedule_time)},
                       {"lastSuccessfulTime", timeOrNull(plan.state.last_successful_time)},
                       {"lastSkippedTime", timeOrNull(plan.state.last_skipped_time)},
                       {"nextScheduleTime", timeOrNull(plan.next_schedule_time)},
                       {"active", std::move(active)},
                       {"conditions", conditionsJson(std::move(conditions), *schedule, now_text)}};
  if (auto patched = patchStatus(*schedule, status); !patched) return patched;
  if (prune_failed) return std::unexpected(op::ReconcileError::retryable(*prune_failed));
  if (!plan.wake_at) return op::ReconcileResult::done();
  // Wake at the planned second, not a moment before it (the plan rounds now down to seconds).
  const auto delay = system_clock::time_point(*plan.wake_at) - wall;
  return op::ReconcileResult::after(std::max<common::Clock::Duration>(
      duration_cast<common::Clock::Duration>(delay), milliseconds(100)));
}

op::ReconcileOutcome BackupScheduleReconciler::patchStatus(const json& schedule,
                                                           const json& status) {
  const json current = schedule.value("status", json::object());
  json merged = current.is_object() ? current : json::object();
  merged.merge_patch(status);
  if (merged == current) return op::ReconcileResult::done();
  op::PatchOptions options;
  options.subresource = "status";
  auto patched = client_.patch(backupSchedules(),
                               {schedule.value(json::json_pointer("/metadata/namespace"), ""),
                                schedule.value(json::json_pointer("/metadata/name"), "")},
                               op::PatchType::kMerge, json{{"status", status}}, options);
  if (!patched) {
    return std::unexpected(
        op::ReconcileError::retryable("patching the status: " + patched.error().toString()));
  }
  return op::ReconcileResult::done();
}

}  // namespace rtable::controllers
