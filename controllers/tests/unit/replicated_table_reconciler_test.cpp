// ReplicatedTableReconciler on FakeKubeClient (which honours resourceVersions, the status
// subresource and apply-creates): owned objects, the kept secret, status and conditions,
// idempotence, invalid specs, a failed apply.
#include "rtable/controllers/replicated_table_reconciler.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "rtable/backup/restore.h"
#include "rtable/common/base64.h"
#include "rtable/common/testing/tls_certificates.h"
#include "rtable/controllers/cluster_backup_reconciler.h"
#include "rtable/controllers/replicated_table_objects.h"
#include "rtable/operator/testing/fake_event_recorder.h"
#include "rtable/operator/testing/fake_kube_client.h"
#include "rtable/replication_core/log_entry.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_registration.h"
#include "rtable/replication_core/table_swap.h"
#include "rtable/replication_core/testing/fake_keeper.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;
using op::resources::secrets;
using op::resources::statefulSets;

json table(int replicas, const std::string& partition_by = "toYYYYMM(d)") {
  return {{"apiVersion", "rtable.io/v1alpha1"},
          {"kind", "ReplicatedTable"},
          {"metadata", {{"name", "events"}, {"namespace", "analytics"}}},
          {"spec",
           {{"table", "events"},
            {"replicas", replicas},
            {"columns", json::array({{{"name", "d"}, {"type", "Date"}},
                                     {{"name", "user"}, {"type", "String"}}})},
            {"partitionBy", partition_by},
            {"orderBy", json::array({"user", "d"})},
            {"zookeeper", {{"connect", "zk-0.zk:2181"}}}}}};
}

class Reconciler : public ::testing::Test {
 protected:
  void SetUp() override {
    ReplicatedTableReconcilerOptions options;
    options.generate_secret = [this] { return "secret-" + std::to_string(++secrets_made_); };
    options.wall_clock = [this] { return now_; };
    reconciler_ = std::make_unique<ReplicatedTableReconciler>(client_, options);
    ASSERT_TRUE(client_.create(
        op::resources::namespaces(),
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "analytics"}}}}));
  }
  json get(const op::ResourceType& type, const std::string& name) {
    auto object = client_.get(type, {"analytics", name});
    EXPECT_TRUE(object) << name << ": " << object.error().toString();
    return object ? *object : json();
  }
  json condition(const std::string& type) {
    const json object = get(replicatedTables(), "events");  // bound: the loop must not outlive it
    for (const auto& c : object["status"]["conditions"]) {
      if (c["type"] == type) return c;
    }
    return json();
  }
  // What the StatefulSet controller would report.
  void setReadyReplicas(int ready) {
    auto sts = get(statefulSets(), "events");
    sts["status"] = {{"replicas", sts["spec"]["replicas"]}, {"readyReplicas", ready}};
    ASSERT_TRUE(client_.updateStatus(statefulSets(), sts));
  }

  op::testing::FakeKubeClient client_;
  prometheus::Registry registry_;  // before the reconciler, whose metrics live in it
  std::unique_ptr<ReplicatedTableReconciler> reconciler_;
  int secrets_made_ = 0;
  std::chrono::system_clock::time_point now_ =
      std::chrono::sys_days{std::chrono::year{2026} / 12 / 2};
};

TEST_F(Reconciler, CreatesTheOwnedObjectsAndReportsReadiness) {
  auto created = client_.create(replicatedTables(), table(3));
  ASSERT_TRUE(created) << created.error().toString();
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome) << outcome.error().message;
  for (const auto& [type, name] : std::vector<std::pair<op::ResourceType, std::string>>{
           {op::resources::services(), "events"},
           {op::resources::services(), "events-headless"},
           {op::resources::configMaps(), "events-config"},
           {secrets(), "events-interserver"},
           {statefulSets(), "events"},
           {op::resources::podDisruptionBudgets(), "events"}}) {
    const json object = get(type, name);
    EXPECT_EQ(object["metadata"]["ownerReferences"][0]["uid"], (*created)["metadata"]["uid"])
        << name;
  }
  const json status = get(replicatedTables(), "events")["status"];
  EXPECT_EQ(status["observedGeneration"], (*created)["metadata"]["generation"]);
  EXPECT_EQ(status["ready"], "0/3");
  EXPECT_EQ(condition("Ready")["status"], "False");
  EXPECT_EQ(condition("Ready")["reason"], "ReplicasNotReady");
  EXPECT_EQ(condition("Degraded")["status"], "False");
  EXPECT_EQ(status["selector"],
            "app.kubernetes.io/component=replica,app.kubernetes.io/instance=events,"
            "app.kubernetes.io/name=rtable");

  setReadyReplicas(2);
  now_ += std::chrono::minutes(1);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["ready"], "2/3");
  EXPECT_EQ(condition("Degraded")["status"], "True");
  EXPECT_EQ(condition("Degraded")["lastTransitionTime"], "2026-12-02T00:01:00Z");
  // Ready stayed False: its transition time is the first one.
  EXPECT_EQ(condition("Ready")["lastTransitionTime"], "2026-12-02T00:00:00Z");

  setReadyReplicas(3);
  now_ += std::chrono::minutes(1);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Ready")["status"], "True");
  EXPECT_EQ(condition("Ready")["reason"], "AllReplicasReady");
  EXPECT_EQ(condition("Ready")["lastTransitionTime"], "2026-12-02T00:02:00Z");
}

TEST_F(Reconciler, ASecondReconcileWritesNothingAndKeepsTheSecret) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json secret = get(secrets(), "events-interserver");
  const int64_t version = client_.currentResourceVersionForTest();
  now_ += std::chrono::minutes(5);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(secrets_made_, 3);  // the interserver secret, the ZooKeeper password, the API token
  EXPECT_EQ(get(secrets(), "events-interserver")["data"], secret["data"]);
  EXPECT_EQ(client_.currentResourceVersionForTest(), version)
      << "the second reconcile changed something";
}

// Rotating the interserver secret (docs/security.md): the operator keeps what the user wrote
// (two lines: new, then old) and the Secret's new version in the pod template rolls the replicas.
TEST_F(Reconciler, AnEditedInterserverSecretIsKeptAndRollsTheReplicas) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto annotation = [&] {
    return get(statefulSets(), "events")["spec"]["template"]["metadata"]["annotations"].value(
        "rtable.io/interserver-version", "");
  };
  json secret = get(secrets(), "events-interserver");
  const std::string before = annotation();
  EXPECT_EQ(before, secret["metadata"]["resourceVersion"]);
  auto old_secret = common::base64Decode(secret["data"]["secret"].get<std::string>());
  ASSERT_TRUE(old_secret);
  secret["data"]["secret"] = common::base64Encode("new-secret\n" + *old_secret + "\n");
  ASSERT_TRUE(client_.update(secrets(), secret));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(get(secrets(), "events-interserver")["data"], secret["data"]);
  EXPECT_NE(annotation(), before);
  EXPECT_EQ(annotation(), get(secrets(), "events-interserver")["metadata"]["resourceVersion"]);
}

// A secret that could not be made (the kernel's random source failed) is never replaced by a
// predictable one: nothing of the table is applied until it can be made.
TEST_F(Reconciler, NoRandomnessMeansNoObjectsRatherThanAWeakSecret) {
  ReplicatedTableReconcilerOptions options;
  options.generate_secret = []() -> std::expected<std::string, std::string> {
    return std::unexpected("getrandom: Function not implemented");
  };
  options.wall_clock = [this] { return now_; };
  reconciler_ = std::make_unique<ReplicatedTableReconciler>(client_, options);
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_FALSE(outcome);
  EXPECT_FALSE(outcome.error().terminal);
  EXPECT_FALSE(client_.get(secrets(), {"analytics", "events-interserver"}));
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));
  EXPECT_EQ(condition("Ready")["reason"], "SecretUnavailable");
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("getrandom"), std::string::npos);
}

TEST_F(Reconciler, AnInvalidSpecChangesNoObjectAndSaysWhy) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3, "toYYYYMM(user)")));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().terminal);
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));
  EXPECT_EQ(condition("Ready")["reason"], "InvalidSpec");
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("spec.partitionBy"),
            std::string::npos)
      << condition("Ready");
}

TEST_F(Reconciler, AFailedApplyIsRetriedAndReported) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  client_.failNextForTest(
      op::testing::Verb::kPatch,
      op::KubeError::of(op::KubeErrorKind::kServerError, "etcdserver: request timed out"));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_FALSE(outcome);
  EXPECT_FALSE(outcome.error().terminal);
  EXPECT_EQ(condition("Ready")["reason"], "ApplyFailed");
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Ready")["reason"], "ReplicasNotReady");
}

// The whole status as the apiserver stores it, field for field: what `kubectl get -o yaml`, the
// printer columns and the scale subresource read.
TEST_F(Reconciler, WritesTheWholeStatus) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  setReadyReplicas(2);
  now_ += std::chrono::minutes(1);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json expected = json::parse(R"({
    "observedGeneration": 1, "replicas": 3, "readyReplicas": 2, "ready": "2/3",
    "selector": "app.kubernetes.io/component=replica,app.kubernetes.io/instance=events,app.kubernetes.io/name=rtable",
    "conditions": [
      {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": "2/3 replicas ready",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"},
      {"type": "Degraded", "status": "True", "reason": "ReplicasUnavailable",
       "message": "1 of 3 replicas are not ready", "observedGeneration": 1,
       "lastTransitionTime": "2026-12-02T00:01:00Z"}]})");
  const json status = get(replicatedTables(), "events")["status"];
  EXPECT_EQ(status, expected) << json::diff(expected, status).dump(1);

  // A failed apply writes the generation and the Ready condition; the rest stays as it was.
  client_.failNextForTest(
      op::testing::Verb::kPatch,
      op::KubeError::of(op::KubeErrorKind::kServerError, "etcdserver: request timed out"));
  now_ += std::chrono::minutes(1);
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  json failed = expected;
  failed["conditions"] = json::array(
      {{{"type", "Ready"},
        {"status", "False"},
        {"reason", "ApplyFailed"},
        {"message", "applying ConfigMap events-config: ServerError: etcdserver: request timed out"},
        {"observedGeneration", 1},
        {"lastTransitionTime", "2026-12-02T00:00:00Z"}}});
  const json after = get(replicatedTables(), "events")["status"];
  EXPECT_EQ(after, failed) << json::diff(failed, after).dump(1);
}

