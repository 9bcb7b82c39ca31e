// The chart's RBAC on a real kube-apiserver (issue 23): `helm install` of helm/rtable, then the
// operator's own identity (its ServiceAccount's token) asks the apiserver. Cluster-wide by
// default; with watchNamespace (here by `helm upgrade`, as a user would narrow it) the same
// rules as a Role in that namespace, and the apiserver refuses the operator everything outside,
// while rtable-operator, run under that identity, still manages the tables there.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cctype>

#include "rtable/common/testing/subprocess.h"
#include "rtable/common/testing/wait.h"
#include "rtable/controllers/replicated_table_reconciler.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/resource.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::controllers {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using op::KubeErrorKind;

class ChartRbac : public ::testing::Test {
 protected:
  void SetUp() override {
    auto plane = op::testing::LocalControlPlane::start({});
    ASSERT_TRUE(plane) << plane.error();
    plane_ = std::make_unique<op::testing::LocalControlPlane>(std::move(*plane));
    for (const char* ns : {"analytics", "other"}) {
      ASSERT_TRUE(plane_->apply(
          json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}.dump()));
    }
  }

  // helm install (or upgrade) of the chart in rtable-system, with `values`.
  void helm(const std::string& verb, const std::string& values) {
    std::vector<std::string> args = {(plane_->binDir() / "helm").string(),
                                     verb,
                                     "rtable",
                                     RTABLE_CHART_DIR,
                                     "--namespace",
                                     "rtable-system",
                                     "--create-namespace",
                                     "--kubeconfig",
                                     plane_->kubeconfigPath().string(),
                                     "--wait=false"};
    if (!values.empty()) {
      args.push_back("--set");
      args.push_back(values);
    }
    auto done = common::testing::runCommand(args, 120s);
    ASSERT_TRUE(done && done->exit_code == 0) << (done ? done->out + done->err : done.error());
  }

  // A client that authenticates as the chart's ServiceAccount, as the operator's pod does.
  std::unique_ptr<op::KubeClient> operatorIdentity() {
    auto kubeconfig = plane_->serviceAccountKubeconfig("rtable-system", "rtable", "");
    EXPECT_TRUE(kubeconfig) << kubeconfig.error();
    auto config = op::KubeConfig::load(*kubeconfig);
    EXPECT_TRUE(config);
    auto cluster = config->clusterConfig();
    EXPECT_TRUE(cluster);
    auto client = op::HttpKubeClient::create(*cluster);
    EXPECT_TRUE(client);
    return client ? std::move(*client) : nullptr;
  }

  // The apiserver's answer to the operator reading `type` in `ns`: allowed (the list came back)
  // or the kind of error.
  static std::string answer(op::KubeClient& client, const op::ResourceType& type,
                            const std::string& ns) {
    auto listed = client.list(type, ns);
    if (listed) return "allowed";
    return listed.error().kind == KubeErrorKind::kForbidden ? "forbidden"
                                                            : listed.error().toString();
  }

  std::unique_ptr<op::testing::LocalControlPlane> plane_;
};

