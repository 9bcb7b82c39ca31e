// planScheduleRun over the clock: due runs and their names, Forbid / Allow / Replace, suspend,
// missed runs with and without startingDeadlineSeconds, retention (keepLast, maxAge, the newest
// Completed backup kept), daylight-saving changes, and the ClusterBackup a run creates.
#include "rtable/controllers/backup_schedule_plan.h"

#include <gtest/gtest.h>

namespace rtable::controllers {
namespace {

using namespace std::chrono;
using nlohmann::json;

sys_seconds at(int y, unsigned m, unsigned d, int h, int min = 0, int s = 0) {
  return sys_days(year{y} / month{m} / day{d}) + hours(h) + minutes(min) + seconds(s);
}

BackupScheduleSpec specOf(const json& fields = json::object()) {
  json spec = {
      {"schedule", "0 3 * * *"},
      {"template",
       {{"metadata", {{"labels", {{"team", "analytics"}}}}},
        {"spec",
         {{"table", "events"}, {"destination", {{"filesystem", {{"path", "/backups"}}}}}}}}}};
  spec.update(fields);
  auto parsed = BackupScheduleSpec::parse(spec);
  EXPECT_TRUE(parsed) << parsed.error().toString();
  return parsed ? *parsed : BackupScheduleSpec{};
}

// A schedule made at noon the day before the first run the tests look at; `created_at` earlier
// where a test needs an older one.
ScheduleState state(sys_seconds created_at = at(2026, 11, 30, 12)) {
  ScheduleState s;
  s.name = "nightly";
  s.created_at = created_at;
  return s;
}

OwnedBackup backup(sys_seconds scheduled, BackupPhase phase) {
  OwnedBackup b;
  b.name = scheduledBackupName("nightly", scheduled);
  b.uid = "uid-" + b.name;
  b.phase = phase;
  b.created_at = scheduled;
  b.scheduled_at = scheduled;
  if (phase != BackupPhase::kPending) b.started_at = scheduled + seconds(5);
  if (phase == BackupPhase::kCompleted || phase == BackupPhase::kFailed)
    b.completed_at = scheduled + minutes(20);
  return b;
}

std::vector<std::string> names(const std::vector<BackupToDelete>& deletes) {
  std::vector<std::string> out;
  for (const auto& d : deletes) out.push_back(d.name);
  return out;
}

std::vector<std::string> reasons(const ScheduleRunPlan& plan) {
  std::vector<std::string> out;
  for (const auto& e : plan.events) out.push_back(e.reason);
  return out;
}

TEST(PlanScheduleRun, NothingIsDueBeforeTheFirstRun) {
  const auto plan = planScheduleRun(specOf(), state(), {}, at(2026, 12, 1, 2, 59, 59));
  EXPECT_FALSE(plan.create);
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 1, 3));
  EXPECT_EQ(plan.wake_at, at(2026, 12, 1, 3));
  EXPECT_TRUE(plan.events.empty());
  EXPECT_FALSE(plan.state.last_schedule_time);
}

TEST(PlanScheduleRun, ADueRunIsCreatedOnce) {
  auto plan = planScheduleRun(specOf(), state(), {}, at(2026, 12, 1, 3, 0, 0));
  ASSERT_EQ(plan.create, at(2026, 12, 1, 3));
  EXPECT_EQ(plan.state.last_schedule_time, at(2026, 12, 1, 3));
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 2, 3));
  EXPECT_TRUE(plan.events.empty()) << plan.events[0].message;  // on time: nothing missed

  // The status write was lost, but the backup exists: its annotation says the run was made.
  plan = planScheduleRun(specOf(), state(), {backup(at(2026, 12, 1, 3), BackupPhase::kPending)},
                         at(2026, 12, 1, 3, 0, 10));
  EXPECT_FALSE(plan.create);
  EXPECT_EQ(plan.state.last_schedule_time, at(2026, 12, 1, 3));
  ASSERT_EQ(plan.active.size(), 1u);
  EXPECT_EQ(plan.active[0].name, "nightly-202612010300");

  // The status says so, and the backup is gone (deleted by hand): still not again.
  ScheduleState recorded = state();
  recorded.last_schedule_time = at(2026, 12, 1, 3);
  plan = planScheduleRun(specOf(), recorded, {}, at(2026, 12, 1, 9));
  EXPECT_FALSE(plan.create);
  EXPECT_TRUE(plan.active.empty());
}

