// The table spec one rtable-core process serves: the schema and settings a ReplicatedTable custom
// resource carries, plus this replica's identity, ZooKeeper, storage and ports. Read from YAML at
// start-up; a bad spec is refused with the field's path ("columns[2].type: unknown type 'Foo'").
// The file's one writer and its one reader are both here: rtable-operator renders a table's config
// with formatYaml(), rtable-core reads it with parseYaml() (docs/rtable-core.md).
//
//   table: events                 # the table's name
//   uid: 3f2a9c1e                 # ZooKeeper identity (default: the name); the operator sets it
//   columns:
//     - {name: d, type: Date}
//     - {name: user, type: String}
//   partitionBy: toYYYYMM(d)      # optional: tuple() (one partition), col, toYYYYMM, toYYYYMMDD
//   orderBy: [user, d]            # optional
//   deduplication: {window: 10000, windowSeconds: 3600}
//   zookeeper: {connect: "zk-0.zk:2181", root: /rtable/tables, sessionTimeoutMs: 30000,
//               credentialsDir: /etc/rtable/zookeeper}  # optional: `username` and `password`
//               # files (a kubernetes.io/basic-auth Secret): the table's nodes get a digest ACL
//   replica: {name: events-0, host: events-0.events-headless}
//   dataDir: /var/lib/rtable
//   listen: 0.0.0.0
//   ports: {http: 8123, metrics: 9363}
//   api:                          # optional: who may call the replica API
//     tokensFile: /etc/rtable/api/tokens  # bearer tokens, one per line (several: rotation)
//     readsNeedToken: false       # select, count, parts, replica: also only with a token
//   replication:                  # optional
//     secretFile: /etc/rtable/interserver/secret   # shared by the replicas; guards part fetches
//     fetchThreads: 4
//     mergeThreads: 2
//     minLogsToKeep: 10           # log entries always kept
//     maxLogsToKeep: 1000         # an offline replica further behind is marked lost
//     cleanupPeriodSeconds: 30
//     fetchConnectTimeoutMs: 1000    # a source not connected by then: the next replica is tried
//     fetchReceiveTimeoutMs: 30000   # a source that sends nothing for this long: the same
//   inserts:                      # optional: defaults for inserts that do not set them
//     quorum: 2                   # insert_quorum (0: off; "auto": a majority of the replicas)
//     quorumTimeoutMs: 600000     # insert_quorum_timeout
//     async:                      # async inserts (async_insert.h), ClickHouse's names and defaults
//       enabled: false            # async_insert for requests that do not say
//       wait: true                # wait_for_async_insert: answer once committed and durable
//       maxDataSize: 1000000      # async_insert_max_data_size: bytes of values per flush
//       maxQueryNumber: 450       # async_insert_max_query_number: inserts per flush
//       busyTimeoutMs: 200        # async_insert_busy_timeout_ms: the oldest insert waits no longer
//       staleTimeoutMs: 5         # async_insert_stale_timeout_ms: flush once none came this long
//       maxBufferedBytes: 67108864  # buffered and flushing together; beyond it: 503 Retry-After
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <string>

#include "rtable/replication_core/dedup_window.h"
#include "rtable/replication_core/table_paths.h"
#include "rtable/replication_core/table_schema.h"
#include "rtable/replication_core/zookeeper_client.h"

