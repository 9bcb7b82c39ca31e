#include "rtable/controllers/replicated_table_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <regex>
#include <set>

#include "destination_specs.h"
#include "json_fields.h"

namespace rtable::controllers {
namespace {

using detail::fail;
using detail::indexPath;
using detail::JsonFields;
using nlohmann::json;

// The patterns of crds/rtable.io_replicatedtables.yaml (ECMAScript and RE2 read them alike).
const std::regex& identifierPattern() {
  static const std::regex pattern("[A-Za-z_][A-Za-z0-9_]*");
  return pattern;
}
const std::regex& quantityPattern() {
  static const std::regex pattern(
      R"((\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?)");
  return pattern;
}
const std::regex& connectPattern() {
  static const std::regex pattern(R"([^,:\s/]+:[0-9]{1,5}(,[^,:\s/]+:[0-9]{1,5})*)");
  return pattern;
}
const std::regex& zookeeperRootPattern() {
  static const std::regex pattern(R"((/[^/\s]+)+)");
  return pattern;
}
const std::regex& dns1123LabelPattern() {
  static const std::regex pattern("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return pattern;
}
const std::regex& dns1035LabelPattern() {
  static const std::regex pattern("[a-z]([-a-z0-9]*[a-z0-9])?");
  return pattern;
}

constexpr std::size_t kMaxNameLength = 128;
constexpr std::size_t kMaxColumns = 256;
constexpr std::size_t kMaxOrderBy = 32;
constexpr std::string_view kCoreContainer = "rtable-core";

bool isDateLike(core::TypeId id) {
  return id == core::TypeId::kDate || id == core::TypeId::kDateTime;
}

std::vector<core::ColumnSpec> parseColumns(JsonFields& spec) {
  if (!spec.find("columns")) fail(spec.at("columns"), "required");
  const json& list = spec.array("columns", kMaxColumns);
  if (list.empty()) fail(spec.at("columns"), "a table needs at least one column");
  std::vector<core::ColumnSpec> columns;
  std::set<std::string> names;
  for (std::size_t i = 0; i < list.size(); ++i) {
    JsonFields column(list[i], indexPath(spec.at("columns"), i));
    core::ColumnSpec c;
    c.name = column.string("name", kMaxNameLength);
    detail::checkPattern(column.at("name"), c.name, identifierPattern(),
                         "an identifier (letters, digits, '_', not starting with a digit)");
    auto type = core::DataType::parse(column.string("type"));
    if (!type) fail(column.at("type"), type.error());
    c.type = *type;
    column.rejectUnknown();
    if (!names.insert(c.name).second)
      fail(column.at("name"), fmt::format("column '{}' is declared twice", c.name));
    columns.push_back(std::move(c));
  }
  return columns;
}

// The same rules as TableSchema::create, with the field's path.
core::PartitionKey parsePartitionKey(JsonFields& spec,
                                     const std::vector<core::ColumnSpec>& columns) {
  const std::string path = spec.at("partitionBy");
  const std::string text = spec.optionalString("partitionBy", 140).value_or("tuple()");
  auto key = core::PartitionKey::parse(text);
  if (!key) fail(path, key.error());
  if (key->kind == core::PartitionKey::Kind::kNone) return *key;
  const core::ColumnSpec* column = nullptr;
  for (const auto& c : columns) {
    if (c.name == key->column) column = &c;
  }
  if (!column) fail(path, fmt::format("{} names no column of the table", key->format()));
  if (column->type.nullable)
    fail(path, fmt::format("partition key column '{}' must not be Nullable", column->name));
  if (key->kind != core::PartitionKey::Kind::kColumn && !isDateLike(column->type.id)) {
    fail(path, fmt::format("{} needs a Date or DateTime column, '{}' is {}", key->format(),
                           column->name, column->type.name()));
  }
  return *key;
}

std::vector<std::string> parseOrderBy(JsonFields& spec,
                                      const std::vector<core::ColumnSpec>& columns) {
  const json& list = spec.array("orderBy", kMaxOrderBy);
  std::vector<std::string> order_by;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = indexPath(spec.at("orderBy"), i);
    if (!list[i].is_string()) fail(path, "expected a column name");
    std::string name = list[i].get<std::string>();
    bool found = false;
    for (const auto& c : columns) found = found || c.name == name;
    if (!found) fail(path, fmt::format("'{}' is not a column of the table", name));
    order_by.push_back(std::move(name));
  }
  return order_by;
}

void checkQuantity(const std::string& path, const json& value) {
  if (value.is_number_integer()) return;
  if (!value.is_string())
    fail(path, fmt::format("expected a quantity, got {}", detail::jsonTypeName(value)));
  detail::checkPattern(path, value.get<std::string>(), quantityPattern(),
                       "a quantity (e.g. 500m, 2Gi)");
}

json parseResources(JsonFields& spec) {
  const json* value = spec.find("resources");
  if (!value) return json::object();
  JsonFields resources(*value, spec.at("resources"));
  for (const char* key : {"limits", "requests"}) {
    const json* map = resources.find(key);
    if (!map) continue;
    if (!map->is_object()) fail(resources.at(key), "expected a map of quantities");
    for (const auto& [name, quantity] : map->items())
      checkQuantity(resources.at(key) + "." + name, quantity);
  }
  resources.rejectUnknown();
  return *value;
}

// Items of a pass-through list: objects with a unique `name` matching `name_pattern`.
std::vector<json> parseNamedObjects(JsonFields& parent, const std::string& key,
                                    std::size_t max_items, const std::regex* name_pattern,
                                    std::string_view pattern_text) {
  const json& list = parent.array(key, max_items);
  std::vector<json> items;
  std::set<std::string> names;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = indexPath(parent.at(key), i);
    if (!list[i].is_object()) fail(path, "expected an object");
    auto name = list[i].find("name");
    if (name == list[i].end() || !name->is_string() || name->get<std::string>().empty()) {
      fail(path + ".name", "required");
    }
    const std::string text = name->get<std::string>();
    if (name_pattern) detail::checkPattern(path + ".name", text, *name_pattern, pattern_text);
    if (!names.insert(text).second) fail(path + ".name", fmt::format("'{}' is given twice", text));
    items.push_back(list[i]);
  }
  return items;
}

// A LabelSelector: matchLabels and matchExpressions (the apiserver checks the expressions).
void checkLabelSelector(JsonFields& parent, const std::string& key) {
  const json* value = parent.find(key);
  if (!value) return;
  JsonFields selector(*value, parent.at(key));
  selector.stringMap("matchLabels");
  const json& expressions = selector.array("matchExpressions", 64);
  for (std::size_t i = 0; i < expressions.size(); ++i) {
    JsonFields expression(expressions[i], indexPath(selector.at("matchExpressions"), i));
    expression.string("key", 317);
    expression.string("operator", 16);
    expression.array("values", 256);
    expression.rejectUnknown();
  }
  selector.rejectUnknown();
}

// networking/v1 NetworkPolicyPeers: each a podSelector and/or namespaceSelector, or an ipBlock.
std::vector<json> parsePeers(JsonFields& parent, const std::string& key) {
  const json& list = parent.array(key, 32);
  std::vector<json> peers;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = indexPath(parent.at(key), i);
    JsonFields peer(list[i], path);
    checkLabelSelector(peer, "podSelector");
    checkLabelSelector(peer, "namespaceSelector");
    if (const json* value = peer.find("ipBlock")) {
      JsonFields block(*value, peer.at("ipBlock"));
      block.string("cidr", 64);
      const json& except = block.array("except", 64);
      for (std::size_t j = 0; j < except.size(); ++j) {
        if (!except[j].is_string())
          fail(indexPath(block.at("except"), j), "expected a CIDR string");
      }
      block.rejectUnknown();
      if (list[i].contains("podSelector") || list[i].contains("namespaceSelector"))
        fail(path, "an ipBlock stands alone: no podSelector or namespaceSelector beside it");
    }
    peer.rejectUnknown();
    if (!list[i].contains("podSelector") && !list[i].contains("namespaceSelector") &&
        !list[i].contains("ipBlock")) {
      fail(path, "a peer needs a podSelector, a namespaceSelector or an ipBlock");
    }
    peers.push_back(list[i]);
  }
  return peers;
}

