// The rtable-core spec (docs/rtable-core.md) a ReplicatedTable's replicas run with, as
// rtable-core's own TableSpec, and its YAML (TableSpec::formatYaml) for the table's ConfigMap. The
// table fields come from the ReplicatedTableSpec 1:1; the rest (ZooKeeper identity, paths inside
// the pod, ports) from the context below.
//
// One ConfigMap serves every pod of the StatefulSet, so each pod passes its own identity on the
// command line (`--replica-name=$(POD_NAME) --replica-host=$(POD_NAME).<headless>.<ns>.svc`),
// which rtable-core applies over the file's replica section. Pure functions: thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/replication_core/table_spec.h"

namespace rtable::controllers {

// The file's replica name and host when the pods give theirs by flag.
inline constexpr std::string_view kReplicaFromFlag = "set-by-replica-name-flag";
inline constexpr std::string_view kReplicaHostFromFlag = "set-by-replica-host-flag";

struct CoreConfigContext {
  std::string name;  // the ReplicatedTable's metadata.name
  std::string ns;    // and namespace
  // The table's ZooKeeper identity (<zookeeper.root>/<uid>); empty: tableUid(ns, name).
  std::string uid;
  std::string replica_name = std::string(kReplicaFromFlag);
  std::string replica_host = std::string(kReplicaHostFromFlag);
  std::filesystem::path data_dir = "/var/lib/rtable";                    // the PVC's mount
  std::filesystem::path secret_file = "/etc/rtable/interserver/secret";  // the Secret's mount
  // Where the table's ZooKeeper identity is mounted (`username`, `password`); empty: none.
  std::filesystem::path zookeeper_credentials_dir = "/etc/rtable/zookeeper";
  // Where the API's bearer tokens are mounted (spec.api.authentication Token); empty: none.
  std::filesystem::path api_tokens_file = "/etc/rtable/api/tokens";
  // Where the TLS Secret is mounted (spec.tls); used only when the spec names one.
  std::filesystem::path tls_dir = "/etc/rtable/tls";
  std::string listen = "0.0.0.0";
  uint16_t http_port = 8123;
  uint16_t metrics_port = 9363;
};

// "<namespace>.<name>": unique in a cluster (a namespace has no dots) and readable in ZooKeeper.
std::string tableUid(std::string_view ns, std::string_view name);

// The replicas' spec. Its interserver secret is only named (context.secret_file): the pods have it.
core::TableSpec coreTableSpec(const ReplicatedTableSpec& spec, const CoreConfigContext& context);

// coreTableSpec's YAML under a comment naming the table; rtable-core's TableSpec::parseYaml reads
// it back to the same spec (the secret read from its file).
std::string renderCoreConfig(const ReplicatedTableSpec& spec, const CoreConfigContext& context);

}  // namespace rtable::controllers
