// The test control plane itself (docs/control-plane.md): the server is the version we built,
// the controller manager really runs controllers, objects survive an apiserver restart, etcd
// compaction really expires old resourceVersions, and RBAC really restricts a second identity.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "rtable/common/testing/wait.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::op::testing {
namespace {

using common::testing::waitFor;
using nlohmann::json;

// Objects appear through controllers and watches: allow for a slow, shared machine.
constexpr auto kEventuallyTimeout = std::chrono::seconds(90);

class ControlPlaneTest : public ::testing::Test {
 protected:
  // One control plane for the binary: starting kube-apiserver takes seconds.
  static void SetUpTestSuite() {
    LocalControlPlaneOptions options;
    options.controller_manager = true;
    auto started = LocalControlPlane::start(options);
    ASSERT_TRUE(started) << started.error();
    plane_ = std::make_unique<LocalControlPlane>(std::move(*started));
  }

  static void TearDownTestSuite() {
    if (plane_ && ::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
      plane_->keepWorkDir();
      fmt::print(stderr, "control plane logs kept in {}\n", plane_->workDir().string());
    }
    plane_.reset();
  }

  void SetUp() override {
    if (!plane_) GTEST_SKIP() << "the control plane did not start";
  }

  // Runs kubectl as admin and expects success; returns stdout.
  static std::string kubectlOk(const std::vector<std::string>& args) {
    auto result = plane_->kubectl(args);
    EXPECT_TRUE(result) << result.error();
    if (!result) return {};
    EXPECT_EQ(result->exit_code, 0)
        << fmt::format("kubectl {}: {}{}", fmt::join(args, " "), result->out, result->err);
    return result->out;
  }

  static json kubectlJson(const std::vector<std::string>& args) {
    auto with_output = args;
    with_output.push_back("-o=json");
    const auto out = kubectlOk(with_output);
    return json::parse(out, nullptr, /*allow_exceptions=*/false);
  }

  static void applyOk(const std::string& manifest) {
    auto applied = plane_->apply(manifest);
    ASSERT_TRUE(applied) << applied.error();
  }

  static inline std::unique_ptr<LocalControlPlane> plane_;
};

std::string statefulSetManifest(const std::string& ns, int replicas) {
  // Parallel: with OrderedReady the controller waits for pod 0 to be Ready, and without a
  // kubelet no pod ever is.
  return fmt::format(R"(apiVersion: v1
kind: Namespace
metadata:
  name: {0}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: {0}
spec:
  serviceName: web
  replicas: {1}
  podManagementPolicy: Parallel
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: main
        image: example.invalid/web:1
)",
                     ns, replicas);
}

// Names of the pods in `ns` that a StatefulSet owns.
std::set<std::string> statefulSetPods(const json& pods) {
  std::set<std::string> names;
  if (!pods.contains("items")) return names;
  for (const auto& pod : pods["items"]) {
    for (const auto& owner : pod["metadata"].value("ownerReferences", json::array())) {
      if (owner.value("kind", "") == "StatefulSet" && owner.value("controller", false)) {
        names.insert(pod["metadata"]["name"].get<std::string>());
      }
    }
  }
  return names;
}

TEST_F(ControlPlaneTest, ServerIsTheVersionBuilt) {
  const json version = kubectlJson({"version"});
  ASSERT_TRUE(version.contains("serverVersion")) << version.dump();
  EXPECT_EQ(version["serverVersion"]["gitVersion"], controlPlaneVersion());
  EXPECT_EQ(version["clientVersion"]["gitVersion"], controlPlaneVersion());
  EXPECT_EQ(plane_->serverUrl().rfind("https://127.0.0.1:", 0), 0u) << plane_->serverUrl();
}

TEST_F(ControlPlaneTest, ControllerManagerTurnsAStatefulSetIntoPods) {
  applyOk(statefulSetManifest("sts-test", 2));
  std::set<std::string> pods;
  EXPECT_TRUE(waitFor(
      [&] {
        pods = statefulSetPods(kubectlJson({"get", "pods", "--namespace=sts-test"}));
        return pods.size() == 2;
      },
      kEventuallyTimeout));
  EXPECT_EQ(pods, (std::set<std::string>{"web-0", "web-1"}));
}

