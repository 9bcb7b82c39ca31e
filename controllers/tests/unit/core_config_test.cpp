// The rendered rtable-core config, read back by rtable-core's own parser (TableSpec::parseYaml),
// for every ReplicatedTable in crds/examples: the CRD's table fields and the core's cannot drift.
#include "rtable/controllers/core_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "../crd_examples.h"
#include "rtable/common/testing/tls_certificates.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::controllers {
namespace {

using nlohmann::json;

class CoreConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rtable-core-config-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    secret_file_ = dir_ / "secret";
    std::ofstream(secret_file_) << "s3cr3t\n";  // as a mounted Secret: a trailing newline
    std::filesystem::create_directories(dir_ / "zookeeper");
    std::ofstream(dir_ / "zookeeper" / "username") << "analytics.t";
    std::ofstream(dir_ / "zookeeper" / "password") << "zk-pw";
    std::ofstream(dir_ / "tokens") << "token-a\ntoken-b\n";
    // As cert-manager's Secret is mounted (spec.tls).
    auto made = common::testing::makeTestCertificates(dir_ / "tls", {"*.t-headless.analytics.svc"});
    ASSERT_TRUE(made) << made.error();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  CoreConfigContext context(const std::string& name) const {
    CoreConfigContext context;
    context.name = name;
    context.ns = "analytics";
    context.secret_file = secret_file_;
    context.zookeeper_credentials_dir = dir_ / "zookeeper";
    context.api_tokens_file = dir_ / "tokens";
    context.tls_dir = dir_ / "tls";
    return context;
  }

  std::filesystem::path dir_;
  std::filesystem::path secret_file_;
};

TEST_F(CoreConfig, EveryExampleTableReadsBackThroughRtableCore) {
  auto examples = testing::loadExamples(testing::crdsDir() / "examples");
  ASSERT_TRUE(examples) << examples.error();
  int tables = 0;
  int with_quorum = 0;
  int with_async = 0;
  int with_tls = 0;
  for (const auto& file : *examples) {
    for (const auto& object : file.documents) {
      if (testing::kindOf(object) != "ReplicatedTable") continue;
      ++tables;
      SCOPED_TRACE(file.path.filename().string());
      auto spec = ReplicatedTableSpec::parse(object["spec"]);
      ASSERT_TRUE(spec) << spec.error().toString();
      const std::string name = object["metadata"]["name"];
      const std::string yaml = renderCoreConfig(*spec, context(name));
      auto core = core::TableSpec::parseYaml(yaml);
      ASSERT_TRUE(core) << core.error() << "\n" << yaml;

      EXPECT_EQ(core->table, spec->table);
      EXPECT_EQ(core->uid, "analytics." + name);
      EXPECT_EQ(core->schema.columns(), spec->columns);
      EXPECT_EQ(core->schema.partitionBy(), spec->partition_by);
      EXPECT_EQ(core->schema.orderBy(), spec->order_by);
      EXPECT_EQ(core->schema, spec->schema());
      // The same type names and partition expressions, as the user wrote them.
      for (std::size_t i = 0; i < spec->columns.size(); ++i) {
        EXPECT_EQ(core->schema.columns()[i].type.name(), object["spec"]["columns"][i]["type"]);
      }
      EXPECT_EQ(core->schema.partitionBy().format(),
                object["spec"].value("partitionBy", "tuple()"));
      EXPECT_EQ(core->deduplication.max_ids, static_cast<std::size_t>(spec->deduplication.window));
      EXPECT_EQ(core->deduplication.max_age.count(), spec->deduplication.window_seconds);
      EXPECT_EQ(core->zookeeper_connect, spec->zookeeper.connect);
      EXPECT_EQ(core->zookeeper_root, spec->zookeeper.root);
      EXPECT_EQ(core->zookeeper_session_timeout.count(), spec->zookeeper.session_timeout_ms);
      EXPECT_EQ(core->tableRoot(), spec->zookeeper.root + "/analytics." + name);
      EXPECT_EQ(core->replica, kReplicaFromFlag);
      EXPECT_EQ(core->replica_host, kReplicaHostFromFlag);
      EXPECT_EQ(core->data_dir, "/var/lib/rtable");
      EXPECT_EQ(core->listen_address, "0.0.0.0");
      EXPECT_EQ(core->http_port, 8123);
      EXPECT_EQ(core->metrics_port, 9363);
      EXPECT_EQ(core->interserver_secret, "s3cr3t");
      EXPECT_EQ(core->fetch_threads, static_cast<std::size_t>(spec->replication.fetch_threads));
      EXPECT_EQ(core->merge_threads, static_cast<std::size_t>(spec->replication.merge_threads));
      EXPECT_EQ(core->min_logs_to_keep,
                static_cast<std::size_t>(spec->replication.min_logs_to_keep));
      EXPECT_EQ(core->max_logs_to_keep,
                static_cast<std::size_t>(spec->replication.max_logs_to_keep));
      EXPECT_EQ(core->cleanup_period.count(), spec->replication.cleanup_period_seconds);
      EXPECT_EQ(core->insert_quorum, static_cast<std::size_t>(spec->insert_quorum));
      if (spec->insert_quorum >= 2) ++with_quorum;
      EXPECT_EQ(core->async_inserts, spec->async_inserts);
      if (spec->async_inserts.enabled) ++with_async;
      EXPECT_EQ(core->tls_dir, spec->tls.enabled() ? dir_ / "tls" : std::filesystem::path());
      if (spec->tls.enabled()) ++with_tls;
    }
  }
  EXPECT_GE(tables, 3);
  EXPECT_GE(with_quorum, 1) << "no example sets spec.insertQuorum";
  EXPECT_GE(with_async, 1) << "no example sets spec.asyncInserts";
  EXPECT_GE(with_tls, 1) << "no example sets spec.tls";
}

