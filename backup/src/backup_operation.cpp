#include "rtable/backup/backup_operation.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "destination_json.h"

namespace rtable::backup {
namespace {

using nlohmann::json;

// A name that stays one path component wherever it is used (destination keys, node names).
bool isPlainName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of("/|\n") == std::string_view::npos;
}

std::string_view kindName(DestinationRef::Kind kind) {
  switch (kind) {
    case DestinationRef::Kind::kS3:
      return "s3";
    case DestinationRef::Kind::kVolume:
      return "volume";
    case DestinationRef::Kind::kFilesystem:
      break;
  }
  return "filesystem";
}

std::expected<std::string, std::string> stringField(const json& object, const char* field,
                                                    std::string_view where) {
  auto it = object.find(field);
  if (it == object.end() || !it->is_string()) {
    return std::unexpected(fmt::format("{}{}: a string is required", where, field));
  }
  return it->get<std::string>();
}

}  // namespace

json destinationToJson(const DestinationRef& destination) {
  json out = {{"kind", kindName(destination.kind)}};
  if (destination.kind == DestinationRef::Kind::kFilesystem) {
    out["path"] = destination.path;
  } else if (destination.kind == DestinationRef::Kind::kVolume) {
    out["claimName"] = destination.claim_name;
    out["path"] = destination.path;
  } else {
    out["endpoint"] = destination.endpoint;
    out["bucket"] = destination.bucket;
    out["prefix"] = destination.prefix;
    out["region"] = destination.region;
    out["credentials"] = {{"secretName", destination.credentials_secret},
                          {"accessKeyIdKey", destination.access_key_id_key},
                          {"secretAccessKeyKey", destination.secret_access_key_key}};
  }
  return out;
}

std::expected<DestinationRef, std::string> destinationFromJson(const json& doc,
                                                               std::string_view where) {
  if (!doc.is_object()) return std::unexpected(fmt::format("{}: an object is required", where));
  DestinationRef destination;
  auto kind = stringField(doc, "kind", where);
  if (!kind) return std::unexpected(kind.error());
  if (*kind == "filesystem") {
    destination.kind = DestinationRef::Kind::kFilesystem;
    auto path = stringField(doc, "path", where);
    if (!path) return std::unexpected(path.error());
    if (path->empty() || path->front() != '/') {
      return std::unexpected(fmt::format("{}path: '{}' is not absolute", where, *path));
    }
    destination.path = *path;
  } else if (*kind == "volume") {
    destination.kind = DestinationRef::Kind::kVolume;
    auto claim = stringField(doc, "claimName", where);
    if (!claim) return std::unexpected(claim.error());
    if (!isPlainName(*claim)) {
      return std::unexpected(fmt::format("{}claimName: '{}' is not a claim's name", where, *claim));
    }
    auto path = stringField(doc, "path", where);
    if (!path) return std::unexpected(path.error());
    if (auto problem = volumePathProblem(*path)) {
      return std::unexpected(fmt::format("{}path: '{}' {}", where, *path, *problem));
    }
    destination.claim_name = *claim;
    destination.path = *path;
  } else if (*kind == "s3") {
    destination.kind = DestinationRef::Kind::kS3;
    for (auto [field, target] :
         {std::pair{"endpoint", &destination.endpoint}, std::pair{"bucket", &destination.bucket},
          std::pair{"prefix", &destination.prefix}, std::pair{"region", &destination.region}}) {
      auto value = stringField(doc, field, where);
      if (!value) return std::unexpected(value.error());
      *target = *value;
    }
    if (destination.bucket.empty())
      return std::unexpected(fmt::format("{}bucket: required", where));
    // Written by every version that writes S3 destinations; still optional, so that a node
    // written before it reads (its S3 destination then fails to open, naming the Secret missing).
    if (auto credentials = doc.find("credentials"); credentials != doc.end()) {
      const std::string inner = fmt::format("{}credentials.", where);
      if (!credentials->is_object()) {
        return std::unexpected(fmt::format("{}credentials: an object is required", where));
      }
      for (auto [field, target] :
           {std::pair{"secretName", &destination.credentials_secret},
            std::pair{"accessKeyIdKey", &destination.access_key_id_key},
            std::pair{"secretAccessKeyKey", &destination.secret_access_key_key}}) {
        auto value = stringField(*credentials, field, inner);
        if (!value) return std::unexpected(value.error());
        *target = *value;
      }
    }
  } else {
    return std::unexpected(
        fmt::format("{}kind: '{}' is not one of filesystem, s3 and volume", where, *kind));
  }
  return destination;
}

