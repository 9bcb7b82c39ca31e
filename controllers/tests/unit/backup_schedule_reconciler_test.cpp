// BackupScheduleReconciler on FakeKubeClient (resourceVersions, the status subresource, uid
// preconditions on delete) with an injected wall clock: the ClusterBackups it creates, deletes and
// reads, the status and conditions it writes, its Events and requeue times, and its answers to
// failed and repeated writes.
#include "rtable/controllers/backup_schedule_reconciler.h"

#include <gtest/gtest.h>

#include "rtable/common/rfc3339.h"
#include "rtable/controllers/backup_schedule_plan.h"
#include "rtable/operator/testing/fake_event_recorder.h"
#include "rtable/operator/testing/fake_kube_client.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono;
using nlohmann::json;
using op::testing::Verb;

json scheduleObject(const json& spec_fields = json::object()) {
  json spec = {
      {"schedule", "0 * * * *"},
      {"template",
       {{"metadata", {{"labels", {{"team", "analytics"}}}}},
        {"spec",
         {{"table", "events"}, {"destination", {{"filesystem", {{"path", "/backups"}}}}}}}}}};
  spec.update(spec_fields);
  return {{"apiVersion", "rtable.io/v1alpha1"},
          {"kind", "BackupSchedule"},
          {"metadata", {{"name", "hourly"}, {"namespace", "analytics"}}},
          {"spec", spec}};
}

class ScheduleReconciler : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(client_.create(
        op::resources::namespaces(),
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "analytics"}}}}));
    BackupScheduleReconcilerOptions options;
    options.wall_clock = [this] { return now_; };
    options.events = &events_;
    reconciler_ = std::make_unique<BackupScheduleReconciler>(client_, options);
  }

  // Creates the schedule; the fake stamps creationTimestamp with the real clock, so the test's
  // time starts from the first full hour after it (t0_, the first run).
  void createSchedule(const json& spec_fields = json::object()) {
    auto created = client_.create(backupSchedules(), scheduleObject(spec_fields));
    ASSERT_TRUE(created) << created.error().toString();
    uid_ = (*created)["metadata"]["uid"];
    auto creation =
        common::parseRfc3339((*created)["metadata"]["creationTimestamp"].get<std::string>());
    ASSERT_TRUE(creation);
    t0_ = ceil<hours>(floor<seconds>(*creation) + seconds(1));
    now_ = t0_ - minutes(1);
  }
  op::ReconcileOutcome reconcile() { return reconciler_->reconcile({"analytics", "hourly"}); }
  json schedule() { return *client_.get(backupSchedules(), {"analytics", "hourly"}); }
  json status() { return schedule()["status"]; }
  json condition(const std::string& type) {
    const json conditions = status().value("conditions", json::array());
    for (const auto& c : conditions) {
      if (c["type"] == type) return c;
    }
    return json();
  }
  std::vector<std::string> backupNames() {
    std::vector<std::string> names;
    auto list = client_.list(clusterBackups(), "analytics");
    EXPECT_TRUE(list);
    for (const auto& item : list->items) names.push_back(item["metadata"]["name"]);
    return names;
  }
  std::string nameAt(sys_seconds t) { return scheduledBackupName("hourly", t); }
  // What the ClusterBackup controller would write.
  void setPhase(const std::string& name, const std::string& phase) {
    auto backup = client_.get(clusterBackups(), {"analytics", name});
    ASSERT_TRUE(backup) << name;
    (*backup)["status"]["phase"] = phase;
    (*backup)["status"]["startedAt"] = common::formatRfc3339(now_);
    if (phase == "Completed" || phase == "Failed")
      (*backup)["status"]["completedAt"] = common::formatRfc3339(now_);
    ASSERT_TRUE(client_.updateStatus(clusterBackups(), *backup));
  }
  std::string text(sys_seconds t) { return common::formatRfc3339(t); }

  op::testing::FakeKubeClient client_;
  op::testing::FakeEventRecorder events_;
  std::unique_ptr<BackupScheduleReconciler> reconciler_;
  std::string uid_;
  sys_seconds t0_;
  system_clock::time_point now_;
};