namespace rtable::core {

// How a replica gathers async inserts (async_insert.h). Defaults: ClickHouse's (23.x+), but the
// stale timeout, which ClickHouse leaves off (0): with it a burst of inserts is flushed as soon as
// it ends, not a busy timeout later, so clients that wait for their answer are not held 200 ms.
struct AsyncInsertSettings {
  bool enabled = false;
  bool wait = true;
  std::size_t max_data_size = 1'000'000;
  std::size_t max_query_number = 450;
  std::chrono::milliseconds busy_timeout{200};
  std::chrono::milliseconds stale_timeout{5};
  std::size_t max_buffered_bytes = 64 << 20;
  friend bool operator==(const AsyncInsertSettings&, const AsyncInsertSettings&) = default;
};

struct TableSpec {
  std::string table;
  std::string uid;
  TableSchema schema;
  DedupWindow deduplication;
  std::string zookeeper_connect;
  std::string zookeeper_root = "/rtable/tables";
  std::chrono::milliseconds zookeeper_session_timeout{30000};
  // The table's ZooKeeper identity (digest scheme), read from zookeeper_credentials_dir; empty:
  // none, the table's nodes are created open to all (tables made before ACLs, tests).
  std::filesystem::path zookeeper_credentials_dir;
  std::string zookeeper_user;
  std::string zookeeper_password;
  std::string zookeeper_previous_password;  // file previousPassword, during a rotation
  std::string replica;
  std::string replica_host = "127.0.0.1";  // how other replicas reach this one
  std::filesystem::path data_dir;
  std::string listen_address = "0.0.0.0";
  // Bearer tokens of the replica API (read from api_tokens_file, one per line); empty: every
  // endpoint is open (no token configured). With tokens, insert, drop_partition, drop_replica
  // and sync need one, and the reads too when api_reads_need_token.
  std::filesystem::path api_tokens_file;
  std::vector<std::string> api_tokens;
  bool api_reads_need_token = false;
  uint16_t http_port = 8123;
  uint16_t metrics_port = 9363;
  // TLS for the API and part fetches: a directory in cert-manager's Secret layout (tls.crt,
  // tls.key, optional ca.crt). Empty: plain HTTP. With it the API serves HTTPS only, the replica
  // advertises "scheme: https", and its fetches from HTTPS replicas trust ca.crt (else the system's
  // roots) and check the source's host name. parseYaml() checks that both sides load.
  std::filesystem::path tls_dir;
  // Replicas fetch parts from each other only with this secret; without one a replica serves no
  // parts and fetches none. parseYaml() reads it from interserver_secret_file
  // (replication.secretFile): its first line. Further lines are secrets still accepted during a
  // rotation (docs/security.md): fetches from this replica may prove any of them, and its own
  // fetches that a source refuses (401) are tried again with each.
  std::string interserver_secret;
  std::vector<std::string> interserver_previous_secrets;
  std::filesystem::path interserver_secret_file;  // empty: no secret
  std::size_t fetch_threads = 4;                  // the fetch pool (I/O)
  std::size_t merge_threads = 2;                  // the merge pool (CPU, disk); 2 cores here
  // Log trimming by the leader (ClickHouse's min/max_replicated_logs_to_keep,
  // cleanup_delay_period).
  std::size_t min_logs_to_keep = 10;
  std::size_t max_logs_to_keep = 1000;
  std::chrono::seconds cleanup_period{30};
  // Part fetches (ClickHouse's connection timeout for fetches is 1 s; its receive timeout for
  // HTTP is 30 s); written to the config only when they differ, so existing pods do not roll.
  static constexpr std::chrono::milliseconds kDefaultFetchConnectTimeout{1000};
  static constexpr std::chrono::milliseconds kDefaultFetchReceiveTimeout{30000};
  std::chrono::milliseconds fetch_connect_timeout = kDefaultFetchConnectTimeout;
  std::chrono::milliseconds fetch_receive_timeout = kDefaultFetchReceiveTimeout;
  // The table's insert_quorum for inserts whose request gives none (a request's own, even 0, wins).
  std::size_t insert_quorum = 0;
  bool insert_quorum_auto = false;
  static constexpr std::chrono::milliseconds kDefaultInsertQuorumTimeout{600000};  // ClickHouse's
  std::chrono::milliseconds insert_quorum_timeout = kDefaultInsertQuorumTimeout;
  AsyncInsertSettings async_inserts;

  // Also reads the secret file, so that a spec that parses is one the replica can serve with.
  static std::expected<TableSpec, std::string> parseYaml(const std::string& text);
  static std::expected<TableSpec, std::string> load(const std::filesystem::path& file);
  // Every field (defaults too) but the secret itself, which stays in its file: parseYaml gives the
  // same spec back. inserts.quorumTimeoutMs and inserts.async are left out at their defaults, so
  // that configs rendered before it was written keep their bytes (the operator rolls the pods when
  // the config changes).
  std::string formatYaml() const;

  // The ZooKeeper tree's root for this table: <zookeeper_root>/<uid>.
  std::string tableRoot() const { return zookeeper_root + "/" + uid; }
  // The session's identities: the table's own, owning tableRoot(), when it has one.
  std::vector<ZooKeeperDigest> zookeeperDigests() const;
  // The text stored in <generation>/metadata: replicas of one table must agree on it.
  std::string metadataText() const;

  friend bool operator==(const TableSpec&, const TableSpec&) = default;
};

}  // namespace rtable::core
