#include "rtable/controllers/replicated_table_spec.h"

#include <gtest/gtest.h>

#include "../crd_examples.h"
#include "rtable/controllers/yaml_json.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;
using testing::crdsDir;
using testing::readText;

json exampleSpec(const std::string& file) {
  auto object = yamlToJson(readText(crdsDir() / "examples" / file));
  EXPECT_TRUE(object) << object.error();
  return object ? (*object)["spec"] : json();
}

json minimalSpec() {
  return {{"table", "t"},
          {"columns", {{{"name", "id"}, {"type", "UInt64"}}}},
          {"zookeeper", {{"connect", "zk:2181"}}}};
}

TEST(ReplicatedTableSpec, ParsesTheEventsExample) {
  auto spec = ReplicatedTableSpec::parse(exampleSpec("events-table.yaml"));
  ASSERT_TRUE(spec) << spec.error().toString();
  EXPECT_EQ(spec->table, "events");
  ASSERT_EQ(spec->columns.size(), 4u);
  EXPECT_EQ(spec->columns[3].name, "score");
  EXPECT_EQ(spec->columns[3].type.name(), "Nullable(Float64)");
  EXPECT_EQ(spec->partition_by.kind, core::PartitionKey::Kind::kToYYYYMM);
  EXPECT_EQ(spec->partition_by.column, "d");
  EXPECT_EQ(spec->order_by, (std::vector<std::string>{"user", "d"}));
  EXPECT_EQ(spec->replicas, 3);
  EXPECT_EQ(spec->storage.size, "20Gi");
  EXPECT_EQ(spec->resources["requests"]["cpu"], "500m");
  EXPECT_EQ(spec->zookeeper.connect, "zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181");
  EXPECT_EQ(spec->zookeeper.root, "/rtable/tables");
  EXPECT_EQ(spec->schema().columns().size(), 4u);
}

TEST(ReplicatedTableSpec, DefaultsAreFilledIn) {
  auto spec = ReplicatedTableSpec::parse(minimalSpec());
  ASSERT_TRUE(spec) << spec.error().toString();
  const json full = spec->toJson();
  EXPECT_EQ(full["partitionBy"], "tuple()");
  EXPECT_EQ(full["orderBy"], json::array());
  EXPECT_EQ(full["replicas"], 3);
  EXPECT_EQ(full["storage"], json({{"size", "10Gi"}}));
  EXPECT_EQ(
      full["zookeeper"],
      json({{"connect", "zk:2181"}, {"root", "/rtable/tables"}, {"sessionTimeoutMs", 30000}}));
  EXPECT_EQ(full["deduplication"], json({{"window", 10000}, {"windowSeconds", 3600}}));
  EXPECT_EQ(full["insertQuorum"], 0);
  EXPECT_EQ(full["headroom"],
            json({{"thresholdPercent", 5}, {"exhaustionDays", 7}, {"autoRecover", true}}));
  EXPECT_EQ(full["replication"], json({{"fetchThreads", 4},
                                       {"mergeThreads", 2},
                                       {"minLogsToKeep", 10},
                                       {"maxLogsToKeep", 1000},
                                       {"cleanupPeriodSeconds", 30},
                                       {"fetchConnectTimeoutMs", 1000},
                                       {"fetchReceiveTimeoutMs", 30000}}));
  EXPECT_FALSE(full.contains("podTemplate"));
  EXPECT_FALSE(full.contains("restoreFrom"));
}

// Every `default:` in the CRD's spec schema is the value parse() fills in: the two cannot drift.
void expectDefaultsMatch(const json& schema, const json& parsed, const std::string& path) {
  if (!schema.contains("properties")) return;
  for (const auto& [name, property] : schema["properties"].items()) {
    const std::string field = path + "." + name;
    if (property.contains("default") && !property["default"].is_object()) {
      ASSERT_TRUE(parsed.contains(name)) << field << " has a CRD default but parse() leaves it out";
      EXPECT_EQ(parsed[name], property["default"]) << field;
    }
    if (parsed.contains(name) && parsed[name].is_object())
      expectDefaultsMatch(property, parsed[name], field);
  }
}