TEST_F(ScheduleReconciler, CreatesEachRunOnTimeAndReportsIt) {
  createSchedule();
  auto outcome = reconcile();
  ASSERT_TRUE(outcome) << outcome.error().message;
  EXPECT_EQ(outcome->requeue_after, minutes(1));  // wakes at the first run
  EXPECT_TRUE(backupNames().empty());
  EXPECT_EQ(status()["nextScheduleTime"], text(t0_));
  EXPECT_EQ(condition("Ready")["reason"], "Scheduled");
  EXPECT_EQ(condition("Ready")["message"], "next run at " + text(t0_));
  EXPECT_EQ(status()["observedGeneration"], 1);

  now_ = t0_ + milliseconds(300);
  outcome = reconcile();
  ASSERT_TRUE(outcome) << outcome.error().message;
  EXPECT_EQ(outcome->requeue_after, hours(1) - milliseconds(300));
  ASSERT_EQ(backupNames(), std::vector<std::string>{nameAt(t0_)});
  const json backup = *client_.get(clusterBackups(), {"analytics", nameAt(t0_)});
  EXPECT_EQ(backup["metadata"]["labels"],
            json({{"team", "analytics"}, {"rtable.io/backup-schedule", "hourly"}}));
  EXPECT_EQ(backup["metadata"]["annotations"]["rtable.io/scheduled-at"], text(t0_));
  EXPECT_EQ(backup["metadata"]["ownerReferences"],
            json::array({{{"apiVersion", "rtable.io/v1alpha1"},
                          {"kind", "BackupSchedule"},
                          {"name", "hourly"},
                          {"uid", uid_},
                          {"controller", true},
                          {"blockOwnerDeletion", true}}}));
  EXPECT_EQ(backup["spec"], json::parse(R"({"table": "events", "deletionPolicy": "Delete",
                                            "destination": {"filesystem": {"path": "/backups"}}})"));
  const json s = status();
  EXPECT_EQ(s["lastScheduleTime"], text(t0_));
  EXPECT_EQ(s["nextScheduleTime"], text(t0_ + hours(1)));
  EXPECT_EQ(s["active"],
            json::array({{{"name", nameAt(t0_)}, {"uid", backup["metadata"]["uid"]}}}));
  EXPECT_FALSE(s.contains("lastSuccessfulTime"));
  EXPECT_EQ(condition("RunSkipped")["status"], "False");
  EXPECT_EQ(condition("RunSkipped")["reason"], "RunCreated");
  ASSERT_EQ(events_.withReason("Created").size(), 1u);
  EXPECT_EQ(events_.withReason("Created")[0].message,
            "created ClusterBackup " + nameAt(t0_) + " for the run of " + text(t0_));
  EXPECT_EQ(events_.withReason("Created")[0].object.kind, "BackupSchedule");

  // Again at the same time: nothing is written.
  const int64_t version = client_.currentResourceVersionForTest();
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(client_.currentResourceVersionForTest(), version);

  // It completes: lastSuccessfulTime, nothing active.
  now_ = t0_ + minutes(10);
  setPhase(nameAt(t0_), "Completed");
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(status()["lastSuccessfulTime"], text(t0_ + minutes(10)));
  EXPECT_EQ(status()["active"], json::array());
}

TEST_F(ScheduleReconciler, ALostAnswerOrStatusWriteNeverMakesASecondBackup) {
  createSchedule();
  now_ = t0_ + seconds(1);
  // The create is applied but its answer lost.
  client_.failNextForTest(Verb::kCreate,
                          op::KubeError::of(op::KubeErrorKind::kTimeout, "context deadline"), 1,
                          op::testing::FakeKubeClient::FaultTiming::kAfterApply);
  auto outcome = reconcile();
  ASSERT_FALSE(outcome);
  EXPECT_FALSE(outcome.error().terminal);
  EXPECT_EQ(events_.withReason("CreateFailed").size(), 1u);
  // The status write fails.
  client_.failNextForTest(Verb::kPatch,
                          op::KubeError::of(op::KubeErrorKind::kServerError, "etcd timeout"));
  ASSERT_FALSE(reconcile());
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(backupNames(), std::vector<std::string>{nameAt(t0_)});
  EXPECT_EQ(status()["lastScheduleTime"], text(t0_));
  EXPECT_EQ(status()["active"].size(), 1u);

  // The name belongs to someone else's ClusterBackup: not taken over, and said so.
  now_ = t0_ + hours(1) + seconds(1);
  setPhase(nameAt(t0_), "Completed");
  json foreign = *client_.get(clusterBackups(), {"analytics", nameAt(t0_)});
  foreign["metadata"] = {{"name", nameAt(t0_ + hours(1))}, {"namespace", "analytics"}};
  foreign.erase("status");
  ASSERT_TRUE(client_.create(clusterBackups(), foreign));
  outcome = reconcile();
  ASSERT_FALSE(outcome);
  ASSERT_EQ(events_.withReason("CreateFailed").size(), 2u);
  EXPECT_NE(
      events_.withReason("CreateFailed")[1].message.find("that this schedule does not control"),
      std::string::npos);
}

TEST_F(ScheduleReconciler, ForbidSkipsARunWhileTheLastOneRuns) {
  createSchedule();
  now_ = t0_;
  ASSERT_TRUE(reconcile());
  setPhase(nameAt(t0_), "Running");
  now_ = t0_ + hours(1);
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(backupNames(), std::vector<std::string>{nameAt(t0_)});
  EXPECT_EQ(status()["lastSkippedTime"], text(t0_ + hours(1)));
  EXPECT_EQ(condition("RunSkipped")["status"], "True");
  EXPECT_EQ(condition("RunSkipped")["reason"], "ConcurrencyForbid");
  EXPECT_EQ(condition("RunSkipped")["lastTransitionTime"], text(t0_ + hours(1)));
  ASSERT_EQ(events_.withReason("RunSkipped").size(), 1u);
  EXPECT_EQ(events_.withReason("RunSkipped")[0].type, op::EventType::kWarning);

  // It finishes: the skipped run stays skipped, the next one runs.
  now_ = t0_ + hours(1) + minutes(30);
  setPhase(nameAt(t0_), "Completed");
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(backupNames().size(), 1u);
  now_ = t0_ + hours(2);
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(backupNames(), (std::vector<std::string>{nameAt(t0_), nameAt(t0_ + hours(2))}));
  EXPECT_EQ(condition("RunSkipped")["status"], "False");
}

