// The objects a ReplicatedTable owns, rendered from every example table and from a hand-made spec.
#include "rtable/controllers/replicated_table_objects.h"

#include <gtest/gtest.h>

#include "../crd_examples.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;

TableObjectsContext context(const std::string& name) {
  TableObjectsContext context;
  context.name = name;
  context.ns = "analytics";
  context.owner_uid = "0b7c2f4e-1111-2222-3333-444455556666";
  context.interserver_secret = "s3cr3t";
  return context;
}

ReplicatedTableSpec spec(const std::string& extra = "") {
  auto parsed = ReplicatedTableSpec::parse(json::parse(R"json({
    "table": "events",
    "columns": [{"name": "d", "type": "Date"}, {"name": "user", "type": "String"}],
    "partitionBy": "toYYYYMM(d)",
    "orderBy": ["user", "d"],
    "zookeeper": {"connect": "zk-0.zk:2181"})json" + extra +
                                                       "}"));
  EXPECT_TRUE(parsed) << parsed.error().toString();
  return *parsed;
}

const json& container(const json& stateful_set, const std::string& name) {
  for (const auto& c : stateful_set["spec"]["template"]["spec"]["containers"]) {
    if (c["name"] == name) return c;
  }
  static const json none;
  ADD_FAILURE() << "no container " << name;
  return none;
}

TEST(TableObjects, EveryObjectIsLabelledAndOwnedByTheTable) {
  const TableObjects objects = renderTableObjects(spec(), context("events"));
  for (const json* object :
       {&objects.headless_service, &objects.client_service, &objects.config_map, &objects.secret,
        &objects.stateful_set, &objects.pod_disruption_budget}) {
    SCOPED_TRACE((*object)["kind"].get<std::string>());
    const json& meta = (*object)["metadata"];
    EXPECT_EQ(meta["namespace"], "analytics");
    EXPECT_EQ(meta["labels"]["app.kubernetes.io/instance"], "events");
    EXPECT_EQ(meta["labels"]["app.kubernetes.io/managed-by"], "rtable-operator");
    ASSERT_EQ(meta["ownerReferences"].size(), 1u);
    const json& owner = meta["ownerReferences"][0];
    EXPECT_EQ(owner["kind"], "ReplicatedTable");
    EXPECT_EQ(owner["apiVersion"], "rtable.io/v1alpha1");
    EXPECT_EQ(owner["uid"], "0b7c2f4e-1111-2222-3333-444455556666");
    EXPECT_EQ(owner["controller"], true);
  }
  EXPECT_EQ(objects.headless_service["metadata"]["name"], "events-headless");
  EXPECT_EQ(objects.headless_service["spec"]["clusterIP"], "None");
  EXPECT_EQ(objects.client_service["metadata"]["name"], "events");
  EXPECT_EQ(objects.secret["data"]["secret"], "czNjcjN0");  // base64 of s3cr3t
  for (const auto& [plain, encoded] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"a", "YQ=="}, {"ab", "YWI="}, {"abc", "YWJj"}, {"abcd", "YWJjZA=="}}) {
    TableObjectsContext c = context("events");
    c.interserver_secret = plain;
    EXPECT_EQ(renderTableObjects(spec(), c).secret["data"]["secret"], encoded) << plain;
  }
}