TEST_F(Reconciler, AnInvalidSpecWritesOnlyTheGenerationAndReady) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3, "toYYYYMM(user)")));
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  const json status = get(replicatedTables(), "events")["status"];
  ASSERT_EQ(status.size(), 2u) << status.dump(1);
  EXPECT_EQ(status["observedGeneration"], 1);
  ASSERT_EQ(status["conditions"].size(), 1u) << status.dump(1);
  json ready = status["conditions"][0];
  EXPECT_NE(ready["message"].get<std::string>().find("spec.partitionBy"), std::string::npos)
      << ready;
  ready.erase("message");
  EXPECT_EQ(ready, json::parse(R"({"type": "Ready", "status": "False", "reason": "InvalidSpec",
                                   "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"})"));
}

TEST_F(Reconciler, ARestoreThatThisOperatorCannotDoIsSaidSo) {
  json restored = table(1);
  restored["spec"]["restoreFrom"] = {{"backup", "nightly-2026-12-01"}};
  ASSERT_TRUE(client_.create(replicatedTables(), restored));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json restore = condition("Restored");
  EXPECT_EQ(restore["status"], "False");
  EXPECT_EQ(restore["reason"], "RestoreUnavailable");
  EXPECT_NE(restore["message"].get<std::string>().find("'nightly-2026-12-01'"), std::string::npos);
}

TEST_F(Reconciler, AGoneTableIsDone) {
  auto outcome = reconciler_->reconcile({"analytics", "nothing"});
  ASSERT_TRUE(outcome);
}

// The same, with the table's ZooKeeper (a fake server with real semantics).
class ReconcilerWithZooKeeper : public Reconciler {
 protected:
  void SetUp() override {
    Reconciler::SetUp();
    ReplicatedTableReconcilerOptions options;
    options.generate_secret = [] { return std::string("s"); };
    options.wall_clock = [this] { return now_; };
    options.events = &events_;
    options.registry = &registry_;
    options.keeper_for = [this](const std::string& connect, const core::ZooKeeperDigest& identity)
        -> core::KeeperResult<std::shared_ptr<core::Keeper>> {
      EXPECT_EQ(connect, "zk-0.zk:2181");
      identities_.push_back(identity);
      if (zookeeper_down_) {
        return std::unexpected(
            core::KeeperError{core::KeeperCode::kConnectionLoss, "", "connection refused", {}});
      }
      return operator_session_;
    };
    options.restrict_subtree =
        [this](const std::string&,
               const core::ZooKeeperDigest& identity) -> core::KeeperResult<std::size_t> {
      restricted_.push_back(identity);
      if (zookeeper_down_) {
        return std::unexpected(
            core::KeeperError{core::KeeperCode::kConnectionLoss, "", "connection refused", {}});
      }
      return restricted_nodes_;
    };
    reconciler_ = std::make_unique<ReplicatedTableReconciler>(client_, options);
  }
  // What the StatefulSet controller reports once every pod runs the current template.
  void setRolledOut() {
    auto sts = get(statefulSets(), "events");
    sts["status"] = {{"replicas", sts["spec"]["replicas"]},
                     {"observedGeneration", sts["metadata"]["generation"]},
                     {"currentRevision", "events-1"},
                     {"updateRevision", "events-1"}};
    ASSERT_TRUE(client_.updateStatus(statefulSets(), sts));
  }
  const core::ZooKeeperDigest identity_{"analytics.events", "s", "/rtable/tables/analytics.events"};
  core::TablePaths replica(const std::string& name) {
    return {"/rtable/tables/analytics.events", 1, name};
  }
  // What rtable-core does when a replica starts: the tree, its replica node, its live session.
  std::unique_ptr<core::Keeper> startReplica(const std::string& name) {
    auto session = zookeeper_->connect();
    // The same spec as the operator's (it made the tree with the replicas' metadata text).
    auto made = session->get(replica(name).metadata());
    EXPECT_TRUE(
        core::createTableIfNotExists(*session, replica(name), made ? made->data : "metadata"));
    EXPECT_TRUE(core::createReplicaIfNotExists(*session, replica(name)));
    EXPECT_TRUE(core::activateReplica(*session, replica(name), "host: " + name + "\n"));
    return session;
  }
  void setReplicas(int replicas) {
    auto scaled = get(replicatedTables(), "events");
    scaled["spec"]["replicas"] = replicas;
    ASSERT_TRUE(client_.update(replicatedTables(), scaled));
  }
  void createPod(const std::string& name) {
    ASSERT_TRUE(client_.create(
        op::resources::pods(),
        {{"apiVersion", "v1"},
         {"kind", "Pod"},
         {"metadata",
          {{"name", name}, {"namespace", "analytics"}, {"labels", tableSelector("events")}}},
         {"spec", {{"containers", json::array({{{"name", "c"}, {"image", "i"}}})}}}}));
  }

  // The operator's metric `name` of table analytics/events with `labels` too; for a histogram,
  // its sum.
  std::optional<double> find(const std::string& name, std::map<std::string, std::string> labels) {
    labels["namespace"] = "analytics";
    labels["table"] = "events";
    for (const auto& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const auto& metric : family.metric) {
        std::size_t matched = 0;
        for (const auto& label : metric.label) {
          auto it = labels.find(label.name);
          if (it != labels.end() && it->second == label.value) ++matched;
        }
        if (matched != labels.size()) continue;
        switch (family.type) {
          case prometheus::MetricType::Gauge:
            return metric.gauge.value;
          case prometheus::MetricType::Counter:
            return metric.counter.value;
          case prometheus::MetricType::Histogram:
            return metric.histogram.sample_sum;
          default:
            return std::nullopt;
        }
      }
    }
    return std::nullopt;
  }
  double value(const std::string& name, std::map<std::string, std::string> labels) {
    auto found = find(name, labels);
    EXPECT_TRUE(found) << name;
    return found.value_or(-1);
  }

  // What replica events-0 (session `session`) does in a swap to generation 2, as its TableHost
  // does: joins generation 2 (its session kept in `next`) and acknowledges the plan's step. The
  // step acknowledged; none once the swap ended.
  std::optional<core::SwapStep> acknowledgeSwapStep(core::Keeper& session,
                                                    std::unique_ptr<core::Keeper>& next) {
    const std::string root = "/rtable/tables/analytics.events";
    auto plan = operator_session_->get(core::swapPath(root));
    if (!plan) return std::nullopt;
    auto parsed = core::SwapPlan::parse(plan->data);
    EXPECT_TRUE(parsed) << parsed.error();
    if (!parsed) return std::nullopt;
    if (!next) {
      next = zookeeper_->connect();
      core::TablePaths in_next{root, 2, "events-0"};
      EXPECT_TRUE(core::createReplicaIfNotExists(*next, in_next));
      EXPECT_TRUE(core::activateReplica(*next, in_next, "host: events-0\n"));
    }
    auto acked = session.create(core::swapAckPath(root, parsed->step, "events-0"), "ok",
                                core::CreateMode::kPersistent);
    EXPECT_TRUE(acked || acked.error().code == core::KeeperCode::kNodeExists);
    return parsed->step;
  }

  std::shared_ptr<core::testing::FakeKeeperServer> zookeeper_ =
      core::testing::FakeKeeperServer::create();
  std::shared_ptr<core::Keeper> operator_session_ = zookeeper_->connect();
  bool zookeeper_down_ = false;
  std::vector<core::ZooKeeperDigest> identities_;  // keeper_for's, in order
  std::vector<core::ZooKeeperDigest> restricted_;  // restrict_subtree's
  std::size_t restricted_nodes_ = 0;
  op::testing::FakeEventRecorder events_;
};

TEST_F(ReconcilerWithZooKeeper, ReportsTheLogAndRemovesScaledDownReplicasOnceTheirPodsAreGone) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome) << outcome.error().message;

  std::map<std::string, std::unique_ptr<core::Keeper>> sessions;
  for (const char* name : {"events-0", "events-1", "events-2"}) {
    sessions[name] = startReplica(name);
    createPod(name);
  }
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(sessions["events-0"]->create(replica("").logEntryPrefix(), "entry",
                                             core::CreateMode::kPersistentSequential));
  }
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  json status = get(replicatedTables(), "events")["status"];
  EXPECT_EQ(status["zookeeperPath"], "/rtable/tables/analytics.events");
  EXPECT_EQ(status["activeGeneration"], 1);
  EXPECT_EQ(status["logMaxIndex"], 4);
  EXPECT_EQ(status["logCounter"], 5);
  EXPECT_EQ(condition("HeadroomLow")["status"], "False");
  EXPECT_EQ(condition("Replicating")["status"], "True");

  // Scaled to 1: events-1 is gone (pod and session), events-2's pod is still terminating.
  setReplicas(1);
  ASSERT_TRUE(client_.remove(op::resources::pods(), {"analytics", "events-1"}));
  sessions.erase("events-1");
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists(replica("events-1").replicaRoot()));
  EXPECT_TRUE(*operator_session_->exists(replica("events-2").replicaRoot()));
  EXPECT_EQ(condition("Replicating")["reason"], "RemovingReplicas");
  EXPECT_NE(condition("Replicating")["message"].get<std::string>().find("events-2"),
            std::string::npos);

  // Its pod is gone but its session lives on for a while: still waiting, nothing half-done.
  ASSERT_TRUE(client_.remove(op::resources::pods(), {"analytics", "events-2"}));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_TRUE(*operator_session_->exists(replica("events-2").queue()));
  EXPECT_EQ(condition("Replicating")["reason"], "RemovingReplicas");
  sessions.erase("events-2");  // the session ends
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists(replica("events-2").replicaRoot()));
  EXPECT_EQ(condition("Replicating")["status"], "True");
  EXPECT_TRUE(*operator_session_->exists(replica("events-0").replicaRoot()));
}