TEST(PlanScheduleRun, AScheduleCreatedAfterARunsTimeWaitsForTheNextRun) {
  ScheduleState fresh = state();
  fresh.created_at = at(2026, 12, 1, 3, 0, 30);
  const auto plan = planScheduleRun(specOf(), fresh, {}, at(2026, 12, 1, 3, 1));
  EXPECT_FALSE(plan.create);
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 2, 3));
}

TEST(PlanScheduleRun, ForbidSkipsARunWhileOneIsPendingOrRunning) {
  const OwnedBackup running = backup(at(2026, 12, 1, 3), BackupPhase::kRunning);
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 1, 3);
  auto plan = planScheduleRun(specOf(), s, {running}, at(2026, 12, 2, 3, 0, 1));
  EXPECT_FALSE(plan.create);
  ASSERT_EQ(plan.skipped, SkipReason::kConcurrencyForbid);
  EXPECT_EQ(plan.state.last_skipped_time, at(2026, 12, 2, 3));
  EXPECT_EQ(reasons(plan), std::vector<std::string>{"RunSkipped"});
  EXPECT_TRUE(plan.events[0].warning);
  EXPECT_NE(plan.events[0].message.find("nightly-202612010300 (Running)"), std::string::npos)
      << plan.events[0].message;
  EXPECT_NE(plan.events[0].message.find("concurrencyPolicy Forbid"), std::string::npos);
  EXPECT_EQ(plan.active.size(), 1u);

  // Skipped for good: when the running one completes an hour later, that run does not start.
  OwnedBackup done = running;
  done.phase = BackupPhase::kCompleted;
  done.completed_at = at(2026, 12, 2, 4);
  plan = planScheduleRun(specOf(), plan.state, {done}, at(2026, 12, 2, 4, 0, 1));
  EXPECT_FALSE(plan.create);
  EXPECT_FALSE(plan.skipped);
  EXPECT_TRUE(plan.events.empty());
  EXPECT_EQ(plan.state.last_successful_time, at(2026, 12, 2, 4));
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 3, 3));

  // A Pending one forbids too; one being deleted does not.
  plan = planScheduleRun(specOf(), s, {backup(at(2026, 12, 1, 3), BackupPhase::kPending)},
                         at(2026, 12, 2, 3));
  EXPECT_EQ(plan.skipped, SkipReason::kConcurrencyForbid);
  OwnedBackup deleting = running;
  deleting.deleting = true;
  plan = planScheduleRun(specOf(), s, {deleting}, at(2026, 12, 2, 3));
  EXPECT_EQ(plan.create, at(2026, 12, 2, 3));
  EXPECT_TRUE(plan.active.empty());
}

TEST(PlanScheduleRun, AllowCreatesBesideARunningOne) {
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 1, 3);
  const auto plan =
      planScheduleRun(specOf({{"concurrencyPolicy", "Allow"}}), s,
                      {backup(at(2026, 12, 1, 3), BackupPhase::kRunning)}, at(2026, 12, 2, 3));
  EXPECT_EQ(plan.create, at(2026, 12, 2, 3));
  EXPECT_TRUE(plan.replace.empty());
  EXPECT_EQ(plan.active.size(), 1u);
}

TEST(PlanScheduleRun, ReplaceDeletesTheRunningOnesThenCreates) {
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 2, 3);
  const auto plan = planScheduleRun(specOf({{"concurrencyPolicy", "Replace"}}), s,
                                    {backup(at(2026, 12, 1, 3), BackupPhase::kRunning),
                                     backup(at(2026, 12, 2, 3), BackupPhase::kPending),
                                     backup(at(2026, 11, 30, 3), BackupPhase::kCompleted)},
                                    at(2026, 12, 3, 3));
  EXPECT_EQ(names(plan.replace),
            (std::vector<std::string>{"nightly-202612010300", "nightly-202612020300"}));
  EXPECT_EQ(plan.replace[0].uid, "uid-nightly-202612010300");
  EXPECT_NE(plan.replace[0].why.find("replaced by the run of 2026-12-03T03:00:00Z"),
            std::string::npos)
      << plan.replace[0].why;
  EXPECT_EQ(plan.create, at(2026, 12, 3, 3));
  EXPECT_TRUE(plan.active.empty());
  // Nothing to replace when nothing runs.
  const auto idle =
      planScheduleRun(specOf({{"concurrencyPolicy", "Replace"}}), s, {}, at(2026, 12, 3, 3));
  EXPECT_TRUE(idle.replace.empty());
  EXPECT_EQ(idle.create, at(2026, 12, 3, 3));
}

