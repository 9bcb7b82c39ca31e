// rtable-operator end to end (issue 6): a real kube-apiserver and kube-controller-manager
// (LocalControlPlane), `helm install` of helm/rtable (CRDs, ServiceAccount, RBAC), a real
// ZooKeeper, LocalKubelet running each replica pod's rtable-core as a local process on its own
// 127.0.0.N, and rtable-operator as a process authenticated as the chart's ServiceAccount. A
// ReplicatedTable applied with kubectl becomes three Ready replicas that replicate a row; scaled to
// two, the removed replica leaves ZooKeeper; the operator restarted mid-way resumes; a second table
// with spec.tls replicates over TLS; deleted, its objects and its ZooKeeper subtree are gone.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "operator_stack.h"
#include "rtable/common/testing/tls_certificates.h"

namespace rtable::controllers {
namespace {

using namespace testing;  // the stack's names: kNs, eventually, httpRequest, ...

class OperatorEndToEnd : public OperatorStack {};

class NamespacedOperatorEndToEnd : public OperatorStack {
 protected:
  NamespacedOperatorEndToEnd() { watch_namespace_ = true; }
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
  // The table's nodes are its identity's alone: every node the operator and the replicas made
  // carries its ACL (the migration found nothing open), and a client without it is refused.
  EXPECT_TRUE(eventually([&] { return conditionReason("ZooKeeperSecured") == "DigestAcl"; }, 60s))
      << tableState();
  {
    auto anonymous =
        core::ZooKeeperClient::connect(core::ZooKeeperConfig{zookeeper_->connectString()});
    ASSERT_TRUE(anonymous);
    for (const std::string& path : {root(), root() + "/1/log", root() + "/1/replicas/events-0"}) {
      auto refused = (*anonymous)->children(path);
      ASSERT_FALSE(refused) << path;
      EXPECT_EQ(refused.error().code, core::KeeperCode::kNoAuth) << path;
    }
  }

  // The replicas run as the pod's securityContext says (the test kubelet applies it): uid and gid
  // 10001, fsGroup 10001 on their volumes, a read-only root file system.
  {
    auto found = common::testing::runCommand({"pgrep", "-f", "--", "--replica-name=events-0"}, 10s);
    ASSERT_TRUE(found && found->exit_code == 0) << (found ? found->err : found.error());
    std::ifstream proc_status("/proc/" + found->out.substr(0, found->out.find('\n')) + "/status");
    std::string line;
    std::string uid;
    std::string gid;
    while (std::getline(proc_status, line)) {
      if (line.starts_with("Uid:")) uid = line;
      if (line.starts_with("Gid:")) gid = line;
    }
    EXPECT_EQ(uid, "Uid:\t10001\t10001\t10001\t10001");
    EXPECT_EQ(gid, "Gid:\t10001\t10001\t10001\t10001");
  }

  // Writes need the table's API token (the Secret the operator made): refused without it.
  auto refused = httpRequest(podIp("events-0"), 8123, "POST", "/insert?format=JSONEachRow",
                             R"({"d":"2026-12-03","user":"mallory"})"
                             "\n");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401) << refused->body;
  ASSERT_NE(apiHeaders(), "");
  // A row through events-0, read on all three.
  auto inserted = httpRequest(podIp("events-0"), 8123, "POST", "/insert?format=JSONEachRow",
                              R"({"d":"2026-12-03","user":"ada"})"
                              "\n",
                              30s, apiHeaders());
  ASSERT_TRUE(inserted && inserted->status == 200)
      << (inserted ? inserted->body : inserted.error());
  for (const char* pod : {"events-0", "events-1", "events-2"}) {
    EXPECT_TRUE(eventually([&] { return count(pod) == 1u; }, 60s)) << pod;
  }

  // Scale to 5: the two new replicas fetch what the others have.
  {
    auto done = plane_->kubectlOk({"scale", "replicatedtable/events", "-n", kNs, "--replicas=5"});
    ASSERT_TRUE(done) << done.error();
  }
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
  {
    auto done = plane_->kubectlOk({"scale", "replicatedtable/events", "-n", kNs, "--replicas=2"});
    ASSERT_TRUE(done) << done.error();
  }
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
                         "\n",
                         30s, apiHeaders());
  ASSERT_TRUE(inserted && inserted->status == 200)
      << (inserted ? inserted->body : inserted.error());
  EXPECT_TRUE(eventually([&] { return count("events-1") == 2u; }, 120s));
  EXPECT_TRUE(eventually([&] { return readyReplicas(2); }, 120s)) << tableState();