// A replica whose oldest queue entry has sat in its queue for 10 minutes (its disk was full, a
// fetch hangs) is named in status.replicaQueues and in Replicating, with the entry; one that is
// only busy is not.
TEST_F(ReconcilerWithZooKeeper, AReplicaWhoseQueueDoesNotProgressIsShownWithItsEntry) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(2)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto r0 = startReplica("events-0");
  auto r1 = startReplica("events-1");
  core::LogEntry entry;
  entry.type = core::LogEntry::Type::kGetPart;
  entry.new_part_name = "202612_5_5_0";
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now_.time_since_epoch()).count();
  // Pulled 11 minutes ago on events-1, 2 minutes ago on events-0.
  zookeeper_->setTimeForTest(now_ms - 11 * 60 * 1000);
  ASSERT_TRUE(r1->create(replica("events-1").queue() + "/queue-", entry.format(),
                         core::CreateMode::kPersistentSequential));
  ASSERT_TRUE(r1->create(replica("events-1").queue() + "/queue-", entry.format(),
                         core::CreateMode::kPersistentSequential));
  zookeeper_->setTimeForTest(now_ms - 2 * 60 * 1000);
  ASSERT_TRUE(r0->create(replica("events-0").queue() + "/queue-", entry.format(),
                         core::CreateMode::kPersistentSequential));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json queues = get(replicatedTables(), "events")["status"]["replicaQueues"];
  EXPECT_EQ(queues, json::parse(R"json([
    {"replica": "events-0", "active": true, "queueSize": 1, "oldestEntry": "GET_PART 202612_5_5_0",
     "oldestWaitingSeconds": 120},
    {"replica": "events-1", "active": true, "queueSize": 2, "oldestEntry": "GET_PART 202612_5_5_0",
     "oldestWaitingSeconds": 660}])json"));
  EXPECT_EQ(condition("Replicating")["status"], "False");
  EXPECT_EQ(condition("Replicating")["reason"], "ReplicaQueueNotProgressing");
  const std::string message = condition("Replicating")["message"];
  EXPECT_NE(message.find("replica events-1: the oldest of its 2 queue entries (GET_PART "
                         "202612_5_5_0) has waited 660 s"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("events-0"), std::string::npos) << message;

  // Its queue drains: Replicating again.
  auto queued = r1->children(replica("events-1").queue());
  ASSERT_TRUE(queued);
  for (const auto& node : queued->names)
    ASSERT_TRUE(r1->remove(replica("events-1").queue() + "/" + node));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Replicating")["status"], "True");
}

// A replica whose data volume is full says so in ZooKeeper (its ephemeral disk_full, the error it
// met): Replicating names it and the error, before any queue that stopped moving; the node gone,
// Replicating again.
TEST_F(ReconcilerWithZooKeeper, AReplicaWhoseVolumeIsFullIsNamedWithTheError) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(2)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto r0 = startReplica("events-0");
  auto r1 = startReplica("events-1");
  ASSERT_TRUE(r1->create(replica("events-1").diskFull(),
                         "writing 202612_5_5_0/x.bin: No space left on device",
                         core::CreateMode::kEphemeral));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Replicating")["status"], "False");
  EXPECT_EQ(condition("Replicating")["reason"], "ReplicaDiskFull");
  const std::string message = condition("Replicating")["message"];
  EXPECT_NE(message.find("replica events-1's data volume is full (writing 202612_5_5_0/x.bin: No "
                         "space left on device)"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("events-0"), std::string::npos) << message;

  ASSERT_TRUE(r1->remove(replica("events-1").diskFull()));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Replicating")["status"], "True");
}

// A scaled-down replica whose pod is gone but whose parts no remaining replica has yet keeps its
// ZooKeeper node: removing it would make those acknowledged rows unfetchable for good.
TEST_F(ReconcilerWithZooKeeper, AScaledDownReplicaHoldingTheOnlyCopyOfAPartIsKept) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  std::map<std::string, std::unique_ptr<core::Keeper>> sessions;
  for (const char* name : {"events-0", "events-1", "events-2"}) {
    sessions[name] = startReplica(name);
    createPod(name);
  }
  auto list = [&](const std::string& name, std::initializer_list<const char*> parts) {
    for (const char* part : parts) {
      ASSERT_TRUE(
          operator_session_->create(replica(name).part(part), "", core::CreateMode::kPersistent));
    }
  };
  list("events-0", {"202612_0_0_0", "202612_1_1_0"});
  list("events-1", {"202612_0_0_0", "202612_1_1_0"});
  // events-2 merged 0 and 1 before the others, and took an insert (block 5) just before it left.
  list("events-2", {"202612_0_1_1", "202612_5_5_0"});

  setReplicas(2);
  ASSERT_TRUE(client_.remove(op::resources::pods(), {"analytics", "events-2"}));
  sessions.erase("events-2");
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_TRUE(*operator_session_->exists(replica("events-2").parts()))
      << "its only copies were dropped";
  EXPECT_EQ(condition("Replicating")["status"], "False");
  EXPECT_EQ(condition("Replicating")["reason"], "ScaledDownReplicaHoldsParts");
  const std::string message = condition("Replicating")["message"];
  EXPECT_NE(message.find("events-2 stopped holding 2 part(s)"), std::string::npos) << message;
  EXPECT_NE(message.find("202612_5_5_0"), std::string::npos) << message;
  EXPECT_NE(message.find("scale back to 3 replicas"), std::string::npos) << message;
  EXPECT_EQ(events_.withReason("ReplicaHoldsUnreplicatedParts").size(), 1u);

  // events-1 fetched block 5 and events-0 ran the merge: every row is on a remaining replica.
  list("events-1", {"202612_5_5_0"});
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_TRUE(*operator_session_->exists(replica("events-2").parts()))
      << "0_1_1 is on no remaining replica yet";
  ASSERT_TRUE(operator_session_->remove(replica("events-0").part("202612_0_0_0")));
  ASSERT_TRUE(operator_session_->remove(replica("events-0").part("202612_1_1_0")));
  list("events-0", {"202612_0_1_1"});
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists(replica("events-2").replicaRoot()));
  EXPECT_EQ(condition("Replicating")["status"], "True");
}

TEST_F(ReconcilerWithZooKeeper, LowHeadroomAndAnUnreachableZooKeeperAreConditions) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  // 4% of the int32 counter left: under the default 5% threshold.
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 2061584302));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("HeadroomLow")["status"], "True");
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["headroom"], "4.00%");

  zookeeper_down_ = true;
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->requeue_after, std::chrono::seconds(30));
  EXPECT_EQ(condition("Replicating")["reason"], "ZooKeeperUnreachable");
  // The objects are there all the same: ZooKeeper is not needed to run the pods.
  EXPECT_TRUE(client_.get(statefulSets(), {"analytics", "events"}));
}

TEST_F(ReconcilerWithZooKeeper, LowHeadroomStartsATableSwapAndEachStepIsShown) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 2061584302));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->requeue_after, std::chrono::seconds(1));  // a swap runs
  const std::string swap = core::swapPath("/rtable/tables/analytics.events");
  auto plan = operator_session_->get(swap);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->data,
            "from: 1\nto: 2\nstep: open\nattacher: \nstarted_ms: 1796169600000\npaused_ms: "
            "0\nswitched_ms: 0\ntrigger: headroom\n");
  json recovery = get(replicatedTables(), "events")["status"]["recovery"];
  EXPECT_EQ(recovery["fromGeneration"], 1);
  EXPECT_EQ(recovery["toGeneration"], 2);
  EXPECT_EQ(recovery["step"], "open");
  EXPECT_EQ(recovery["trigger"], "headroom");
  EXPECT_EQ(recovery["startedAt"], "2026-12-02T00:00:00Z");
  EXPECT_EQ(condition("Recovering")["status"], "True");
  EXPECT_EQ(events_.withReason("SwapStarted").size(), 1u);

  // The replica acknowledges the step (what its TableHost does): the next look moves it on.
  ASSERT_TRUE(session->create(
      core::swapAckPath("/rtable/tables/analytics.events", core::SwapStep::kOpen, "events-0"), "ok",
      core::CreateMode::kPersistent));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  recovery = get(replicatedTables(), "events")["status"]["recovery"];
  EXPECT_EQ(recovery["step"], "pause");
  EXPECT_EQ(recovery["message"], "waiting for every replica to acknowledge pause");
  EXPECT_EQ(events_.withReason("SwapStep").size(), 1u);
  EXPECT_EQ(events_.withReason("SwapStarted").size(), 1u);  // not started again

  // The swap ends (the rest of its steps, as the driver runs them): generation 2 active, the plan
  // and generation 1 gone.
  ASSERT_TRUE(operator_session_->set("/rtable/tables/analytics.events/active", "2", -1));
  ASSERT_TRUE(core::removeRecursive(*operator_session_, swap));
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(
      core::TablePaths{"/rtable/tables/analytics.events", 2, ""}.log(), 3));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  recovery = get(replicatedTables(), "events")["status"]["recovery"];
  EXPECT_EQ(recovery["result"], "Succeeded");
  EXPECT_EQ(recovery["finishedAt"], "2026-12-02T00:00:00Z");
  EXPECT_EQ(recovery["step"], "cleanup");
  EXPECT_EQ(condition("Recovering")["reason"], "SwapSucceeded");
  EXPECT_EQ(events_.withReason("SwapSucceeded").size(), 1u);
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["activeGeneration"], 2);
}

