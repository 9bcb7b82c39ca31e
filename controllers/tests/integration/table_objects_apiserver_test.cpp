// The objects a ReplicatedTable owns (renderTableObjects) against a real kube-apiserver: the
// server accepts every one of them by server-side apply, a second apply of the same objects
// changes nothing (the reconciler may run any number of times), and a hand edit of a field the
// operator owns is reverted by the next apply.
#include <gtest/gtest.h>

#include "rtable/controllers/replicated_table_objects.h"
#include "rtable/operator/http_kube_client.h"
#include "rtable/operator/kube_config.h"
#include "rtable/operator/testing/local_control_plane.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;

class TableObjectsApiServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto plane = op::testing::LocalControlPlane::start();
    ASSERT_TRUE(plane) << plane.error();
    plane_ = std::make_unique<op::testing::LocalControlPlane>(std::move(*plane));
    auto config = op::KubeConfig::load(plane_->kubeconfigPath());
    ASSERT_TRUE(config) << config.error().toString();
    auto cluster = config->clusterConfig();
    ASSERT_TRUE(cluster) << cluster.error().toString();
    auto client = op::HttpKubeClient::create(*cluster);
    ASSERT_TRUE(client) << client.error().toString();
    client_ = std::move(*client);
    auto ns = client_->create(
        op::resources::namespaces(),
        json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "analytics"}}}});
    ASSERT_TRUE(ns) << ns.error().toString();
  }
  static void TearDownTestSuite() {
    client_.reset();
    plane_.reset();
  }

  static TableObjects render(int replicas) {
    auto spec = ReplicatedTableSpec::parse(json::parse(R"json({
      "table": "events", "replicas": 3,
      "columns": [{"name": "d", "type": "Date"}, {"name": "user", "type": "String"}],
      "partitionBy": "toYYYYMM(d)", "orderBy": ["user", "d"],
      "zookeeper": {"connect": "zk-0.zk:2181"},
      "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
      "podTemplate": {"containers": [{"name": "log-shipper", "image": "busybox:1.36"}],
                      "tolerations": [{"key": "dedicated", "operator": "Exists"}]},
      "networkPolicy": {"enabled": true,
                        "apiFrom": [{"namespaceSelector": {"matchLabels": {"team": "ingest"}},
                                     "podSelector": {"matchLabels": {"role": "writer"}}},
                                    {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.9.0/24"]}}],
                        "metricsFrom": [{"namespaceSelector": {"matchLabels":
                            {"kubernetes.io/metadata.name": "monitoring"}}}]}})json"));
    EXPECT_TRUE(spec) << spec.error().toString();
    spec->replicas = replicas;
    TableObjectsContext context;
    context.name = "events";
    context.ns = "analytics";
    context.owner_uid = "6a0f4d2c-0000-4000-8000-000000000001";
    context.interserver_secret = "s3cr3t";
    return renderTableObjects(*spec, context);
  }

  struct Applied {
    const op::ResourceType type;
    const json* object;
  };
  static std::vector<Applied> all(const TableObjects& o) {
    return {{op::resources::services(), &o.headless_service},
            {op::resources::services(), &o.client_service},
            {op::resources::configMaps(), &o.config_map},
            {op::resources::secrets(), &o.secret},
            {op::resources::statefulSets(), &o.stateful_set},
            {op::resources::podDisruptionBudgets(), &o.pod_disruption_budget},
            {op::resources::networkPolicies(), &o.network_policy}};
  }

  // Applies every object as the reconciler does; returns name -> resourceVersion.
  static std::map<std::string, std::string> applyAll(const TableObjects& objects) {
    std::map<std::string, std::string> versions;
    for (const auto& [type, object] : all(objects)) {
      op::PatchOptions options;
      options.field_manager = "rtable-operator";
      options.force = true;
      const op::ObjectKey key{"analytics", (*object)["metadata"]["name"]};
      auto applied = client_->patch(type, key, op::PatchType::kApply, *object, options);
      EXPECT_TRUE(applied) << (*object)["kind"] << " " << key.name << ": "
                           << applied.error().toString();
      if (applied)
        versions[(*object)["kind"].get<std::string>() + "/" + key.name] =
            (*applied)["metadata"]["resourceVersion"];
    }
    return versions;
  }

  static inline std::unique_ptr<op::testing::LocalControlPlane> plane_;
  static inline std::unique_ptr<op::KubeClient> client_;
};

TEST_F(TableObjectsApiServer, TheServerAcceptsThemAndASecondApplyChangesNothing) {
  const TableObjects objects = render(3);
  const auto first = applyAll(objects);
  ASSERT_EQ(first.size(), 7u);
  const auto second = applyAll(objects);
  EXPECT_EQ(first, second) << "a second apply of the same objects changed something";

  auto sts = client_->get(op::resources::statefulSets(), {"analytics", "events"});
  ASSERT_TRUE(sts) << sts.error().toString();
  EXPECT_EQ((*sts)["spec"]["replicas"], 3);
  EXPECT_EQ((*sts)["spec"]["template"]["spec"]["containers"].size(), 2u);
  EXPECT_EQ((*sts)["metadata"]["ownerReferences"][0]["kind"], "ReplicatedTable");
  auto secret = client_->get(op::resources::secrets(), {"analytics", "events-interserver"});
  ASSERT_TRUE(secret);
  EXPECT_EQ((*secret)["data"]["secret"], "czNjcjN0");  // base64 of s3cr3t
}

// The NetworkPolicy as the server stores it: the replicas admit each other and the peers given, on
// their ports only. And the two Secrets the reconciler makes beside the applied objects.
TEST_F(TableObjectsApiServer, TheNetworkPolicyAndTheTablesSecretsAreAccepted) {
  (void)applyAll(render(3));
  auto policy = client_->get(op::resources::networkPolicies(), {"analytics", "events"});
  ASSERT_TRUE(policy) << policy.error().toString();
  const json& spec = (*policy)["spec"];
  EXPECT_EQ(spec["podSelector"]["matchLabels"], tableSelector("events"));
  EXPECT_EQ(spec["policyTypes"], json::array({"Ingress"}));
  ASSERT_EQ(spec["ingress"].size(), 3u);
  EXPECT_EQ(spec["ingress"][0]["from"][0]["podSelector"]["matchLabels"], tableSelector("events"));
  EXPECT_EQ(spec["ingress"][0]["ports"][0]["port"], 8123);
  EXPECT_EQ(spec["ingress"][1]["from"][1]["ipBlock"]["cidr"], "10.20.0.0/16");
  EXPECT_EQ(spec["ingress"][1]["ports"][0]["port"], 8123);
  EXPECT_EQ(spec["ingress"][2]["ports"][0]["port"], 9363);
  EXPECT_EQ(spec["ingress"][2]["from"][0]["namespaceSelector"]["matchLabels"]
                ["kubernetes.io/metadata.name"],
            "monitoring");

  TableObjectsContext context;
  context.name = "events";
  context.ns = "analytics";
  context.owner_uid = "6a0f4d2c-0000-4000-8000-000000000001";
  auto identity = client_->create(op::resources::secrets(),
                                  renderZooKeeperSecret(context, "analytics.events", "pw", false));
  ASSERT_TRUE(identity) << identity.error().toString();
  EXPECT_EQ((*identity)["type"], "kubernetes.io/basic-auth");
  auto tokens = client_->create(op::resources::secrets(), renderApiTokensSecret(context, "t0k3n"));
  ASSERT_TRUE(tokens) << tokens.error().toString();
  EXPECT_EQ((*tokens)["data"]["tokens"], "dDBrM24K");  // base64 of "t0k3n\n"
}

TEST_F(TableObjectsApiServer, AHandEditOfAnOwnedFieldIsRevertedAndAScaleIsApplied) {
  (void)applyAll(render(3));
  // Someone scales the StatefulSet by hand (another field manager).
  op::PatchOptions by_hand;
  by_hand.field_manager = "kubectl-edit";
  auto edited = client_->patch(op::resources::statefulSets(), {"analytics", "events"},
                               op::PatchType::kMerge, json{{"spec", {{"replicas", 7}}}}, by_hand);
  ASSERT_TRUE(edited) << edited.error().toString();
  EXPECT_EQ((*edited)["spec"]["replicas"], 7);
  (void)applyAll(render(3));
  EXPECT_EQ(
      (*client_->get(op::resources::statefulSets(), {"analytics", "events"}))["spec"]["replicas"],
      3);
  // A scale in the spec is an apply like any other.
  (void)applyAll(render(5));
  EXPECT_EQ(
      (*client_->get(op::resources::statefulSets(), {"analytics", "events"}))["spec"]["replicas"],
      5);
}

}  // namespace
}  // namespace rtable::controllers