TEST(PlanScheduleRun, SuspendStartsNothingAndResumingStartsNothingAtOnce) {
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 1, 3);
  const auto running = backup(at(2026, 12, 1, 3), BackupPhase::kRunning);
  auto plan = planScheduleRun(specOf({{"suspend", true}}), s, {running}, at(2026, 12, 2, 3, 0, 1));
  EXPECT_FALSE(plan.create);
  EXPECT_FALSE(plan.skipped);
  EXPECT_TRUE(plan.events.empty());
  EXPECT_TRUE(plan.replace.empty());
  EXPECT_EQ(plan.active.size(), 1u);  // running ones go on
  EXPECT_FALSE(plan.next_schedule_time);
  EXPECT_EQ(plan.wake_at, at(2026, 12, 3, 3));  // to note the next run as skipped
  EXPECT_EQ(plan.state.last_skipped_time, at(2026, 12, 2, 3));

  // Resumed at 10:00: the 03:00 run that came while suspended does not start now.
  plan = planScheduleRun(specOf(), plan.state, {}, at(2026, 12, 2, 10));
  EXPECT_FALSE(plan.create);
  EXPECT_TRUE(plan.events.empty());
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 3, 3));
}

TEST(PlanScheduleRun, AfterDowntimeOnlyTheMostRecentMissedRunStarts) {
  ScheduleState s = state(at(2026, 11, 1, 0));
  s.last_schedule_time = at(2026, 11, 28, 3);
  const auto plan = planScheduleRun(specOf(), s, {}, at(2026, 12, 1, 5));
  EXPECT_EQ(plan.create, at(2026, 12, 1, 3));
  ASSERT_EQ(reasons(plan), std::vector<std::string>{"MissedSchedule"});
  EXPECT_TRUE(plan.events[0].warning);
  EXPECT_EQ(plan.events[0].message,
            "2 earlier runs (from 2026-11-29T03:00:00Z) were missed (was the operator not "
            "running?); only the most recent, of 2026-12-01T03:00:00Z, starts now, 2h late");
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 2, 3));

  // Late, but nothing before it missed.
  s.last_schedule_time = at(2026, 11, 30, 3);
  const auto late = planScheduleRun(specOf(), s, {}, at(2026, 12, 1, 3, 20));
  EXPECT_EQ(late.create, at(2026, 12, 1, 3));
  ASSERT_EQ(reasons(late), std::vector<std::string>{"MissedSchedule"});
  EXPECT_EQ(late.events[0].message,
            "the run of 2026-12-01T03:00:00Z starts 20m late (was the operator not running?)");

  // Counting stops at kMaxMissedRunsCounted.
  s.last_schedule_time = at(2026, 11, 28, 3);
  const auto minutely =
      planScheduleRun(specOf({{"schedule", "* * * * *"}}), s, {}, at(2026, 12, 1, 5, 0, 30));
  EXPECT_EQ(minutely.create, at(2026, 12, 1, 5));
  ASSERT_EQ(minutely.events.size(), 1u);
  EXPECT_TRUE(minutely.events[0].message.starts_with("100 or more earlier runs"))
      << minutely.events[0].message;
}

