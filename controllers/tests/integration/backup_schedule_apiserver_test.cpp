// The BackupSchedule controller against a real kube-apiserver (LocalControlPlane, the CRDs of
// crds/): the operator process's informers, work queue and Event recorder with the controller as
// rtable-operator wires it, and a wall clock the test moves past several scheduled times. No
// ClusterBackup controller runs: the test writes the backups' status.phase itself, as that
// controller would, and watches the schedule create runs (owner references, labels, annotation,
// spec), skip one under Forbid, miss one while "down", prune by retention, and keep its status;
// a second ClusterBackup for the same run is refused by the apiserver (its name is the run's).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <set>

#include "rtable/common/rfc3339.h"
#include "rtable/common/testing/wait.h"
#include "rtable/controllers/backup_schedule_controller.h"
#include "rtable/controllers/backup_schedule_plan.h"
#include "rtable/controllers/backup_specs.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/operator_process.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono;
using common::testing::waitFor;
using nlohmann::json;

constexpr const char* kNamespace = "backups";

class BackupScheduleApiServer : public ::testing::Test {
 protected:
  void SetUp() override {
    op::testing::LocalControlPlaneOptions options;
    options.start_timeout = seconds(240);  // a loaded 2-core machine
    auto plane = op::testing::LocalControlPlane::start(options);
    ASSERT_TRUE(plane) << plane.error();
    plane_ = std::make_unique<op::testing::LocalControlPlane>(std::move(*plane));
    auto config = op::KubeConfig::load(plane_->kubeconfigPath());
    ASSERT_TRUE(config) << config.error().toString();
    auto cluster = config->clusterConfig();
    ASSERT_TRUE(cluster) << cluster.error().toString();
    auto client = op::HttpKubeClient::create(*cluster);
    ASSERT_TRUE(client) << client.error().toString();
    client_ = std::move(*client);
    auto applied = plane_->kubectl({"apply", "-f", RTABLE_CRDS_DIR});
    ASSERT_TRUE(applied && applied->exit_code == 0)
        << (applied ? applied->out + applied->err : applied.error());
    ASSERT_TRUE(waitFor(
        [&] {
          for (const char* name : {"clusterbackups.rtable.io", "backupschedules.rtable.io"}) {
            auto crd = client_->get(op::resources::customResourceDefinitions(), {"", name});
            if (!crd) return false;
            const json conditions = (*crd)["status"].value("conditions", json::array());
            if (std::none_of(conditions.begin(), conditions.end(), [](const json& c) {
                  return c["type"] == "Established" && c["status"] == "True";
                })) {
              return false;
            }
          }
          return client_->list(backupSchedules(), kNamespace).has_value() &&
                 client_->list(clusterBackups(), kNamespace).has_value();
        },
        seconds(120), milliseconds(200)))
        << "the CRDs were not served";
    auto ns = client_->create(
        op::resources::namespaces(),
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNamespace}}}});
    ASSERT_TRUE(ns) << ns.error().toString();
  }

  void TearDown() override {
    if (process_) {
      process_->requestShutdown();
      if (exit_.valid()) exit_.wait();
      process_.reset();
    }
    if (plane_ && HasFailure()) {
      plane_->keepWorkDir();
      fmt::print(stderr, "control plane logs kept in {}\n", plane_->workDir().string());
    }
    client_.reset();
    plane_.reset();
  }

  // rtable-operator's wiring of the controller, with the test's wall clock.
  void startOperator() {
    op::OperatorProcessOptions options;
    options.leader_elect = false;
    options.health_probe_bind_address = "0";
    options.metrics_bind_address = "0";
    process_ = std::make_unique<op::OperatorProcess>(*client_, std::move(options));
    BackupScheduleControllerOptions controller;
    controller.reconciler.wall_clock = [this] {
      std::lock_guard lock(mu_);
      return now_;
    };
    ASSERT_TRUE(addBackupScheduleController(*process_, std::move(controller)));
    auto started = process_->start();
    ASSERT_TRUE(started) << started.error();
    exit_ = std::async(std::launch::async, [this] { return process_->wait(); });
  }

  // Moves the wall clock and makes the controller look (what its requeue at the scheduled time
  // does in production, where the clock moves by itself): an annotation on the schedule.
  void tickTo(sys_seconds t) {
    {
      std::lock_guard lock(mu_);
      now_ = t;
    }
    const json patch = {
        {"metadata", {{"annotations", {{"test.rtable.io/now", common::formatRfc3339(t)}}}}}};
    auto patched =
        client_->patch(backupSchedules(), {kNamespace, "hourly"}, op::PatchType::kMerge, patch);
    ASSERT_TRUE(patched) << patched.error().toString();
  }

  json schedule() {
    auto object = client_->get(backupSchedules(), {kNamespace, "hourly"});
    return object ? *object : json();
  }
  json status() { return schedule().value("status", json::object()); }
  json condition(const std::string& type) {
    const json conditions = status().value("conditions", json::array());
    for (const auto& c : conditions) {
      if (c["type"] == type) return c;
    }
    return json();
  }
  std::vector<std::string> backupNames() {
    std::vector<std::string> names;
    auto list = client_->list(clusterBackups(), kNamespace);
    if (!list) return {"<" + list.error().toString() + ">"};
    for (const auto& item : list->items) names.push_back(item["metadata"]["name"]);
    std::sort(names.begin(), names.end());
    return names;
  }
  // Polls until the backups are exactly `expected` (by scheduled time).
  void expectBackups(const std::vector<sys_seconds>& expected) {
    std::vector<std::string> names;
    for (sys_seconds t : expected) names.push_back(scheduledBackupName("hourly", t));
    std::sort(names.begin(), names.end());
    EXPECT_TRUE(waitFor([&] { return backupNames() == names; }, seconds(30), milliseconds(50)))
        << "backups: " << json(backupNames()).dump() << "\nexpected: " << json(names).dump();
  }
  void expectStatus(const std::string& field, const json& value) {
    EXPECT_TRUE(waitFor([&] { return status().value(field, json()) == value; }, seconds(30),
                        milliseconds(50)))
        << "status." << field << " is " << status().value(field, json()).dump() << ", expected "
        << value.dump() << "\n"
        << status().dump(1);
  }
  // What the ClusterBackup controller would write, through the status subresource.
  void finish(sys_seconds run, const std::string& phase, sys_seconds completed) {
    const json patch = {{"status",
                         {{"phase", phase},
                          {"startedAt", common::formatRfc3339(run + seconds(10))},
                          {"completedAt", common::formatRfc3339(completed)}}}};
    op::PatchOptions options;
    options.subresource = "status";
    auto patched =
        client_->patch(clusterBackups(), {kNamespace, scheduledBackupName("hourly", run)},
                       op::PatchType::kMerge, patch, options);
    ASSERT_TRUE(patched) << patched.error().toString();
  }
  std::string text(sys_seconds t) { return common::formatRfc3339(t); }

  std::unique_ptr<op::testing::LocalControlPlane> plane_;
  std::unique_ptr<op::KubeClient> client_;
  std::unique_ptr<op::OperatorProcess> process_;
  std::future<op::ProcessExit> exit_;
  std::mutex mu_;
  system_clock::time_point now_;
};