TEST_F(ReconcilerWithZooKeeper, ASwapStartsOncePerAnnotationValueAndNotWithAutoRecoverOff) {
  json spec = table(1);
  spec["spec"]["headroom"] = {{"autoRecover", false}};
  ASSERT_TRUE(client_.create(replicatedTables(), spec));
  auto session = startReplica("events-0");
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 2061584302));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const std::string swap = core::swapPath("/rtable/tables/analytics.events");
  EXPECT_FALSE(*operator_session_->exists(swap)) << "autoRecover is off";
  EXPECT_EQ(condition("HeadroomLow")["status"], "True");

  auto annotated = get(replicatedTables(), "events");
  annotated["metadata"]["annotations"] = {{"rtable.io/swap", "2026-12-02"}};
  ASSERT_TRUE(client_.update(replicatedTables(), annotated));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_TRUE(*operator_session_->exists(swap));
  json recovery = get(replicatedTables(), "events")["status"]["recovery"];
  EXPECT_EQ(recovery["trigger"], "manual: 2026-12-02");
  EXPECT_EQ(recovery["lastManualTrigger"], "2026-12-02");

  // Aborted (by hand, or a replica's verify): the same annotation does not start it again.
  core::SwapDriver driver(*operator_session_, "/rtable/tables/analytics.events");
  ASSERT_TRUE(driver.abort());
  ASSERT_TRUE(session->create(
      core::swapAckPath("/rtable/tables/analytics.events", core::SwapStep::kAbort, "events-0"),
      "ok", core::CreateMode::kPersistent));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists(swap));
  recovery = get(replicatedTables(), "events")["status"]["recovery"];
  EXPECT_EQ(recovery["result"], "Aborted");
  EXPECT_EQ(events_.withReason("SwapAborted").size(), 1u);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists(swap));
  EXPECT_EQ(events_.withReason("SwapStarted").size(), 1u);
}

// An operator killed right after it created the plan of a manual swap (before its status said
// so): the next one resumes that swap, records the annotation value as spent from the plan, and
// starts no second swap for it once the first ended.
TEST_F(ReconcilerWithZooKeeper, AManualSwapResumedFromItsPlanIsNotStartedAgain) {
  json spec = table(1);
  spec["spec"]["headroom"] = {{"autoRecover", false}};
  spec["metadata"]["annotations"] = {{"rtable.io/swap", "v1"}};
  const std::string root = "/rtable/tables/analytics.events";
  auto session = startReplica("events-0");
  ASSERT_TRUE(client_.create(replicatedTables(), spec));
  // What the dead operator's reconcile did before it died.
  ASSERT_TRUE(core::SwapDriver(*operator_session_, root).begin("manual: v1"));

  std::vector<std::string> recorded;
  ReplicatedTableReconcilerOptions options;
  options.wall_clock = [this] { return now_; };
  options.events = &events_;
  options.keeper_for = [this](const std::string&, const core::ZooKeeperDigest&) {
    return core::KeeperResult<std::shared_ptr<core::Keeper>>(operator_session_);
  };
  options.swap_step_recorded_for_test = [&](const core::SwapPlan& plan) {
    recorded.emplace_back(core::swapStepName(plan.step));
  };
  ReplicatedTableReconciler next(client_, options);
  std::unique_ptr<core::Keeper> in_next;  // the replica's session in generation 2
  for (int call = 0; call < 20; ++call) {
    ASSERT_TRUE(next.reconcile({"analytics", "events"}));
    if (call == 0) {
      const json recovery = get(replicatedTables(), "events")["status"]["recovery"];
      EXPECT_EQ(recovery["trigger"], "manual: v1");
      EXPECT_EQ(recovery["lastManualTrigger"], "v1");
    }
    if (!acknowledgeSwapStep(*session, in_next)) break;
  }
  EXPECT_EQ(recorded,
            (std::vector<std::string>{"pause", "drain", "attach", "verify", "switch", "cleanup"}));
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["recovery"]["result"], "Succeeded");
  ASSERT_TRUE(next.reconcile({"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists(core::swapPath(root))) << "a second swap for v1";
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["activeGeneration"], 2);
}

// Every counter that stops the table is watched, not only the log: a partition's block numbers
// under the threshold start a swap, and the condition names that counter.
TEST_F(ReconcilerWithZooKeeper, APartitionsBlockNumbersUnderTheThresholdStartASwap) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  ASSERT_TRUE(
      session->create(replica("").blockNumbers("202612"), "", core::CreateMode::kPersistent));
  ASSERT_TRUE(
      zookeeper_->setSequentialCounterForTest(replica("").blockNumbers("202612"), 2100000000));
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("events-0").queue(), 1900000000));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("HeadroomLow")["status"], "True");
  EXPECT_EQ(condition("HeadroomLow")["reason"], "BelowThreshold");
  EXPECT_EQ(condition("HeadroomLow")["message"],
            "block_numbers/202612: 47483648 sequential creates left (2.2111% of the int32 "
            "counter); threshold 5%");
  const json status = get(replicatedTables(), "events")["status"];
  EXPECT_EQ(status["headroomCounter"], "block_numbers/202612");
  EXPECT_EQ(status["headroom"], "2.21%");
  EXPECT_EQ(status["logCounter"], 0);  // the log itself is fine
  EXPECT_TRUE(*operator_session_->exists(core::swapPath("/rtable/tables/analytics.events")));
  EXPECT_EQ(status["recovery"]["trigger"], "headroom");
  auto started = events_.withReason("SwapStarted");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_NE(started[0].message.find("block_numbers/202612"), std::string::npos)
      << started[0].message;
}

// The operator samples the counters' growth: a log that would run out within exhaustionDays at
// its rate starts a swap, once it has been sampled for growth_min_span (10 minutes).
TEST_F(ReconcilerWithZooKeeper, ALogThatRunsOutWithinExhaustionDaysStartsASwap) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  const std::string swap = core::swapPath("/rtable/tables/analytics.events");
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 1000000000));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  // 1'000'000 creates in 5 minutes: fast, but not sampled long enough to be a trend.
  now_ += std::chrono::minutes(5);
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 1001000000));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("HeadroomLow")["status"], "False");
  EXPECT_FALSE(get(replicatedTables(), "events")["status"].contains("exhaustionSeconds"));
  EXPECT_FALSE(*operator_session_->exists(swap));
  // Ten minutes at 3333 creates/s: the 1'145'483'648 left last about 4 days, under the default 7.
  now_ += std::chrono::minutes(5);
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 1002000000));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("HeadroomLow")["status"], "True");
  EXPECT_EQ(condition("HeadroomLow")["reason"], "ExhaustionSoon");
  EXPECT_EQ(condition("HeadroomLow")["message"],
            "log: 1145483648 sequential creates left (53.3407% of the int32 counter); at its "
            "growth rate it runs out in 4.0 days (exhaustionDays 7)");
  EXPECT_DOUBLE_EQ(get(replicatedTables(), "events")["status"]["exhaustionSeconds"].get<double>(),
                   1145483648.0 / (2000000.0 / 600.0));
  EXPECT_TRUE(*operator_session_->exists(swap));
}

TEST_F(ReconcilerWithZooKeeper, ExhaustionDaysZeroOnlyReportsTheProjection) {
  json spec = table(1);
  spec["spec"]["headroom"] = {{"exhaustionDays", 0}};
  ASSERT_TRUE(client_.create(replicatedTables(), spec));
  auto session = startReplica("events-0");
  for (int64_t counter : {1000000000, 1001000000, 1002000000}) {
    ASSERT_TRUE(
        zookeeper_->setSequentialCounterForTest(replica("").log(), static_cast<int32_t>(counter)));
    ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
    now_ += std::chrono::minutes(5);
  }
  EXPECT_EQ(condition("HeadroomLow")["status"], "False");
  EXPECT_TRUE(get(replicatedTables(), "events")["status"].contains("exhaustionSeconds"));
  EXPECT_FALSE(*operator_session_->exists(core::swapPath("/rtable/tables/analytics.events")));
}