TEST(PlanScheduleRun, StartingDeadlineSecondsBoundsHowLateARunStarts) {
  ScheduleState s = state(at(2026, 11, 1, 0));
  s.last_schedule_time = at(2026, 11, 28, 3);
  auto plan =
      planScheduleRun(specOf({{"startingDeadlineSeconds", 3600}}), s, {}, at(2026, 12, 1, 5));
  EXPECT_FALSE(plan.create);
  ASSERT_EQ(plan.skipped, SkipReason::kStartingDeadlineExceeded);
  EXPECT_EQ(plan.state.last_skipped_time, at(2026, 12, 1, 3));
  ASSERT_EQ(reasons(plan), std::vector<std::string>{"MissedSchedule"});
  EXPECT_EQ(plan.events[0].message,
            "the run of 2026-12-01T03:00:00Z was not started: it is 2h late, past "
            "startingDeadlineSeconds (3600); 2 earlier runs (from 2026-11-29T03:00:00Z) were "
            "missed");
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 2, 3));
  // The next look at it does not report it again.
  plan = planScheduleRun(specOf({{"startingDeadlineSeconds", 3600}}), plan.state, {},
                         at(2026, 12, 1, 6));
  EXPECT_FALSE(plan.create);
  EXPECT_TRUE(plan.events.empty());

  // Within the deadline it starts.
  plan =
      planScheduleRun(specOf({{"startingDeadlineSeconds", 3 * 3600}}), s, {}, at(2026, 12, 1, 5));
  EXPECT_EQ(plan.create, at(2026, 12, 1, 3));
  EXPECT_FALSE(plan.skipped);
  // On time it starts whatever the deadline.
  plan = planScheduleRun(specOf({{"startingDeadlineSeconds", 1}}), s, {}, at(2026, 12, 1, 3));
  EXPECT_EQ(plan.create, at(2026, 12, 1, 3));
}

// As with a CronJob: runs count from the last one handled, whatever the schedule was then.
TEST(PlanScheduleRun, AChangedScheduleCountsItsTimesSinceTheLastRun) {
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 1, 3);
  auto plan = planScheduleRun(specOf({{"schedule", "0 6 * * *"}}), s, {}, at(2026, 12, 1, 10));
  EXPECT_EQ(plan.create, at(2026, 12, 1, 6));
  EXPECT_EQ(reasons(plan), std::vector<std::string>{"MissedSchedule"});
  plan = planScheduleRun(specOf({{"schedule", "0 6 * * *"}, {"startingDeadlineSeconds", 600}}), s,
                         {}, at(2026, 12, 1, 10));
  EXPECT_FALSE(plan.create);
  EXPECT_EQ(plan.next_schedule_time, at(2026, 12, 2, 6));
}

TEST(PlanScheduleRun, KeepLastKeepsTheNewestCompletedAndFailedOnesApart) {
  const sys_seconds now = at(2026, 12, 10, 12);
  std::vector<OwnedBackup> backups = {
      backup(at(2026, 12, 1, 3), BackupPhase::kCompleted),
      backup(at(2026, 12, 2, 3), BackupPhase::kFailed),
      backup(at(2026, 12, 3, 3), BackupPhase::kCompleted),
      backup(at(2026, 12, 4, 3), BackupPhase::kFailed),
      backup(at(2026, 12, 5, 3), BackupPhase::kCompleted),
      backup(at(2026, 12, 6, 3), BackupPhase::kFailed),
      backup(at(2026, 12, 7, 3), BackupPhase::kCompleted),
      backup(at(2026, 11, 1, 3), BackupPhase::kRunning),  // never by retention
      backup(at(2026, 11, 2, 3), BackupPhase::kPending),
  };
  OwnedBackup going = backup(at(2026, 11, 3, 3), BackupPhase::kCompleted);
  going.deleting = true;  // already on its way
  backups.push_back(going);
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 10, 3);
  const auto plan = planScheduleRun(specOf({{"retention", {{"keepLast", 2}}}}), s, backups, now);
  EXPECT_EQ(names(plan.prune),
            (std::vector<std::string>{"nightly-202612030300", "nightly-202612020300",
                                      "nightly-202612010300"}));
  EXPECT_EQ(plan.prune[0].why, "Completed, scheduled 2026-12-03T03:00:00Z: beyond keepLast 2");
  EXPECT_EQ(plan.prune[1].why,
            "Failed, scheduled 2026-12-02T03:00:00Z: beyond keepLast 2 (of the Failed ones)");
  EXPECT_EQ(plan.state.last_successful_time, at(2026, 12, 7, 3, 20));
  // Without retention, nothing goes.
  EXPECT_TRUE(planScheduleRun(specOf(), s, backups, now).prune.empty());
}