TEST(ReplicatedTableSpec, TheCrdDefaultsAreTheParserDefaults) {
  auto crd = yamlToJson(readText(crdsDir() / "rtable.io_replicatedtables.yaml"));
  ASSERT_TRUE(crd) << crd.error();
  const json& schema =
      (*crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
  auto spec = ReplicatedTableSpec::parse(minimalSpec());
  ASSERT_TRUE(spec);
  expectDefaultsMatch(schema, spec->toJson(), "spec");
  // And the other way round: everything parse() fills in has a CRD default.
  const json full = spec->toJson();
  for (const auto& [name, value] : full.items()) {
    if (minimalSpec().contains(name)) continue;
    EXPECT_TRUE(schema["properties"][name].contains("default")) << "spec." << name;
  }
}

TEST(ReplicatedTableSpec, RoundTripsEveryField) {
  for (const char* file :
       {"events-table.yaml", "minimal-table.yaml", "sidecar-table.yaml", "restored-table.yaml",
        "restored-from-location.yaml", "restored-from-s3.yaml", "restored-from-volume.yaml"}) {
    auto spec = ReplicatedTableSpec::parse(exampleSpec(file));
    ASSERT_TRUE(spec) << file << ": " << spec.error().toString();
    auto again = ReplicatedTableSpec::parse(spec->toJson());
    ASSERT_TRUE(again) << file << ": " << again.error().toString();
    EXPECT_EQ(*again, *spec) << file;
    EXPECT_EQ(again->toJson(), spec->toJson()) << file;
  }
  auto sidecar = ReplicatedTableSpec::parse(exampleSpec("sidecar-table.yaml"));
  ASSERT_TRUE(sidecar);
  EXPECT_EQ(sidecar->pod_template.containers.at(0)["image"], "fluent/fluent-bit:3.1");
  EXPECT_EQ(sidecar->pod_template.containers.at(0)["volumeMounts"][0]["mountPath"],
            "/fluent-bit/etc");
  EXPECT_EQ(sidecar->pod_template.labels.at("tier"), "storage");
  EXPECT_EQ(sidecar->headroom.threshold_percent, 2.5);
  EXPECT_FALSE(sidecar->headroom.auto_recover);
  EXPECT_EQ(sidecar->storage.storage_class_name, "fast-ssd");
  EXPECT_EQ(sidecar->insert_quorum, 2);
  ASSERT_EQ(sidecar->pod_template.volume_mounts.size(), 1u);
  EXPECT_EQ(sidecar->pod_template.volume_mounts[0]["mountPath"], "/mnt/backups");
  EXPECT_EQ(sidecar->zookeeper.credentials_secret, "metrics-zookeeper-identity");
  EXPECT_EQ(sidecar->zookeeperCredentialsSecret("metrics"), "metrics-zookeeper-identity");
  EXPECT_EQ(sidecar->apiTokensSecret("metrics"), "metrics-api-tokens");
  EXPECT_TRUE(sidecar->api.reads_need_token);
  EXPECT_EQ(sidecar->tls.secret_name, "metrics-tls");
  auto minimal = ReplicatedTableSpec::parse(exampleSpec("minimal-table.yaml"));
  ASSERT_TRUE(minimal);
  EXPECT_TRUE(minimal->api.token_required);  // secure by default
  EXPECT_EQ(minimal->zookeeperCredentialsSecret("t"), "t-zookeeper");
  EXPECT_EQ(minimal->apiTokensSecret("t"), "t-api-tokens");
  EXPECT_FALSE(minimal->tls.enabled());  // a certificate is the user's to give
}

struct BadSpec {
  const char* pointer;  // a JSON pointer into the minimal spec
  json value;
  const char* error;  // the whole "path: message", or its start
};

TEST(ReplicatedTableSpec, ErrorsNameTheField) {
  const std::vector<BadSpec> cases = {
      {"/replicas", 0, "spec.replicas: must be from 1 to 100, got 0"},
      {"/replicas", "3", "spec.replicas: expected an integer, got string"},
      {"/replicas", 2.5, "spec.replicas: expected an integer, got number"},
      // Beyond int64 (found by fuzz_crd_specs: the cast of 1e23 was undefined behaviour).
      {"/replicas", 1e23, "spec.replicas: must be from 1 to 100, got 1e+23"},
      {"/replicas", 18446744073709551615ULL,
       "spec.replicas: must be from 1 to 100, got 18446744073709551615"},
      {"/replicas", -9.3e18, "spec.replicas: must be from 1 to 100, got -9.3e+18"},
      {"/columns/0/type", "Foo", "spec.columns[0].type: unknown type 'Foo'"},
      {"/columns/1",
       {{"name", "id"}, {"type", "String"}},
       "spec.columns[1].name: column 'id' is declared twice"},
      {"/columns/1",
       {{"name", "2x"}, {"type", "String"}},
       "spec.columns[1].name: '2x' is not an identifier"},
      {"/columns/1", {{"name", "x"}}, "spec.columns[1].type: required"},
      {"/columns/1",
       {{"name", "x"}, {"type", "Date"}, {"codec", "ZSTD"}},
       "spec.columns[1].codec: unknown field"},
      {"/columns", json::array(), "spec.columns: a table needs at least one column"},
      {"/table", "my-table", "spec.table: 'my-table' is not an identifier"},
      {"/partitionBy", "toStartOfHour(id)",
       "spec.partitionBy: partition key 'toStartOfHour(id)' must be"},
      {"/partitionBy", "toYYYYMM(id)",
       "spec.partitionBy: toYYYYMM(id) needs a Date or DateTime column, 'id' is UInt64"},
      {"/partitionBy", "day", "spec.partitionBy: day names no column"},
      {"/orderBy", {"id", "day"}, "spec.orderBy[1]: 'day' is not a column of the table"},
      {"/zookeeper", {{"root", "/x"}}, "spec.zookeeper.connect: required"},
      {"/zookeeper/connect", "zk-0,zk-1", "spec.zookeeper.connect: 'zk-0,zk-1' is not host:port"},
      {"/zookeeper/root", "/rtable/",
       "spec.zookeeper.root: '/rtable/' is not an absolute ZooKeeper path"},
      {"/zookeeper/sessionTimeoutMs", 10,
       "spec.zookeeper.sessionTimeoutMs: must be from 1000 to 600000"},
      {"/zookeeper/credentialsSecret", "Table_Identity",
       "spec.zookeeper.credentialsSecret: 'Table_Identity' is not a Secret's name"},
      {"/api",
       {{"authentication", "Basic"}},
       "spec.api.authentication: 'Basic' must be Token or None"},
      {"/api",
       {{"authentication", "None"}, {"tokensSecret", "t"}},
       "spec.api.tokensSecret: only with authentication Token"},
      {"/api",
       {{"authentication", "None"}, {"readsNeedToken", true}},
       "spec.api.readsNeedToken: only with authentication Token"},
      {"/api", {{"tokens", "abc"}}, "spec.api.tokens: unknown field"},
      {"/tls",
       {{"secretName", "Events_TLS"}},
       "spec.tls.secretName: 'Events_TLS' is not a Secret's name"},
      {"/tls", {{"issuer", "letsencrypt"}}, "spec.tls.issuer: unknown field"},
      {"/networkPolicy",
       {{"apiFrom", {json::object()}}},
       "spec.networkPolicy.apiFrom[0]: a peer needs a podSelector, a namespaceSelector or an "
       "ipBlock"},
      {"/networkPolicy",
       {{"apiFrom", {{{"ipBlock", {{"cidr", "10.0.0.0/8"}}}, {"podSelector", json::object()}}}}},
       "spec.networkPolicy.apiFrom[0]: an ipBlock stands alone"},
      {"/networkPolicy",
       {{"metricsFrom", {{{"podSelector", {{"matchLabel", {{"a", "b"}}}}}}}}},
       "spec.networkPolicy.metricsFrom[0].podSelector.matchLabel: unknown field"},
      {"/podTemplate",
       {{"volumeMounts", {{{"name", "nfs"}, {"mountPath", "/mnt"}}}}},
       "spec.podTemplate.volumeMounts[0].name: 'nfs' is not a volume of podTemplate.volumes"},
      {"/podTemplate",
       {{"volumes", {{{"name", "nfs"}, {"emptyDir", json::object()}}}},
        {"volumeMounts", {{{"name", "nfs"}, {"mountPath", "/var/lib/rtable/x"}}}}},
       "spec.podTemplate.volumeMounts[0].mountPath: '/var/lib/rtable/x' overlaps /var/lib/rtable"},
      {"/podTemplate",
       {{"volumes", {{{"name", "nfs"}, {"emptyDir", json::object()}}}},
        {"volumeMounts", {{{"name", "nfs"}, {"mountPath", "/etc"}}}}},
       "spec.podTemplate.volumeMounts[0].mountPath: '/etc' overlaps /etc/rtable"},
      {"/podTemplate",
       {{"volumes", {{{"name", "nfs"}, {"emptyDir", json::object()}}}},
        {"volumeMounts", {{{"name", "nfs"}, {"mountPath", "mnt"}}}}},
       "spec.podTemplate.volumeMounts[0].mountPath: 'mnt' is not an absolute path"},
      {"/networkPolicy",
       {{"enabled", "yes"}},
       "spec.networkPolicy.enabled: expected true or false, got string"},
      {"/storage", {{"size", "ten gigs"}}, "spec.storage.size: 'ten gigs' is not a quantity"},
      {"/resources",
       {{"limits", {{"memory", "lots"}}}},
       "spec.resources.limits.memory: 'lots' is not a quantity"},
      {"/insertQuorum", 4, "spec.insertQuorum: 4 exceeds replicas (3)"},
      {"/replication",
       {{"minLogsToKeep", 100}, {"maxLogsToKeep", 50}},
       "spec.replication.maxLogsToKeep: 50 is below minLogsToKeep (100)"},
      {"/headroom",
       {{"autoRecover", "yes"}},
       "spec.headroom.autoRecover: expected true or false, got string"},
      {"/podTemplate",
       {{"containers", {{{"name", "rtable-core"}}}}},
       "spec.podTemplate.containers[0].name: the name rtable-core is taken"},
      {"/podTemplate",
       {{"env", {{{"name", "A"}}, {{"name", "A"}}}}},
       "spec.podTemplate.env[1].name: 'A' is given twice"},
      {"/podTemplate",
       {{"tolerations", {{{"operator", "Maybe"}}}}},
       "spec.podTemplate.tolerations[0].operator: 'Maybe' is not one of"},
      {"/restoreFrom", json::object(),
       "spec.restoreFrom: exactly one of backup, filesystem, persistentVolumeClaim and s3 must be "
       "given"},
      {"/restoreFrom",
       {{"backup", "b"}, {"filesystem", {{"path", "/backups"}}}, {"name", "x"}},
       "spec.restoreFrom: exactly one of backup, filesystem, persistentVolumeClaim and s3 must be "
       "given"},
      {"/restoreFrom",
       {{"filesystem", {{"path", "/backups"}}}},
       "spec.restoreFrom.name: name is given with filesystem, persistentVolumeClaim or s3, and "
       "only with them"},
      {"/restoreFrom",
       {{"backup", "b"}, {"name", "x"}},
       "spec.restoreFrom.name: name is given with filesystem, persistentVolumeClaim or s3, and "
       "only with them"},
      {"/restoreFrom",
       {{"s3",
         {{"endpoint", "http://s3:8333"}, {"bucket", "bkt"}, {"credentials", json::object()}}},
        {"name", "x"}},
       "spec.restoreFrom.s3.credentials.secretName: required"},
      {"/backupCredentials",
       {"s3", "S3"},
       "spec.backupCredentials[1]: 'S3' is not a Secret's name"},
      {"/backupCredentials", {"s3", "s3"}, "spec.backupCredentials[1]: 's3' is listed twice"},
      {"/restoreFrom",
       {{"filesystem", {{"path", "backups/"}}}, {"name", "x"}},
       "spec.restoreFrom.filesystem.path: 'backups/' must be an absolute path"},
      {"/replica", 3, "spec.replica: unknown field"},
  };
  for (const auto& c : cases) {
    json spec = minimalSpec();
    spec[json::json_pointer(c.pointer)] = c.value;
    auto parsed = ReplicatedTableSpec::parse(spec);
    ASSERT_FALSE(parsed) << c.pointer << " = " << c.value.dump();
    EXPECT_TRUE(parsed.error().toString().starts_with(c.error))
        << parsed.error().toString() << "\nexpected: " << c.error;
  }
  EXPECT_EQ(ReplicatedTableSpec::parse(json::array()).error().toString(),
            "spec: expected an object, got array");
}

TEST(ReplicatedTableSpec, TheNameMustNameAStatefulSet) {
  EXPECT_FALSE(checkReplicatedTableName("events"));
  EXPECT_FALSE(checkReplicatedTableName(std::string(52, 'a')));
  for (const std::string& bad : std::vector<std::string>{"events.v2", "Events", "1events",
                                                         "events-", std::string(53, 'a')}) {
    auto error = checkReplicatedTableName(bad);
    ASSERT_TRUE(error) << bad;
    EXPECT_EQ(error->path, "metadata.name");
  }
}

TEST(ReplicatedTableSpec, UpdatesKeepTheTableIdentity) {
  const ReplicatedTableSpec old_spec =
      *ReplicatedTableSpec::parse(exampleSpec("events-table.yaml"));
  auto changed = [&](auto edit) {
    json spec = old_spec.toJson();
    edit(spec);
    auto parsed = ReplicatedTableSpec::parse(spec);
    EXPECT_TRUE(parsed) << parsed.error().toString();
    auto error = checkReplicatedTableUpdate(old_spec, *parsed);
    return error ? error->toString() : std::string("accepted");
  };
  EXPECT_EQ(changed([](json&) {}), "accepted");
  EXPECT_EQ(changed([](json& s) { s["replicas"] = 5; }), "accepted");
  EXPECT_EQ(changed([](json& s) { s["zookeeper"]["connect"] = "zk-new:2181"; }), "accepted");
  EXPECT_EQ(changed([](json& s) { s["storage"]["size"] = "50Gi"; }), "accepted");
  EXPECT_EQ(changed([](json& s) { s["table"] = "clicks"; }), "spec.table: table is immutable");
  EXPECT_TRUE(changed([](json& s) {
                s["columns"][2]["type"] = "UInt64";
              }).starts_with("spec.columns[2].type: a column's type is immutable"));
  EXPECT_TRUE(changed([](json& s) {
                s["columns"].push_back({{"name", "x"}, {"type", "String"}});
              }).starts_with("spec.columns: columns cannot be added"));
  EXPECT_TRUE(changed([](json& s) {
                std::swap(s["columns"][0], s["columns"][1]);
              }).starts_with("spec.columns: columns cannot be added, removed or reordered"));
  EXPECT_EQ(changed([](json& s) { s["partitionBy"] = "toYYYYMMDD(d)"; }),
            "spec.partitionBy: partitionBy is immutable");
  EXPECT_EQ(changed([](json& s) { s["orderBy"] = {"d", "user"}; }),
            "spec.orderBy: orderBy is immutable");
  EXPECT_EQ(changed([](json& s) { s["zookeeper"]["root"] = "/other"; }),
            "spec.zookeeper.root: zookeeper.root is immutable");
  EXPECT_EQ(changed([](json& s) { s["storage"]["storageClassName"] = "slow"; }),
            "spec.storage.storageClassName: storageClassName is immutable");
  EXPECT_EQ(changed([](json& s) { s["restoreFrom"] = {{"backup", "b"}}; }),
            "spec.restoreFrom: restoreFrom can only be given when the table is created");
}

}  // namespace
}  // namespace rtable::controllers