// A stuck log (log-2147483647 taken) swaps at once, and the whole swap, acknowledged step by step
// as the replica's TableHost does, ends in the status and the metrics with its duration and
// write pause (from the plan's times), the new generation's counters replacing the old ones'.
TEST_F(ReconcilerWithZooKeeper, AStuckLogSwapsAndTheSwapsFiguresAreExported) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 2147483647));
  ASSERT_TRUE(
      session->create(replica("").logEntryPrefix(), "e", core::CreateMode::kPersistentSequential));
  const std::string root = "/rtable/tables/analytics.events";
  std::unique_ptr<core::Keeper> next;  // the replica's session in generation 2
  std::vector<std::string> steps;
  for (int call = 0; call < 20; ++call) {
    ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
    if (call == 0) {
      // The histograms come with the table's first swap's end, not before (most tables never
      // swap: their 23 series each would be most of /metrics at a thousand tables).
      EXPECT_FALSE(find("rtable_table_swap_duration_seconds", {}));
      EXPECT_FALSE(find("rtable_table_swap_write_pause_seconds", {}));
      EXPECT_TRUE(find("rtable_table_swap_running", {}));
    }
    if (call == 0) {
      EXPECT_EQ(condition("HeadroomLow")["reason"], "Exhausted");
      EXPECT_EQ(value("rtable_table_swap_running", {}), 1.0);
    }
    const auto step = acknowledgeSwapStep(*session, next);
    if (!step) break;  // ended
    steps.emplace_back(core::swapStepName(*step));
    now_ += std::chrono::seconds(1);
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"open", "pause", "drain", "attach", "verify", "switch",
                                             "cleanup"}));
  const json recovery = get(replicatedTables(), "events")["status"]["recovery"];
  EXPECT_EQ(recovery["result"], "Succeeded");
  // Begun at the first call, paused at the second, switched at the sixth, ended at the eighth.
  EXPECT_EQ(recovery["durationSeconds"], 7.0);
  EXPECT_EQ(recovery["writePauseSeconds"], 4.0);
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["activeGeneration"], 2);

  EXPECT_EQ(value("rtable_table_generation", {}), 2.0);
  EXPECT_EQ(value("rtable_table_swap_running", {}), 0.0);
  EXPECT_EQ(value("rtable_table_swaps_total", {{"result", "Succeeded"}}), 1.0);
  EXPECT_EQ(value("rtable_table_swaps_total", {{"result", "Aborted"}}), 0.0);
  EXPECT_EQ(value("rtable_table_swap_duration_seconds", {}), 7.0);  // the histogram's sum
  EXPECT_EQ(value("rtable_table_swap_write_pause_seconds", {}), 4.0);
  // The next reconcile reads generation 2's counters; generation 1's series are gone.
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(value("rtable_table_counter_headroom_ratio", {{"generation", "2"}, {"counter", "log"}}),
            1.0);
  EXPECT_FALSE(
      find("rtable_table_counter_headroom_ratio", {{"generation", "1"}, {"counter", "log"}}));
  EXPECT_EQ(condition("HeadroomLow")["status"], "False");

  // Deleted: every series of the table goes.
  ASSERT_TRUE(client_.remove(replicatedTables(), {"analytics", "events"}));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(find("rtable_table_generation", {}));
}

// kubectl annotate ... rtable.io/swap-abort=<value> aborts the running swap; the automatic one then
// waits swap_retry_after (15 minutes) before it starts again, and the same value aborts nothing
// more.
TEST_F(ReconcilerWithZooKeeper, TheAbortAnnotationAbortsARunningSwapAndTheNextOneWaits) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 2061584302));
  const std::string root = "/rtable/tables/analytics.events";
  auto step = [&]() -> std::string {
    auto plan = operator_session_->get(core::swapPath(root));
    if (!plan) return "none";
    auto parsed = core::SwapPlan::parse(plan->data);
    return parsed ? std::string(core::swapStepName(parsed->step)) : parsed.error();
  };
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(step(), "open");

  auto annotated = get(replicatedTables(), "events");
  annotated["metadata"]["annotations"] = {{"rtable.io/swap-abort", "oops"}};
  ASSERT_TRUE(client_.update(replicatedTables(), annotated));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(step(), "abort");
  auto requested = events_.withReason("SwapAbortRequested");
  ASSERT_EQ(requested.size(), 1u);
  EXPECT_EQ(requested[0].message,
            "aborting the table swap 1 -> 2 (rtable.io/swap-abort=oops): generation 1 serves on");
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["recovery"]["lastAbortRequest"], "oops");
  ASSERT_TRUE(session->create(core::swapAckPath(root, core::SwapStep::kAbort, "events-0"), "ok",
                              core::CreateMode::kPersistent));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(step(), "none");
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["recovery"]["result"], "Aborted");

  // Headroom is still low, but the automatic swap waits after an abort.
  now_ += std::chrono::minutes(14);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(step(), "none");
  EXPECT_EQ(condition("HeadroomLow")["status"], "True");
  now_ += std::chrono::minutes(2);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(step(), "open");
  EXPECT_EQ(events_.withReason("SwapStarted").size(), 2u);
  // The annotation's value was spent on the first swap.
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(step(), "open");
  EXPECT_EQ(events_.withReason("SwapAbortRequested").size(), 1u);
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["recovery"]["lastAbortRequest"], "oops");
}

// A log at its last name whose entry the cleaner removed is stuck all the same: Exhausted, and
// after an aborted swap the next one starts at once instead of waiting swap_retry_after (a table
// merely BelowThreshold would wait).
TEST_F(ReconcilerWithZooKeeper, ALogAtTheLastNameWithoutItsEntryIsExhaustedAndSwapsAtOnce) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  ASSERT_TRUE(zookeeper_->setSequentialCounterForTest(replica("").log(), 2147483647));
  const std::string root = "/rtable/tables/analytics.events";
  ASSERT_FALSE(*operator_session_->exists(replica("").log() + "/log-2147483647"));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("HeadroomLow")["reason"], "Exhausted");
  EXPECT_EQ(get(replicatedTables(), "events")["status"]["headroom"], "0.00%");
  ASSERT_TRUE(*operator_session_->exists(core::swapPath(root)));

  auto annotated = get(replicatedTables(), "events");
  annotated["metadata"]["annotations"] = {{"rtable.io/swap-abort", "once"}};
  ASSERT_TRUE(client_.update(replicatedTables(), annotated));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_TRUE(session->create(core::swapAckPath(root, core::SwapStep::kAbort, "events-0"), "ok",
                              core::CreateMode::kPersistent));
  // The reconcile that ends the aborted swap begins the next one.
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(events_.withReason("SwapAborted").size(), 1u);
  EXPECT_EQ(events_.withReason("SwapStarted").size(), 2u) << "the stuck table waits";
  EXPECT_TRUE(*operator_session_->exists(core::swapPath(root)));
}

TEST_F(ReconcilerWithZooKeeper, WritesTheWholeStatus) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  auto session = startReplica("events-0");
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(session->create(replica("").logEntryPrefix(), "entry",
                                core::CreateMode::kPersistentSequential));
  }
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json expected = json::parse(R"json({
    "observedGeneration": 1, "replicas": 0, "readyReplicas": 0, "ready": "0/1",
    "selector": "app.kubernetes.io/component=replica,app.kubernetes.io/instance=events,app.kubernetes.io/name=rtable",
    "zookeeperPath": "/rtable/tables/analytics.events", "activeGeneration": 1, "logMaxIndex": 4,
    "logCounter": 5, "headroom": "100.00%", "headroomCounter": "log",
    "replicaQueues": [{"replica": "events-0", "active": true, "queueSize": 0}],
    "conditions": [
      {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": "0/1 replicas ready",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"},
      {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"},
      {"type": "HeadroomLow", "status": "False", "reason": "AboveThreshold",
       "message": "log: 2147483643 sequential creates left (100.0000% of the int32 counter); threshold 5%",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"},
      {"type": "Recovering", "status": "False", "reason": "NoSwapNeeded", "message": "",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"},
      {"type": "Replicating", "status": "True", "reason": "AsExpected", "message": "",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"},
      {"type": "ZooKeeperSecured", "status": "False", "reason": "WaitingForRollout",
       "message": "the table's nodes get the ACL of its ZooKeeper identity as it is now once every replica runs with it",
       "observedGeneration": 1, "lastTransitionTime": "2026-12-02T00:00:00Z"}]})json");
  json expected_status = expected;
  expected_status["headroomRatio"] = 2147483643.0 / 2147483648.0;
  const json status = get(replicatedTables(), "events")["status"];
  EXPECT_EQ(status, expected_status) << json::diff(expected_status, status).dump(1);
}

// The tree exists before any pod runs, with exactly the metadata rtable-core's own parser gives
// for the rendered config (a difference would keep every replica from joining).
TEST_F(ReconcilerWithZooKeeper, CreatesTheTreeWithTheReplicasMetadataBeforeThePods) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto metadata = operator_session_->get(replica("").metadata());
  ASSERT_TRUE(metadata) << metadata.error().toString();
  EXPECT_EQ(
      metadata->data,
      "metadata format version: 1\ncolumns: `d` Date, `user` String\npartition key: toYYYYMM(d)\n"
      "sorting key: user d\n");
  EXPECT_EQ(events_.withReason("ZooKeeperTreeCreated").size(), 1u);
  // A replica with the same spec joins it.
  auto session = zookeeper_->connect();
  EXPECT_TRUE(core::createTableIfNotExists(*session, replica("events-0"), metadata->data));
  EXPECT_EQ(condition("Replicating")["status"], "True");
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(events_.withReason("ZooKeeperTreeCreated").size(), 1u);  // once
}

// Deletion: the finalizer holds the table until its pods are gone, then the ZooKeeper subtree goes
// (every generation), then the table.
TEST_F(ReconcilerWithZooKeeper, DeletionRemovesTheZooKeeperTreeAfterThePods) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(get(replicatedTables(), "events")["metadata"]["finalizers"],
            json::array({kZooKeeperFinalizer}));
  auto session = startReplica("events-0");
  createPod("events-0");
  ASSERT_TRUE(operator_session_->create("/rtable/tables/analytics.events/2", "",
                                        core::CreateMode::kPersistent));

  ASSERT_TRUE(client_.remove(replicatedTables(), {"analytics", "events"}));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome) << outcome.error().message;
  EXPECT_EQ(outcome->requeue_after, std::chrono::seconds(2));
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));  // its pods go with it
  EXPECT_TRUE(*operator_session_->exists("/rtable/tables/analytics.events"));
  EXPECT_TRUE(client_.get(replicatedTables(), {"analytics", "events"}));
  EXPECT_EQ(events_.withReason("WaitingForPods").size(), 1u);

  // ZooKeeper down once the pods are gone: retried, the table stays.
  ASSERT_TRUE(client_.remove(op::resources::pods(), {"analytics", "events-0"}));
  session.reset();
  zookeeper_down_ = true;
  EXPECT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_TRUE(client_.get(replicatedTables(), {"analytics", "events"}));
  EXPECT_EQ(events_.withReason("CleanupFailed").size(), 1u);

  zookeeper_down_ = false;
  outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome) << outcome.error().message;
  EXPECT_FALSE(*operator_session_->exists("/rtable/tables/analytics.events"));
  EXPECT_TRUE(*operator_session_->exists("/rtable/tables"));
  auto gone = client_.get(replicatedTables(), {"analytics", "events"});
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().kind, op::KubeErrorKind::kNotFound);
  EXPECT_EQ(events_.withReason("ZooKeeperTreeRemoved").size(), 1u);
  // The identity the operator made went with the tree, not before it.
  EXPECT_FALSE(client_.get(secrets(), {"analytics", "events-zookeeper"}));
  EXPECT_EQ(identities_.back(), identity_);
}