TEST_F(ScheduleReconciler, ReplaceDeletesTheRunningBackupThenCreates) {
  createSchedule({{"concurrencyPolicy", "Replace"}});
  now_ = t0_;
  ASSERT_TRUE(reconcile());
  setPhase(nameAt(t0_), "Running");
  now_ = t0_ + hours(1);
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(backupNames(), std::vector<std::string>{nameAt(t0_ + hours(1))});
  ASSERT_EQ(events_.withReason("Replaced").size(), 1u);
  EXPECT_TRUE(events_.withReason("Replaced")[0].message.starts_with("deleted ClusterBackup " +
                                                                    nameAt(t0_) + " (Running"));
  EXPECT_EQ(status()["active"].size(), 1u);
  EXPECT_EQ(status()["active"][0]["name"], nameAt(t0_ + hours(1)));
}

TEST_F(ScheduleReconciler, RetentionDeletesTheOldestAndRetriesAFailedDelete) {
  createSchedule({{"retention", {{"keepLast", 1}}}, {"concurrencyPolicy", "Allow"}});
  for (int h = 0; h < 3; ++h) {
    now_ = t0_ + hours(h);
    ASSERT_TRUE(reconcile());
    setPhase(nameAt(t0_ + hours(h)), "Completed");
  }
  // Each completion made the previous Completed one surplus, deleted on the next reconcile; the
  // last one's completion is seen now.
  client_.failNextForTest(Verb::kDelete,
                          op::KubeError::of(op::KubeErrorKind::kServerError, "etcd timeout"));
  auto outcome = reconcile();
  ASSERT_FALSE(outcome);
  EXPECT_EQ(events_.withReason("DeleteFailed").size(), 1u);
  EXPECT_EQ(status()["lastSuccessfulTime"], text(t0_ + hours(2)));  // written all the same
  ASSERT_TRUE(reconcile());
  EXPECT_EQ(backupNames(), std::vector<std::string>{nameAt(t0_ + hours(2))});
  const auto deleted = events_.withReason("Deleted");
  ASSERT_EQ(deleted.size(), 2u);
  EXPECT_EQ(deleted[0].message, "deleted ClusterBackup " + nameAt(t0_) + " (Completed, scheduled " +
                                    text(t0_) + ": beyond keepLast 1)");
}

TEST_F(ScheduleReconciler, SuspendedStartsNothingAndSaysSo) {
  createSchedule({{"suspend", true}});
  now_ = t0_ + seconds(5);
  auto outcome = reconcile();
  ASSERT_TRUE(outcome);
  EXPECT_TRUE(backupNames().empty());
  EXPECT_EQ(condition("Ready")["status"], "False");
  EXPECT_EQ(condition("Ready")["reason"], "Suspended");
  EXPECT_FALSE(status().contains("nextScheduleTime"));
  EXPECT_EQ(status()["lastSkippedTime"], text(t0_));
  EXPECT_EQ(outcome->requeue_after, hours(1) - seconds(5));

  // Resumed: Ready again, the run that came while suspended does not start now.
  json resumed = schedule();
  resumed["spec"]["suspend"] = false;
  ASSERT_TRUE(client_.update(backupSchedules(), resumed));
  ASSERT_TRUE(reconcile());
  EXPECT_TRUE(backupNames().empty());
  EXPECT_EQ(condition("Ready")["reason"], "Scheduled");
  EXPECT_EQ(status()["observedGeneration"], 2);
  EXPECT_EQ(status()["nextScheduleTime"], text(t0_ + hours(1)));
}

TEST_F(ScheduleReconciler, AnInvalidSpecCreatesNothingAndSaysWhy) {
  createSchedule({{"timeZone", "Mars/Olympus_Mons"}});
  now_ = t0_;
  auto outcome = reconcile();
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().terminal);
  EXPECT_TRUE(backupNames().empty());
  EXPECT_EQ(condition("Ready")["reason"], "InvalidSpec");
  EXPECT_TRUE(condition("Ready")["message"].get<std::string>().starts_with(
      "spec.timeZone: unknown time zone 'Mars/Olympus_Mons'"))
      << condition("Ready");
  EXPECT_EQ(events_.withReason("InvalidSpec").size(), 1u);
}

TEST_F(ScheduleReconciler, AGoneScheduleIsDone) {
  auto outcome = reconcile();
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->requeue_after, common::Clock::Duration::zero());
}

}  // namespace
}  // namespace rtable::controllers
