#include "rtable/controllers/core_config.h"

#include <fmt/format.h>

namespace rtable::controllers {

std::string tableUid(std::string_view ns, std::string_view name) {
  return fmt::format("{}.{}", ns, name);
}

core::TableSpec coreTableSpec(const ReplicatedTableSpec& spec, const CoreConfigContext& context) {
  core::TableSpec core;
  core.table = spec.table;
  core.uid = context.uid.empty() ? tableUid(context.ns, context.name) : context.uid;
  core.schema = spec.schema();
  core.deduplication.max_ids = static_cast<std::size_t>(spec.deduplication.window);
  core.deduplication.max_age = std::chrono::seconds(spec.deduplication.window_seconds);
  core.zookeeper_connect = spec.zookeeper.connect;
  core.zookeeper_root = spec.zookeeper.root;
  core.zookeeper_session_timeout = std::chrono::milliseconds(spec.zookeeper.session_timeout_ms);
  core.zookeeper_credentials_dir = context.zookeeper_credentials_dir;
  core.replica = context.replica_name;
  core.replica_host = context.replica_host;
  core.data_dir = context.data_dir;
  core.listen_address = context.listen;
  core.http_port = context.http_port;
  core.metrics_port = context.metrics_port;
  core.interserver_secret_file = context.secret_file;
  if (spec.api.token_required) {
    core.api_tokens_file = context.api_tokens_file;
    core.api_reads_need_token = spec.api.reads_need_token;
  }
  if (spec.tls.enabled()) core.tls_dir = context.tls_dir;
  const ReplicationSettings& r = spec.replication;
  core.fetch_threads = static_cast<std::size_t>(r.fetch_threads);
  core.merge_threads = static_cast<std::size_t>(r.merge_threads);
  core.min_logs_to_keep = static_cast<std::size_t>(r.min_logs_to_keep);
  core.max_logs_to_keep = static_cast<std::size_t>(r.max_logs_to_keep);
  core.cleanup_period = std::chrono::seconds(r.cleanup_period_seconds);
  core.fetch_connect_timeout = std::chrono::milliseconds(r.fetch_connect_timeout_ms);
  core.fetch_receive_timeout = std::chrono::milliseconds(r.fetch_receive_timeout_ms);
  // spec.insertQuorum: the quorum of inserts that give none (a request's insert_quorum wins).
  core.insert_quorum = static_cast<std::size_t>(spec.insert_quorum);
  // spec.asyncInserts: written to the config only when not the defaults (no roll of old tables).
  core.async_inserts = spec.async_inserts;
  return core;
}

std::string renderCoreConfig(const ReplicatedTableSpec& spec, const CoreConfigContext& context) {
  return fmt::format(
             "# rtable-core spec of ReplicatedTable {}/{}, rendered by rtable-operator "
             "(docs/rtable-core.md).\n"
             "# Each pod sets its own replica name and host with --replica-name and "
             "--replica-host.\n",
             context.ns, context.name) +
         coreTableSpec(spec, context).formatYaml();
}

}  // namespace rtable::controllers