// The table's ZooKeeper identity: made once (basic-auth, not owned by the table, so that it
// outlives the pods until the tree is gone), mounted into the pods, named in their config, and the
// one every operator session for the table holds; a changed Secret is read, never overwritten.
TEST_F(ReconcilerWithZooKeeper, TheTablesZooKeeperIdentityIsMadeOnceAndEverySessionHoldsIt) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(3)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json secret = get(secrets(), "events-zookeeper");
  EXPECT_EQ(secret["type"], "kubernetes.io/basic-auth");
  EXPECT_EQ(secret["data"]["username"], common::base64Encode("analytics.events"));
  EXPECT_EQ(secret["data"]["password"], common::base64Encode("s"));
  EXPECT_FALSE(secret["metadata"].contains("ownerReferences"));
  ASSERT_FALSE(identities_.empty());
  for (const auto& identity : identities_) EXPECT_EQ(identity, identity_);

  const json pod = get(statefulSets(), "events")["spec"]["template"]["spec"];
  bool mounted = false;
  for (const auto& volume : pod["volumes"]) {
    if (volume["name"] == "zookeeper") {
      EXPECT_EQ(volume["secret"]["secretName"], "events-zookeeper");
      mounted = true;
    }
  }
  EXPECT_TRUE(mounted);
  const std::string config = get(op::resources::configMaps(), "events-config")["data"]["core.yaml"];
  EXPECT_NE(config.find("credentialsDir: /etc/rtable/zookeeper"), std::string::npos) << config;

  json changed = secret;
  changed["data"]["password"] = common::base64Encode("rotated");
  ASSERT_TRUE(client_.update(secrets(), changed));
  identities_.clear();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(get(secrets(), "events-zookeeper")["data"]["password"],
            common::base64Encode("rotated"));
  ASSERT_FALSE(identities_.empty());
  EXPECT_EQ(identities_.back().password, "rotated");
}

// A table made before ACLs has open nodes: once every replica runs with the identity (the
// StatefulSet rolled out), the operator gives the tree the table's ACL, once.
TEST_F(ReconcilerWithZooKeeper, OpenNodesAreLockedOnceTheReplicasRolledOutAndOnlyOnce) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_TRUE(restricted_.empty()) << "locked while a replica may still run without the identity";
  EXPECT_EQ(condition("ZooKeeperSecured")["reason"], "WaitingForRollout");

  setRolledOut();
  zookeeper_down_ = true;
  (void)reconciler_->reconcile({"analytics", "events"});
  zookeeper_down_ = false;
  restricted_.clear();
  restricted_nodes_ = 7;
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_EQ(restricted_.size(), 1u);
  EXPECT_EQ(restricted_[0], identity_);
  EXPECT_EQ(condition("ZooKeeperSecured")["status"], "True");
  EXPECT_EQ(condition("ZooKeeperSecured")["reason"], "DigestAcl");
  ASSERT_EQ(events_.withReason("ZooKeeperSecured").size(), 1u);
  EXPECT_NE(events_.withReason("ZooKeeperSecured")[0].message.find("gave 7 nodes"),
            std::string::npos);

  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(restricted_.size(), 1u) << "the tree was walked again";
  EXPECT_EQ(condition("ZooKeeperSecured")["status"], "True");
}

// A password rotation (docs/security.md): each edit of the identity's Secret rolls the replicas,
// and once they rolled the tree gets the ACL of the identity as it is then: both passwords, then
// the new one alone.
TEST_F(ReconcilerWithZooKeeper, AZooKeeperPasswordRotatesInTwoRolledSteps) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  setRolledOut();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_EQ(restricted_.size(), 1u);
  auto annotation = [&] {
    return get(statefulSets(), "events")["spec"]["template"]["metadata"]["annotations"].value(
        "rtable.io/zookeeper-identity-version", "");
  };
  std::string version = annotation();
  EXPECT_EQ(version, get(secrets(), "events-zookeeper")["metadata"]["resourceVersion"]);

  json secret = get(secrets(), "events-zookeeper");
  secret["data"]["previousPassword"] = secret["data"]["password"];
  secret["data"]["password"] = common::base64Encode("new-pw");
  ASSERT_TRUE(client_.update(secrets(), secret));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_NE(annotation(), version) << "the replicas must roll to read both passwords";
  version = annotation();
  EXPECT_EQ(condition("ZooKeeperSecured")["reason"], "WaitingForRollout");
  EXPECT_EQ(restricted_.size(), 1u) << "walked before the replicas had both passwords";
  setRolledOut();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_EQ(restricted_.size(), 2u);
  core::ZooKeeperDigest rotating{identity_.user, "new-pw", identity_.subtree, identity_.password};
  EXPECT_EQ(restricted_[1], rotating);
  EXPECT_EQ(condition("ZooKeeperSecured")["status"], "True");
  EXPECT_NE(condition("ZooKeeperSecured")["message"].get<std::string>().find("(rotating)"),
            std::string::npos);

  secret = get(secrets(), "events-zookeeper");
  secret["data"].erase("previousPassword");
  ASSERT_TRUE(client_.update(secrets(), secret));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_NE(annotation(), version);
  EXPECT_EQ(restricted_.size(), 2u);
  setRolledOut();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_EQ(restricted_.size(), 3u);
  EXPECT_EQ(restricted_[2], (core::ZooKeeperDigest{identity_.user, "new-pw", identity_.subtree}));
  EXPECT_EQ(condition("ZooKeeperSecured")["message"].get<std::string>().find("rotating"),
            std::string::npos);
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(restricted_.size(), 3u) << "walked again without a change";
}

// A Secret the user names must exist and hold both keys: until then nothing of the table is
// made (its pods could not start) and Ready says why.
TEST_F(Reconciler, ANamedZooKeeperSecretMustExistWithBothKeysBeforeAnythingIsMade) {
  json named = table(1);
  named["spec"]["zookeeper"]["credentialsSecret"] = "events-identity";
  ASSERT_TRUE(client_.create(replicatedTables(), named));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_FALSE(outcome);
  EXPECT_FALSE(outcome.error().terminal);
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));
  EXPECT_FALSE(client_.get(secrets(), {"analytics", "events-zookeeper"}));
  EXPECT_EQ(condition("Ready")["reason"], "ZooKeeperCredentialsUnavailable");
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("events-identity"),
            std::string::npos);

  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", {{"name", "events-identity"}, {"namespace", "analytics"}}},
                 {"type", "kubernetes.io/basic-auth"},
                 {"data", {{"username", common::base64Encode("events-writer")}}}};
  ASSERT_TRUE(client_.create(secrets(), secret));
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("password"), std::string::npos);
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  secret = get(secrets(), "events-identity");
  secret["data"]["password"] = common::base64Encode("pw");
  ASSERT_TRUE(client_.update(secrets(), secret));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json pod = get(statefulSets(), "events")["spec"]["template"]["spec"];
  EXPECT_NE(pod["volumes"].dump().find("events-identity"), std::string::npos);
  EXPECT_FALSE(client_.get(secrets(), {"analytics", "events-zookeeper"}));
}

// The replica API's bearer token: made once (owned by the table), mounted, and named in the
// config; with authentication None there is none and the API is open.
TEST_F(Reconciler, TheApiTokenIsMadeOnceMountedAndNamedUnlessAuthenticationIsNone) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json secret = get(secrets(), "events-api-tokens");
  auto token = common::base64Decode(secret["data"]["tokens"].get<std::string>());
  ASSERT_TRUE(token);
  EXPECT_TRUE(token->starts_with("secret-")) << *token;
  EXPECT_TRUE(token->ends_with("\n"));
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["kind"], "ReplicatedTable");
  const json pod = get(statefulSets(), "events")["spec"]["template"]["spec"];
  EXPECT_NE(pod["volumes"].dump().find("\"secretName\":\"events-api-tokens\""), std::string::npos);
  EXPECT_NE(pod["containers"][0]["volumeMounts"].dump().find("/etc/rtable/api"), std::string::npos);
  const std::string config = get(op::resources::configMaps(), "events-config")["data"]["core.yaml"];
  EXPECT_NE(config.find("tokensFile: /etc/rtable/api/tokens"), std::string::npos) << config;
  // Kept: the clients hold it.
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(get(secrets(), "events-api-tokens")["data"], secret["data"]);
  // A rotation (a second token added) rolls the replicas, which read the tokens at start.
  auto annotation = [&] {
    return get(statefulSets(), "events")["spec"]["template"]["metadata"]["annotations"].value(
        "rtable.io/api-tokens-version", "");
  };
  const std::string before = annotation();
  EXPECT_EQ(before, secret["metadata"]["resourceVersion"]);
  json rotated = get(secrets(), "events-api-tokens");
  rotated["data"]["tokens"] = common::base64Encode(*token + "new-token\n");
  ASSERT_TRUE(client_.update(secrets(), rotated));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_NE(annotation(), before);

  json open = get(replicatedTables(), "events");
  open["spec"]["api"] = {{"authentication", "None"}};
  ASSERT_TRUE(client_.update(replicatedTables(), open));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json open_pod = get(statefulSets(), "events")["spec"]["template"]["spec"];
  EXPECT_EQ(open_pod["volumes"].dump().find("events-api-tokens"), std::string::npos);
  const std::string open_config =
      get(op::resources::configMaps(), "events-config")["data"]["core.yaml"];
  EXPECT_EQ(open_config.find("tokensFile"), std::string::npos) << open_config;
}

