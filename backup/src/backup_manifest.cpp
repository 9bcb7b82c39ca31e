#include "rtable/backup/backup_manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

namespace rtable::backup {

using nlohmann::json;

const ManifestTable* BackupManifest::table(std::string_view name) const {
  for (const auto& table : tables) {
    if (table.table == name) return &table;
  }
  return nullptr;
}

std::vector<std::string> BackupManifest::dataFiles() const {
  std::set<std::string> names;
  for (const auto& file : files) {
    if (!file.data_file.empty()) names.insert(file.data_file);
  }
  return {names.begin(), names.end()};
}

std::string BackupManifest::format() const {
  json tables_json = json::array();
  for (const auto& table : tables) {
    json parts = json::array();
    for (const auto& part : table.parts) {
      parts.push_back(
          {{"name", part.name}, {"rows", part.rows}, {"checksum", part.checksum.hex()}});
    }
    tables_json.push_back({{"table", table.table},
                           {"generation", table.generation},
                           {"metadata", table.metadata},
                           {"sourceHost", table.source_host},
                           {"rows", table.rows},
                           {"parts", parts}});
  }
  json files_json = json::array();
  for (const auto& file : files) {
    files_json.push_back({{"name", file.name},
                          {"size", file.size},
                          {"checksum", file.checksum.hex()},
                          {"dataFile", file.data_file}});
  }
  return json{{"version", version},
              {"name", name},
              {"uid", uid},
              {"startedMs", started_ms},
              {"completedMs", completed_ms},
              {"tables", tables_json},
              {"files", files_json},
              {"dataFiles", data_files},
              {"dataBytes", data_bytes},
              {"bytesWritten", bytes_written},
              {"bytesReused", bytes_reused}}
             .dump(1) +
         "\n";
}

namespace {

struct Reader {
  std::string error;
  bool ok() const { return error.empty(); }
  const json* field(const json& object, const std::string& where, const char* name,
                    json::value_t type) {
    if (!ok()) return nullptr;
    auto it = object.find(name);
    bool matches = it != object.end() &&
                   (it->type() == type ||
                    (type == json::value_t::number_unsigned &&
                     it->type() == json::value_t::number_integer && it->get<int64_t>() >= 0));
    if (!matches) {
      error = fmt::format("{}{}: missing or of the wrong type", where, name);
      return nullptr;
    }
    return &*it;
  }
  std::string string(const json& object, const std::string& where, const char* name) {
    auto value = field(object, where, name, json::value_t::string);
    return value ? value->get<std::string>() : "";
  }
  uint64_t number(const json& object, const std::string& where, const char* name) {
    auto value = field(object, where, name, json::value_t::number_unsigned);
    return value ? value->get<uint64_t>() : 0;
  }
  core::Hash128 hash(const json& object, const std::string& where, const char* name) {
    std::string text = string(object, where, name);
    if (!ok()) return {};
    auto hash = core::Hash128::fromHex(text);
    if (!hash) error = fmt::format("{}{}: '{}' is not 32 hex digits", where, name, text);
    return hash.value_or(core::Hash128{});
  }
};

}  // namespace

std::expected<BackupManifest, std::string> BackupManifest::parse(std::string_view text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::unexpected("not a JSON object");
  Reader r;
  BackupManifest manifest;
  manifest.version = static_cast<int>(r.number(doc, "", "version"));
  if (r.ok() && manifest.version > kVersion) {
    return std::unexpected(
        fmt::format("version {}: written by a newer rtable (this one reads up to {})",
                    manifest.version, kVersion));
  }
  manifest.name = r.string(doc, "", "name");
  manifest.uid = r.string(doc, "", "uid");
  manifest.started_ms = static_cast<int64_t>(r.number(doc, "", "startedMs"));
  manifest.completed_ms = static_cast<int64_t>(r.number(doc, "", "completedMs"));
  manifest.data_files = r.number(doc, "", "dataFiles");
  manifest.data_bytes = r.number(doc, "", "dataBytes");
  manifest.bytes_written = r.number(doc, "", "bytesWritten");
  manifest.bytes_reused = r.number(doc, "", "bytesReused");
  if (auto tables = r.field(doc, "", "tables", json::value_t::array)) {
    for (std::size_t i = 0; i < tables->size() && r.ok(); ++i) {
      const json& item = (*tables)[i];
      std::string where = fmt::format("tables[{}].", i);
      ManifestTable table;
      table.table = r.string(item, where, "table");
      table.generation = static_cast<int64_t>(r.number(item, where, "generation"));
      table.metadata = r.string(item, where, "metadata");
      table.source_host = r.string(item, where, "sourceHost");
      table.rows = r.number(item, where, "rows");
      if (auto parts = r.field(item, where, "parts", json::value_t::array)) {
        for (std::size_t j = 0; j < parts->size() && r.ok(); ++j) {
          std::string part_where = fmt::format("{}parts[{}].", where, j);
          ManifestPart part;
          part.name = r.string((*parts)[j], part_where, "name");
          part.rows = r.number((*parts)[j], part_where, "rows");
          part.checksum = r.hash((*parts)[j], part_where, "checksum");
          table.parts.push_back(std::move(part));
        }
      }
      manifest.tables.push_back(std::move(table));
    }
  }
  if (auto files = r.field(doc, "", "files", json::value_t::array)) {
    for (std::size_t i = 0; i < files->size() && r.ok(); ++i) {
      std::string where = fmt::format("files[{}].", i);
      ManifestFile file;
      file.name = r.string((*files)[i], where, "name");
      file.size = r.number((*files)[i], where, "size");
      file.checksum = r.hash((*files)[i], where, "checksum");
      file.data_file = r.string((*files)[i], where, "dataFile");
      if (r.ok() && file.size > 0 && file.data_file.empty()) {
        r.error = fmt::format("{}dataFile: required for a file of {} bytes", where, file.size);
      }
      manifest.files.push_back(std::move(file));
    }
  }
  if (!r.ok()) return std::unexpected(r.error);
  return manifest;
}

std::string manifestName(std::string_view backup_name) {
  return fmt::format("{}{}/manifest.json", kManifestsPrefix, backup_name);
}

}  // namespace rtable::backup
