#include "rtable/replication_core/table_spec.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "rtable/common/testing/tls_certificates.h"

namespace rtable::core {
namespace {

constexpr const char* kSpec = R"(
table: events
uid: 3f2a9c1e
columns:
  - {name: d, type: Date}
  - {name: user, type: String}
  - {name: n, type: Nullable(UInt32)}
partitionBy: toYYYYMM(d)
orderBy: [user, d]
deduplication: {window: 100, windowSeconds: 60}
zookeeper: {connect: "127.0.0.1:2181", root: /rtable/tables, sessionTimeoutMs: 10000}
replica: {name: events-0, host: 127.0.0.2}
dataDir: /tmp/x
listen: 127.0.0.2
ports: {http: 18123, metrics: 19363}
)";

TEST(TableSpec, ReadsEveryField) {
  auto spec = TableSpec::parseYaml(kSpec);
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->table, "events");
  EXPECT_EQ(spec->uid, "3f2a9c1e");
  EXPECT_EQ(spec->schema.columns().size(), 3u);
  EXPECT_EQ(spec->schema.columns()[2].type.name(), "Nullable(UInt32)");
  EXPECT_EQ(spec->schema.partitionBy().format(), "toYYYYMM(d)");
  EXPECT_EQ(spec->schema.orderBy(), (std::vector<std::string>{"user", "d"}));
  EXPECT_EQ(spec->deduplication.max_ids, 100u);
  EXPECT_EQ(spec->deduplication.max_age, std::chrono::seconds(60));
  EXPECT_EQ(spec->zookeeper_connect, "127.0.0.1:2181");
  EXPECT_EQ(spec->zookeeper_session_timeout, std::chrono::milliseconds(10000));
  EXPECT_EQ(spec->replica, "events-0");
  EXPECT_EQ(spec->replica_host, "127.0.0.2");
  EXPECT_EQ(spec->data_dir, "/tmp/x");
  EXPECT_EQ(spec->http_port, 18123);
  EXPECT_EQ(spec->metrics_port, 19363);
  EXPECT_EQ(spec->tableRoot(), "/rtable/tables/3f2a9c1e");
  EXPECT_EQ(spec->metadataText(),
            "metadata format version: 1\ncolumns: `d` Date, `user` String, `n` Nullable(UInt32)\n"
            "partition key: toYYYYMM(d)\nsorting key: user d\n");
}

TEST(TableSpec, DefaultsApply) {
  auto spec = TableSpec::parseYaml(R"(
table: t
columns: [{name: x, type: UInt64}]
zookeeper: {connect: "zk:2181"}
replica: {name: r1}
dataDir: /data
)");
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->uid, "t");
  EXPECT_EQ(spec->schema.partitionBy().format(), "tuple()");
  EXPECT_EQ(spec->deduplication.max_ids, 10000u);
  EXPECT_EQ(spec->deduplication.max_age, std::chrono::seconds(3600));
  EXPECT_EQ(spec->http_port, 8123);
  EXPECT_EQ(spec->metrics_port, 9363);
  EXPECT_EQ(spec->zookeeper_root, "/rtable/tables");
  EXPECT_EQ(spec->interserver_secret, "");
  EXPECT_EQ(spec->fetch_threads, 4u);
  EXPECT_EQ(spec->merge_threads, 2u);
  EXPECT_EQ(spec->insert_quorum, 0u);
  EXPECT_FALSE(spec->insert_quorum_auto);
  EXPECT_EQ(spec->insert_quorum_timeout, std::chrono::milliseconds(600000));
}