// spec.networkPolicy: applied (before the pods) when enabled, deleted when switched off.
TEST_F(Reconciler, ANetworkPolicyIsAppliedWhenEnabledAndDeletedWhenSwitchedOff) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(client_.get(op::resources::networkPolicies(), {"analytics", "events"}));

  json guarded = get(replicatedTables(), "events");
  guarded["spec"]["networkPolicy"] = {
      {"enabled", true},
      {"apiFrom", json::array({{{"podSelector", {{"matchLabels", {{"role", "writer"}}}}}}})}};
  ASSERT_TRUE(client_.update(replicatedTables(), guarded));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json policy = get(op::resources::networkPolicies(), "events");
  EXPECT_EQ(policy["spec"]["ingress"][1]["from"][0]["podSelector"]["matchLabels"]["role"],
            "writer");
  EXPECT_EQ(policy["metadata"]["ownerReferences"][0]["kind"], "ReplicatedTable");

  json open = get(replicatedTables(), "events");
  open["spec"]["networkPolicy"] = {{"enabled", false}};
  ASSERT_TRUE(client_.update(replicatedTables(), open));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(client_.get(op::resources::networkPolicies(), {"analytics", "events"}));
}

// spec.tls: the Secret must exist and hold a certificate for the replicas' names and its key
// before anything is made; then the pods mount it, rtable-core's config names it, and the probes
// speak HTTPS.
TEST_F(Reconciler, ATlsSecretMustServeTheReplicasNamesBeforeAnythingIsMade) {
  char pattern[] = "/tmp/rtable-reconciler-tls-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::filesystem::path dir = pattern;
  auto made = common::testing::makeTestCertificates(
      dir / "right",
      {"*.events-headless.analytics.svc", "*.events-headless.analytics.svc.cluster.local"});
  ASSERT_TRUE(made) << made.error();
  made = common::testing::makeTestCertificates(dir / "wrong", {"*.other-headless.analytics.svc"});
  ASSERT_TRUE(made) << made.error();
  auto file = [](const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto tlsSecret = [&](const std::filesystem::path& from) {
    return json{{"apiVersion", "v1"},
                {"kind", "Secret"},
                {"type", "kubernetes.io/tls"},
                {"metadata", {{"name", "events-tls"}, {"namespace", "analytics"}}},
                {"data",
                 {{"tls.crt", common::base64Encode(file(from / "tls.crt"))},
                  {"tls.key", common::base64Encode(file(from / "tls.key"))},
                  {"ca.crt", common::base64Encode(file(from / "ca.crt"))}}}};
  };
  json tls_table = table(1);
  tls_table["spec"]["tls"] = {{"secretName", "events-tls"}};
  ASSERT_TRUE(client_.create(replicatedTables(), tls_table));
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Ready")["reason"], "TlsSecretUnavailable");
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("events-tls does not exist"),
            std::string::npos)
      << condition("Ready");
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  // A certificate for another table's replicas: they would refuse each other's fetches.
  ASSERT_TRUE(client_.create(secrets(), tlsSecret(dir / "wrong")));
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find(
                "does not name events-0.events-headless.analytics.svc"),
            std::string::npos)
      << condition("Ready");
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  json right = tlsSecret(dir / "right");
  right["metadata"] = get(secrets(), "events-tls")["metadata"];
  ASSERT_TRUE(client_.update(secrets(), right));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  const json pod = get(statefulSets(), "events")["spec"]["template"]["spec"];
  EXPECT_NE(pod["volumes"].dump().find("\"secretName\":\"events-tls\""), std::string::npos);
  EXPECT_NE(pod["containers"][0]["volumeMounts"].dump().find("/etc/rtable/tls"), std::string::npos);
  EXPECT_EQ(pod["containers"][0]["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
  EXPECT_EQ(pod["containers"][0]["livenessProbe"]["httpGet"]["scheme"], "HTTPS");
  const std::string config = get(op::resources::configMaps(), "events-config")["data"]["core.yaml"];
  EXPECT_NE(config.find("tls:\n  dir: /etc/rtable/tls"), std::string::npos) << config;
  std::filesystem::remove_all(dir);
}

// A tokens Secret the user names must exist with at least one token before anything is made.
TEST_F(Reconciler, ANamedApiTokensSecretMustHoldATokenBeforeAnythingIsMade) {
  json named = table(1);
  named["spec"]["api"] = {{"tokensSecret", "events-clients"}, {"readsNeedToken", true}};
  ASSERT_TRUE(client_.create(replicatedTables(), named));
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Ready")["reason"], "ApiTokensUnavailable");
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("events-clients"),
            std::string::npos);
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", {{"name", "events-clients"}, {"namespace", "analytics"}}},
                 {"data", {{"tokens", common::base64Encode("\n  \n")}}}};
  ASSERT_TRUE(client_.create(secrets(), secret));
  ASSERT_FALSE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_NE(condition("Ready")["message"].get<std::string>().find("at least one"),
            std::string::npos);

  secret = get(secrets(), "events-clients");
  secret["data"]["tokens"] = common::base64Encode("t1\nt2\n");
  ASSERT_TRUE(client_.update(secrets(), secret));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(client_.get(secrets(), {"analytics", "events-api-tokens"}));
  const json pod = get(statefulSets(), "events")["spec"]["template"]["spec"];
  EXPECT_NE(pod["volumes"].dump().find("\"secretName\":\"events-clients\""), std::string::npos);
  const std::string config = get(op::resources::configMaps(), "events-config")["data"]["core.yaml"];
  EXPECT_NE(config.find("readsNeedToken: true"), std::string::npos) << config;
}

// Without a way to ZooKeeper the reconciler adds no finalizer (it could never remove it).
TEST_F(Reconciler, WithoutZooKeeperNoFinalizer) {
  ASSERT_TRUE(client_.create(replicatedTables(), table(1)));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_FALSE(get(replicatedTables(), "events")["metadata"].contains("finalizers"));
}

TEST_F(ReconcilerWithZooKeeper,
       ARestoredTableWaitsForItsBackupThenAsksItsReplicasAndSaysHowItWent) {
  json restored = table(3);
  restored["spec"]["restoreFrom"] = {{"backup", "nightly"}};
  ASSERT_TRUE(client_.create(replicatedTables(), restored));
  const std::string request_path = "/rtable/tables/analytics.events/restore";

  // No such backup: nothing is created, the table says what it waits for.
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "BackupNotFound");
  EXPECT_EQ(condition("Ready")["reason"], "WaitingForBackup");
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));
  EXPECT_FALSE(*operator_session_->exists("/rtable/tables/analytics.events"));
  EXPECT_EQ(events_.withReason("RestoreWaiting").size(), 1u);

  // The backup runs: still waiting.
  json backup = {{"apiVersion", "rtable.io/v1alpha1"},
                 {"kind", "ClusterBackup"},
                 {"metadata", {{"name", "nightly"}, {"namespace", "analytics"}}},
                 {"spec",
                  {{"table", "events-old"},
                   {"destination", {{"filesystem", {{"path", "/backups/nightly"}}}}}}}};
  auto created = client_.create(clusterBackups(), backup);
  ASSERT_TRUE(created) << created.error().toString();
  (*created)["status"] = {{"phase", "Running"}};
  auto running = client_.updateStatus(clusterBackups(), *created);
  ASSERT_TRUE(running) << running.error().toString();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "BackupNotCompleted");
  EXPECT_NE(condition("Restored")["message"].get<std::string>().find("is Running"),
            std::string::npos);
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  // Completed: the request goes to ZooKeeper before the tree and the pods.
  (*running)["status"] = {{"phase", "Completed"},
                          {"contents", json::array({{{"table", "events-old"}, {"rows", 30}}})}};
  ASSERT_TRUE(client_.updateStatus(clusterBackups(), *running));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto node = operator_session_->get(request_path);
  ASSERT_TRUE(node) << node.error().toString();
  auto request = backup::RestoreRequest::parse(node->data);
  ASSERT_TRUE(request) << request.error();
  EXPECT_EQ(request->backup, "analytics.nightly");
  EXPECT_EQ(request->table, "events-old");
  EXPECT_EQ(request->destination.path, "/backups/nightly");
  EXPECT_EQ(request->state, backup::RestoreRequest::State::kPending);
  EXPECT_TRUE(client_.get(statefulSets(), {"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "RestorePending");
  EXPECT_EQ(events_.withReason("RestoreRequested").size(), 1u);

  // A replica restores: the condition follows the request; done is said once.
  request->state = backup::RestoreRequest::State::kRunning;
  request->restorer = "events-1";
  request->parts_total = 3;
  request->parts_done = 1;
  request->rows_done = 10;
  ASSERT_TRUE(operator_session_->set(request_path, request->format(), -1));
  auto outcome = reconciler_->reconcile({"analytics", "events"});
  ASSERT_TRUE(outcome);
  EXPECT_EQ(condition("Restored")["reason"], "Restoring");
  EXPECT_NE(condition("Restored")["message"].get<std::string>().find("1 of 3 parts"),
            std::string::npos);
  request->state = backup::RestoreRequest::State::kDone;
  request->parts_done = 3;
  request->rows_done = 30;
  ASSERT_TRUE(operator_session_->set(request_path, request->format(), -1));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["status"], "True");
  EXPECT_EQ(condition("Restored")["message"],
            "restored ClusterBackup nightly (table events-old): 3 parts, 30 rows");
  EXPECT_EQ(events_.withReason("Restored").size(), 1u);
  // The backup may go now: the table no longer needs it.
  ASSERT_TRUE(client_.remove(clusterBackups(), {"analytics", "nightly"}));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["status"], "True");
}