TEST(PlanScheduleRun, MaxAgePrunesOldFinishedBackupsButNeverTheNewestCompleted) {
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 12, 10, 3);
  const std::vector<OwnedBackup> backups = {
      backup(at(2026, 12, 1, 3), BackupPhase::kCompleted),  // 9d9h old
      backup(at(2026, 12, 2, 3), BackupPhase::kFailed),     // 8d9h old
      backup(at(2026, 12, 4, 3), BackupPhase::kCompleted),  // 6d9h old
      backup(at(2026, 12, 8, 3), BackupPhase::kFailed),     // 2d9h old
      backup(at(2026, 12, 9, 3), BackupPhase::kCompleted),  // 1d9h old
  };
  const auto spec = specOf({{"retention", {{"maxAge", "1w"}}}});
  auto plan = planScheduleRun(spec, s, backups, at(2026, 12, 10, 12));
  EXPECT_EQ(names(plan.prune),
            (std::vector<std::string>{"nightly-202612020300", "nightly-202612010300"}));
  EXPECT_EQ(plan.prune[1].why,
            "Completed, scheduled 2026-12-01T03:00:00Z: older than maxAge 1w (9d9h old)");
  // Retention looks again when the next one expires (2026-12-04 03:00 + 1w), if that is before the
  // next run; here the next run comes first.
  EXPECT_EQ(plan.wake_at, at(2026, 12, 11, 3));
  plan = planScheduleRun(specOf({{"retention", {{"maxAge", "1w"}}}, {"schedule", "0 3 1 * *"}}), s,
                         backups, at(2026, 12, 10, 12));
  EXPECT_EQ(plan.wake_at, at(2026, 12, 11, 3, 0, 1));

  // Months later, with no newer success, the newest Completed one stays: the only good backup.
  plan = planScheduleRun(spec, s, backups, at(2027, 3, 1, 0));
  EXPECT_EQ(names(plan.prune),
            (std::vector<std::string>{"nightly-202612080300", "nightly-202612040300",
                                      "nightly-202612020300", "nightly-202612010300"}));
  // Both rules: kept only if within keepLast and within maxAge.
  plan = planScheduleRun(specOf({{"retention", {{"maxAge", "1w"}, {"keepLast", 1}}}}), s, backups,
                         at(2026, 12, 10, 12));
  EXPECT_EQ(names(plan.prune),
            (std::vector<std::string>{"nightly-202612040300", "nightly-202612020300",
                                      "nightly-202612010300"}));
}

// Europe/Berlin, "30 2 * * *": on 2026-03-29 02:30 does not exist (the run is at 03:00 CEST,
// 01:00 UTC); on 2026-10-25 it happens twice (one run, at the first, 00:30 UTC).
TEST(PlanScheduleRun, AcrossDaylightSavingChanges) {
  const auto spec = specOf({{"schedule", "30 2 * * *"}, {"timeZone", "Europe/Berlin"}});
  ScheduleState s = state(at(2026, 1, 1, 0));
  s.last_schedule_time = at(2026, 3, 28, 1, 30);
  auto plan = planScheduleRun(spec, s, {}, at(2026, 3, 29, 0, 59));
  EXPECT_FALSE(plan.create);
  EXPECT_EQ(plan.next_schedule_time, at(2026, 3, 29, 1, 0));
  plan = planScheduleRun(spec, s, {}, at(2026, 3, 29, 1, 0));
  ASSERT_EQ(plan.create, at(2026, 3, 29, 1, 0));
  EXPECT_EQ(scheduledBackupName("nightly", *plan.create), "nightly-202603290100");
  EXPECT_EQ(plan.next_schedule_time, at(2026, 3, 30, 0, 30));

  s.last_schedule_time = at(2026, 10, 24, 0, 30);
  plan = planScheduleRun(spec, s, {}, at(2026, 10, 25, 0, 30));
  ASSERT_EQ(plan.create, at(2026, 10, 25, 0, 30));
  s.last_schedule_time = plan.create;
  // The second 02:30 (01:30 UTC) is no run.
  plan = planScheduleRun(spec, s, {}, at(2026, 10, 25, 1, 30, 5));
  EXPECT_FALSE(plan.create);
  EXPECT_TRUE(plan.events.empty());
  EXPECT_EQ(plan.next_schedule_time, at(2026, 10, 26, 1, 30));
}