TEST_F(BackupScheduleApiServer, RunsSkipsMissesAndPrunesOnTheClock) {
  // Hourly in Berlin time, keep 2 good backups and nothing older than 3.5 h (but the newest good
  // one), never two at once.
  const json object = json::parse(R"({
    "apiVersion": "rtable.io/v1alpha1", "kind": "BackupSchedule",
    "metadata": {"name": "hourly", "namespace": "backups"},
    "spec": {"schedule": "0 * * * *", "timeZone": "Europe/Berlin",
             "template": {"metadata": {"labels": {"team": "analytics"}},
                          "spec": {"table": "events",
                                   "destination": {"filesystem": {"path": "/backups/hourly"}}}},
             "retention": {"keepLast": 2, "maxAge": "210m"}}})");
  auto created = client_->create(backupSchedules(), object);
  ASSERT_TRUE(created) << created.error().toString();
  const std::string uid = (*created)["metadata"]["uid"];
  auto creation =
      common::parseRfc3339((*created)["metadata"]["creationTimestamp"].get<std::string>());
  ASSERT_TRUE(creation);
  // The first run: the first full hour after the schedule was made (by the apiserver's clock).
  const sys_seconds t0 = ceil<hours>(floor<seconds>(*creation) + seconds(1));
  now_ = t0 - minutes(1);
  startOperator();
  expectStatus("nextScheduleTime", text(t0));
  EXPECT_EQ(condition("Ready")["reason"], "Scheduled");
  EXPECT_TRUE(backupNames().empty());

  // t0: the first run.
  tickTo(t0 + seconds(5));
  expectBackups({t0});
  auto backup = client_->get(clusterBackups(), {kNamespace, scheduledBackupName("hourly", t0)});
  ASSERT_TRUE(backup) << backup.error().toString();
  EXPECT_EQ((*backup)["metadata"]["ownerReferences"],
            json::array({{{"apiVersion", "rtable.io/v1alpha1"},
                          {"kind", "BackupSchedule"},
                          {"name", "hourly"},
                          {"uid", uid},
                          {"controller", true},
                          {"blockOwnerDeletion", true}}}));
  EXPECT_EQ((*backup)["metadata"]["labels"],
            json({{"team", "analytics"}, {"rtable.io/backup-schedule", "hourly"}}));
  EXPECT_EQ((*backup)["metadata"]["annotations"]["rtable.io/scheduled-at"], text(t0));
  json template_spec = object["spec"]["template"]["spec"];
  template_spec["deletionPolicy"] = "Delete";  // the CRD's default
  EXPECT_EQ((*backup)["spec"], template_spec);
  expectStatus("lastScheduleTime", text(t0));
  expectStatus("active", json::array({{{"name", scheduledBackupName("hourly", t0)},
                                       {"uid", (*backup)["metadata"]["uid"]}}}));
  expectStatus("nextScheduleTime", text(t0 + hours(1)));

  // The same run cannot be created twice: its name is taken.
  auto spec = BackupScheduleSpec::parse(object["spec"]);
  ASSERT_TRUE(spec);
  auto again = client_->create(clusterBackups(),
                               renderScheduledBackup(*spec, "hourly", kNamespace, uid, t0));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().kind, op::KubeErrorKind::kAlreadyExists) << again.error().toString();

  // t0+1h: the first one is still Pending: Forbid skips this run.
  tickTo(t0 + hours(1) + seconds(5));
  expectStatus("lastSkippedTime", text(t0 + hours(1)));
  EXPECT_EQ(condition("RunSkipped")["reason"], "ConcurrencyForbid");
  EXPECT_EQ(condition("RunSkipped")["status"], "True");
  expectBackups({t0});

  // It completes (no tick: the ClusterBackup's change alone brings its schedule up to date).
  finish(t0, "Completed", t0 + hours(1) + seconds(30));
  expectStatus("lastSuccessfulTime", text(t0 + hours(1) + seconds(30)));
  expectStatus("active", json::array());
  expectBackups({t0});  // the skipped run stays skipped

  // t0+2h Completed, t0+3h Failed.
  tickTo(t0 + hours(2) + seconds(5));
  expectBackups({t0, t0 + hours(2)});
  EXPECT_EQ(condition("RunSkipped")["status"], "False");
  finish(t0 + hours(2), "Completed", t0 + hours(2) + minutes(10));
  expectStatus("lastSuccessfulTime", text(t0 + hours(2) + minutes(10)));
  tickTo(t0 + hours(3) + seconds(5));
  expectBackups({t0, t0 + hours(2), t0 + hours(3)});
  finish(t0 + hours(3), "Failed", t0 + hours(3) + minutes(10));
  expectStatus("active", json::array());

  // t0+4h: the t0 backup is older than maxAge (3.5 h) and not the newest Completed one: deleted.
  tickTo(t0 + hours(4) + seconds(5));
  expectBackups({t0 + hours(2), t0 + hours(3), t0 + hours(4)});
  finish(t0 + hours(4), "Completed", t0 + hours(4) + minutes(10));
  expectStatus("lastSuccessfulTime", text(t0 + hours(4) + minutes(10)));

  // The operator "is down" at t0+5h; at t0+6h31m only the most recent run starts (late), the
  // missed one is reported, and retention drops what is now older than 3.5 h (t0+2h Completed,
  // t0+3h Failed).
  tickTo(t0 + hours(6) + minutes(31));
  expectBackups({t0 + hours(4), t0 + hours(6)});
  expectStatus("lastScheduleTime", text(t0 + hours(6)));
  expectStatus("nextScheduleTime", text(t0 + hours(7)));
  expectStatus("lastSuccessfulTime", text(t0 + hours(4) + minutes(10)));
  EXPECT_EQ(status()["active"].size(), 1u);
  EXPECT_EQ(status()["observedGeneration"], 1);
  EXPECT_EQ(condition("Ready")["status"], "True");

  // kubectl get -o wide shows the zone, the next run and the Ready condition's reason.
  auto wide = plane_->kubectl({"get", "bs", "-n", kNamespace, "-o", "wide"});
  ASSERT_TRUE(wide && wide->exit_code == 0) << (wide ? wide->err : wide.error());
  EXPECT_NE(wide->out.find("AGE   TIME-ZONE       NEXT-SCHEDULE          REASON"),
            std::string::npos)
      << wide->out;
  EXPECT_NE(wide->out.find("Europe/Berlin   " + text(t0 + hours(7)) + "   Scheduled"),
            std::string::npos)
      << wide->out;

  // The Events, as kubectl describe shows them.
  auto reasonsPosted = [&] {
    std::set<std::string> reasons;
    op::ListOptions selector;
    selector.field_selector = "involvedObject.name=hourly";
    auto events = client_->list(op::resources::events(), kNamespace, selector);
    if (events) {
      for (const auto& e : events->items) reasons.insert(e.value("reason", ""));
    }
    return reasons;
  };
  const std::set<std::string> expected = {"Created", "RunSkipped", "Deleted", "MissedSchedule"};
  EXPECT_TRUE(waitFor(
      [&] {
        const auto posted = reasonsPosted();
        return std::includes(posted.begin(), posted.end(), expected.begin(), expected.end());
      },
      seconds(30), milliseconds(100)))
      << json(reasonsPosted()).dump();
}

}  // namespace
}  // namespace rtable::controllers