// One TableSpec is written (coreTableSpec, TableSpec::formatYaml) and read back whole by
// rtable-core's parser, its secret from the file the config names.
TEST_F(CoreConfig, ReadsBackToTheSpecItWasWrittenFrom) {
  auto examples = testing::loadExamples(testing::crdsDir() / "examples");
  ASSERT_TRUE(examples) << examples.error();
  for (const auto& file : *examples) {
    for (const auto& object : file.documents) {
      if (testing::kindOf(object) != "ReplicatedTable") continue;
      SCOPED_TRACE(file.path.filename().string());
      auto spec = ReplicatedTableSpec::parse(object["spec"]);
      ASSERT_TRUE(spec) << spec.error().toString();
      const CoreConfigContext c = context(object["metadata"]["name"]);
      core::TableSpec written = coreTableSpec(*spec, c);
      EXPECT_EQ(written.interserver_secret_file, secret_file_);
      auto read = core::TableSpec::parseYaml(renderCoreConfig(*spec, c));
      ASSERT_TRUE(read) << read.error();
      written.interserver_secret = "s3cr3t";   // the operator names the file; the pod reads it
      written.zookeeper_user = "analytics.t";  // and the ZooKeeper identity's directory
      written.zookeeper_password = "zk-pw";
      if (spec->api.token_required) written.api_tokens = {"token-a", "token-b"};
      EXPECT_EQ(*read, written);
    }
  }
}