TEST(TableSpec, ReadsTheInsertDefaults) {
  const std::string base =
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\nreplica: {name: "
      "r1}\n"
      "dataDir: /d\n";
  auto two = TableSpec::parseYaml(base + "inserts: {quorum: 2, quorumTimeoutMs: 1500}\n");
  ASSERT_TRUE(two) << two.error();
  EXPECT_EQ(two->insert_quorum, 2u);
  EXPECT_FALSE(two->insert_quorum_auto);
  EXPECT_EQ(two->insert_quorum_timeout, std::chrono::milliseconds(1500));
  auto majority = TableSpec::parseYaml(base + "inserts: {quorum: auto}\n");
  ASSERT_TRUE(majority) << majority.error();
  EXPECT_TRUE(majority->insert_quorum_auto);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"inserts: {quorum: most}\n",
       "inserts.quorum: expected a number of replicas from 0 to 1000 or 'auto', got 'most'"},
      {"inserts: {quorum: -1}\n", "inserts.quorum: expected a number of replicas"},
      {"inserts: {quorum: [2]}\n", "inserts.quorum: expected a number of replicas"},
      {"inserts: {quorumTimeoutMs: 0}\n",
       "inserts.quorumTimeoutMs: expected a whole number from 1"},
      {"inserts: {quorom: 2}\n", "inserts.quorom: unknown field"},
  };
  for (const auto& [text, why] : bad) {
    auto spec = TableSpec::parseYaml(base + text);
    ASSERT_FALSE(spec) << text;
    EXPECT_NE(spec.error().find(why), std::string::npos) << spec.error();
  }
}

TEST(TableSpec, ReadsTheAsyncInsertSettings) {
  const std::string base =
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\nreplica: {name: "
      "r1}\ndataDir: /d\n";
  auto defaults = TableSpec::parseYaml(base);
  ASSERT_TRUE(defaults) << defaults.error();
  // ClickHouse's names and defaults (async_insert_*), and ours for the stale timeout.
  EXPECT_FALSE(defaults->async_inserts.enabled);
  EXPECT_TRUE(defaults->async_inserts.wait);
  EXPECT_EQ(defaults->async_inserts.max_data_size, 1'000'000u);
  EXPECT_EQ(defaults->async_inserts.max_query_number, 450u);
  EXPECT_EQ(defaults->async_inserts.busy_timeout, std::chrono::milliseconds(200));
  EXPECT_EQ(defaults->async_inserts.stale_timeout, std::chrono::milliseconds(5));
  // At their defaults they are not written: configs rendered before keep their bytes.
  EXPECT_EQ(defaults->formatYaml().find("async"), std::string::npos);

  auto set = TableSpec::parseYaml(
      base +
      "inserts: {async: {enabled: true, wait: false, maxDataSize: 5000, maxQueryNumber: 7, "
      "busyTimeoutMs: 50, staleTimeoutMs: 0, maxBufferedBytes: 10000}}\n");
  ASSERT_TRUE(set) << set.error();
  EXPECT_TRUE(set->async_inserts.enabled);
  EXPECT_FALSE(set->async_inserts.wait);
  EXPECT_EQ(set->async_inserts.max_data_size, 5000u);
  EXPECT_EQ(set->async_inserts.max_query_number, 7u);
  EXPECT_EQ(set->async_inserts.busy_timeout, std::chrono::milliseconds(50));
  EXPECT_EQ(set->async_inserts.stale_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(set->async_inserts.max_buffered_bytes, 10000u);
  auto again = TableSpec::parseYaml(set->formatYaml());
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(*again, *set);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"inserts: {async: {enabled: yes please}}\n",
       "inserts.async.enabled: expected true or false, got 'yes please'"},
      {"inserts: {async: {busyTimeoutMs: 0}}\n",
       "inserts.async.busyTimeoutMs: expected a whole number from 1"},
      {"inserts: {async: {maxDataSize: 2000, maxBufferedBytes: 1000}}\n",
       "inserts.async.maxBufferedBytes: 1000 is below maxDataSize 2000"},
      {"inserts: {async: {maxQueries: 3}}\n", "inserts.async.maxQueries: unknown field"},
  };
  for (const auto& [text, why] : bad) {
    auto spec = TableSpec::parseYaml(base + text);
    ASSERT_FALSE(spec) << text;
    EXPECT_NE(spec.error().find(why), std::string::npos) << spec.error();
  }
}

