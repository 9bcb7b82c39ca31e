#include "rtable/replication_core/table_spec.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "rtable/common/secret_file.h"
#include "rtable/common/tls.h"

namespace rtable::core {
namespace {

struct SpecError {
  std::string message;
};

// Reads a mapping's fields by name and remembers which it saw, so unknown (misspelt) keys are
// reported instead of silently ignored. yaml-cpp's exceptions end here.
class Fields {
 public:
  Fields(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {
    if (!node_.IsMap()) throw SpecError{fmt::format("{}: expected a mapping", where())};
  }

  std::string where(std::string_view key = {}) const {
    if (key.empty()) return path_.empty() ? "spec" : path_;
    return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
  }

  bool has(const std::string& key) {
    seen_.insert(key);
    return node_[key].IsDefined() && !node_[key].IsNull();
  }

  YAML::Node node(const std::string& key) {
    seen_.insert(key);
    return node_[key];
  }

  std::string string(const std::string& key, std::optional<std::string> fallback = std::nullopt) {
    if (!has(key)) {
      if (fallback) return *fallback;
      throw SpecError{fmt::format("{}: required", where(key))};
    }
    const YAML::Node value = node_[key];
    if (!value.IsScalar()) throw SpecError{fmt::format("{}: expected a string", where(key))};
    return value.Scalar();
  }

  template <class T>
  T number(const std::string& key, T fallback, T min, T max) {
    if (!has(key)) return fallback;
    const std::string text = node_[key].IsScalar() ? node_[key].Scalar() : "";
    int64_t value = 0;
    std::istringstream in(text);
    if (!(in >> value) || !in.eof() || value < static_cast<int64_t>(min) ||
        value > static_cast<int64_t>(max)) {
      throw SpecError{fmt::format("{}: expected a whole number from {} to {}, got '{}'", where(key),
                                  min, max, text)};
    }
    return static_cast<T>(value);
  }

  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const std::string text = node_[key].IsScalar() ? node_[key].Scalar() : "";
    if (text == "true") return true;
    if (text == "false") return false;
    throw SpecError{fmt::format("{}: expected true or false, got '{}'", where(key), text)};
  }

