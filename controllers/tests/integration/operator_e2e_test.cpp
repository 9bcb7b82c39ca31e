// rtable-operator end to end (issue 6): a real kube-apiserver and kube-controller-manager
// (LocalControlPlane), `helm install` of helm/rtable (CRDs, ServiceAccount, RBAC), a real
// ZooKeeper, LocalKubelet running each replica pod's rtable-core as a local process on its own
// 127.0.0.N, and rtable-operator as a process authenticated as the chart's ServiceAccount. A
// ReplicatedTable applied with kubectl becomes three Ready replicas that replicate a row; scaled to
// two, the removed replica leaves ZooKeeper; the operator restarted mid-way resumes; deleted, its
// objects and its ZooKeeper subtree are gone.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <expected>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include "rtable/common/testing/http_client.h"
#include "rtable/common/testing/subprocess.h"
#include "rtable/common/testing/wait.h"
#include "rtable/controllers/replicated_table_reconciler.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/local_control_plane.h"
#include "rtable/operator/testing/local_kubelet.h"
#include "rtable/operator/testing/operator_log.h"
#include "rtable/replication_core/testing/local_zookeeper.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::controllers {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;
using common::testing::httpRequest;
using common::testing::Subprocess;
using core::testing::LocalZooKeeper;
using op::testing::LocalControlPlane;
using op::testing::LocalControlPlaneOptions;
using op::testing::LocalImage;
using op::testing::LocalKubelet;
using op::testing::LocalKubeletOptions;

constexpr const char* kImage = "rtable/rtable:e2e";
constexpr const char* kNs = "analytics";

// The apiserver and the replicas are asked at most 4 times a second.
bool eventually(const std::function<bool()>& check, std::chrono::seconds timeout) {
  return common::testing::waitFor(check, timeout, 250ms);
}

class OperatorEndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    core::ZooKeeperClient::silenceLibraryLog();  // ZooKeeper stops before our session at the end
    LocalControlPlaneOptions plane_options;
    plane_options.controller_manager = true;  // StatefulSet, garbage collector
    auto plane = LocalControlPlane::start(plane_options);
    ASSERT_TRUE(plane) << plane.error();
    plane_ = std::make_unique<LocalControlPlane>(std::move(*plane));
    // helm install: the CRDs, the operator's ServiceAccount and least-privilege RBAC (its
    // Deployment's pod cannot run here: no image; the operator runs as a local process below,
    // with that ServiceAccount's token, so the chart's RBAC is what the scenario exercises).
    auto installed = common::testing::runCommand(
        {(plane_->binDir() / "helm").string(), "install", "rtable", RTABLE_CHART_DIR, "--namespace",
         "rtable-system", "--create-namespace", "--kubeconfig", plane_->kubeconfigPath().string(),
         "--set", std::string("coreImage.repository=rtable/rtable,coreImage.tag=e2e")},
        120s);
    ASSERT_TRUE(installed && installed->exit_code == 0)
        << (installed ? installed->out + installed->err : installed.error());
    auto identity = plane_->serviceAccountKubeconfig("rtable-system", "rtable", "rtable");
    ASSERT_TRUE(identity) << identity.error();
    operator_kubeconfig_ = *identity;
    ASSERT_TRUE(plane_->kubectl({"wait", "--for=condition=Established",
                                 "crd/replicatedtables.rtable.io", "--timeout=60s"}));
    ASSERT_TRUE(plane_->apply(
        json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNs}}}}.dump()));

    auto zookeeper = LocalZooKeeper::start();
    ASSERT_TRUE(zookeeper) << zookeeper.error();
    zookeeper_ = std::move(*zookeeper);

    LocalKubeletOptions kubelet_options;
    kubelet_options.kubeconfig = plane_->kubeconfigPath();
    kubelet_options.images[kImage] = LocalImage{{RTABLE_CORE_BINARY}, {}, {}};
    kubelet_options.host_hosts_file = plane_->workDir() / "host-hosts";
    {
      std::ofstream(kubelet_options.host_hosts_file) << "127.0.0.1\tlocalhost\n";
    }
    kubelet_options.max_termination_grace = 30s;
    kubelet_options.restart_backoff_initial = 1s;  // a killed replica comes back quickly
    auto kubelet = LocalKubelet::start(kubelet_options);
    ASSERT_TRUE(kubelet) << kubelet.error();
    kubelet_ = std::make_unique<LocalKubelet>(std::move(*kubelet));

    auto config = op::KubeConfig::load(plane_->kubeconfigPath());
    ASSERT_TRUE(config);
    auto cluster = config->clusterConfig();
    ASSERT_TRUE(cluster);
    auto client = op::HttpKubeClient::create(*cluster);
    ASSERT_TRUE(client);
    client_ = std::move(*client);

    auto keeper =
        core::ZooKeeperClient::connect(core::ZooKeeperConfig{zookeeper_->connectString()});
    ASSERT_TRUE(keeper) << keeper.error().toString();
    keeper_ = std::move(*keeper);
    startOperator();
  }

  void TearDown() override {
    if (HasFailure()) {
      plane_->keepWorkDir();
      kubelet_->keepWorkDir();
      std::fprintf(stderr, "kept: control plane %s, kubelet %s, operator log %s\n",
                   plane_->workDir().c_str(), kubelet_->workDir().c_str(), operatorLog().c_str());
    }
    operator_.reset();
    kubelet_.reset();  // stops the replicas before ZooKeeper and the apiserver go
    keeper_.reset();
    zookeeper_.reset();
    plane_.reset();
  }

  fs::path operatorLog() const { return plane_->workDir() / "rtable-operator.log"; }

  void startOperator() {
    ::setenv("RTABLE_CORE_IMAGE", kImage, 1);
    auto process = Subprocess::start(
        {RTABLE_OPERATOR_BINARY, "--kubeconfig", operator_kubeconfig_.string(),
         "--leader-election-namespace=rtable-system", "--health-probe-bind-address=127.0.0.1:0",
         "--metrics-bind-address=127.0.0.1:0"},
        operatorLog());
    ASSERT_TRUE(process) << process.error();
    operator_ = std::make_unique<Subprocess>(std::move(*process));
  }

  std::optional<json> table() {
    auto object = client_->get(replicatedTables(), {kNs, "events"});
    if (!object) return std::nullopt;
    return *object;
  }
  std::string tableState() {
    auto object = table();
    return object ? object->value("status", json::object()).dump() : "(no table)";
  }
  bool readyReplicas(int n) {
    auto object = table();
    if (!object) return false;
    const json status = object->value("status", json::object());
    if (status.value("readyReplicas", -1) != n ||
        status.value("observedGeneration", -1) !=
            object->value(json::json_pointer("/metadata/generation"), -2)) {
      return false;
    }
    for (const auto& condition : status.value("conditions", json::array())) {
      if (condition.value("type", "") == "Ready") return condition.value("status", "") == "True";
    }
    return false;
  }
  std::string podIp(const std::string& pod) {
    auto object = client_->get(op::resources::pods(), {kNs, pod});
    return object ? object->value(json::json_pointer("/status/podIP"), "") : "";
  }
  std::optional<uint64_t> count(const std::string& pod) {
    auto answer = httpRequest(podIp(pod), 8123, "GET", "/count", "", 5s);
    if (!answer || answer->status != 200) return std::nullopt;
    const json body = json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("rows")) return std::nullopt;
    return body["rows"].get<uint64_t>();
  }
  bool zkExists(const std::string& path) {
    auto stat = keeper_->exists(path);
    return stat && stat->has_value();
  }
  std::string root() const { return "/rtable/tables/analytics.events"; }

  // Reconciles of ReplicatedTables that ended without error since the operator (re)started.
  double finishedReconciles() const {
    // The last report in the log (appended to across restarts) is the running process's.
    std::ifstream in(operatorLog());
    std::stringstream log;
    log << in.rdbuf();
    const auto port = op::testing::reportedPorts(log.str()).metrics;
    if (!port) return 0;
    auto answer = httpRequest("127.0.0.1", *port, "GET", "/metrics", "", 5s);
    if (!answer || answer->status != 200) return 0;
    double total = 0;
    for (const char* result : {"success", "requeue", "requeue_after"}) {
      const std::string prefix = fmt::format(
          "controller_runtime_reconcile_total{{controller=\"replicatedtable\",result=\"{}\"}} ",
          result);
      if (auto at = answer->body.find(prefix); at != std::string::npos) {
        total += std::stod(answer->body.substr(at + prefix.size()));
      }
    }
    return total;
  }

  // Everything the operator has written for the table, as "kind/name" -> version: the spec
  // generation of the StatefulSet and the PodDisruptionBudget (controllers move their status),
  // the resourceVersion of the Services, ConfigMap and Secret, the count of each Event it
  // recorded. Equal snapshots: no action was taken in between.
  std::map<std::string, std::string> operatorActions() {
    std::map<std::string, std::string> actions;
    auto record = [&](const op::ResourceType& type, const std::string& kind, bool generation) {
      auto items = tableObjects(type);
      EXPECT_TRUE(items) << kind << ": " << items.error();
      if (!items) return;
      for (const json& item : *items) {
        const json& meta = item["metadata"];
        actions[kind + "/" + meta.value("name", "")] =
            generation ? std::to_string(meta.value("generation", 0))
                       : meta.value("resourceVersion", "");
      }
    };
    record(op::resources::statefulSets(), "StatefulSet", true);
    record(op::resources::podDisruptionBudgets(), "PodDisruptionBudget", true);
    record(op::resources::services(), "Service", false);
    record(op::resources::configMaps(), "ConfigMap", false);
    record(op::resources::secrets(), "Secret", false);
    auto events = client_->list(op::resources::events(), kNs);
    EXPECT_TRUE(events) << events.error().toString();
    if (events) {
      for (const json& event : events->items) {
        if (event.value("reportingComponent", "") != "rtable-operator") continue;
        actions["Event/" + event.value("reason", "") + "/" + event["metadata"].value("name", "")] =
            std::to_string(event.value("count", 0));
      }
    }
    return actions;
  }
  // What is left of the table in the namespace: "kind/name" of every object with its labels.
  std::vector<std::string> leftovers() {
    std::vector<std::string> left;
    const std::vector<std::pair<op::ResourceType, std::string>> kinds = {
        {op::resources::statefulSets(), "StatefulSet"},
        {op::resources::pods(), "Pod"},
        {op::resources::podDisruptionBudgets(), "PodDisruptionBudget"},
        {op::resources::services(), "Service"},
        {op::resources::configMaps(), "ConfigMap"},
        {op::resources::secrets(), "Secret"},
        {op::resources::persistentVolumeClaims(), "PersistentVolumeClaim"}};
    for (const auto& [type, kind] : kinds) {
      auto items = tableObjects(type);
      if (!items) {
        left.push_back(kind + ": " + items.error());
        continue;
      }
      for (const json& item : *items)
        left.push_back(kind + "/" + item["metadata"].value("name", ""));
    }
    return left;
  }
  // The table's objects of one kind, by the instance label the operator gives them all.
  std::expected<std::vector<json>, std::string> tableObjects(const op::ResourceType& type) {
    op::ListOptions options;
    options.label_selector = "app.kubernetes.io/instance=events";
    auto list = client_->list(type, kNs, options);
    if (!list) return std::unexpected(list.error().toString());
    return std::move(list->items);
  }

  std::unique_ptr<LocalControlPlane> plane_;
  std::unique_ptr<LocalZooKeeper> zookeeper_;
  std::unique_ptr<LocalKubelet> kubelet_;
  std::unique_ptr<op::HttpKubeClient> client_;
  std::unique_ptr<core::Keeper> keeper_;
  std::unique_ptr<Subprocess> operator_;
  fs::path operator_kubeconfig_;  // the chart's ServiceAccount
};

