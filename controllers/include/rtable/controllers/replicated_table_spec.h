// ReplicatedTableSpec: the spec of a ReplicatedTable custom resource
// (crds/rtable.io_replicatedtables.yaml, docs/crds.md) as plain data.
//
// parse() applies the same defaults and checks as the CRD's schema, plus what the schema cannot
// say as clearly (every check of rtable-core's TableSchema::create), so a spec that parses is one
// rtable-core will serve. Errors name the field's path. The table fields use rtable-core's own
// types (DataType, PartitionKey) so the CRD and the core cannot drift apart.
//
// Plain copyable values; no shared state: thread-safe as values are.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/spec_error.h"
#include "rtable/replication_core/table_schema.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::controllers {

struct ZooKeeperSettings {
  std::string connect;  // host:port[,host:port...]
  std::string root = "/rtable/tables";
  int64_t session_timeout_ms = 30000;
  // A `kubernetes.io/basic-auth` Secret in the table's namespace holding the table's ZooKeeper
  // identity (docs/security.md); none: the operator makes `<name>-zookeeper`. Immutable: the
  // table's nodes carry the identity's ACL.
  std::optional<std::string> credentials_secret;
  friend bool operator==(const ZooKeeperSettings&, const ZooKeeperSettings&) = default;
};

// Who may call the replica API (docs/security.md): with `token_required`, insert, drop_partition,
// drop_replica and sync need a bearer token from the Secret (and the reads too with
// `reads_need_token`); otherwise every endpoint is open to whoever reaches the pods.
struct ApiSettings {
  bool token_required = true;                // authentication: Token | None
  std::optional<std::string> tokens_secret;  // key `tokens`; none: <name>-api-tokens, made
  bool reads_need_token = false;
  friend bool operator==(const ApiSettings&, const ApiSettings&) = default;
};

// spec.tls (docs/security.md): TLS for the replica API and part fetches, on when a Secret is
// named: cert-manager's layout (tls.crt, tls.key, ca.crt), a certificate for
// `*.<name>-headless.<namespace>.svc` (how replicas address each other), renewed in place.
struct TlsSettings {
  std::optional<std::string> secret_name;
  bool enabled() const { return secret_name.has_value(); }
  friend bool operator==(const TlsSettings&, const TlsSettings&) = default;
};

// spec.networkPolicy (docs/security.md): with `enabled`, a NetworkPolicy `<name>` admits to the
// replicas only each other (part fetches), the API's clients and the metrics' scrapers.
struct NetworkPolicySettings {
  bool enabled = false;
  std::vector<nlohmann::json> api_from;      // networking/v1 NetworkPolicyPeers; empty: the
                                             // table's own namespace
  std::vector<nlohmann::json> metrics_from;  // empty: from anywhere
  friend bool operator==(const NetworkPolicySettings&, const NetworkPolicySettings&) = default;
};

struct StorageSettings {
  std::string size = "10Gi";  // a Kubernetes quantity
  std::optional<std::string> storage_class_name;
  friend bool operator==(const StorageSettings&, const StorageSettings&) = default;
};

// rtable-core's `deduplication` (DedupWindow; defaults from ClickHouse 25.9+).
struct DeduplicationSettings {
  int64_t window = 10000;
  int64_t window_seconds = 3600;
  friend bool operator==(const DeduplicationSettings&, const DeduplicationSettings&) = default;
};

// When the log counter's headroom counts as low (DESIGN.md 2.5, 2.6).
struct HeadroomPolicy {
  double threshold_percent = 5;
  int32_t exhaustion_days = 7;  // 0: only the percentage
  bool auto_recover = true;
  friend bool operator==(const HeadroomPolicy&, const HeadroomPolicy&) = default;
};

// rtable-core's `replication` section, apart from the secret the operator provides.
struct ReplicationSettings {
  int32_t fetch_threads = 4;
  int32_t merge_threads = 2;
  int64_t min_logs_to_keep = 10;
  int64_t max_logs_to_keep = 1000;
  int64_t cleanup_period_seconds = 30;
  int64_t fetch_connect_timeout_ms = 1000;
  int64_t fetch_receive_timeout_ms = 30000;
  friend bool operator==(const ReplicationSettings&, const ReplicationSettings&) = default;
};

// User additions to the replica pods; core/v1 shapes are kept as JSON and passed through.
struct PodTemplateAdditions {
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::vector<nlohmann::json> containers;  // core/v1 Container, beside rtable-core
  std::vector<nlohmann::json> env;         // core/v1 EnvVar, of the rtable-core container
  std::vector<nlohmann::json> volumes;     // core/v1 Volume
  // core/v1 VolumeMount of the rtable-core container, of the volumes above (a filesystem backup
  // destination: the same path on every replica, on a root that is read-only).
  std::vector<nlohmann::json> volume_mounts;
  std::vector<nlohmann::json> tolerations;  // core/v1 Toleration
  std::map<std::string, std::string> node_selector;
  std::optional<std::string> priority_class_name;