PodTemplateAdditions parsePodTemplate(JsonFields& spec) {
  PodTemplateAdditions result;
  const json* value = spec.find("podTemplate");
  if (!value) return result;
  JsonFields pod(*value, spec.at("podTemplate"));
  if (const json* metadata = pod.find("metadata")) {
    JsonFields meta(*metadata, pod.at("metadata"));
    result.labels = meta.stringMap("labels");
    result.annotations = meta.stringMap("annotations");
    meta.rejectUnknown();
  }
  result.containers =
      parseNamedObjects(pod, "containers", 16, &dns1123LabelPattern(), "a DNS-1123 label");
  for (std::size_t i = 0; i < result.containers.size(); ++i) {
    if (result.containers[i]["name"] == kCoreContainer) {
      fail(indexPath(pod.at("containers"), i) + ".name",
           "the name rtable-core is taken by the replica's own container");
    }
  }
  result.env = parseNamedObjects(pod, "env", 128, nullptr, "");
  result.volumes = parseNamedObjects(pod, "volumes", 32, nullptr, "");
  std::set<std::string> volume_names;
  for (const auto& volume : result.volumes) volume_names.insert(volume["name"].get<std::string>());
  const json& mounts = pod.array("volumeMounts", 32);
  std::set<std::string> mount_paths;
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    const std::string path = indexPath(pod.at("volumeMounts"), i);
    JsonFields mount(mounts[i], path);
    const std::string name = mount.string("name", 63);
    if (!volume_names.contains(name))
      fail(mount.at("name"), fmt::format("'{}' is not a volume of podTemplate.volumes", name));
    const std::string target = mount.string("mountPath", 1024);
    if (!target.starts_with('/') || target.find("..") != std::string::npos)
      fail(mount.at("mountPath"), fmt::format("'{}' is not an absolute path", target));
    // The operator's own mounts stay its own.
    for (const std::string_view reserved : {"/var/lib/rtable", "/etc/rtable"}) {
      if (target == reserved || target.starts_with(std::string(reserved) + "/") ||
          std::string(reserved).starts_with(target == "/" ? "/" : target + "/")) {
        fail(mount.at("mountPath"),
             fmt::format("'{}' overlaps {}, where the operator mounts the replica's own volumes",
                         target, reserved));
      }
    }
    if (!mount_paths.insert(target).second)
      fail(mount.at("mountPath"), fmt::format("'{}' is mounted twice", target));
    mount.boolean("readOnly", false);
    mount.optionalString("subPath", 1024);
    mount.rejectUnknown();
    result.volume_mounts.push_back(mounts[i]);
  }
  const json& tolerations = pod.array("tolerations", 1000);
  for (std::size_t i = 0; i < tolerations.size(); ++i) {
    JsonFields toleration(tolerations[i], indexPath(pod.at("tolerations"), i));
    toleration.optionalString("key");
    toleration.optionalString("value");
    if (auto op = toleration.optionalString("operator"); op && *op != "Exists" && *op != "Equal") {
      fail(toleration.at("operator"), fmt::format("'{}' is not one of Exists, Equal", *op));
    }
    if (auto effect = toleration.optionalString("effect"); effect && *effect != "NoSchedule" &&
                                                           *effect != "PreferNoSchedule" &&
                                                           *effect != "NoExecute") {
      fail(toleration.at("effect"),
           fmt::format("'{}' is not one of NoSchedule, PreferNoSchedule, NoExecute", *effect));
    }
    toleration.optionalInteger("tolerationSeconds", INT64_MIN, INT64_MAX);
    toleration.rejectUnknown();
    result.tolerations.push_back(tolerations[i]);
  }
  result.node_selector = pod.stringMap("nodeSelector");
  result.priority_class_name = pod.optionalString("priorityClassName", 253);
  pod.rejectUnknown();
  return result;
}