std::optional<std::string> volumePathProblem(std::string_view path) {
  if (path.empty()) return std::nullopt;
  if (path.front() == '/') return "is not a relative path";
  if (path.find('\0') != std::string_view::npos) return "holds a NUL byte";
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    const std::string_view component = path.substr(start, end - start);
    if (component.empty() || component == "." || component == "..") {
      return "must be directory names joined by '/' (no '.', '..' or empty component)";
    }
    start = end + 1;
  }
  return std::nullopt;
}

std::string DestinationRef::location() const {
  if (kind == Kind::kFilesystem) return path;
  if (kind == Kind::kVolume) {
    return path.empty() ? fmt::format("pvc://{}", claim_name)
                        : fmt::format("pvc://{}/{}", claim_name, path);
  }
  return prefix.empty() ? fmt::format("s3://{}", bucket)
                        : fmt::format("s3://{}/{}", bucket, prefix);
}

std::vector<std::string> BackupOperation::hosts() const {
  std::vector<std::string> all;
  for (const auto& table : tables) all.insert(all.end(), table.hosts.begin(), table.hosts.end());
  std::sort(all.begin(), all.end());
  return all;
}

const BackupTableRef* BackupOperation::tableOf(std::string_view host) const {
  for (const auto& table : tables) {
    if (std::find(table.hosts.begin(), table.hosts.end(), host) != table.hosts.end()) return &table;
  }
  return nullptr;
}

std::string BackupOperation::format() const {
  json tables_json = json::array();
  for (const auto& table : tables) {
    tables_json.push_back({{"table", table.table},
                           {"tableRoot", table.table_root},
                           {"generation", table.generation},
                           {"hosts", table.hosts}});
  }
  return json{{"uid", uid},
              {"name", name},
              {"startedMs", started_ms},
              {"tables", tables_json},
              {"destination", destinationToJson(destination)}}
      .dump();
}