  bool empty() const;
  friend bool operator==(const PodTemplateAdditions&, const PodTemplateAdditions&) = default;
};

// Where a table is restored from: exactly one of a ClusterBackup of its namespace (`backup`) or a
// backup found by its location (`filesystem_path`, `persistent_volume_claim` or `s3`, with `name`:
// another cluster's, or one whose ClusterBackup is gone, as after losing the cluster).
struct RestoreSource {
  std::string backup;  // a ClusterBackup in the table's namespace
  // With a location: the backup's name there (backups/<name>/).
  std::string name;
  std::string filesystem_path;  // a directory every replica mounts at this path
  // A claim of the table's namespace; the replicas mount it.
  std::optional<BackupDestination::PersistentVolumeClaim> persistent_volume_claim;
  std::optional<BackupDestination::S3> s3;  // a bucket; the replicas mount its credentials
  // The backup's table restored; empty: its only table (with `backup`, also the one named as
  // this ReplicatedTable).
  std::string table;
  // "ClusterBackup nightly" or "backup analytics.nightly in /backups", for messages.
  std::string describe() const;
  friend bool operator==(const RestoreSource&, const RestoreSource&) = default;
};

struct ReplicatedTableSpec {
  std::string table;
  std::vector<core::ColumnSpec> columns;
  core::PartitionKey partition_by;
  std::vector<std::string> order_by;
  int32_t replicas = 3;
  StorageSettings storage;
  nlohmann::json resources = nlohmann::json::object();  // core/v1 ResourceRequirements
  ZooKeeperSettings zookeeper;
  DeduplicationSettings deduplication;
  int32_t insert_quorum = 0;                // 0: off
  core::AsyncInsertSettings async_inserts;  // spec.asyncInserts: rtable-core's inserts.async
  ApiSettings api;                          // spec.api
  TlsSettings tls;                          // spec.tls
  NetworkPolicySettings network_policy;     // spec.networkPolicy
  HeadroomPolicy headroom;
  ReplicationSettings replication;
  PodTemplateAdditions pod_template;
  std::optional<RestoreSource> restore_from;
  // Secrets (in the table's namespace) the replica pods mount for S3 backup destinations, one
  // folder each under /etc/rtable/backup-credentials/ (rtable-core's openDestination).
  std::vector<std::string> backup_credentials;

  // PersistentVolumeClaims (in the table's namespace, ReadWriteMany) the replica pods mount for
  // volume backup destinations, one folder each under /var/lib/rtable-backup-volumes/.
  std::vector<std::string> backup_volumes;

  // backup_credentials, and restoreFrom.s3's Secret when it is not among them: what the pods mount.
  std::vector<std::string> mountedCredentials() const;
  // The Secret with the table's ZooKeeper identity: the one named, else `<table name>-zookeeper`.
  std::string zookeeperCredentialsSecret(const std::string& table_name) const;
  // The Secret with the API's bearer tokens: the one named, else `<table name>-api-tokens`.
  std::string apiTokensSecret(const std::string& table_name) const;
  // backup_volumes, and restoreFrom.persistentVolumeClaim's claim when it is not among them.
  std::vector<std::string> mountedVolumes() const;

  // `spec` is the object's .spec. Defaults are filled in as the CRD's schema fills them.
  static std::expected<ReplicatedTableSpec, SpecError> parse(const nlohmann::json& spec);
  // Every field, defaults included; parse(toJson()) gives the same spec back.
  nlohmann::json toJson() const;
  // The schema rtable-core builds from the same fields (never fails for a parsed spec).
  core::TableSchema schema() const;

  friend bool operator==(const ReplicatedTableSpec&, const ReplicatedTableSpec&) = default;
};

// metadata.name names the StatefulSet, its pods and the Services: a DNS-1035 label of at most
// 52 characters (the StatefulSet's controller-revision-hash label adds 11).
std::optional<SpecError> checkReplicatedTableName(std::string_view name);

// What an update may not change (the CRD's `self == oldSelf` rules): the table's name, its
// columns (names, order and types: rtable-core has no ALTER TABLE), partitionBy, orderBy,
// zookeeper.root, storage.storageClassName and restoreFrom.
std::optional<SpecError> checkReplicatedTableUpdate(const ReplicatedTableSpec& old_spec,
                                                    const ReplicatedTableSpec& new_spec);

}  // namespace rtable::controllers
