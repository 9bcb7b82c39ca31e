#include "rtable/controllers/core_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace rtable::controllers {

std::string tableUid(std::string_view ns, std::string_view name) { return fmt::format("{}.{}", ns, name); }

std::string renderCoreConfig(const ReplicatedTableSpec& spec, const CoreConfigContext& context) {
  YAML::Emitter out;
  out << YAML::Comment(fmt::format(
      "rtable-core spec of ReplicatedTable {}/{}, rendered by rtable-operator (docs/rtable-core.md).\n"
      "Each pod sets its own replica name and host with --replica-name and --replica-host.",
      context.ns, context.name));
  out << YAML::BeginMap;
  out << YAML::Key << "table" << YAML::Value << spec.table;
  out << YAML::Key << "uid" << YAML::Value << (context.uid.empty() ? tableUid(context.ns, context.name) : context.uid);
  out << YAML::Key << "columns" << YAML::Value << YAML::BeginSeq;
  for (const auto& column : spec.columns) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << column.name << YAML::Key << "type"
        << YAML::Value << column.type.name() << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "partitionBy" << YAML::Value << spec.partition_by.format();
  out << YAML::Key << "orderBy" << YAML::Value << YAML::Flow << spec.order_by;
  out << YAML::Key << "deduplication" << YAML::Value << YAML::BeginMap << YAML::Key << "window" << YAML::Value
      << spec.deduplication.window << YAML::Key << "windowSeconds" << YAML::Value << spec.deduplication.window_seconds
      << YAML::EndMap;
  out << YAML::Key << "zookeeper" << YAML::Value << YAML::BeginMap << YAML::Key << "connect" << YAML::Value
      << spec.zookeeper.connect << YAML::Key << "root" << YAML::Value << spec.zookeeper.root << YAML::Key
      << "sessionTimeoutMs" << YAML::Value << spec.zookeeper.session_timeout_ms << YAML::EndMap;
  out << YAML::Key << "replica" << YAML::Value << YAML::BeginMap << YAML::Key << "name" << YAML::Value
      << context.replica_name << YAML::Key << "host" << YAML::Value << context.replica_host << YAML::EndMap;
  out << YAML::Key << "dataDir" << YAML::Value << context.data_dir.string();
  out << YAML::Key << "listen" << YAML::Value << context.listen;
  out << YAML::Key << "ports" << YAML::Value << YAML::BeginMap << YAML::Key << "http" << YAML::Value
      << context.http_port << YAML::Key << "metrics" << YAML::Value << context.metrics_port << YAML::EndMap;
  const ReplicationSettings& r = spec.replication;
  out << YAML::Key << "replication" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "secretFile" << YAML::Value << context.secret_file.string();
  out << YAML::Key << "fetchThreads" << YAML::Value << r.fetch_threads;
  out << YAML::Key << "mergeThreads" << YAML::Value << r.merge_threads;
  out << YAML::Key << "minLogsToKeep" << YAML::Value << r.min_logs_to_keep;
  out << YAML::Key << "maxLogsToKeep" << YAML::Value << r.max_logs_to_keep;
  out << YAML::Key << "cleanupPeriodSeconds" << YAML::Value << r.cleanup_period_seconds;
  out << YAML::EndMap;
  // spec.insertQuorum: the quorum of inserts that give none (a request's insert_quorum wins).
  out << YAML::Key << "inserts" << YAML::Value << YAML::BeginMap << YAML::Key << "quorum" << YAML::Value
      << spec.insert_quorum << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace rtable::controllers
