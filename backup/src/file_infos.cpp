#include "rtable/backup/file_infos.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace rtable::backup {

std::string formatFileInfos(const std::vector<BackupFileInfo>& infos) {
  std::string text;
  for (const auto& info : infos) {
    text += fmt::format("{} {} {}\n", info.size, info.checksum.hex(), info.name);
  }
  return text;
}

std::expected<std::vector<BackupFileInfo>, std::string> parseFileInfos(std::string_view text) {
  std::vector<BackupFileInfo> infos;
  std::size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    auto end = text.find('\n');
    if (end == std::string_view::npos) {
      return std::unexpected(fmt::format("file infos line {}: no newline at the end", line_number));
    }
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end + 1);
    auto fail = [&](std::string_view what) {
      return std::unexpected(fmt::format("file infos line {}: {}", line_number, what));
    };
    auto first = line.find(' ');
    auto second = first == std::string_view::npos ? first : line.find(' ', first + 1);
    if (second == std::string_view::npos) return fail("expected '<size> <checksum> <name>'");
    BackupFileInfo info;
    std::string_view size = line.substr(0, first);
    auto [ptr, ec] = std::from_chars(size.data(), size.data() + size.size(), info.size);
    if (ec != std::errc() || ptr != size.data() + size.size()) return fail("bad size");
    auto checksum = core::Hash128::fromHex(line.substr(first + 1, second - first - 1));
    if (!checksum) return fail("bad checksum");
    info.checksum = *checksum;
    info.name = std::string(line.substr(second + 1));
    if (info.name.empty()) return fail("empty name");
    infos.push_back(std::move(info));
  }
  return infos;
}

std::string dataFileName(uint64_t size, const core::Hash128& checksum) {
  std::string hex = checksum.hex();
  return fmt::format("data/{}/{}-{}", hex.substr(0, 2), hex, size);
}

const PlannedFile* BackupFilePlan::find(std::string_view name) const {
  auto it = std::lower_bound(
      files.begin(), files.end(), name,
      [](const PlannedFile& file, std::string_view key) { return file.info.name < key; });
  return it != files.end() && it->info.name == name ? &*it : nullptr;
}

std::expected<BackupFilePlan, std::string> planFiles(
    const std::map<std::string, std::vector<BackupFileInfo>>& infos_by_host) {
  // name -> (info, first host that published it)
  std::map<std::string, std::pair<BackupFileInfo, std::string>> by_name;
  for (const auto& [host, infos] : infos_by_host) {
    for (const auto& info : infos) {
      auto [it, inserted] = by_name.emplace(info.name, std::pair{info, host});
      if (!inserted &&
          (it->second.first.size != info.size || it->second.first.checksum != info.checksum)) {
        return std::unexpected(fmt::format(
            "hosts {} and {} hold different files {} (size {} and {}, checksum {} and {})",
            it->second.second, host, info.name, it->second.first.size, info.size,
            it->second.first.checksum.hex(), info.checksum.hex()));
      }
    }
  }
  BackupFilePlan plan;
  std::map<std::pair<uint64_t, std::string>, std::size_t> index_by_content;
  for (auto& [name, entry] : by_name) {
    PlannedFile file;
    file.info = std::move(entry.first);
    plan.logical_bytes += file.info.size;
    std::size_t position = plan.files.size();
    if (file.info.size == 0) {
      file.data_file_index = position;  // nothing to write: no host elects a writer for it
    } else {
      auto [it, inserted] =
          index_by_content.emplace(std::pair{file.info.size, file.info.checksum.hex()}, position);
      file.data_file_index = it->second;
      file.data_file = dataFileName(file.info.size, file.info.checksum);
      if (inserted) {
        ++plan.data_files;
        plan.data_bytes += file.info.size;
      }
    }
    plan.files.push_back(std::move(file));
  }
  return plan;
}

core::KeeperStatus writeChunked(core::Keeper& keeper, const std::string& path,
                                std::string_view value, std::size_t max_chunk) {
  if (auto created = keeper.create(path, "", core::CreateMode::kPersistent);
      !created && created.error().code != core::KeeperCode::kNodeExists) {
    return std::unexpected(created.error());
  }
  std::size_t chunks = std::max<std::size_t>(1, (value.size() + max_chunk - 1) / max_chunk);
  for (std::size_t i = 0; i < chunks; ++i) {
    std::string chunk(value.substr(std::min(value.size(), i * max_chunk), max_chunk));
    // Zero-padded: the children's names sort as their numbers (seed 001).
    std::string chunk_path = fmt::format("{}/{:06}", path, i);
    auto created = keeper.create(chunk_path, chunk, core::CreateMode::kPersistent);
    if (!created && created.error().code == core::KeeperCode::kNodeExists) {
      auto set = keeper.set(chunk_path, chunk);
      if (!set) return std::unexpected(set.error());
    } else if (!created) {
      return std::unexpected(created.error());
    }
  }
  return {};
}

core::KeeperResult<std::string> readChunked(core::Keeper& keeper, const std::string& path) {
  auto children = keeper.children(path);
  if (!children) return std::unexpected(children.error());
  std::vector<std::string> names = children->names;
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  for (const auto& name : names) paths.push_back(path + "/" + name);
  std::string value;
  for (auto& chunk : keeper.getMany(paths)) {
    if (!chunk) return std::unexpected(chunk.error());
    value += chunk->data;
  }
  return value;
}

}  // namespace rtable::backup
