#include "rtable/backup/backup_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <system_error>

namespace rtable::backup {

namespace fs = std::filesystem;

StorageResult<BackupManifest> readManifest(BackupStorage& storage, const std::string& name) {
  auto text = storage.read(manifestName(name));
  if (!text) return std::unexpected(text.error());
  auto manifest = BackupManifest::parse(*text);
  if (!manifest) {
    return std::unexpected(StorageError{
        StorageError::Kind::kCorrupt,
        fmt::format("{}/{}: {}", storage.location(), manifestName(name), manifest.error())});
  }
  return *manifest;
}

std::expected<void, std::string> materializePart(BackupStorage& storage,
                                                 const BackupManifest& manifest,
                                                 const std::string& table, const std::string& part,
                                                 const fs::path& dir) {
  const std::string prefix = table + "/" + part + "/";
  auto first = std::lower_bound(
      manifest.files.begin(), manifest.files.end(), prefix,
      [](const ManifestFile& file, const std::string& key) { return file.name < key; });
  std::error_code ec;
  if (fs::exists(dir, ec)) return std::unexpected(fmt::format("{} exists already", dir.string()));
  if (!fs::create_directories(dir, ec)) {
    return std::unexpected(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  }
  auto fail = [&](std::string message) -> std::expected<void, std::string> {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    return std::unexpected(std::move(message));
  };
  bool any = false;
  for (auto it = first; it != manifest.files.end() && it->name.starts_with(prefix); ++it) {
    any = true;
    const std::string file_name = it->name.substr(prefix.size());
    const fs::path target = dir / file_name;
    std::string bytes;
    if (!it->data_file.empty()) {
      auto read = storage.read(it->data_file);
      if (!read) {
        return fail(fmt::format("{}: reading {} ({}): {}", it->name, it->data_file,
                                storageErrorKindName(read.error().kind), read.error().message));
      }
      bytes = std::move(*read);
    }
    if (bytes.size() != it->size) {
      return fail(
          fmt::format("{}: {} bytes where the manifest says {} (the data file {} is "
                      "damaged)",
                      it->name, bytes.size(), it->size, it->data_file));
    }
    if (auto hash = core::hash128(bytes); hash != it->checksum) {
      return fail(
          fmt::format("{}: checksum {} where the manifest says {} (the data file {} is "
                      "damaged)",
                      it->name, hash.hex(), it->checksum.hex(), it->data_file));
    }
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) return fail(fmt::format("{}: cannot write {}", it->name, target.string()));
  }
  if (!any) return fail(fmt::format("the backup holds no part {} of table {}", part, table));
  return {};
}

}  // namespace rtable::backup