TEST_F(ReconcilerWithZooKeeper, ATableRestoredFromALocationNeedsNoClusterBackup) {
  // After losing the cluster: its ClusterBackups are gone, its backups are not.
  json restored = table(3);
  restored["spec"]["restoreFrom"] = {{"filesystem", {{"path", "/backups"}}},
                                     {"name", "analytics.nightly"}};
  ASSERT_TRUE(client_.create(replicatedTables(), restored));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto node = operator_session_->get("/rtable/tables/analytics.events/restore");
  ASSERT_TRUE(node) << node.error().toString();
  auto request = backup::RestoreRequest::parse(node->data);
  ASSERT_TRUE(request) << request.error();
  EXPECT_EQ(request->backup, "analytics.nightly");
  EXPECT_EQ(request->table, "");  // the backup's only table: the restoring replica finds it
  EXPECT_EQ(request->destination.path, "/backups");
  EXPECT_TRUE(client_.get(statefulSets(), {"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["message"],
            "waiting for a replica to restore backup analytics.nightly in /backups");
}

TEST_F(ReconcilerWithZooKeeper, ATableRestoredFromS3WaitsForItsCredentialsAndMountsThem) {
  json restored = table(3);
  restored["spec"]["restoreFrom"] = {{"s3",
                                      {{"endpoint", "http://seaweedfs.backup.svc:8333"},
                                       {"bucket", "analytics-backups"},
                                       {"prefix", "cluster-a"},
                                       {"credentials", {{"secretName", "s3-backup"}}}}},
                                     {"name", "analytics.nightly"}};
  ASSERT_TRUE(client_.create(replicatedTables(), restored));
  const std::string request_path = "/rtable/tables/analytics.events/restore";

  // No Secret: nothing is created, the table says which Secret it waits for.
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "CredentialsNotFound");
  EXPECT_EQ(condition("Restored")["message"],
            "the credentials Secret s3-backup of s3://analytics-backups/cluster-a does not exist "
            "in namespace analytics");
  EXPECT_FALSE(*operator_session_->exists(request_path));
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  // A Secret without the secret key: still waiting, naming the key.
  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", {{"name", "s3-backup"}, {"namespace", "analytics"}}},
                 {"data", {{"accessKeyId", "QUtJQQ=="}}}};
  auto created = client_.create(op::resources::secrets(), secret);
  ASSERT_TRUE(created) << created.error().toString();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["message"],
            "the credentials Secret s3-backup has no key 'secretAccessKey'");

  (*created)["data"]["secretAccessKey"] = "c2VjcmV0";
  ASSERT_TRUE(client_.update(op::resources::secrets(), *created));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto node = operator_session_->get(request_path);
  ASSERT_TRUE(node) << node.error().toString();
  auto request = backup::RestoreRequest::parse(node->data);
  ASSERT_TRUE(request) << request.error();
  EXPECT_EQ(request->backup, "analytics.nightly");
  EXPECT_EQ(request->destination.kind, backup::DestinationRef::Kind::kS3);
  EXPECT_EQ(request->destination.location(), "s3://analytics-backups/cluster-a");
  EXPECT_EQ(request->destination.endpoint, "http://seaweedfs.backup.svc:8333");
  EXPECT_EQ(request->destination.credentials_secret, "s3-backup");
  EXPECT_EQ(node->data.find("c2VjcmV0"), std::string::npos) << "a key in ZooKeeper";
  // The pods mount the Secret (not listed in backupCredentials: restoreFrom's own).
  auto set = client_.get(statefulSets(), {"analytics", "events"});
  ASSERT_TRUE(set);
  EXPECT_NE(set->dump().find("/etc/rtable/backup-credentials/s3-backup"), std::string::npos);
  EXPECT_EQ(condition("Restored")["message"],
            "waiting for a replica to restore backup analytics.nightly in "
            "s3://analytics-backups/cluster-a");
}

TEST_F(ReconcilerWithZooKeeper, ATableRestoredFromAClaimWaitsForASharedClaimAndMountsIt) {
  json restored = table(3);
  restored["spec"]["restoreFrom"] = {
      {"persistentVolumeClaim", {{"claimName", "rtable-backups"}, {"subPath", "cluster-a"}}},
      {"name", "analytics.nightly"}};
  ASSERT_TRUE(client_.create(replicatedTables(), restored));
  const std::string request_path = "/rtable/tables/analytics.events/restore";

  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "ClaimNotFound");
  EXPECT_EQ(condition("Restored")["message"],
            "the PersistentVolumeClaim rtable-backups of pvc://rtable-backups/cluster-a does not "
            "exist in namespace analytics");
  EXPECT_FALSE(*operator_session_->exists(request_path));
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  // ReadWriteOnce: three replicas on several nodes could not all mount it.
  json claim = {
      {"apiVersion", "v1"},
      {"kind", "PersistentVolumeClaim"},
      {"metadata", {{"name", "rtable-backups"}, {"namespace", "analytics"}}},
      {"spec",
       {{"accessModes", {"ReadWriteOnce"}}, {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}};
  auto created = client_.create(op::resources::persistentVolumeClaims(), claim);
  ASSERT_TRUE(created) << created.error().toString();
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "ClaimNotShared");
  EXPECT_EQ(condition("Restored")["message"],
            "the PersistentVolumeClaim rtable-backups is not ReadWriteMany (access modes "
            "[\"ReadWriteOnce\"]): the 3 replicas of table events may run on several nodes and "
            "must all write to it");

  (*created)["spec"]["accessModes"] = {"ReadWriteMany"};
  ASSERT_TRUE(client_.update(op::resources::persistentVolumeClaims(), *created));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto node = operator_session_->get(request_path);
  ASSERT_TRUE(node) << node.error().toString();
  auto request = backup::RestoreRequest::parse(node->data);
  ASSERT_TRUE(request) << request.error();
  EXPECT_EQ(request->destination.kind, backup::DestinationRef::Kind::kVolume);
  EXPECT_EQ(request->destination.location(), "pvc://rtable-backups/cluster-a");
  auto set = client_.get(statefulSets(), {"analytics", "events"});
  ASSERT_TRUE(set);
  EXPECT_NE(set->dump().find("/var/lib/rtable-backup-volumes/rtable-backups"), std::string::npos);
  EXPECT_EQ(condition("Restored")["message"],
            "waiting for a replica to restore backup analytics.nightly in "
            "pvc://rtable-backups/cluster-a");
}

TEST_F(ReconcilerWithZooKeeper, ARestoreFromAnS3ClusterBackupNeedsTheTableToMountItsSecret) {
  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", {{"name", "s3-backup"}, {"namespace", "analytics"}}},
                 {"data", {{"accessKeyId", "QUtJQQ=="}, {"secretAccessKey", "c2VjcmV0"}}}};
  ASSERT_TRUE(client_.create(op::resources::secrets(), secret));
  json backup = {{"apiVersion", "rtable.io/v1alpha1"},
                 {"kind", "ClusterBackup"},
                 {"metadata", {{"name", "nightly"}, {"namespace", "analytics"}}},
                 {"spec",
                  {{"table", "events"},
                   {"destination",
                    {{"s3",
                      {{"endpoint", "http://s3:8333"},
                       {"bucket", "backups"},
                       {"credentials", {{"secretName", "s3-backup"}}}}}}}}}};
  auto created = client_.create(clusterBackups(), backup);
  ASSERT_TRUE(created) << created.error().toString();
  (*created)["status"] = {{"phase", "Completed"},
                          {"contents", json::array({{{"table", "events"}, {"rows", 30}}})}};
  ASSERT_TRUE(client_.updateStatus(clusterBackups(), *created));

  json restored = table(3);
  restored["spec"]["restoreFrom"] = {{"backup", "nightly"}};
  ASSERT_TRUE(client_.create(replicatedTables(), restored));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  EXPECT_EQ(condition("Restored")["reason"], "CredentialsNotMounted");
  EXPECT_EQ(condition("Restored")["message"],
            "the replicas of table events do not mount the credentials Secret s3-backup of "
            "s3://backups: add it to the table's spec.backupCredentials (its pods restart, one at "
            "a time, to mount it)");
  EXPECT_FALSE(client_.get(statefulSets(), {"analytics", "events"}));

  // Listed (restoreFrom is immutable, backupCredentials is not): the restore is asked for.
  auto current = client_.get(replicatedTables(), {"analytics", "events"});
  ASSERT_TRUE(current);
  (*current)["spec"]["backupCredentials"] = {"s3-backup"};
  ASSERT_TRUE(client_.update(replicatedTables(), *current));
  ASSERT_TRUE(reconciler_->reconcile({"analytics", "events"}));
  auto node = operator_session_->get("/rtable/tables/analytics.events/restore");
  ASSERT_TRUE(node) << node.error().toString();
  auto request = backup::RestoreRequest::parse(node->data);
  ASSERT_TRUE(request) << request.error();
  EXPECT_EQ(request->destination.credentials_secret, "s3-backup");
  EXPECT_EQ(condition("Restored")["reason"], "RestorePending");
}

}  // namespace
}  // namespace rtable::controllers
