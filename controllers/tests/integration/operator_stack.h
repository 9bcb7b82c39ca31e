// The whole rtable stack for end-to-end tests (issues 6 and 20): a real kube-apiserver and
// kube-controller-manager (LocalControlPlane), `helm install` of helm/rtable (CRDs, ServiceAccount,
// RBAC), a real ZooKeeper, LocalKubelet running each replica pod's rtable-core as a local process
// on its own 127.0.0.N, and rtable-operator as a process authenticated as the chart's
// ServiceAccount. The tests' table is `events` in the namespace `analytics`. Each test binary that
// includes this names the binaries and the chart with RTABLE_OPERATOR_BINARY, RTABLE_CORE_BINARY
// and RTABLE_CHART_DIR (controllers/tests/CMakeLists.txt).
#pragma once

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
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "rtable/common/base64.h"
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
#include "rtable/replication_core/testing/retrying_writers.h"
#include "rtable/replication_core/zookeeper_client.h"

#if !defined(RTABLE_CHART_DIR) || !defined(RTABLE_OPERATOR_BINARY) || !defined(RTABLE_CORE_BINARY)
#error "RTABLE_CHART_DIR, RTABLE_OPERATOR_BINARY and RTABLE_CORE_BINARY must be defined"
#endif

namespace rtable::controllers::testing {

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

inline constexpr const char* kImage = "rtable/rtable:e2e";
inline constexpr const char* kNs = "analytics";
// The pods of a 3-replica `events` table.
inline constexpr const char* kPods[] = {"events-0", "events-1", "events-2"};

// The apiserver and the replicas are asked at most 4 times a second.
inline bool eventually(const std::function<bool()>& check, std::chrono::seconds timeout) {
  return common::testing::waitFor(check, timeout, 250ms);
}

class OperatorStack : public ::testing::Test {
 protected:
  void SetUp() override {
    core::ZooKeeperClient::silenceLibraryLog();  // ZooKeeper stops before our session at the end
    LocalControlPlaneOptions plane_options;
    plane_options.controller_manager = true;  // StatefulSet, garbage collector
    auto plane = LocalControlPlane::start(plane_options);
    ASSERT_TRUE(plane) << plane.error();
    plane_ = std::make_unique<LocalControlPlane>(std::move(*plane));
    // Before the chart: with watchNamespace its Role goes into it.
    ASSERT_TRUE(plane_->apply(
        json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNs}}}}.dump()));
    // helm install: the CRDs, the operator's ServiceAccount and least-privilege RBAC (its
    // Deployment's pod cannot run here: no image; the operator runs as a local process below,
    // with that ServiceAccount's token, so the chart's RBAC is what the scenario exercises).
    auto installed = common::testing::runCommand(
        {(plane_->binDir() / "helm").string(), "install", "rtable", RTABLE_CHART_DIR, "--namespace",
         "rtable-system", "--create-namespace", "--kubeconfig", plane_->kubeconfigPath().string(),
         // The chart's NetworkPolicy on: the real apiserver validates it (nothing enforces it
         // here: the test kubelet has no network plugin).
         "--set",
         std::string(
             "coreImage.repository=rtable/rtable,coreImage.tag=e2e,networkPolicy.enabled=true") +
             (watch_namespace_ ? std::string(",watchNamespace=") + kNs : std::string())},
        120s);
    ASSERT_TRUE(installed && installed->exit_code == 0)
        << (installed ? installed->out + installed->err : installed.error());
    auto identity = plane_->serviceAccountKubeconfig("rtable-system", "rtable", "rtable");
    ASSERT_TRUE(identity) << identity.error();
    operator_kubeconfig_ = *identity;
    {
      auto done = plane_->kubectlOk({"wait", "--for=condition=Established",
                                     "crd/replicatedtables.rtable.io", "--timeout=60s"});
      ASSERT_TRUE(done) << done.error();
    }

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
    if (writers_) writers_->stop(std::chrono::seconds(10));
    writers_.reset();
    // A failed SetUp may have stopped before the kubelet (or the control plane) existed.
    if (HasFailure() && plane_ && kubelet_) {
      plane_->keepWorkDir();
      kubelet_->keepWorkDir();
      std::fprintf(stderr, "kept: control plane %s, kubelet %s, operator log %s\n",
                   plane_->workDir().c_str(), kubelet_->workDir().c_str(), operatorLog().c_str());
    } else if (HasFailure() && plane_) {
      plane_->keepWorkDir();
      std::fprintf(stderr, "kept: control plane %s\n", plane_->workDir().c_str());
    }
    operator_.reset();
    kubelet_.reset();  // stops the replicas before ZooKeeper and the apiserver go
    keeper_.reset();
    zookeeper_.reset();
    plane_.reset();
  }

  fs::path operatorLog() const { return plane_->workDir() / "rtable-operator.log"; }

  // Set by a fixture's constructor: the chart installed with watchNamespace=kNs (a Role there
  // only, no ClusterRole for the table's objects) and the operator run as its Deployment would.
  bool watch_namespace_ = false;

  // `env`: "NAME=value" settings for this process only; `flags`: more flags.
  void startOperator(const std::vector<std::string>& env = {},
                     const std::vector<std::string>& flags = {}) {
    ::setenv("RTABLE_CORE_IMAGE", kImage, 1);
    std::vector<std::string> all_env = env;
    // As the chart's Deployment sets it with watchNamespace.
    if (watch_namespace_) all_env.push_back(std::string("WATCH_NAMESPACE=") + kNs);
    std::vector<std::string> argv;
    if (!all_env.empty()) argv.push_back("env");  // execs the operator: same pid
    argv.insert(argv.end(), all_env.begin(), all_env.end());
    argv.insert(argv.end(),
                {RTABLE_OPERATOR_BINARY, "--kubeconfig", operator_kubeconfig_.string(),
                 "--leader-election-namespace=rtable-system",
                 "--health-probe-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0"});
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto process = Subprocess::start(argv, operatorLog());
    ASSERT_TRUE(process) << process.error();
    operator_ = std::make_unique<Subprocess>(std::move(*process));
  }

  // The swap tests' table (3 replicas, rows of core::testing::idRow), autoRecover off: a swap
  // waits for the test to allow or ask for it. Returns once its 3 replicas are ready.
  void applyTable() {
    ASSERT_TRUE(plane_->apply(tableManifest("events", "  headroom: {autoRecover: false}\n")));
    ASSERT_TRUE(eventually([&] { return readyReplicas(3); }, 240s)) << tableState();
  }
  // A 3-replica table of core::testing::idRow named `name`; `extra`: more of its spec (indented
  // lines).
  std::string tableManifest(const std::string& name, const std::string& extra) {
    return fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ReplicatedTable
metadata: {{name: {}, namespace: {}}}
spec:
  table: events
  columns:
    - {{name: id, type: UInt64}}
    - {{name: d, type: Date}}
    - {{name: user, type: String}}
  partitionBy: toYYYYMM(d)
  orderBy: [id]
  replicas: 3
  zookeeper: {{connect: "{}", sessionTimeoutMs: 10000}}
  storage: {{size: 1Gi}}
{}{})",
                       name, kNs, zookeeper_->connectString(), extra,
                       table_pod_template_.empty() ? "" : "  podTemplate:\n" + table_pod_template_);
  }

  // Four writers into applyTable()'s table that retry every failed or timed-out block with its
  // insert_deduplication_token (single rows and batches, round-robin over the replicas), each
  // pausing `pause_between_blocks` after a block.
  void startWriters(std::chrono::milliseconds pause_between_blocks = 100ms) {
    core::testing::RetryingWritersOptions options;
    for (const char* pod : kPods) options.replicas.push_back(endpoint(pod));
    options.row = core::testing::idRow;
    options.block_sizes = {1, 7, 1, 25};
    options.writers = 4;
    // 100 ms: about 30 blocks a second in all, each a part to fetch and merge on two shared cores.
    options.pause_between_blocks = pause_between_blocks;
    writers_ = std::make_unique<core::testing::RetryingWriters>(options);
    writers_->start();
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
  // The header that authorizes writes (the first token of the Secret the operator made for the
  // table's API); empty before it exists.
  std::string apiHeaders(const std::string& table = "events") {
    auto secret = client_->get(op::resources::secrets(), {kNs, table + "-api-tokens"});
    if (!secret) return "";
    auto tokens = common::base64Decode(secret->value(json::json_pointer("/data/tokens"), ""));
    if (!tokens) return "";
    return "Authorization: Bearer " + tokens->substr(0, tokens->find('\n')) + "\r\n";
  }
  core::testing::ReplicaEndpoint endpoint(const std::string& pod,
                                          const std::string& table = "events") {
    return core::testing::ReplicaEndpoint{podIp(pod), 8123, apiHeaders(table)};
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
    auto stat = tableKeeper().exists(path);
    return stat && stat->has_value();
  }
  // The table's ZooKeeper identity, from the Secret the operator made for it (nullopt until then).
  std::optional<core::ZooKeeperDigest> tableIdentity() {
    auto secret = client_->get(op::resources::secrets(), {kNs, "events-zookeeper"});
    if (!secret) return std::nullopt;
    auto user = common::base64Decode(secret->value(json::json_pointer("/data/username"), ""));
    auto password = common::base64Decode(secret->value(json::json_pointer("/data/password"), ""));
    if (!user || !password || user->empty()) return std::nullopt;
    return core::ZooKeeperDigest{*user, *password, root()};
  }
  // The test's ZooKeeper session, holding the table's identity once the operator made it: the
  // table's nodes refuse everyone else.
  core::Keeper& tableKeeper() {
    if (!authenticated_) {
      if (auto identity = tableIdentity(); identity && keeper_->addDigest(*identity)) {
        authenticated_ = true;
      }
    }
    return *keeper_;
  }
  std::string root() const { return "/rtable/tables/analytics.events"; }

  json status() {
    auto object = table();
    return object ? object->value("status", json::object()) : json::object();
  }
  std::string conditionReason(const std::string& type) {
    for (const auto& condition : status().value("conditions", json::array())) {
      if (condition.value("type", "") == type) return condition.value("reason", "");
    }
    return "";
  }

  std::optional<json> getJson(const std::string& pod, const std::string& target) {
    auto answer = httpRequest(podIp(pod), 8123, "GET", target, "", 10s);
    if (!answer || answer->status != 200) return std::nullopt;
    json body = json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return std::nullopt;
    return body;
  }
  // Active parts by name -> checksum, when the replica's queue is empty.
  std::optional<std::map<std::string, std::string>> settledParts(const std::string& pod) {
    auto state = getJson(pod, "/replica");
    auto parts = getJson(pod, "/parts");
    if (!state || !parts || !(*state)["queue"].empty()) return std::nullopt;
    std::map<std::string, std::string> sums;
    for (const auto& part : *parts) sums[part["name"]] = part["checksum"];
    return sums;
  }

  // The 3-replica table's final check, once its writers stopped: every replica synced, serving
  // `generation`, with the same parts, holding exactly the `acknowledged` rows, each once (count
  // and per row). A part attached twice, or a block inserted twice, would show as a row twice.
  void expectReplicasHoldExactly(const std::set<uint64_t>& acknowledged, int64_t generation) {
    const std::multiset<uint64_t> expected(acknowledged.begin(), acknowledged.end());
    for (const char* pod : kPods) {
      // Asked again while it answers SYNC_TIMEOUT: a queue of thousands of blocks drains slowly
      // on two cores that other builds share.
      std::string answer;
      ASSERT_TRUE(eventually(
          [&] {
            auto synced = httpRequest(podIp(pod), 8123, "POST", "/sync?timeout_seconds=30", "", 40s,
                                      apiHeaders());
            answer = synced ? synced->body : synced.error();
            return synced && synced->status == 200;
          },
          180s))
          << pod << ": " << answer;
    }
    std::map<std::string, std::map<std::string, std::string>> parts;
    EXPECT_TRUE(eventually(
        [&] {
          parts.clear();
          for (const char* pod : kPods) {
            auto settled = settledParts(pod);
            if (!settled) return false;
            parts[pod] = *settled;
          }
          return parts["events-0"] == parts["events-1"] && parts["events-0"] == parts["events-2"];
        },
        90s))
        << "parts differ: " << ::testing::PrintToString(parts);
    for (const char* pod : kPods) {
      auto holds =
          core::testing::checkReplicaHolds(endpoint(pod), static_cast<int>(generation), expected);
      EXPECT_TRUE(holds) << pod << ": " << (holds ? "" : holds.error());
    }
  }

  // The port of the running operator's /metrics (it binds port 0 and reports it in its log).
  std::optional<int> operatorMetricsPort() const {
    // The last report in the log (appended to across restarts) is the running process's.
    std::ifstream in(operatorLog());
    std::stringstream log;
    log << in.rdbuf();
    return op::testing::reportedPorts(log.str()).metrics;
  }

  // Reconciles of ReplicatedTables that ended without error since the operator (re)started.
  double finishedReconciles() const {
    const auto port = operatorMetricsPort();
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
  std::unique_ptr<core::ZooKeeperClient> keeper_;
  bool authenticated_ = false;  // keeper_ holds the table's identity
  // Lines of spec.podTemplate (4-space indented) tableManifest gives every table; empty: none.
  std::string table_pod_template_;
  std::unique_ptr<Subprocess> operator_;
  fs::path operator_kubeconfig_;
  std::unique_ptr<core::testing::RetryingWriters>
      writers_;  // startWriters()  // the chart's ServiceAccount
};

}  // namespace rtable::controllers::testing