  void rejectUnknown() const {
    for (const auto& entry : node_) {
      const std::string key = entry.first.as<std::string>();
      if (!seen_.contains(key)) throw SpecError{fmt::format("{}: unknown field", where(key))};
    }
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> seen_;
};

// A secret from a file (a mounted Secret's key); `field` names the spec field in errors.
std::string readSecretFile(const std::string& field, const std::filesystem::path& file) {
  auto secret = common::readSecretFile(file);
  if (!secret) throw SpecError{fmt::format("{}: {}", field, secret.error())};
  return *secret;
}

TableSpec parse(const YAML::Node& root) {
  Fields spec(root, "");
  TableSpec result;
  result.table = spec.string("table");
  result.uid = spec.string("uid", result.table);
  if (result.uid.empty() || result.uid.find('/') != std::string::npos) {
    throw SpecError{fmt::format("uid: '{}' must be non-empty and contain no '/'", result.uid)};
  }

  const YAML::Node columns = spec.node("columns");
  if (!columns.IsSequence() || columns.size() == 0) {
    throw SpecError{"columns: expected a non-empty list of {name, type}"};
  }
  std::vector<ColumnSpec> column_specs;
  for (std::size_t i = 0; i < columns.size(); ++i) {
    Fields column(columns[i], fmt::format("columns[{}]", i));
    ColumnSpec c;
    c.name = column.string("name");
    auto type = DataType::parse(column.string("type"));
    if (!type) throw SpecError{fmt::format("{}: {}", column.where("type"), type.error())};
    c.type = *type;
    column.rejectUnknown();
    column_specs.push_back(std::move(c));
  }
  auto partition = PartitionKey::parse(spec.string("partitionBy", ""));
  if (!partition) throw SpecError{"partitionBy: " + partition.error()};
  std::vector<std::string> order_by;
  if (spec.has("orderBy")) {
    const YAML::Node order = spec.node("orderBy");
    if (!order.IsSequence()) throw SpecError{"orderBy: expected a list of column names"};
    for (const auto& name : order) order_by.push_back(name.as<std::string>());
  }
  auto schema = TableSchema::create(std::move(column_specs), *partition, std::move(order_by));
  if (!schema) throw SpecError{"columns: " + schema.error()};
  result.schema = std::move(*schema);

  if (spec.has("deduplication")) {
    Fields dedup(spec.node("deduplication"), "deduplication");
    result.deduplication.max_ids =
        dedup.number<std::size_t>("window", result.deduplication.max_ids, 0, 10'000'000);
    result.deduplication.max_age = std::chrono::seconds(dedup.number<int64_t>(
        "windowSeconds", result.deduplication.max_age.count(), 0, 365 * 86400));
    dedup.rejectUnknown();
  }

  Fields zookeeper(spec.node("zookeeper"), "zookeeper");
  result.zookeeper_connect = zookeeper.string("connect");
  result.zookeeper_root = zookeeper.string("root", result.zookeeper_root);
  if (!result.zookeeper_root.starts_with('/') || result.zookeeper_root.ends_with('/')) {
    throw SpecError{fmt::format("zookeeper.root: '{}' must start with '/' and not end with it",
                                result.zookeeper_root)};
  }
  result.zookeeper_session_timeout = std::chrono::milliseconds(zookeeper.number<int64_t>(
      "sessionTimeoutMs", result.zookeeper_session_timeout.count(), 1000, 600000));
  if (zookeeper.has("credentialsDir")) {
    result.zookeeper_credentials_dir = zookeeper.string("credentialsDir");
    result.zookeeper_user =
        readSecretFile("zookeeper.credentialsDir", result.zookeeper_credentials_dir / "username");
    result.zookeeper_password =
        readSecretFile("zookeeper.credentialsDir", result.zookeeper_credentials_dir / "password");
    // Only while the password rotates (docs/security.md): the Secret's key previousPassword.
    const auto previous = result.zookeeper_credentials_dir / "previousPassword";
    std::error_code ignored;
    if (std::filesystem::exists(previous, ignored)) {
      result.zookeeper_previous_password = readSecretFile("zookeeper.credentialsDir", previous);
    }
  }
  zookeeper.rejectUnknown();

  Fields replica(spec.node("replica"), "replica");
  result.replica = replica.string("name");
  if (result.replica.empty() || result.replica.find('/') != std::string::npos) {
    throw SpecError{
        fmt::format("replica.name: '{}' must be non-empty and contain no '/'", result.replica)};
  }
  result.replica_host = replica.string("host", result.replica_host);
  replica.rejectUnknown();

  result.data_dir = spec.string("dataDir");
  result.listen_address = spec.string("listen", result.listen_address);
  if (spec.has("ports")) {
    Fields ports(spec.node("ports"), "ports");
    result.http_port = ports.number<uint16_t>("http", result.http_port, 1, 65535);
    result.metrics_port = ports.number<uint16_t>("metrics", result.metrics_port, 1, 65535);
    ports.rejectUnknown();
  }
  if (spec.has("api")) {
    Fields api(spec.node("api"), "api");
    if (api.has("tokensFile")) {
      result.api_tokens_file = api.string("tokensFile");
      std::istringstream lines(readSecretFile("api.tokensFile", result.api_tokens_file));
      for (std::string line; std::getline(lines, line);) {
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
        if (!line.empty()) result.api_tokens.push_back(line);
      }
    }
    result.api_reads_need_token = api.boolean("readsNeedToken", false);
    if (result.api_reads_need_token && result.api_tokens.empty()) {
      throw SpecError{"api.readsNeedToken: true needs api.tokensFile"};
    }
    api.rejectUnknown();
  }
  if (spec.has("tls")) {
    Fields tls(spec.node("tls"), "tls");
    result.tls_dir = tls.string("dir");
    tls.rejectUnknown();
    const auto files = common::TlsFiles::inDirectory(result.tls_dir);
    if (auto server = common::TlsContext::load(common::TlsContext::Side::kServer, files); !server)
      throw SpecError{"tls.dir: " + server.error()};
    if (auto client = common::TlsContext::load(common::TlsContext::Side::kClient, files); !client)
      throw SpecError{"tls.dir: " + client.error()};
  }
  if (spec.has("replication")) {
    Fields replication(spec.node("replication"), "replication");
    if (replication.has("secretFile")) {
      result.interserver_secret_file = replication.string("secretFile");
      std::istringstream lines(
          readSecretFile("replication.secretFile", result.interserver_secret_file));
      for (std::string line; std::getline(lines, line);) {
        // Spaces are kept: a secret from before rotations existed is taken byte for byte.
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        if (result.interserver_secret.empty()) {
          result.interserver_secret = line;
        } else {
          result.interserver_previous_secrets.push_back(line);
        }
      }
    }
    result.fetch_threads =
        replication.number<std::size_t>("fetchThreads", result.fetch_threads, 1, 64);
    result.merge_threads =
        replication.number<std::size_t>("mergeThreads", result.merge_threads, 1, 64);
    result.min_logs_to_keep =
        replication.number<std::size_t>("minLogsToKeep", result.min_logs_to_keep, 1, 1'000'000);
    result.max_logs_to_keep =
        replication.number<std::size_t>("maxLogsToKeep", result.max_logs_to_keep, 1, 10'000'000);
    if (result.max_logs_to_keep < result.min_logs_to_keep) {
      throw SpecError{fmt::format("replication.maxLogsToKeep: {} is below minLogsToKeep {}",
                                  result.max_logs_to_keep, result.min_logs_to_keep)};
    }
    result.cleanup_period = std::chrono::seconds(replication.number<int64_t>(
        "cleanupPeriodSeconds", result.cleanup_period.count(), 1, 3600));
    result.fetch_connect_timeout = std::chrono::milliseconds(replication.number<int64_t>(
        "fetchConnectTimeoutMs", result.fetch_connect_timeout.count(), 10, 600'000));
    result.fetch_receive_timeout = std::chrono::milliseconds(replication.number<int64_t>(
        "fetchReceiveTimeoutMs", result.fetch_receive_timeout.count(), 100, 3'600'000));
    replication.rejectUnknown();
  }
  if (spec.has("inserts")) {
    Fields inserts(spec.node("inserts"), "inserts");
    const YAML::Node quorum = inserts.node("quorum");
    if (quorum.IsScalar() && quorum.Scalar() == "auto") {
      result.insert_quorum_auto = true;
    } else if (inserts.has("quorum")) {
      const std::string text = quorum.IsScalar() ? quorum.Scalar() : "";
      std::size_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || value > 1000) {
        throw SpecError{fmt::format(
            "inserts.quorum: expected a number of replicas from 0 to 1000 or 'auto', got '{}'",
            text)};
      }
      result.insert_quorum = value;
    }
    result.insert_quorum_timeout = std::chrono::milliseconds(inserts.number<int64_t>(
        "quorumTimeoutMs", result.insert_quorum_timeout.count(), 1, 86'400'000));
    if (inserts.has("async")) {
      Fields async(inserts.node("async"), "inserts.async");
      AsyncInsertSettings& a = result.async_inserts;
      a.enabled = async.boolean("enabled", a.enabled);
      a.wait = async.boolean("wait", a.wait);
      a.max_data_size =
          async.number<std::size_t>("maxDataSize", a.max_data_size, 1, std::size_t{1} << 30);
      a.max_query_number =
          async.number<std::size_t>("maxQueryNumber", a.max_query_number, 1, 100'000);
      a.busy_timeout = std::chrono::milliseconds(
          async.number<int64_t>("busyTimeoutMs", a.busy_timeout.count(), 1, 600'000));
      a.stale_timeout = std::chrono::milliseconds(
          async.number<int64_t>("staleTimeoutMs", a.stale_timeout.count(), 0, 600'000));
      a.max_buffered_bytes = async.number<std::size_t>("maxBufferedBytes", a.max_buffered_bytes, 1,
                                                       std::size_t{1} << 40);
      if (a.max_buffered_bytes < a.max_data_size) {
        throw SpecError{fmt::format(
            "inserts.async.maxBufferedBytes: {} is below maxDataSize {} (one flush must fit)",
            a.max_buffered_bytes, a.max_data_size)};
      }
      async.rejectUnknown();
    }
    inserts.rejectUnknown();
  }
  spec.rejectUnknown();
  return result;
}

}  // namespace

std::expected<TableSpec, std::string> TableSpec::parseYaml(const std::string& text) {
  try {
    return parse(YAML::Load(text));
  } catch (const SpecError& e) {
    return std::unexpected(e.message);
  } catch (const YAML::Exception& e) {
    return std::unexpected(fmt::format("not valid YAML: {}", e.what()));
  }
}

std::expected<TableSpec, std::string> TableSpec::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return std::unexpected(fmt::format("cannot read {}", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  auto spec = parseYaml(text.str());
  if (!spec) return std::unexpected(fmt::format("{}: {}", file.string(), spec.error()));
  return spec;
}

std::string TableSpec::formatYaml() const {
  // The order and layout of the fields are those of the file's comment in table_spec.h.
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "table" << YAML::Value << table;
  out << YAML::Key << "uid" << YAML::Value << uid;
  out << YAML::Key << "columns" << YAML::Value << YAML::BeginSeq;
  for (const auto& column : schema.columns()) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << column.name
        << YAML::Key << "type" << YAML::Value << column.type.name() << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "partitionBy" << YAML::Value << schema.partitionBy().format();
  out << YAML::Key << "orderBy" << YAML::Value << YAML::Flow << schema.orderBy();
  out << YAML::Key << "deduplication" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "window" << YAML::Value << deduplication.max_ids;
  out << YAML::Key << "windowSeconds" << YAML::Value << deduplication.max_age.count();
  out << YAML::EndMap;
  out << YAML::Key << "zookeeper" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "connect" << YAML::Value << zookeeper_connect;
  out << YAML::Key << "root" << YAML::Value << zookeeper_root;
  out << YAML::Key << "sessionTimeoutMs" << YAML::Value << zookeeper_session_timeout.count();
  if (!zookeeper_credentials_dir.empty()) {
    out << YAML::Key << "credentialsDir" << YAML::Value << zookeeper_credentials_dir.string();
  }
  out << YAML::EndMap;
  out << YAML::Key << "replica" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << replica;
  out << YAML::Key << "host" << YAML::Value << replica_host;
  out << YAML::EndMap;
  out << YAML::Key << "dataDir" << YAML::Value << data_dir.string();
  out << YAML::Key << "listen" << YAML::Value << listen_address;
  out << YAML::Key << "ports" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "http" << YAML::Value << http_port;
  out << YAML::Key << "metrics" << YAML::Value << metrics_port;
  out << YAML::EndMap;
  if (!api_tokens_file.empty()) {
    out << YAML::Key << "api" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "tokensFile" << YAML::Value << api_tokens_file.string();
    out << YAML::Key << "readsNeedToken" << YAML::Value << api_reads_need_token;
    out << YAML::EndMap;
  }
  if (!tls_dir.empty()) {
    out << YAML::Key << "tls" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "dir" << YAML::Value << tls_dir.string();
    out << YAML::EndMap;
  }
  out << YAML::Key << "replication" << YAML::Value << YAML::BeginMap;
  if (!interserver_secret_file.empty()) {
    out << YAML::Key << "secretFile" << YAML::Value << interserver_secret_file.string();
  }
  out << YAML::Key << "fetchThreads" << YAML::Value << fetch_threads;
  out << YAML::Key << "mergeThreads" << YAML::Value << merge_threads;
  out << YAML::Key << "minLogsToKeep" << YAML::Value << min_logs_to_keep;
  out << YAML::Key << "maxLogsToKeep" << YAML::Value << max_logs_to_keep;
  out << YAML::Key << "cleanupPeriodSeconds" << YAML::Value << cleanup_period.count();
  if (fetch_connect_timeout != kDefaultFetchConnectTimeout) {
    out << YAML::Key << "fetchConnectTimeoutMs" << YAML::Value << fetch_connect_timeout.count();
  }
  if (fetch_receive_timeout != kDefaultFetchReceiveTimeout) {
    out << YAML::Key << "fetchReceiveTimeoutMs" << YAML::Value << fetch_receive_timeout.count();
  }
  out << YAML::EndMap;
  out << YAML::Key << "inserts" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "quorum" << YAML::Value;
  if (insert_quorum_auto) {
    out << "auto";
  } else {
    out << insert_quorum;
  }
  if (insert_quorum_timeout != kDefaultInsertQuorumTimeout) {
    out << YAML::Key << "quorumTimeoutMs" << YAML::Value << insert_quorum_timeout.count();
  }
  if (async_inserts != AsyncInsertSettings{}) {
    const AsyncInsertSettings& a = async_inserts;
    out << YAML::Key << "async" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "enabled" << YAML::Value << a.enabled;
    out << YAML::Key << "wait" << YAML::Value << a.wait;
    out << YAML::Key << "maxDataSize" << YAML::Value << a.max_data_size;
    out << YAML::Key << "maxQueryNumber" << YAML::Value << a.max_query_number;
    out << YAML::Key << "busyTimeoutMs" << YAML::Value << a.busy_timeout.count();
    out << YAML::Key << "staleTimeoutMs" << YAML::Value << a.stale_timeout.count();
    out << YAML::Key << "maxBufferedBytes" << YAML::Value << a.max_buffered_bytes;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string TableSpec::metadataText() const {
  // Like ClickHouse's <zp>/metadata: what replicas must agree on to hold the same data.
  std::string text = "metadata format version: 1\n";
  text += "columns:";
  for (const auto& c : schema.columns()) text += fmt::format(" `{}` {},", c.name, c.type.name());
  text.back() = '\n';
  text += fmt::format("partition key: {}\n", schema.partitionBy().format());
  text += "sorting key:";
  for (const auto& c : schema.orderBy()) text += " " + c;
  text += "\n";
  return text;
}

std::vector<ZooKeeperDigest> TableSpec::zookeeperDigests() const {
  if (zookeeper_user.empty()) return {};
  return {ZooKeeperDigest{zookeeper_user, zookeeper_password, tableRoot(),
                          zookeeper_previous_password}};
}

}  // namespace rtable::core