TEST_F(ChartRbac, WithWatchNamespaceTheOperatorIsRefusedEverythingOutsideIt) {
  helm("install", "");
  {
    auto done = plane_->kubectlOk(
        {"wait", "--for=condition=Established", "crd/replicatedtables.rtable.io", "--timeout=60s"});
    ASSERT_TRUE(done) << done.error();
  }
  auto client = operatorIdentity();
  ASSERT_TRUE(client);
  // Cluster-wide by default: the operator may read Secrets in any namespace.
  ASSERT_TRUE(common::testing::waitFor(
      [&] { return answer(*client, op::resources::pods(), "other") == "allowed"; }, 30s));
  // (A new CRD's storage answers 429 for a moment after it is Established.)
  EXPECT_TRUE(common::testing::waitFor(
      [&] { return answer(*client, replicatedTables(), "other") == "allowed"; }, 30s))
      << answer(*client, replicatedTables(), "other");
  auto secret = client->get(op::resources::secrets(), {"other", "anything"});
  ASSERT_FALSE(secret);
  EXPECT_EQ(secret.error().kind, KubeErrorKind::kNotFound);  // asked, and allowed to

  helm("upgrade", "watchNamespace=analytics");
  // RBAC changes take effect as the apiserver's informers see them: within a second or two.
  ASSERT_TRUE(common::testing::waitFor(
      [&] { return answer(*client, op::resources::pods(), "other") == "forbidden"; }, 30s));
  for (const auto& type :
       {op::resources::pods(), op::resources::statefulSets(), replicatedTables()}) {
    SCOPED_TRACE(type.resource);
    EXPECT_EQ(answer(*client, type, "other"), "forbidden");
    EXPECT_EQ(answer(*client, type, ""), "forbidden");  // every namespace at once
    EXPECT_EQ(answer(*client, type, "analytics"), "allowed");
  }
  secret = client->get(op::resources::secrets(), {"other", "anything"});
  ASSERT_FALSE(secret);
  EXPECT_EQ(secret.error().kind, KubeErrorKind::kForbidden) << secret.error().toString();
  secret = client->get(op::resources::secrets(), {"analytics", "anything"});
  ASSERT_FALSE(secret);
  EXPECT_EQ(secret.error().kind, KubeErrorKind::kNotFound) << secret.error().toString();
  // Its leader election Lease stays in the release namespace.
  EXPECT_EQ(answer(*client, op::resources::leases(), "rtable-system"), "forbidden")
      << "the Lease Role grants get, create and update, not list";
  auto lease = client->get(op::resources::leases(), {"rtable-system", "rtable-operator-lock"});
  ASSERT_FALSE(lease);
  EXPECT_EQ(lease.error().kind, KubeErrorKind::kNotFound) << lease.error().toString();

  // rtable-operator itself under exactly that identity, WATCH_NAMESPACE=analytics as the chart's
  // Deployment sets it: a table there gets its objects without one 403; a table elsewhere is not
  // its business. (No ZooKeeper listens at the tables' connect string: the operator says so in
  // their status and applies their objects all the same.)
  auto kubeconfig = plane_->serviceAccountKubeconfig("rtable-system", "rtable", "");
  ASSERT_TRUE(kubeconfig);
  const auto log = plane_->workDir() / "rtable-operator.log";
  auto running = common::testing::Subprocess::start(
      {"env", "WATCH_NAMESPACE=analytics", "RTABLE_CORE_IMAGE=rtable/rtable:e2e",
       RTABLE_OPERATOR_BINARY, "--kubeconfig", kubeconfig->string(),
       "--leader-election-namespace=rtable-system", "--health-probe-bind-address=127.0.0.1:0",
       "--metrics-bind-address=127.0.0.1:0"},
      log);
  ASSERT_TRUE(running) << running.error();
  for (const char* ns : {"analytics", "other"}) {
    ASSERT_TRUE(plane_->apply(fmt::format(R"(apiVersion: rtable.io/v1alpha1
kind: ReplicatedTable
metadata: {{name: events, namespace: {}}}
spec:
  table: events
  columns: [{{name: id, type: UInt64}}]
  replicas: 1
  zookeeper: {{connect: "127.0.0.1:9"}}
)",
                                          ns)));
  }
  auto admin = op::KubeConfig::load(plane_->kubeconfigPath());
  ASSERT_TRUE(admin);
  auto admin_client = op::HttpKubeClient::create(*admin->clusterConfig());
  ASSERT_TRUE(admin_client);
  auto exists = [&](const op::ResourceType& type, const std::string& ns, const std::string& name) {
    return static_cast<bool>((*admin_client)->get(type, {ns, name}));
  };
  EXPECT_TRUE(common::testing::waitFor(
      [&] {
        return exists(op::resources::statefulSets(), "analytics", "events") &&
               exists(op::resources::secrets(), "analytics", "events-interserver") &&
               exists(op::resources::configMaps(), "analytics", "events-config");
      },
      60s))
      << common::testing::tailOfFile(log);
  EXPECT_FALSE(exists(op::resources::statefulSets(), "other", "events"));
  running->stop(10s);
  std::string text = common::testing::tailOfFile(log, 1 << 20);
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_EQ(text.find("forbidden"), std::string::npos) << text;
  EXPECT_EQ(text.find("(403)"), std::string::npos) << text;  // KubeError::toString
}

}  // namespace
}  // namespace rtable::controllers