std::expected<BackupOperation, std::string> BackupOperation::parse(std::string_view text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::unexpected("not a JSON object");
  BackupOperation op;
  auto uid = stringField(doc, "uid", "");
  if (!uid) return std::unexpected(uid.error());
  op.uid = *uid;
  if (!isPlainName(op.uid))
    return std::unexpected(fmt::format("uid: '{}' is not a plain name", op.uid));
  auto name = stringField(doc, "name", "");
  if (!name) return std::unexpected(name.error());
  op.name = *name;
  if (!isPlainName(op.name)) {
    return std::unexpected(fmt::format("name: '{}' is not a plain name", op.name));
  }
  if (auto it = doc.find("startedMs"); it != doc.end() && it->is_number_integer()) {
    op.started_ms = it->get<int64_t>();
  }
  auto tables = doc.find("tables");
  if (tables == doc.end() || !tables->is_array() || tables->empty()) {
    return std::unexpected("tables: at least one table is required");
  }
  std::set<std::string> seen_hosts;
  for (std::size_t i = 0; i < tables->size(); ++i) {
    const json& item = (*tables)[i];
    std::string where = fmt::format("tables[{}].", i);
    if (!item.is_object()) return std::unexpected(fmt::format("tables[{}]: not an object", i));
    BackupTableRef table;
    auto table_name = stringField(item, "table", where);
    if (!table_name) return std::unexpected(table_name.error());
    table.table = *table_name;
    if (!isPlainName(table.table)) {
      return std::unexpected(fmt::format("{}table: '{}' is not a plain name", where, table.table));
    }
    auto root = stringField(item, "tableRoot", where);
    if (!root) return std::unexpected(root.error());
    table.table_root = *root;
    auto generation = item.find("generation");
    if (generation == item.end() || !generation->is_number_integer() ||
        generation->get<int64_t>() < 1) {
      return std::unexpected(fmt::format("{}generation: a number >= 1 is required", where));
    }
    table.generation = generation->get<int64_t>();
    auto hosts = item.find("hosts");
    if (hosts == item.end() || !hosts->is_array() || hosts->empty()) {
      return std::unexpected(fmt::format("{}hosts: at least one host is required", where));
    }
    for (const auto& host : *hosts) {
      if (!host.is_string() || !isPlainName(host.get<std::string>())) {
        return std::unexpected(fmt::format("{}hosts: '{}' is not a host name", where, host.dump()));
      }
      if (!seen_hosts.insert(host.get<std::string>()).second) {
        return std::unexpected(
            fmt::format("{}hosts: '{}' appears twice", where, host.get<std::string>()));
      }
      table.hosts.push_back(host.get<std::string>());
    }
    op.tables.push_back(std::move(table));
  }
  auto destination = doc.find("destination");
  if (destination == doc.end() || !destination->is_object()) {
    return std::unexpected("destination: an object is required");
  }
  auto parsed = destinationFromJson(*destination, "destination.");
  if (!parsed) return std::unexpected(parsed.error());
  op.destination = std::move(*parsed);
  return op;
}

std::string stage::gatheringMetadata(int attempt) {
  return fmt::format("{} ({})", kGatheringMetadata, attempt);
}

std::string BackupPaths::rootFor(std::string_view tables_root) {
  auto slash = tables_root.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return "/backups";
  return std::string(tables_root.substr(0, slash)) + "/backups";
}

std::string BackupPaths::started(std::string_view host) const {
  return fmt::format("{}/started|{}", stage(), host);
}
std::string BackupPaths::finished(std::string_view host) const {
  return fmt::format("{}/finished|{}", stage(), host);
}
std::string BackupPaths::alive(std::string_view host) const {
  return fmt::format("{}/alive|{}", stage(), host);
}
std::string BackupPaths::current(std::string_view host, std::string_view stage_name) const {
  return fmt::format("{}/current|{}|{}", stage(), host, stage_name);
}
std::string BackupPaths::parts(std::string_view host) const {
  return fmt::format("{}/{}", parts(), host);
}
std::string BackupPaths::fileInfos(std::string_view host) const {
  return fmt::format("{}/{}", fileInfos(), host);
}
std::string BackupPaths::writingFile(std::size_t index) const {
  return fmt::format("{}/{}", writingFiles(), index);
}

StageNodeName parseStageNodeName(std::string_view name) {
  StageNodeName parsed;
  if (name == "error") {
    parsed.kind = StageNodeName::Kind::kError;
    return parsed;
  }
  auto bar = name.find('|');
  if (bar == std::string_view::npos) return parsed;
  std::string_view kind = name.substr(0, bar);
  std::string_view rest = name.substr(bar + 1);
  if (kind == "current") {
    auto second = rest.find('|');
    if (second == std::string_view::npos) return parsed;
    parsed.kind = StageNodeName::Kind::kCurrent;
    parsed.host = std::string(rest.substr(0, second));
    parsed.stage = std::string(rest.substr(second + 1));
    return parsed;
  }
  parsed.host = std::string(rest);
  if (kind == "started") parsed.kind = StageNodeName::Kind::kStarted;
  if (kind == "finished") parsed.kind = StageNodeName::Kind::kFinished;
  if (kind == "alive") parsed.kind = StageNodeName::Kind::kAlive;
  return parsed;
}

}  // namespace rtable::backup