TEST(PlanScheduleRun, MessagesShowTheZonesWallClock) {
  const auto spec = specOf({{"timeZone", "Europe/Berlin"}});
  ScheduleState s = state();
  s.last_schedule_time = at(2026, 11, 30, 2);
  const auto plan = planScheduleRun(spec, s, {}, at(2026, 12, 1, 4));
  ASSERT_EQ(plan.events.size(), 1u);
  EXPECT_EQ(plan.events[0].message,
            "the run of 2026-12-01T02:00:00Z (2026-12-01 03:00 Europe/Berlin) starts 2h late (was "
            "the operator not running?)");
}

TEST(ScheduledBackup, NameLabelsAnnotationsOwnerAndSpec) {
  EXPECT_EQ(scheduledBackupName("nightly", at(2026, 12, 1, 3, 0)), "nightly-202612010300");
  EXPECT_EQ(scheduledBackupName("team.hourly", at(2027, 1, 9, 23, 45)), "team.hourly-202701092345");
  const auto spec = specOf(
      {{"template",
        {{"metadata",
          {{"labels", {{"team", "analytics"}, {"rtable.io/backup-schedule", "not-mine"}}},
           {"annotations", {{"note", "x"}}}}},
         {"spec", {{"table", "events"}, {"destination", {{"filesystem", {{"path", "/b"}}}}}}}}}});
  const json object =
      renderScheduledBackup(spec, "nightly", "analytics", "uid-1", at(2026, 12, 1, 3));
  const json expected = json::parse(R"({
    "apiVersion": "rtable.io/v1alpha1", "kind": "ClusterBackup",
    "metadata": {
      "name": "nightly-202612010300", "namespace": "analytics",
      "labels": {"team": "analytics", "rtable.io/backup-schedule": "nightly"},
      "annotations": {"note": "x", "rtable.io/scheduled-at": "2026-12-01T03:00:00Z"},
      "ownerReferences": [{"apiVersion": "rtable.io/v1alpha1", "kind": "BackupSchedule",
                           "name": "nightly", "uid": "uid-1", "controller": true,
                           "blockOwnerDeletion": true}]},
    "spec": {"table": "events", "deletionPolicy": "Delete",
             "destination": {"filesystem": {"path": "/b"}}}})");
  EXPECT_EQ(object, expected) << json::diff(expected, object).dump(1);

  // Read back as the schedule sees it.
  json stored = object;
  stored["metadata"]["uid"] = "b-1";
  stored["metadata"]["creationTimestamp"] = "2026-12-01T03:00:01Z";
  stored["status"] = {{"phase", "Completed"},
                      {"startedAt", "2026-12-01T03:00:02Z"},
                      {"completedAt", "2026-12-01T03:10:00Z"}};
  const OwnedBackup read = OwnedBackup::fromObject(stored);
  EXPECT_EQ(read.name, "nightly-202612010300");
  EXPECT_EQ(read.uid, "b-1");
  EXPECT_EQ(read.phase, BackupPhase::kCompleted);
  EXPECT_EQ(read.scheduled_at, at(2026, 12, 1, 3));
  EXPECT_EQ(read.created_at, at(2026, 12, 1, 3, 0, 1));
  EXPECT_EQ(read.started_at, at(2026, 12, 1, 3, 0, 2));
  EXPECT_EQ(read.completed_at, at(2026, 12, 1, 3, 10));
  EXPECT_FALSE(read.deleting);
  stored.erase("status");  // no phase yet: Pending
  EXPECT_EQ(OwnedBackup::fromObject(stored).phase, BackupPhase::kPending);
  EXPECT_TRUE(OwnedBackup::fromObject(stored).active());
}

}  // namespace
}  // namespace rtable::controllers