TEST_F(OperatorEndToEnd, ATableFromApplyToDelete) {
  const std::string manifest = fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ReplicatedTable
metadata: {{name: events, namespace: {}}}
spec:
  table: events
  columns:
    - {{name: d, type: Date}}
    - {{name: user, type: String}}
  partitionBy: toYYYYMM(d)
  orderBy: [user, d]
  replicas: 3
  zookeeper: {{connect: "{}", sessionTimeoutMs: 6000}}
  storage: {{size: 1Gi}}
)",
                                           kNs, zookeeper_->connectString());
  ASSERT_TRUE(plane_->apply(manifest));
  ASSERT_TRUE(eventually([&] { return readyReplicas(3); }, 240s)) << tableState();
  auto printed = plane_->kubectl({"get", "replicatedtables", "-n", kNs});
  ASSERT_TRUE(printed);
  EXPECT_NE(printed->out.find("3/3"), std::string::npos) << printed->out;
  EXPECT_TRUE(zkExists(root() + "/1/replicas/events-2/is_active"));
  EXPECT_EQ(table()->value(json::json_pointer("/metadata/finalizers"), json::array()),
            json::array({kZooKeeperFinalizer}));

  // A row through events-0, read on all three.
  auto inserted = httpRequest(podIp("events-0"), 8123, "POST", "/insert?format=JSONEachRow",
                              R"({"d":"2026-12-03","user":"ada"})"
                              "\n");
  ASSERT_TRUE(inserted && inserted->status == 200)
      << (inserted ? inserted->body : inserted.error());
  for (const char* pod : {"events-0", "events-1", "events-2"}) {
    EXPECT_TRUE(eventually([&] { return count(pod) == 1u; }, 60s)) << pod;
  }

  // Scale to 5: the two new replicas fetch what the others have.
  ASSERT_TRUE(plane_->kubectl({"scale", "replicatedtable/events", "-n", kNs, "--replicas=5"}));
  ASSERT_TRUE(eventually([&] { return readyReplicas(5); }, 240s)) << tableState();
  for (const char* pod : {"events-3", "events-4"}) {
    EXPECT_TRUE(eventually([&] { return count(pod) == 1u; }, 60s)) << pod;
  }

  // The operator restarts: it picks up where it was, without acting again on what it did.
  const auto before_restart = operatorActions();
  EXPECT_TRUE(before_restart.contains("StatefulSet/events"))
      << ::testing::PrintToString(before_restart);
  EXPECT_TRUE(before_restart.contains("Secret/events-interserver"))
      << ::testing::PrintToString(before_restart);
  EXPECT_TRUE(std::any_of(before_restart.begin(), before_restart.end(), [](const auto& action) {
    return action.first.starts_with("Event/ZooKeeperTreeCreated/");
  })) << ::testing::PrintToString(before_restart);
  operator_.reset();
  startOperator();
  ASSERT_TRUE(eventually([&] { return finishedReconciles() >= 1; }, 120s))
      << "the restarted operator never reconciled; log " << operatorLog();
  EXPECT_EQ(operatorActions(), before_restart) << "the restarted operator acted again";

  // Scale to 2: events-2..4 go, and so do their replicas in ZooKeeper.
  ASSERT_TRUE(plane_->kubectl({"scale", "replicatedtable/events", "-n", kNs, "--replicas=2"}));
  for (const char* gone : {"events-2", "events-3", "events-4"}) {
    EXPECT_TRUE(eventually([&] { return !zkExists(root() + "/1/replicas/" + gone); }, 180s))
        << gone << ": " << tableState();
  }
  EXPECT_TRUE(eventually([&] { return readyReplicas(2); }, 120s)) << tableState();
  EXPECT_TRUE(zkExists(root() + "/1/replicas/events-1"));

  // kill -9 of events-1's rtable-core: the kubelet restarts it, and it catches up on a row
  // inserted meanwhile.
  auto killed =
      common::testing::runCommand({"pkill", "-9", "-f", "--", "--replica-name=events-1"}, 10s);
  ASSERT_TRUE(killed && killed->exit_code == 0)
      << (killed ? killed->out + killed->err : killed.error());
  inserted = httpRequest(podIp("events-0"), 8123, "POST", "/insert?format=JSONEachRow",
                         R"({"d":"2026-12-03","user":"grace"})"
                         "\n");
  ASSERT_TRUE(inserted && inserted->status == 200)
      << (inserted ? inserted->body : inserted.error());
  EXPECT_TRUE(eventually([&] { return count("events-1") == 2u; }, 120s));
  EXPECT_TRUE(eventually([&] { return readyReplicas(2); }, 120s)) << tableState();

  // Deleted: the pods, then the ZooKeeper subtree, then the table itself; the garbage collector
  // takes every object the table owned (the claims go with the StatefulSet: whenDeleted Delete).
  const auto owned = leftovers();
  for (const char* object : {"StatefulSet/events", "Pod/events-0", "PodDisruptionBudget/events",
                             "Service/events", "Service/events-headless", "ConfigMap/events-config",
                             "Secret/events-interserver", "PersistentVolumeClaim/data-events-0"}) {
    EXPECT_NE(std::find(owned.begin(), owned.end(), object), owned.end())
        << object << " not among " << ::testing::PrintToString(owned);
  }
  ASSERT_TRUE(plane_->kubectl({"delete", "replicatedtable/events", "-n", kNs, "--wait=false"}));
  EXPECT_TRUE(eventually([&] { return !table().has_value(); }, 180s)) << tableState();
  EXPECT_FALSE(zkExists(root()));
  EXPECT_TRUE(eventually([&] { return leftovers().empty(); }, 120s))
      << ::testing::PrintToString(leftovers());
}

}  // namespace
}  // namespace rtable::controllers