TEST(TableSpec, ReadsTheInterserverSecretFromItsFile) {
  const auto file = std::filesystem::temp_directory_path() / "rtable-spec-test-secret";
  std::ofstream(file) << "s3cret\n";
  const std::string base =
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\nreplica: {name: "
      "r1}\n"
      "dataDir: /d\n";
  auto spec = TableSpec::parseYaml(base + "replication: {secretFile: " + file.string() +
                                   ", fetchThreads: 8, mergeThreads: 1}\n");
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->interserver_secret, "s3cret");  // the file's trailing newline is not part of it
  EXPECT_EQ(spec->fetch_threads, 8u);
  EXPECT_EQ(spec->merge_threads, 1u);
  EXPECT_TRUE(spec->interserver_previous_secrets.empty());

  // A rotation (docs/security.md): the first line signs, the others are still accepted.
  std::ofstream(file) << "new-secret\r\n\nold-secret\n";
  auto rotating = TableSpec::parseYaml(base + "replication: {secretFile: " + file.string() + "}\n");
  ASSERT_TRUE(rotating) << rotating.error();
  EXPECT_EQ(rotating->interserver_secret, "new-secret");
  EXPECT_EQ(rotating->interserver_previous_secrets, std::vector<std::string>{"old-secret"});

  std::ofstream(file) << "\n";
  auto empty = TableSpec::parseYaml(base + "replication: {secretFile: " + file.string() + "}\n");
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().find("replication.secretFile: '" + file.string() + "' is empty"),
            std::string::npos)
      << empty.error();
  std::filesystem::remove(file);
  auto missing = TableSpec::parseYaml(base + "replication: {secretFile: " + file.string() + "}\n");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("replication.secretFile: cannot read"), std::string::npos)
      << missing.error();
  auto logs = TableSpec::parseYaml(
      base + "replication: {minLogsToKeep: 3, maxLogsToKeep: 7, cleanupPeriodSeconds: 2}\n");
  ASSERT_TRUE(logs) << logs.error();
  EXPECT_EQ(logs->min_logs_to_keep, 3u);
  EXPECT_EQ(logs->max_logs_to_keep, 7u);
  EXPECT_EQ(logs->cleanup_period, std::chrono::seconds(2));
  auto inverted =
      TableSpec::parseYaml(base + "replication: {minLogsToKeep: 30, maxLogsToKeep: 7}\n");
  ASSERT_FALSE(inverted);
  EXPECT_NE(inverted.error().find("replication.maxLogsToKeep: 7 is below minLogsToKeep 30"),
            std::string::npos)
      << inverted.error();
  auto zero = TableSpec::parseYaml(base + "replication: {fetchThreads: 0}\n");
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().find("replication.fetchThreads: expected a whole number from 1 to 64"),
            std::string::npos)
      << zero.error();
}

TEST(TableSpec, ReadsTheZooKeeperCredentialFromItsDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "rtable-spec-test-zk-credentials";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "username") << "table-t\n";
  std::ofstream(dir / "password") << "pw\n";
  const std::string yaml =
      "table: t\nuid: u1\ncolumns: [{name: x, type: UInt64}]\n"
      "zookeeper: {connect: zk, credentialsDir: " +
      dir.string() + "}\nreplica: {name: r1}\ndataDir: /d\n";
  auto spec = TableSpec::parseYaml(yaml);
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->zookeeperDigests(),
            (std::vector<ZooKeeperDigest>{{"table-t", "pw", "/rtable/tables/u1"}}));
  const std::string text = spec->formatYaml();
  EXPECT_NE(text.find("credentialsDir: " + dir.string()), std::string::npos) << text;
  EXPECT_EQ(text.find("pw"), std::string::npos) << "the password stays in its file:\n" << text;
  auto again = TableSpec::parseYaml(text);
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(*again, *spec);

  // During a password rotation the Secret has previousPassword too: both go to the session.
  std::ofstream(dir / "previousPassword") << "old-pw\n";
  auto rotating = TableSpec::parseYaml(yaml);
  ASSERT_TRUE(rotating) << rotating.error();
  ZooKeeperDigest both{"table-t", "pw", "/rtable/tables/u1"};
  both.previous_password = "old-pw";
  EXPECT_EQ(rotating->zookeeperDigests(), std::vector<ZooKeeperDigest>{both});
  std::filesystem::remove(dir / "previousPassword");

  std::filesystem::remove(dir / "password");
  auto missing = TableSpec::parseYaml(yaml);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("zookeeper.credentialsDir: cannot read '" +
                                 (dir / "password").string() + "'"),
            std::string::npos)
      << missing.error();
  std::filesystem::remove_all(dir);
  auto without = TableSpec::parseYaml(
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\n"
      "replica: {name: r1}\ndataDir: /d\n");
  ASSERT_TRUE(without);
  EXPECT_TRUE(without->zookeeperDigests().empty());  // nodes open to all, as before
}