// A list of object names of the table's namespace mounted into its pods (backupCredentials,
// backupVolumes): each a DNS-1123 subdomain, at most 16, none twice.
std::vector<std::string> parseNameList(JsonFields& spec, const char* key, std::string_view what) {
  std::vector<std::string> names;
  const json& list = spec.array(key, 16);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = indexPath(spec.at(key), i);
    if (!list[i].is_string()) fail(path, fmt::format("expected {}", what));
    std::string name = list[i].get<std::string>();
    if (name.size() > 253) fail(path, "may not be longer than 253 characters");
    detail::checkPattern(path, name, secretNamePattern(), what);
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      fail(path, fmt::format("'{}' is listed twice", name));
    }
    names.push_back(std::move(name));
  }
  return names;
}

ReplicatedTableSpec parseSpec(const json& object) {
  JsonFields spec(object, "spec");
  ReplicatedTableSpec result;
  result.table = spec.string("table", kMaxNameLength);
  detail::checkPattern(spec.at("table"), result.table, identifierPattern(),
                       "an identifier (letters, digits, '_', not starting with a digit)");
  result.columns = parseColumns(spec);
  result.partition_by = parsePartitionKey(spec, result.columns);
  result.order_by = parseOrderBy(spec, result.columns);
  result.replicas = static_cast<int32_t>(spec.integer("replicas", result.replicas, 1, 100));

  if (const json* value = spec.find("storage")) {
    JsonFields storage(*value, spec.at("storage"));
    if (auto size = storage.optionalString("size")) {
      detail::checkPattern(storage.at("size"), *size, quantityPattern(), "a quantity (e.g. 10Gi)");
      result.storage.size = *size;
    }
    result.storage.storage_class_name = storage.optionalString("storageClassName", 253);
    storage.rejectUnknown();
  }
  result.resources = parseResources(spec);

  if (!spec.find("zookeeper")) fail(spec.at("zookeeper"), "required");
  JsonFields zookeeper(*spec.find("zookeeper"), spec.at("zookeeper"));
  result.zookeeper.connect = zookeeper.string("connect", 1024);
  detail::checkPattern(zookeeper.at("connect"), result.zookeeper.connect, connectPattern(),
                       "host:port[,host:port...]");
  if (auto root = zookeeper.optionalString("root", 512)) {
    detail::checkPattern(zookeeper.at("root"), *root, zookeeperRootPattern(),
                         "an absolute ZooKeeper path without a trailing '/'");
    result.zookeeper.root = *root;
  }
  result.zookeeper.session_timeout_ms =
      zookeeper.integer("sessionTimeoutMs", result.zookeeper.session_timeout_ms, 1000, 600000);
  if (auto secret = zookeeper.optionalString("credentialsSecret", 253)) {
    detail::checkPattern(zookeeper.at("credentialsSecret"), *secret, secretNamePattern(),
                         "a Secret's name");
    result.zookeeper.credentials_secret = *secret;
  }
  zookeeper.rejectUnknown();

  if (const json* value = spec.find("deduplication")) {
    JsonFields dedup(*value, spec.at("deduplication"));
    result.deduplication.window =
        dedup.integer("window", result.deduplication.window, 0, 10'000'000);
    result.deduplication.window_seconds =
        dedup.integer("windowSeconds", result.deduplication.window_seconds, 0, 365 * 86400);
    dedup.rejectUnknown();
  }
  result.insert_quorum = static_cast<int32_t>(spec.integer("insertQuorum", 0, 0, 100));
  if (result.insert_quorum > result.replicas) {
    fail(spec.at("insertQuorum"),
         fmt::format("{} exceeds replicas ({}): the quorum could never be met",
                     result.insert_quorum, result.replicas));
  }

  if (const json* value = spec.find("networkPolicy")) {
    JsonFields policy(*value, spec.at("networkPolicy"));
    result.network_policy.enabled = policy.boolean("enabled", false);
    result.network_policy.api_from = parsePeers(policy, "apiFrom");
    result.network_policy.metrics_from = parsePeers(policy, "metricsFrom");
    policy.rejectUnknown();
  }

  if (const json* value = spec.find("api")) {
    JsonFields api(*value, spec.at("api"));
    if (auto mode = api.optionalString("authentication")) {
      if (*mode != "Token" && *mode != "None")
        fail(api.at("authentication"), fmt::format("'{}' must be Token or None", *mode));
      result.api.token_required = *mode == "Token";
    }
    if (auto secret = api.optionalString("tokensSecret", 253)) {
      detail::checkPattern(api.at("tokensSecret"), *secret, secretNamePattern(), "a Secret's name");
      if (!result.api.token_required)
        fail(api.at("tokensSecret"), "only with authentication Token");
      result.api.tokens_secret = *secret;
    }
    result.api.reads_need_token = api.boolean("readsNeedToken", false);
    if (result.api.reads_need_token && !result.api.token_required)
      fail(api.at("readsNeedToken"), "only with authentication Token");
    api.rejectUnknown();
  }

  if (const json* value = spec.find("tls")) {
    JsonFields tls(*value, spec.at("tls"));
    if (auto secret = tls.optionalString("secretName", 253)) {
      detail::checkPattern(tls.at("secretName"), *secret, secretNamePattern(), "a Secret's name");
      result.tls.secret_name = *secret;
    }
    tls.rejectUnknown();
  }

  if (const json* value = spec.find("asyncInserts")) {
    JsonFields async(*value, spec.at("asyncInserts"));
    core::AsyncInsertSettings& a = result.async_inserts;
    a.enabled = async.boolean("enabled", a.enabled);
    a.wait = async.boolean("wait", a.wait);
    a.max_data_size = static_cast<std::size_t>(
        async.integer("maxDataSize", static_cast<int64_t>(a.max_data_size), 1, int64_t{1} << 30));
    a.max_query_number = static_cast<std::size_t>(
        async.integer("maxQueryNumber", static_cast<int64_t>(a.max_query_number), 1, 100'000));
    a.busy_timeout = std::chrono::milliseconds(
        async.integer("busyTimeoutMs", a.busy_timeout.count(), 1, 600'000));
    a.stale_timeout = std::chrono::milliseconds(
        async.integer("staleTimeoutMs", a.stale_timeout.count(), 0, 600'000));
    a.max_buffered_bytes = static_cast<std::size_t>(async.integer(
        "maxBufferedBytes", static_cast<int64_t>(a.max_buffered_bytes), 1, int64_t{1} << 40));
    if (a.max_buffered_bytes < a.max_data_size) {
      fail(async.at("maxBufferedBytes"),
           fmt::format("{} is below maxDataSize ({}): one flush must fit", a.max_buffered_bytes,
                       a.max_data_size));
    }
    async.rejectUnknown();
  }

  if (const json* value = spec.find("headroom")) {
    JsonFields headroom(*value, spec.at("headroom"));
    result.headroom.threshold_percent =
        headroom.number("thresholdPercent", result.headroom.threshold_percent, 0, 100);
    result.headroom.exhaustion_days = static_cast<int32_t>(
        headroom.integer("exhaustionDays", result.headroom.exhaustion_days, 0, 3650));
    result.headroom.auto_recover = headroom.boolean("autoRecover", result.headroom.auto_recover);
    headroom.rejectUnknown();
  }

  if (const json* value = spec.find("replication")) {
    JsonFields replication(*value, spec.at("replication"));
    ReplicationSettings& r = result.replication;
    r.fetch_threads =
        static_cast<int32_t>(replication.integer("fetchThreads", r.fetch_threads, 1, 64));
    r.merge_threads =
        static_cast<int32_t>(replication.integer("mergeThreads", r.merge_threads, 1, 64));
    r.min_logs_to_keep = replication.integer("minLogsToKeep", r.min_logs_to_keep, 1, 1'000'000);
    r.max_logs_to_keep = replication.integer("maxLogsToKeep", r.max_logs_to_keep, 1, 10'000'000);
    r.cleanup_period_seconds =
        replication.integer("cleanupPeriodSeconds", r.cleanup_period_seconds, 1, 3600);
    r.fetch_connect_timeout_ms =
        replication.integer("fetchConnectTimeoutMs", r.fetch_connect_timeout_ms, 10, 600'000);
    r.fetch_receive_timeout_ms =
        replication.integer("fetchReceiveTimeoutMs", r.fetch_receive_timeout_ms, 100, 3'600'000);
    if (r.max_logs_to_keep < r.min_logs_to_keep) {
      fail(replication.at("maxLogsToKeep"),
           fmt::format("{} is below minLogsToKeep ({})", r.max_logs_to_keep, r.min_logs_to_keep));
    }
    replication.rejectUnknown();
  }

  result.pod_template = parsePodTemplate(spec);

  result.backup_credentials = parseNameList(spec, "backupCredentials", "a Secret's name");
  result.backup_volumes = parseNameList(spec, "backupVolumes", "a PersistentVolumeClaim's name");

  if (const json* value = spec.find("restoreFrom")) {
    JsonFields restore(*value, spec.at("restoreFrom"));
    RestoreSource source;
    source.backup = restore.optionalString("backup", 253).value_or("");
    source.name = restore.optionalString("name", 253).value_or("");
    source.table = restore.optionalString("table", 253).value_or("");
    if (const json* fs = restore.find("filesystem")) {
      JsonFields filesystem(*fs, restore.at("filesystem"));
      source.filesystem_path = filesystem.string("path", 4096);
      if (source.filesystem_path.size() < 2 || source.filesystem_path.front() != '/' ||
          source.filesystem_path.back() == '/') {
        fail(filesystem.at("path"), fmt::format("'{}' must be an absolute path without a "
                                                "trailing '/'",
                                                source.filesystem_path));
      }
      filesystem.rejectUnknown();
    }
    if (const json* pvc = restore.find("persistentVolumeClaim")) {
      source.persistent_volume_claim = parseVolumeClaim(*pvc, restore.at("persistentVolumeClaim"));
    }
    if (const json* s3 = restore.find("s3")) source.s3 = parseS3(*s3, restore.at("s3"));
    restore.rejectUnknown();
    const int locations = !source.filesystem_path.empty() +
                          source.persistent_volume_claim.has_value() + source.s3.has_value();
    if (!source.backup.empty() + locations != 1) {
      fail(restore.path(),
           "exactly one of backup, filesystem, persistentVolumeClaim and s3 must be given");
    }
    if ((locations > 0) == source.name.empty()) {
      fail(restore.at("name"),
           "name is given with filesystem, persistentVolumeClaim or s3, and only with them (the "
           "backup's name in that location)");
    }
    if (source.name.find('/') != std::string::npos || source.name == "..") {
      fail(restore.at("name"), fmt::format("'{}' is not a backup's name", source.name));
    }
    result.restore_from = std::move(source);
  }
  spec.rejectUnknown();

  // rtable-core must agree; the checks above are meant to have caught everything it would.
  auto schema = core::TableSchema::create(result.columns, result.partition_by, result.order_by);
  if (!schema) fail("spec.columns", schema.error());
  return result;
}

json namedListJson(const std::vector<json>& items) {
  json list = json::array();
  for (const auto& item : items) list.push_back(item);
  return list;
}

}  // namespace

bool PodTemplateAdditions::empty() const {
  return labels.empty() && annotations.empty() && containers.empty() && env.empty() &&
         volumes.empty() && volume_mounts.empty() && tolerations.empty() && node_selector.empty() &&
         !priority_class_name;
}

std::string RestoreSource::describe() const {
  if (!backup.empty()) return "ClusterBackup " + backup;
  if (persistent_volume_claim) {
    const auto& claim = *persistent_volume_claim;
    return claim.sub_path.empty()
               ? fmt::format("backup {} in pvc://{}", name, claim.claim_name)
               : fmt::format("backup {} in pvc://{}/{}", name, claim.claim_name, claim.sub_path);
  }
  if (s3) {
    return s3->prefix.empty()
               ? fmt::format("backup {} in s3://{}", name, s3->bucket)
               : fmt::format("backup {} in s3://{}/{}", name, s3->bucket, s3->prefix);
  }
  return fmt::format("backup {} in {}", name, filesystem_path);
}

std::vector<std::string> ReplicatedTableSpec::mountedVolumes() const {
  std::vector<std::string> claims = backup_volumes;
  if (restore_from && restore_from->persistent_volume_claim &&
      std::find(claims.begin(), claims.end(), restore_from->persistent_volume_claim->claim_name) ==
          claims.end()) {
    claims.push_back(restore_from->persistent_volume_claim->claim_name);
  }
  return claims;
}

std::string ReplicatedTableSpec::apiTokensSecret(const std::string& table_name) const {
  return api.tokens_secret.value_or(table_name + "-api-tokens");
}

std::string ReplicatedTableSpec::zookeeperCredentialsSecret(const std::string& table_name) const {
  return zookeeper.credentials_secret.value_or(table_name + "-zookeeper");
}

std::vector<std::string> ReplicatedTableSpec::mountedCredentials() const {
  std::vector<std::string> secrets = backup_credentials;
  if (restore_from && restore_from->s3 &&
      std::find(secrets.begin(), secrets.end(), restore_from->s3->credentials_secret) ==
          secrets.end()) {
    secrets.push_back(restore_from->s3->credentials_secret);
  }
  return secrets;
}

std::expected<ReplicatedTableSpec, SpecError> ReplicatedTableSpec::parse(const json& spec) {
  try {
    return parseSpec(spec);
  } catch (const detail::SpecFailure& failure) {
    return std::unexpected(failure.error);
  } catch (const json::exception& e) {
    // A shape the checks above missed: still an answer, never a crash.
    return std::unexpected(SpecError{"spec", e.what()});
  }
}

json ReplicatedTableSpec::toJson() const {
  json spec = json::object();
  spec["table"] = table;
  json cols = json::array();
  for (const auto& c : columns) cols.push_back({{"name", c.name}, {"type", c.type.name()}});
  spec["columns"] = std::move(cols);
  spec["partitionBy"] = partition_by.format();
  spec["orderBy"] = order_by;
  spec["replicas"] = replicas;
  spec["storage"] = {{"size", storage.size}};
  if (storage.storage_class_name) spec["storage"]["storageClassName"] = *storage.storage_class_name;
  if (!resources.empty()) spec["resources"] = resources;
  spec["zookeeper"] = {{"connect", zookeeper.connect},
                       {"root", zookeeper.root},
                       {"sessionTimeoutMs", zookeeper.session_timeout_ms}};
  if (zookeeper.credentials_secret)
    spec["zookeeper"]["credentialsSecret"] = *zookeeper.credentials_secret;
  spec["deduplication"] = {{"window", deduplication.window},
                           {"windowSeconds", deduplication.window_seconds}};
  spec["insertQuorum"] = insert_quorum;
  spec["networkPolicy"] = {{"enabled", network_policy.enabled}};
  if (!network_policy.api_from.empty()) spec["networkPolicy"]["apiFrom"] = network_policy.api_from;
  if (!network_policy.metrics_from.empty())
    spec["networkPolicy"]["metricsFrom"] = network_policy.metrics_from;
  spec["api"] = {{"authentication", api.token_required ? "Token" : "None"},
                 {"readsNeedToken", api.reads_need_token}};
  if (api.tokens_secret) spec["api"]["tokensSecret"] = *api.tokens_secret;
  if (tls.secret_name) spec["tls"] = {{"secretName", *tls.secret_name}};
  spec["asyncInserts"] = {{"enabled", async_inserts.enabled},
                          {"wait", async_inserts.wait},
                          {"maxDataSize", async_inserts.max_data_size},
                          {"maxQueryNumber", async_inserts.max_query_number},
                          {"busyTimeoutMs", async_inserts.busy_timeout.count()},
                          {"staleTimeoutMs", async_inserts.stale_timeout.count()},
                          {"maxBufferedBytes", async_inserts.max_buffered_bytes}};
  spec["headroom"] = {{"thresholdPercent", headroom.threshold_percent},
                      {"exhaustionDays", headroom.exhaustion_days},
                      {"autoRecover", headroom.auto_recover}};
  spec["replication"] = {{"fetchThreads", replication.fetch_threads},
                         {"mergeThreads", replication.merge_threads},
                         {"minLogsToKeep", replication.min_logs_to_keep},
                         {"maxLogsToKeep", replication.max_logs_to_keep},
                         {"cleanupPeriodSeconds", replication.cleanup_period_seconds},
                         {"fetchConnectTimeoutMs", replication.fetch_connect_timeout_ms},
                         {"fetchReceiveTimeoutMs", replication.fetch_receive_timeout_ms}};
  if (!pod_template.empty()) {
    json pod = json::object();
    const PodTemplateAdditions& p = pod_template;
    if (!p.labels.empty()) pod["metadata"]["labels"] = detail::stringMapJson(p.labels);
    if (!p.annotations.empty())
      pod["metadata"]["annotations"] = detail::stringMapJson(p.annotations);
    if (!p.containers.empty()) pod["containers"] = namedListJson(p.containers);
    if (!p.env.empty()) pod["env"] = namedListJson(p.env);
    if (!p.volumes.empty()) pod["volumes"] = namedListJson(p.volumes);
    if (!p.volume_mounts.empty()) pod["volumeMounts"] = p.volume_mounts;
    if (!p.tolerations.empty()) pod["tolerations"] = namedListJson(p.tolerations);
    if (!p.node_selector.empty()) pod["nodeSelector"] = detail::stringMapJson(p.node_selector);
    if (p.priority_class_name) pod["priorityClassName"] = *p.priority_class_name;
    spec["podTemplate"] = std::move(pod);
  }
  if (restore_from) {
    json restore = json::object();
    if (!restore_from->backup.empty()) restore["backup"] = restore_from->backup;
    if (!restore_from->name.empty()) restore["name"] = restore_from->name;
    if (!restore_from->filesystem_path.empty())
      restore["filesystem"] = {{"path", restore_from->filesystem_path}};
    if (restore_from->persistent_volume_claim) {
      restore["persistentVolumeClaim"] = volumeClaimJson(*restore_from->persistent_volume_claim);
    }
    if (restore_from->s3) restore["s3"] = s3Json(*restore_from->s3);
    if (!restore_from->table.empty()) restore["table"] = restore_from->table;
    spec["restoreFrom"] = std::move(restore);
  }
  if (!backup_credentials.empty()) spec["backupCredentials"] = backup_credentials;
  if (!backup_volumes.empty()) spec["backupVolumes"] = backup_volumes;
  return spec;
}

core::TableSchema ReplicatedTableSpec::schema() const {
  auto schema = core::TableSchema::create(columns, partition_by, order_by);
  // parse() has run the same checks; a hand-built spec that fails them is a programming error.
  if (!schema) throw std::logic_error("ReplicatedTableSpec::schema: " + schema.error());
  return std::move(*schema);
}

std::optional<SpecError> checkReplicatedTableName(std::string_view name) {
  const std::string text(name);
  if (name.size() > 52 || !std::regex_match(text, dns1035LabelPattern())) {
    return SpecError{
        "metadata.name",
        fmt::format("'{}' must be a DNS-1035 label (lower case letters, digits, '-', starting "
                    "with a letter) of at most 52 characters: it names the table's "
                    "StatefulSet, pods and Services",
                    name)};
  }
  return std::nullopt;
}

std::optional<SpecError> checkReplicatedTableUpdate(const ReplicatedTableSpec& old_spec,
                                                    const ReplicatedTableSpec& new_spec) {
  if (new_spec.table != old_spec.table) return SpecError{"spec.table", "table is immutable"};
  bool same_names = new_spec.columns.size() == old_spec.columns.size();
  for (std::size_t i = 0; same_names && i < new_spec.columns.size(); ++i) {
    same_names = new_spec.columns[i].name == old_spec.columns[i].name;
  }
  // Types first where the names line up, as the CRD's per-column rule reports them.
  for (std::size_t i = 0; i < new_spec.columns.size(); ++i) {
    for (const auto& old_column : old_spec.columns) {
      if (old_column.name == new_spec.columns[i].name &&
          old_column.type != new_spec.columns[i].type) {
        return SpecError{
            indexPath("spec.columns", i) + ".type",
            fmt::format("a column's type is immutable ('{}' is {}, was {})", old_column.name,
                        new_spec.columns[i].type.name(), old_column.type.name())};
      }
    }
  }
  if (!same_names) {
    return SpecError{
        "spec.columns",
        "columns cannot be added, removed or reordered (rtable-core has no ALTER TABLE)"};
  }
  if (new_spec.partition_by != old_spec.partition_by)
    return SpecError{"spec.partitionBy", "partitionBy is immutable"};
  if (new_spec.order_by != old_spec.order_by)
    return SpecError{"spec.orderBy", "orderBy is immutable"};
  if (new_spec.zookeeper.root != old_spec.zookeeper.root) {
    return SpecError{"spec.zookeeper.root", "zookeeper.root is immutable"};
  }
  if (new_spec.zookeeper.credentials_secret != old_spec.zookeeper.credentials_secret) {
    return SpecError{"spec.zookeeper.credentialsSecret",
                     "zookeeper.credentialsSecret is immutable (the table's nodes carry its ACL)"};
  }
  if (new_spec.storage.storage_class_name != old_spec.storage.storage_class_name) {
    return SpecError{"spec.storage.storageClassName", "storageClassName is immutable"};
  }
  // The CRD's two rules, worded alike: given or taken away after creation, or changed.
  if (new_spec.restore_from.has_value() != old_spec.restore_from.has_value()) {
    return SpecError{"spec.restoreFrom", "restoreFrom can only be given when the table is created"};
  }
  if (new_spec.restore_from != old_spec.restore_from) {
    return SpecError{"spec.restoreFrom", "restoreFrom is immutable"};
  }
  return std::nullopt;
}

}  // namespace rtable::controllers