TEST_F(CoreConfig, TheContextGivesIdentityPathsAndPorts) {
  auto spec = ReplicatedTableSpec::parse({{"table", "t"},
                                          {"columns", {{{"name", "id"}, {"type", "UInt64"}}}},
                                          {"zookeeper", {{"connect", "zk:2181"}}}});
  ASSERT_TRUE(spec);
  CoreConfigContext c = context("t");
  c.uid = "3f2a9c1e";
  c.replica_name = "t-2";
  c.replica_host = "t-2.t-headless.analytics.svc";
  c.data_dir = dir_ / "data";
  c.listen = "127.0.0.5";
  c.http_port = 18123;
  c.metrics_port = 19363;
  auto core = core::TableSpec::parseYaml(renderCoreConfig(*spec, c));
  ASSERT_TRUE(core) << core.error();
  EXPECT_EQ(core->uid, "3f2a9c1e");
  EXPECT_EQ(core->replica, "t-2");
  EXPECT_EQ(core->replica_host, "t-2.t-headless.analytics.svc");
  EXPECT_EQ(core->data_dir, dir_ / "data");
  EXPECT_EQ(core->listen_address, "127.0.0.5");
  EXPECT_EQ(core->http_port, 18123);
  EXPECT_EQ(core->metrics_port, 19363);
  // The table's ZooKeeper identity from the mounted Secret, owning the table's subtree.
  EXPECT_EQ(core->zookeeper_credentials_dir, dir_ / "zookeeper");
  ASSERT_EQ(core->zookeeperDigests().size(), 1u);
  EXPECT_EQ(core->zookeeperDigests()[0],
            (core::ZooKeeperDigest{"analytics.t", "zk-pw", "/rtable/tables/3f2a9c1e"}));
}

// Every replica's config gives the same ZooKeeper metadata: otherwise rtable-core refuses to join.
TEST_F(CoreConfig, ReplicasAgreeOnTheTableMetadata) {
  auto object =
      yamlDocumentsToJson(testing::readText(testing::crdsDir() / "examples/events-table.yaml"));
  ASSERT_TRUE(object);
  auto spec = ReplicatedTableSpec::parse(object->front()["spec"]);
  ASSERT_TRUE(spec);
  CoreConfigContext a = context("events");
  CoreConfigContext b = context("events");
  a.replica_name = "events-0";
  b.replica_name = "events-1";
  auto core_a = core::TableSpec::parseYaml(renderCoreConfig(*spec, a));
  auto core_b = core::TableSpec::parseYaml(renderCoreConfig(*spec, b));
  ASSERT_TRUE(core_a && core_b);
  EXPECT_EQ(core_a->metadataText(), core_b->metadataText());
  EXPECT_NE(core_a->metadataText().find("partition key: toYYYYMM(d)"), std::string::npos)
      << core_a->metadataText();
}

// The ConfigMap's bytes: a change rolls every replica pod (the config hash annotation), so the
// text is pinned, not only what it parses to.
TEST_F(CoreConfig, RendersTheSameBytes) {
  auto object =
      yamlDocumentsToJson(testing::readText(testing::crdsDir() / "examples/events-table.yaml"));
  ASSERT_TRUE(object);
  auto spec = ReplicatedTableSpec::parse(object->front()["spec"]);
  ASSERT_TRUE(spec);
  CoreConfigContext c;
  c.name = "events";
  c.ns = "analytics";
  EXPECT_EQ(
      renderCoreConfig(*spec, c),
      R"(# rtable-core spec of ReplicatedTable analytics/events, rendered by rtable-operator (docs/rtable-core.md).
# Each pod sets its own replica name and host with --replica-name and --replica-host.
table: events
uid: analytics.events
columns:
  - {name: d, type: Date}
  - {name: user, type: String}
  - {name: clicks, type: UInt32}
  - {name: score, type: Nullable(Float64)}
partitionBy: toYYYYMM(d)
orderBy: [user, d]
deduplication:
  window: 10000
  windowSeconds: 3600
zookeeper:
  connect: zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181
  root: /rtable/tables
  sessionTimeoutMs: 30000
  credentialsDir: /etc/rtable/zookeeper
replica:
  name: set-by-replica-name-flag
  host: set-by-replica-host-flag
dataDir: /var/lib/rtable
listen: 0.0.0.0
ports:
  http: 8123
  metrics: 9363
api:
  tokensFile: /etc/rtable/api/tokens
  readsNeedToken: false
replication:
  secretFile: /etc/rtable/interserver/secret
  fetchThreads: 4
  mergeThreads: 2
  minLogsToKeep: 10
  maxLogsToKeep: 1000
  cleanupPeriodSeconds: 30
inserts:
  quorum: 0
)");
}

TEST(TableUid, NamespaceDotName) {
  EXPECT_EQ(tableUid("analytics", "events"), "analytics.events");
}

}  // namespace
}  // namespace rtable::controllers