TEST(TableSpec, ReadsTheApiTokensOnePerLine) {
  const auto file = std::filesystem::temp_directory_path() / "rtable-spec-test-api-tokens";
  std::ofstream(file) << "new-token\r\n\nold-token \n";  // rotation: both valid for a while
  const std::string base =
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\n"
      "replica: {name: r1}\ndataDir: /d\n";
  auto spec = TableSpec::parseYaml(base + "api: {tokensFile: " + file.string() + "}\n");
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->api_tokens, (std::vector<std::string>{"new-token", "old-token"}));
  EXPECT_FALSE(spec->api_reads_need_token);
  const std::string text = spec->formatYaml();
  EXPECT_EQ(text.find("new-token"), std::string::npos) << text;
  auto again = TableSpec::parseYaml(text);
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(*again, *spec);

  auto no_tokens = TableSpec::parseYaml(base + "api: {readsNeedToken: true}\n");
  ASSERT_FALSE(no_tokens);
  EXPECT_NE(no_tokens.error().find("api.readsNeedToken: true needs api.tokensFile"),
            std::string::npos)
      << no_tokens.error();
  auto unknown = TableSpec::parseYaml(base + "api: {token: x}\n");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("api.token: unknown field"), std::string::npos) << unknown.error();
  std::filesystem::remove(file);
}

// tls.dir names a cert-manager Secret's directory; a spec that parses is one whose certificates
// load on both sides, and formatYaml names the directory again.
TEST(TableSpec, ReadsTheTlsDirectoryAndRefusesOneThatDoesNotLoad) {
  const auto dir = std::filesystem::temp_directory_path() / "rtable-spec-test-tls";
  std::filesystem::remove_all(dir);
  auto made = common::testing::makeTestCertificates(dir, {"r1.example"});
  ASSERT_TRUE(made) << made.error();
  const std::string base =
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\n"
      "replica: {name: r1}\ndataDir: /d\n";
  auto spec = TableSpec::parseYaml(base + "tls: {dir: " + dir.string() + "}\n");
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->tls_dir, dir);
  auto again = TableSpec::parseYaml(spec->formatYaml());
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(*again, *spec);
  auto plain = TableSpec::parseYaml(base);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->formatYaml().find("tls"), std::string::npos) << "no tls key without TLS";

  std::filesystem::remove(dir / "tls.key");
  auto no_key = TableSpec::parseYaml(base + "tls: {dir: " + dir.string() + "}\n");
  ASSERT_FALSE(no_key);
  EXPECT_NE(no_key.error().find("tls.dir: cannot load the TLS private key '" +
                                (dir / "tls.key").string()),
            std::string::npos)
      << no_key.error();
  auto unknown = TableSpec::parseYaml(base + "tls: {dir: " + dir.string() + ", cert: x}\n");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("tls.cert: unknown field"), std::string::npos) << unknown.error();
  std::filesystem::remove_all(dir);
}