  // A table with spec.tls (a Secret as cert-manager writes it, for *.secure-headless.<ns>.svc):
  // its replicas answer HTTPS only (the kubelet's probes too), present the certificate, and
  // replicate over TLS (each fetch checks the source's certificate for its DNS name).
  {
    char pattern[] = "/tmp/rtable-e2e-tls-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    const fs::path tls_dir = pattern;
    auto made = common::testing::makeTestCertificates(
        tls_dir, {fmt::format("*.secure-headless.{}.svc", kNs)});
    ASSERT_TRUE(made) << made.error();
    auto file = [&](const char* name) {
      std::ifstream in(tls_dir / name);
      return common::base64Encode(std::string(std::istreambuf_iterator<char>(in), {}));
    };
    ASSERT_TRUE(client_->create(op::resources::secrets(),
                                json{{"apiVersion", "v1"},
                                     {"kind", "Secret"},
                                     {"type", "kubernetes.io/tls"},
                                     {"metadata", {{"name", "secure-tls"}, {"namespace", kNs}}},
                                     {"data",
                                      {{"tls.crt", file("tls.crt")},
                                       {"tls.key", file("tls.key")},
                                       {"ca.crt", file("ca.crt")}}}}));
    std::string manifest = tableManifest("secure", "  tls: {secretName: secure-tls}\n");
    manifest.replace(manifest.find("replicas: 3"), 11, "replicas: 2");
    ASSERT_TRUE(plane_->apply(manifest));
    auto ready = [&] {
      auto object = client_->get(replicatedTables(), {kNs, "secure"});
      return object && object->value(json::json_pointer("/status/readyReplicas"), 0) == 2;
    };
    ASSERT_TRUE(eventually(ready, 240s))
        << client_->get(replicatedTables(), {kNs, "secure"})->dump();
    auto trusted = common::TlsContext::load(common::TlsContext::Side::kClient,
                                            common::TlsFiles::inDirectory(tls_dir));
    ASSERT_TRUE(trusted) << trusted.error();
    auto https = [&](const std::string& pod, const std::string& method, const std::string& target,
                     const std::string& body) {
      return common::testing::httpsRequest(**trusted, podIp(pod), 8123, method, target, body, 30s,
                                           apiHeaders("secure"),
                                           fmt::format("{}.secure-headless.{}.svc", pod, kNs));
    };
    auto secure_insert = https("secure-0", "POST", "/insert?format=JSONEachRow",
                               core::testing::idRow(1) + core::testing::idRow(2));
    ASSERT_TRUE(secure_insert && secure_insert->status == 200)
        << (secure_insert ? secure_insert->body : secure_insert.error());
    EXPECT_TRUE(eventually(
        [&] {
          auto counted = https("secure-1", "GET", "/count", "");
          return counted && counted->status == 200 && json::parse(counted->body)["rows"] == 2;
        },
        60s))
        << "secure-1 did not fetch over TLS; its log is under " << kubelet_->workDir();
    auto plain = httpRequest(podIp("secure-1"), 8123, "GET", "/count", "", 5s);
    EXPECT_FALSE(plain && plain->status == 200) << "plain HTTP answered";
    {
      auto done =
          plane_->kubectlOk({"delete", "replicatedtable/secure", "-n", kNs, "--wait=false"});
      ASSERT_TRUE(done) << done.error();
    }
    EXPECT_TRUE(eventually(
        [&] { return !client_->get(replicatedTables(), {kNs, "secure"}).has_value(); }, 180s));
    ASSERT_TRUE(client_->remove(op::resources::secrets(), {kNs, "secure-tls"}));
    fs::remove_all(tls_dir);
  }

  // Deleted: the pods, then the ZooKeeper subtree, then the table itself; the garbage collector
  // takes every object the table owned (the claims go with the StatefulSet: whenDeleted Delete).
  const auto owned = leftovers();
  for (const char* object :
       {"StatefulSet/events", "Pod/events-0", "PodDisruptionBudget/events", "Service/events",
        "Service/events-headless", "ConfigMap/events-config", "Secret/events-interserver",
        "Secret/events-zookeeper", "PersistentVolumeClaim/data-events-0"}) {
    EXPECT_NE(std::find(owned.begin(), owned.end(), object), owned.end())
        << object << " not among " << ::testing::PrintToString(owned);
  }
  {
    auto done = plane_->kubectlOk({"delete", "replicatedtable/events", "-n", kNs, "--wait=false"});
    ASSERT_TRUE(done) << done.error();
  }
  EXPECT_TRUE(eventually([&] { return !table().has_value(); }, 180s)) << tableState();
  EXPECT_FALSE(zkExists(root()));
  EXPECT_TRUE(eventually([&] { return leftovers().empty(); }, 120s))
      << ::testing::PrintToString(leftovers());
}

// The chart with watchNamespace: the operator under exactly its Role (no rights outside the
// namespace, none cluster-wide for the table's objects) still makes a table's replicas, which
// replicate, and removes its ZooKeeper tree on deletion; a table in another namespace is not its
// business and stays untouched.
TEST_F(NamespacedOperatorEndToEnd, ATableReplicatesAndIsDeletedUnderTheChartsNamespacedRole) {
  ASSERT_TRUE(plane_->apply(
      json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "elsewhere"}}}}
          .dump()));
  std::string elsewhere = tableManifest("outside", "");
  elsewhere.replace(elsewhere.find(std::string("namespace: ") + kNs),
                    std::string("namespace: ").size() + std::string(kNs).size(),
                    "namespace: elsewhere");
  ASSERT_TRUE(plane_->apply(elsewhere));
  applyTable();
  auto inserted = httpRequest(podIp("events-0"), 8123, "POST", "/insert?format=JSONEachRow",
                              core::testing::idRow(1), 30s, apiHeaders());
  ASSERT_TRUE(inserted && inserted->status == 200)
      << (inserted ? inserted->body : inserted.error());
  for (const char* pod : kPods) {
    EXPECT_TRUE(eventually([&] { return count(pod) == 1u; }, 60s)) << pod;
  }
  // Never reconciled: no status, no StatefulSet, no finalizer.
  auto outside = client_->get(replicatedTables(), {"elsewhere", "outside"});
  ASSERT_TRUE(outside);
  EXPECT_FALSE(outside->contains("status")) << outside->dump();
  EXPECT_FALSE(outside->value(json::json_pointer("/metadata/finalizers"), json()).is_array());
  EXPECT_FALSE(client_->get(op::resources::statefulSets(), {"elsewhere", "outside"}));

  {
    auto done = plane_->kubectlOk({"delete", "replicatedtable/events", "-n", kNs, "--wait=false"});
    ASSERT_TRUE(done) << done.error();
  }
  EXPECT_TRUE(eventually([&] { return !table().has_value(); }, 180s)) << tableState();
  EXPECT_FALSE(zkExists(root()));
}

}  // namespace
}  // namespace rtable::controllers