TEST_F(ControlPlaneTest, ApiServerRestartKeepsObjectsAndControllersReconnect) {
  applyOk(statefulSetManifest("restart-test", 1));
  applyOk(R"(apiVersion: v1
kind: ConfigMap
metadata:
  name: survivor
  namespace: restart-test
data:
  key: before-restart
)");
  const json before = kubectlJson({"get", "configmap", "survivor", "--namespace=restart-test"});
  ASSERT_TRUE(waitFor(
      [&] {
        return statefulSetPods(kubectlJson({"get", "pods", "--namespace=restart-test"})).size() ==
               1;
      },
      kEventuallyTimeout));

  ASSERT_TRUE(plane_->stopApiServer());
  EXPECT_FALSE(plane_->apiServerRunning());
  auto refused = plane_->kubectl({"get", "--raw=/readyz"}, std::chrono::seconds(20));
  ASSERT_TRUE(refused) << refused.error();
  EXPECT_NE(refused->exit_code, 0) << "the apiserver still answers: " << refused->out;

  auto restarted = plane_->startApiServer();
  ASSERT_TRUE(restarted) << restarted.error();
  EXPECT_TRUE(plane_->apiServerRunning());
  const json after = kubectlJson({"get", "configmap", "survivor", "--namespace=restart-test"});
  EXPECT_EQ(after["metadata"]["uid"], before["metadata"]["uid"]);
  EXPECT_EQ(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"]);
  EXPECT_EQ(after["data"]["key"], "before-restart");

  // The controller manager's watches resume on the restarted apiserver.
  kubectlOk({"scale", "statefulset/web", "--replicas=2", "--namespace=restart-test"});
  EXPECT_TRUE(waitFor(
      [&] {
        return statefulSetPods(kubectlJson({"get", "pods", "--namespace=restart-test"})).size() ==
               2;
      },
      kEventuallyTimeout));
}

// An exact list at an old resourceVersion is served from the watch cache's snapshots while they
// last, else by etcd. Compaction drops both: the apiserver learns it through compact_rev_key
// and then delegates to etcd, which no longer has the revision. (A watch from an old
// resourceVersion is no test of compaction: the watch cache answers it from its own window.)
TEST_F(ControlPlaneTest, CompactionExpiresOldResourceVersions) {
  applyOk(R"(apiVersion: v1
kind: Namespace
metadata:
  name: compaction-test
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: versioned
  namespace: compaction-test
data:
  key: first
)");
  const json first = kubectlJson({"get", "configmap", "versioned", "--namespace=compaction-test"});
  const std::string old_rv = first["metadata"]["resourceVersion"];
  kubectlOk({"patch", "configmap", "versioned", "--namespace=compaction-test", "--type=merge",
             R"(--patch={"data":{"key":"second"}})"});
  const std::string old_list = fmt::format(
      "--raw=/api/v1/namespaces/compaction-test/configmaps?resourceVersion={}"
      "&resourceVersionMatch=Exact",
      old_rv);

  // Before compaction the old state is still there to read.
  // (The controller manager also puts kube-root-ca.crt into every namespace.)
  const json listed = json::parse(kubectlOk({"get", old_list}), nullptr, false);
  ASSERT_TRUE(listed.contains("items")) << listed.dump();
  std::optional<json> old_state;
  for (const auto& item : listed["items"]) {
    if (item["metadata"]["name"] == "versioned") old_state = item;
  }
  ASSERT_TRUE(old_state) << listed.dump();
  EXPECT_EQ((*old_state)["data"]["key"], "first");

  auto compacted = plane_->compactEtcd();
  ASSERT_TRUE(compacted) << compacted.error();
  EXPECT_GT(*compacted, std::stoll(old_rv));

  // -v=6 logs each request's HTTP status.
  std::string last;
  const bool gone = waitFor(
      [&] {
        auto result = plane_->kubectl({"get", old_list, "-v=6"});
        if (!result) return false;
        last = result->out + result->err;
        return result->exit_code != 0 && last.find("410 Gone") != std::string::npos &&
               last.find("Expired") != std::string::npos;
      },
      kEventuallyTimeout);
  EXPECT_TRUE(gone) << last;

  // The current state is unaffected.
  const json current =
      kubectlJson({"get", "configmap", "versioned", "--namespace=compaction-test"});
  EXPECT_EQ(current["data"]["key"], "second");
}

TEST_F(ControlPlaneTest, RestrictedIdentityHasOnlyItsClusterRole) {
  applyOk(R"(apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: rtable-test-configmap-reader
rules:
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
)");
  auto kubeconfig =
      plane_->serviceAccountKubeconfig("rbac-test", "reader", "rtable-test-configmap-reader");
  ASSERT_TRUE(kubeconfig) << kubeconfig.error();
  kubectlOk({"create", "configmap", "visible", "--namespace=rbac-test", "--from-literal=a=b"});

  auto as_reader = [&](const std::vector<std::string>& args) {
    auto result = plane_->kubectlAs(*kubeconfig, args);
    EXPECT_TRUE(result) << result.error();
    return result ? *result : CommandResult{};
  };

  const auto whoami = as_reader({"auth", "whoami", "-o=jsonpath={.status.userInfo.username}"});
  EXPECT_EQ(whoami.exit_code, 0) << whoami.err;
  EXPECT_EQ(whoami.out, "system:serviceaccount:rbac-test:reader");

  const auto allowed =
      as_reader({"get", "configmap", "visible", "--namespace=rbac-test", "-o=jsonpath={.data.a}"});
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_EQ(allowed.out, "b");

  const auto secrets = as_reader({"get", "secrets", "--namespace=rbac-test"});
  EXPECT_NE(secrets.exit_code, 0);
  EXPECT_NE(secrets.err.find("(Forbidden)"), std::string::npos) << secrets.err;
  EXPECT_NE(secrets.err.find("cannot list resource \"secrets\""), std::string::npos) << secrets.err;

  const auto create = as_reader(
      {"create", "configmap", "not-allowed", "--namespace=rbac-test", "--from-literal=a=b"});
  EXPECT_NE(create.exit_code, 0);
  EXPECT_NE(create.err.find("cannot create resource \"configmaps\""), std::string::npos)
      << create.err;
  // And the refusal was RBAC's, not a failed write: the object does not exist.
  auto missing = plane_->kubectl({"get", "configmap", "not-allowed", "--namespace=rbac-test"});
  ASSERT_TRUE(missing) << missing.error();
  EXPECT_NE(missing->exit_code, 0);
  EXPECT_NE(missing->err.find("NotFound"), std::string::npos) << missing->err;
}

}  // namespace
}  // namespace rtable::op::testing