// The operator writes the file with formatYaml and rtable-core reads it with parseYaml: every field
// survives, defaults and all, and the secret is read again from the file formatYaml names.
TEST(TableSpec, FormatYamlRoundTripsEveryField) {
  const auto file = std::filesystem::temp_directory_path() / "rtable-spec-test-round-trip-secret";
  std::ofstream(file) << "s3cret\n";
  auto spec =
      TableSpec::parseYaml(std::string(kSpec) + "replication: {secretFile: " + file.string() +
                           ", fetchThreads: 8, mergeThreads: 1, minLogsToKeep: 3, maxLogsToKeep: 7,"
                           " cleanupPeriodSeconds: 2, fetchConnectTimeoutMs: 250,"
                           " fetchReceiveTimeoutMs: 5000}\n"
                           "inserts: {quorum: 2, quorumTimeoutMs: 1500}\n");
  ASSERT_TRUE(spec) << spec.error();
  EXPECT_EQ(spec->interserver_secret_file, file);
  EXPECT_EQ(spec->fetch_connect_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(spec->fetch_receive_timeout, std::chrono::milliseconds(5000));
  const std::string text = spec->formatYaml();
  auto again = TableSpec::parseYaml(text);
  ASSERT_TRUE(again) << again.error() << "\n" << text;
  EXPECT_EQ(*again, *spec) << text;
  EXPECT_EQ(again->formatYaml(), text);
  EXPECT_EQ(text.find("s3cret"), std::string::npos) << "the secret stays in its file:\n" << text;

  // `auto` quorum, no secret, and every default.
  auto defaults = TableSpec::parseYaml(
      "table: t\ncolumns: [{name: x, type: UInt64}]\nzookeeper: {connect: zk}\n"
      "replica: {name: r1}\ndataDir: /d\ninserts: {quorum: auto}\n");
  ASSERT_TRUE(defaults) << defaults.error();
  auto defaults_again = TableSpec::parseYaml(defaults->formatYaml());
  ASSERT_TRUE(defaults_again) << defaults_again.error() << "\n" << defaults->formatYaml();
  EXPECT_EQ(*defaults_again, *defaults);
  EXPECT_TRUE(defaults_again->insert_quorum_auto);
  std::filesystem::remove(file);
}

TEST(TableSpec, FormatYamlWritesTheDocumentedLayout) {
  TableSpec spec = *TableSpec::parseYaml(kSpec);
  spec.interserver_secret_file = "/etc/rtable/interserver/secret";
  EXPECT_EQ(spec.formatYaml(), R"(table: events
uid: 3f2a9c1e
columns:
  - {name: d, type: Date}
  - {name: user, type: String}
  - {name: n, type: Nullable(UInt32)}
partitionBy: toYYYYMM(d)
orderBy: [user, d]
deduplication:
  window: 100
  windowSeconds: 60
zookeeper:
  connect: 127.0.0.1:2181
  root: /rtable/tables
  sessionTimeoutMs: 10000
replica:
  name: events-0
  host: 127.0.0.2
dataDir: /tmp/x
listen: 127.0.0.2
ports:
  http: 18123
  metrics: 19363
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
  spec.insert_quorum_timeout = std::chrono::milliseconds(1500);
  EXPECT_NE(spec.formatYaml().find("inserts:\n  quorum: 0\n  quorumTimeoutMs: 1500\n"),
            std::string::npos)
      << spec.formatYaml();
}

TEST(TableSpec, ErrorsNameTheField) {
  const std::string base = "table: t\nzookeeper: {connect: zk}\nreplica: {name: r1}\ndataDir: /d\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {base, "columns: expected a non-empty list"},
      {base + "columns: [{name: x, type: Foo}]\n", "columns[0].type: unknown type 'Foo'"},
      {base + "columns: [{name: x}]\n", "columns[0].type: required"},
      {base + "columns: [{name: x, type: UInt8, size: 3}]\n", "columns[0].size: unknown field"},
      {base + "columns: [{name: x, type: UInt8}]\npartitionBy: toYYYYMM(x)\n",
       "needs a Date or DateTime column"},
      {base + "columns: [{name: x, type: UInt8}]\nports: {http: 70000}\n",
       "ports.http: expected a whole number from 1 to 65535, got '70000'"},
      {base + "columns: [{name: x, type: UInt8}]\ndedupliction: {window: 1}\n",
       "dedupliction: unknown field"},
      {"table: t\ncolumns: [{name: x, type: UInt8}]\nreplica: {name: r1}\ndataDir: /d\n",
       "zookeeper: expected a mapping"},
      {base + "columns: [{name: x, type: UInt8}]\nuid: a/b\n", "uid: 'a/b'"},
      {"table: [unclosed\n", "not valid YAML"},
  };
  for (const auto& [text, why] : cases) {
    auto spec = TableSpec::parseYaml(text);
    ASSERT_FALSE(spec) << text;
    EXPECT_NE(spec.error().find(why), std::string::npos) << spec.error();
  }
}

}  // namespace
}  // namespace rtable::core