TEST(TableObjects, TheStatefulSetRunsRtableCoreWithItsConfigSecretAndProbes) {
  const TableObjects objects =
      renderTableObjects(spec(R"(, "replicas": 5, "storage": {"size": "50Gi",
      "storageClassName": "fast"}, "resources": {"requests": {"cpu": "500m"}})"),
                         context("events"));
  const json& sts = objects.stateful_set;
  EXPECT_EQ(sts["spec"]["replicas"], 5);
  EXPECT_EQ(sts["spec"]["serviceName"], "events-headless");
  // The selector selects the pods, and the Services and the PDB select the same pods.
  const json& pod_labels = sts["spec"]["template"]["metadata"]["labels"];
  for (const auto& [key, value] : sts["spec"]["selector"]["matchLabels"].items())
    EXPECT_EQ(pod_labels[key], value);
  EXPECT_EQ(objects.client_service["spec"]["selector"], sts["spec"]["selector"]["matchLabels"]);
  EXPECT_EQ(objects.pod_disruption_budget["spec"]["selector"], sts["spec"]["selector"]);

  const json& core = container(sts, "rtable-core");
  EXPECT_EQ(core["args"],
            json::array({"--config=/etc/rtable/config/core.yaml", "--replica-name=$(POD_NAME)",
                         "--replica-host=$(POD_NAME).events-headless.$(POD_NAMESPACE).svc",
                         "--listen=$(POD_IP)"}));
  EXPECT_EQ(core["readinessProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(core["livenessProbe"]["httpGet"]["path"], "/healthz");
  EXPECT_EQ(core["resources"]["requests"]["cpu"], "500m");
  EXPECT_EQ(sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
            "50Gi");
  EXPECT_EQ(sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"], "fast");
  EXPECT_EQ(sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"], "9363");

  // The ConfigMap's core.yaml names the pod's paths (core_config_test reads such files back
  // through rtable-core's parser).
  const std::string config = objects.config_map["data"]["core.yaml"];
  EXPECT_NE(config.find("dataDir: /var/lib/rtable"), std::string::npos) << config;
  EXPECT_NE(config.find("secretFile: /etc/rtable/interserver/secret"), std::string::npos) << config;
  const json& mounts = core["volumeMounts"];
  EXPECT_EQ(mounts[0]["mountPath"], "/var/lib/rtable");
  EXPECT_EQ(mounts[1]["mountPath"], "/etc/rtable/config");
  EXPECT_EQ(mounts[2]["mountPath"], "/etc/rtable/interserver");
}

TEST(TableObjects, RenderingIsDeterministicAndAConfigChangeRollsThePods) {
  const TableObjects a = renderTableObjects(spec(), context("events"));
  const TableObjects b = renderTableObjects(spec(), context("events"));
  EXPECT_EQ(a.stateful_set, b.stateful_set);
  EXPECT_EQ(a.config_map, b.config_map);
  const TableObjects c =
      renderTableObjects(spec(R"(, "deduplication": {"window": 500})"), context("events"));
  const auto hash = [](const TableObjects& o) {
    return o.stateful_set["spec"]["template"]["metadata"]["annotations"][kConfigHashAnnotation];
  };
  EXPECT_EQ(hash(a), hash(b));
  EXPECT_NE(hash(a), hash(c));
}

TEST(TableObjects, PodTemplateAdditionsAreMergedIn) {
  const TableObjects objects = renderTableObjects(spec(R"(, "podTemplate": {
      "metadata": {"labels": {"team": "ads"}, "annotations": {"owner": "ads@example.com"}},
      "containers": [{"name": "log-shipper", "image": "busybox:1.36"}],
      "env": [{"name": "TZ", "value": "UTC"}],
      "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
      "nodeSelector": {"disk": "ssd"}, "priorityClassName": "high"})"),
                                                  context("events"));
  const json& pod = objects.stateful_set["spec"]["template"];
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "ads");
  EXPECT_EQ(pod["metadata"]["labels"]["app.kubernetes.io/instance"], "events");
  EXPECT_EQ(pod["metadata"]["annotations"]["owner"], "ads@example.com");
  EXPECT_EQ(container(objects.stateful_set, "log-shipper")["image"], "busybox:1.36");
  const json& env = container(objects.stateful_set, "rtable-core")["env"];
  EXPECT_EQ(env.back(), (json{{"name", "TZ"}, {"value", "UTC"}}));
  EXPECT_EQ(env[0]["name"], "POD_NAME");
  EXPECT_EQ(pod["spec"]["tolerations"][0]["key"], "dedicated");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["disk"], "ssd");
  EXPECT_EQ(pod["spec"]["priorityClassName"], "high");
}

