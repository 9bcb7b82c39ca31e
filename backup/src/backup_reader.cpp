#include "rtable/backup/backup_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <system_error>
#include <utility>
#include <vector>

#include "rtable/replication_core/hash128.h"

namespace rtable::backup {

namespace fs = std::filesystem;

namespace {

// A local file's size and content hash, read in chunks: a part's column file can be larger than
// memory should hold.
std::expected<std::pair<uint64_t, core::Hash128>, std::string> sizeAndHash(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::unexpected(fmt::format("cannot read {}", file.string()));
  core::Hasher128 hasher;
  std::vector<char> chunk(1 << 20);
  uint64_t size = 0;
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    hasher.update(chunk.data(), got);
    size += got;
  }
  if (in.bad()) return std::unexpected(fmt::format("cannot read {}", file.string()));
  return std::pair{size, hasher.digest()};
}

}  // namespace

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
    // Streamed from the destination into place, then checked there: never held in memory whole.
    if (!it->data_file.empty()) {
      auto read = storage.readToFile(it->data_file, target);
      if (!read) {
        return fail(fmt::format("{}: reading {} ({}): {}", it->name, it->data_file,
                                storageErrorKindName(read.error().kind), read.error().message));
      }
    } else {
      std::ofstream out(target, std::ios::binary | std::ios::trunc);  // an empty file
      out.close();
      if (!out) return fail(fmt::format("{}: cannot write {}", it->name, target.string()));
    }
    auto written = sizeAndHash(target);
    if (!written) return fail(fmt::format("{}: {}", it->name, written.error()));
    const auto& [size, hash] = *written;
    if (size != it->size) {
      return fail(
          fmt::format("{}: {} bytes where the manifest says {} (the data file {} is "
                      "damaged)",
                      it->name, size, it->size, it->data_file));
    }
    if (hash != it->checksum) {
      return fail(
          fmt::format("{}: checksum {} where the manifest says {} (the data file {} is "
                      "damaged)",
                      it->name, hash.hex(), it->checksum.hex(), it->data_file));
    }
  }
  if (!any) return fail(fmt::format("the backup holds no part {} of table {}", part, table));
  return {};
}

}  // namespace rtable::backup