TEST(TableObjects, BackupCredentialsAreMountedWhereRtableCoreLooksForThem) {
  // Listed ones, then restoreFrom.s3's (mounted without being listed).
  const TableObjects objects = renderTableObjects(spec(R"(, "backupCredentials": ["s3-backup"],
      "restoreFrom": {"name": "prod.b1", "s3": {"endpoint": "http://s3:8333", "bucket": "bkt",
                      "credentials": {"secretName": "old-cluster.s3"}}})"),
                                                  context("events"));
  const json& pod = objects.stateful_set["spec"]["template"]["spec"];
  json volumes = json::array();
  for (const auto& volume : pod["volumes"]) {
    if (volume["name"].get<std::string>().starts_with("backup-credentials-"))
      volumes.push_back(volume);
  }
  EXPECT_EQ(volumes, json::parse(R"([
      {"name": "backup-credentials-0", "secret": {"secretName": "s3-backup", "defaultMode": 256}},
      {"name": "backup-credentials-1", "secret": {"secretName": "old-cluster.s3", "defaultMode": 256}}])"));
  json mounts = json::array();
  for (const auto& mount : container(objects.stateful_set, "rtable-core")["volumeMounts"]) {
    if (mount["name"].get<std::string>().starts_with("backup-credentials-"))
      mounts.push_back(mount);
  }
  EXPECT_EQ(mounts, json::parse(R"([
      {"name": "backup-credentials-0", "readOnly": true,
       "mountPath": "/etc/rtable/backup-credentials/s3-backup"},
      {"name": "backup-credentials-1", "readOnly": true,
       "mountPath": "/etc/rtable/backup-credentials/old-cluster.s3"}])"));
  // A table without them mounts none.
  const TableObjects plain = renderTableObjects(spec(""), context("events"));
  EXPECT_EQ(plain.stateful_set.dump().find("backup-credentials"), std::string::npos);
}

TEST(TableObjects, BackupVolumesAreMountedWritableWhereRtableCoreLooksForThem) {
  // Listed ones, then restoreFrom's claim (mounted without being listed).
  const TableObjects objects = renderTableObjects(spec(R"(, "backupVolumes": ["rtable-backups"],
      "restoreFrom": {"name": "prod.b1",
                      "persistentVolumeClaim": {"claimName": "old-backups", "subPath": "a"}})"),
                                                  context("events"));
  const json& pod = objects.stateful_set["spec"]["template"]["spec"];
  json volumes = json::array();
  for (const auto& volume : pod["volumes"]) {
    if (volume["name"].get<std::string>().starts_with("backup-volume-")) volumes.push_back(volume);
  }
  EXPECT_EQ(volumes, json::parse(R"([
      {"name": "backup-volume-0", "persistentVolumeClaim": {"claimName": "rtable-backups"}},
      {"name": "backup-volume-1", "persistentVolumeClaim": {"claimName": "old-backups"}}])"));
  json mounts = json::array();
  for (const auto& mount : container(objects.stateful_set, "rtable-core")["volumeMounts"]) {
    if (mount["name"].get<std::string>().starts_with("backup-volume-")) mounts.push_back(mount);
  }
  EXPECT_EQ(mounts, json::parse(R"([
      {"name": "backup-volume-0", "mountPath": "/var/lib/rtable-backup-volumes/rtable-backups"},
      {"name": "backup-volume-1", "mountPath": "/var/lib/rtable-backup-volumes/old-backups"}])"));
  const TableObjects plain = renderTableObjects(spec(""), context("events"));
  EXPECT_EQ(plain.stateful_set.dump().find("backup-volume"), std::string::npos);
}

TEST(TableObjects, EveryExampleTableRenders) {
  auto examples = testing::loadExamples(testing::crdsDir() / "examples");
  ASSERT_TRUE(examples) << examples.error();
  for (const auto& file : *examples) {
    for (const auto& object : file.documents) {
      if (testing::kindOf(object) != "ReplicatedTable") continue;
      SCOPED_TRACE(file.path.filename().string());
      auto parsed = ReplicatedTableSpec::parse(object["spec"]);
      ASSERT_TRUE(parsed) << parsed.error().toString();
      const TableObjects objects = renderTableObjects(*parsed, context(object["metadata"]["name"]));
      EXPECT_EQ(objects.stateful_set["spec"]["replicas"], parsed->replicas);
      EXPECT_FALSE(objects.config_map["data"]["core.yaml"].get<std::string>().empty());
    }
  }
}

}  // namespace
}  // namespace rtable::controllers
